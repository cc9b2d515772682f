"""Every file of ../shared/validation as a benchmark source: its runs planner estimates, its rows it
cannot (each with why), and the issue's target. benchmarks/accuracy.py scores them; benchmarks/calibrate.py
refits on a subset of them (leave-one-source-out)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import pandas as pd

from benchmarks.moe_runs import MOE_FILE, moe_runs
from benchmarks.titan_runs import TITAN_FILES, titan_runs
from benchmarks.validation_runs import (
    BLOOM_FILE,
    BRIDGE_FILE,
    DATA,
    LLMFOUNDRY_FILE,
    LONG_CONTEXT_FILE,
    NARAYANAN_FILE,
    NEMO_FILE,
    TABLE4_FILE,
    LayerRow,
    Run,
    Skipped,
    bloom_runs,
    bloom_skipped,
    h100_runs,
    korthikanti_layer_rows,
    llmfoundry_runs,
    long_context_runs,
    narayanan_ptdp_skipped,
    narayanan_zero3_ooms,
    narayanan_zero3_runs,
)

__all__ = ["Source", "skipped_files", "sources"]

MAPE_TARGET = 0.10  # issue 10: every source's time MAPE ≤ 10 %
MOE_MAPE_TARGET = 0.12  # issue 11: moe_ep_throughput.csv's H100 and B200 rows ≤ 12 %


@dataclass(frozen=True)
class Source:
    """One published data set: what planner estimates from it, what it cannot, and the target."""

    name: str
    file: str
    runs: tuple[Run, ...]
    skipped: tuple[Skipped, ...]
    target: float = MAPE_TARGET
    layers: tuple[LayerRow, ...] = ()  # Korthikanti Table 4: per-layer times instead of whole runs
    ooms: tuple[Run, ...] = ()  # runs documented as out of memory: scored only on being predicted not to fit
    completions: tuple[Run, ...] = ()  # runs documented as completed, time not scored: scored on being predicted to fit

    @property
    def ran(self) -> tuple[Run, ...]:
        """Every run documented as having run: the time-scored ones and the completions."""
        return self.runs + self.completions


def _h100(file: str) -> tuple[tuple[Run, ...], tuple[Skipped, ...]]:
    runs, skipped = h100_runs()
    return tuple(r for r in runs if r.file == file), tuple(s for s in skipped if s.file == file)


def _moe_source(name: str, rack_scale: bool) -> Source:
    moe = moe_runs(rack_scale)
    return Source(name, MOE_FILE, moe.runs, moe.skipped, MOE_MAPE_TARGET, ooms=moe.ooms, completions=moe.completions)


@cache
def sources() -> tuple[Source, ...]:
    """The sources with runs planner can estimate, in the README's order."""
    nemo, bridge = _h100(NEMO_FILE), _h100(BRIDGE_FILE)
    titan = {file: titan_runs(file) for file in TITAN_FILES}
    return (
        Source("BLOOM-176B sweep (Megatron-DeepSpeed, A100)", BLOOM_FILE, bloom_runs(), bloom_skipped(),
               ooms=bloom_runs(ooms=True)),
        Source("Korthikanti 2022 Table 4 (22B layer, A100)", TABLE4_FILE, (), (), 0.05, korthikanti_layer_rows()),
        Source("NeMo 24.07 (H100, FP8)", NEMO_FILE, *nemo),
        Source("Megatron-Bridge 25.11 (H100, FP8)", BRIDGE_FILE, *bridge),
        Source("Narayanan 2021 Table 2 (DeepSpeed ZeRO-3, A100)", NARAYANAN_FILE, narayanan_zero3_runs(),
               narayanan_ptdp_skipped(), 0.15, ooms=narayanan_zero3_ooms()),
        Source("llm-foundry MPT (PyTorch FSDP, A100)", LLMFOUNDRY_FILE, llmfoundry_runs(), ()),
        Source("NeMo / Megatron-Bridge long context CP (H100/B200/GB300, FP8)", LONG_CONTEXT_FILE,
               *long_context_runs()),
        Source("torchtitan 2024-12 (FSDP2/TP, H100)", TITAN_FILES[0], *titan[TITAN_FILES[0]]),
        Source("torchtitan docs 2024 (FSDP2, A100/H100)", TITAN_FILES[1], *titan[TITAN_FILES[1]]),
        Source("torchao float8/MXFP8 (FSDP2, H100/MI300X/B200)", TITAN_FILES[2], *titan[TITAN_FILES[2]]),
        _moe_source("Megatron-Bridge MoE with EP (H100/B200, force-balanced)", False),
        _moe_source("Megatron-Bridge MoE with EP (B300/GB200/GB300, force-balanced)", True),
    )


def _rows(file: str, reason: Callable[[pd.Series], str], key: str = "row_id") -> tuple[Skipped, ...]:
    return tuple(Skipped(file, f"{key} {row[key]}", reason(row)) for _, row in pd.read_csv(DATA / file).iterrows())


def _fsdp_other_reason(row: pd.Series) -> str:
    if "offload" in f"{row['other_flags']} {row['model']}".lower():
        return "CPU offload not modelled"
    return "model shape, batch or throughput not stated"


@cache
def skipped_files() -> tuple[Skipped, ...]:
    """Rows of the validation files no source estimates (features planner lacks, inputs not stated)."""
    formula = "a formula, not a measurement: reproduced exactly by tests/test_memory.py"
    return (
        _rows("fsdp_zero3_other_datapoints.csv", _fsdp_other_reason)
        + _rows("deepspeed_zeropp_vs_zero3_v100_2023.csv", lambda _: "model shape not stated")
        + _rows("zero2020_other_datapoints.csv", lambda _: "aggregate figure without a run configuration", "setting")
        + _rows("deepspeed_estimator_examples.csv",
                lambda _: "DeepSpeed's estimator (CPU offload, largest-layer terms), not a measurement", "options")
        + _rows("zero2020_table1_model_state_memory.csv", lambda _: formula, "model")
        + _rows("korthikanti2022_table2_activation_memory_per_layer.csv", lambda _: formula, "configuration")
    )
