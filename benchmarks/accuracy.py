"""How well planner's `estimate` reproduces published training runs (a report, not a pass/fail timer).

    python -m benchmarks.accuracy              # per-run tables, per-file MAPE / worst, summary
    python -m benchmarks.accuracy --summary    # the summary table only (README "Accuracy")

Each run goes through `planner.cost.estimate.estimate` with the run's model, cluster, training and
parallel configuration (benchmarks/validation_runs.py), using the shipped profiles/calibration.yaml.
The calibration was fitted on the BLOOM *fit half* only; the *hold half* is out of sample.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.validation_runs import (
    Run,
    bloom_runs,
    h100_runs,
    korthikanti_layer_rows,
    llmfoundry_runs,
    narayanan_zero3_runs,
    predict,
    predict_layer,
    shipped_before_fix_nic_ratio,
    split_fit_hold,
)
from planner.gpu import GIB
from planner.profile.calibration import Calibration, default_calibration
from planner.render import format_table

__all__ = ["Score", "bloom_memory_errors", "run_errors", "score"]

TARGETS = {"bloom": 0.08, "korthikanti": 0.05, "h100": 0.10, "bloom_memory": 0.10, "narayanan_zero3": 0.15,
           "llmfoundry": 0.10}


@dataclass(frozen=True)
class Score:
    """Mean absolute relative error and the worst one over a set of data points."""

    count: int
    mape: float
    worst: float


def score(errors: Sequence[float]) -> Score:
    magnitudes = [abs(e) for e in errors]
    return Score(len(magnitudes), sum(magnitudes) / len(magnitudes), max(magnitudes))


def run_errors(runs: Sequence[Run], calibration: Calibration) -> list[tuple[Run, float, float]]:
    """(run, predicted seconds, relative error) per run."""
    out = []
    for run in runs:
        predicted = predict(run, calibration).iteration_time_s
        out.append((run, predicted, predicted / run.iteration_s - 1))
    return out


def bloom_memory_errors(runs: Sequence[Run], calibration: Calibration) -> list[tuple[Run, float, float]]:
    """(run, predicted peak bytes, relative error) for BLOOM rows that report a memory figure."""
    out = []
    for run in runs:
        if run.memory_bytes:
            predicted = predict(run, calibration).peak_memory_bytes
            out.append((run, predicted, predicted / run.memory_bytes - 1))
    return out


def _pct(value: float) -> str:
    return f"{100 * value:+.1f} %"


def _print_runs(title: str, rows: list[tuple[Run, float, float]], unit: str, scale: float) -> None:
    print(f"\n## {title}")
    table = [[run.label, f"{run.iteration_s if unit == 's' else run.memory_bytes / scale:.3f}",
              f"{predicted / scale:.3f}", _pct(error)] for run, predicted, error in rows]
    print(format_table(["run", f"published {unit}", f"predicted {unit}", "error"], table))
    result = score([e for _, _, e in rows])
    print(f"MAPE {100 * result.mape:.1f} %, worst {100 * result.worst:.1f} % over {result.count} runs")


def _layer_rows(calibration: Calibration) -> tuple[list[list[str]], list[float]]:
    table, errors = [], []
    for row in korthikanti_layer_rows():
        forward, backward = predict_layer(row, calibration)
        fe, be = forward / row.forward_s - 1, backward / row.backward_s - 1
        errors += [fe, be]
        table.append([row.experiment, f"{1e3 * row.forward_s:.1f}", f"{1e3 * forward:.2f}", _pct(fe),
                      f"{1e3 * row.backward_s:.1f}", f"{1e3 * backward:.2f}", _pct(be)])
    return table, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="print only the summary table")
    args = parser.parse_args()
    calibration = default_calibration()
    fit_half, hold_half = split_fit_hold(bloom_runs())
    bloom_fit, bloom_hold = run_errors(fit_half, calibration), run_errors(hold_half, calibration)
    memory = bloom_memory_errors(bloom_runs(), calibration)
    h100, skipped = h100_runs()
    h100_rows = run_errors(h100, calibration)
    layer_table, layer_errors = _layer_rows(calibration)
    zero3_rows = run_errors(narayanan_zero3_runs(), calibration)
    fsdp_rows = run_errors(llmfoundry_runs(), calibration)
    if not args.summary:
        _print_runs("BLOOM sweep, fit half (iteration time)", bloom_fit, "s", 1.0)
        _print_runs("BLOOM sweep, hold-out half (iteration time)", bloom_hold, "s", 1.0)
        _print_runs("BLOOM sweep, peak memory per GPU", memory, "GiB", GIB)
        print("\n## Korthikanti et al. 2022 Table 4: one 22B layer (ms)")
        print(format_table(["experiment", "fwd", "pred", "err", "bwd", "pred", "err"], layer_table))
        _print_runs("H100 FP8 runs (NeMo 24.07, Megatron-Bridge 25.11)", h100_rows, "s", 1.0)
        print("skipped: " + "; ".join(skipped))
        _print_runs("Narayanan et al. 2021 Table 2, DeepSpeed ZeRO-3 rows", zero3_rows, "s", 1.0)
        _print_runs("llm-foundry MPT, PyTorch FSDP FULL_SHARD on A100", fsdp_rows, "s", 1.0)
        print(f"BLOOM rows before Jean Zay's PCIe/NUMA fix: inter-node bandwidth × "
              f"{shipped_before_fix_nic_ratio():.3f} (fitted cluster state, profiles/calibration.yaml cluster_states)")
    summary = [
        ("BLOOM sweep time, fit half", [e for *_, e in bloom_fit], TARGETS["bloom"]),
        ("BLOOM sweep time, hold-out half", [e for *_, e in bloom_hold], TARGETS["bloom"]),
        ("BLOOM sweep time, all", [e for *_, e in bloom_fit + bloom_hold], TARGETS["bloom"]),
        ("BLOOM sweep peak memory", [e for *_, e in memory], TARGETS["bloom_memory"]),
        ("Korthikanti Table 4 layer fwd/bwd", layer_errors, TARGETS["korthikanti"]),
        ("H100 FP8 runs time", [e for *_, e in h100_rows], TARGETS["h100"]),
        ("Narayanan Table 2 ZeRO-3 time", [e for *_, e in zero3_rows], TARGETS["narayanan_zero3"]),
        ("llm-foundry FSDP time", [e for *_, e in fsdp_rows], TARGETS["llmfoundry"]),
    ]
    print("\n| data | points | MAPE | worst | target |\n|---|---|---|---|---|")
    for name, errors, target in summary:
        result = score(errors)
        print(f"| {name} | {result.count} | {100 * result.mape:.1f} % | {100 * result.worst:.1f} % | "
              f"{'each' if name.startswith(('Korthikanti', 'Narayanan')) else 'MAPE'} ≤ {100 * target:.0f} % |")


if __name__ == "__main__":
    main()
