"""Held-out check: Megatron-Bridge's published dense Llama pre-training runs, never fitted.

Megatron-Bridge's docs/performance-summary.md and docs/performance-summary-archive.md (NVIDIA-NeMo/Megatron-Bridge)
list, per NeMo container release, the throughput of its performance recipes on DGX-H100, B200, B300, GB200 and
GB300. Three of the 25.11 H100 rows are in ../shared/validation (megatron_bridge_2511_h100_dense.csv); the rest are
not, so nothing is calibrated on them. This script reads copies of those pages and estimates every dense Llama-3
pre-training row (8B, 70B, 405B) as its table states it — layout, micro-batch, global batch, sequence, FSDP,
precision — with the settings shared by the validation file's rows for what a table does not state (distributed
optimizer or Megatron-FSDP, sequence parallelism and TP communication overlap when tp > 1, interleaving when vp > 1,
16-bit gradients, cuDNN attention, no recompute, current-scaling FP8 on Hopper's "FP8" and MXFP8 where named).
Per-release recipe details the tables leave out (CUDA graphs, CPU offload, recompute of a few layers) are not read,
so single rows can be off for reasons the table cannot show; the per-system means are the signal.

    PYTHONPATH=. python -m benchmarks.bridge_dense SUMMARY.md [ARCHIVE.md ...] [--runs]
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from benchmarks.accuracy import held_out_errors, held_out_fit_lines, held_out_line, held_out_pages
from benchmarks.bridge_systems import (
    bridge_cluster,
    bridge_config,
    bridge_gpu,
    bridge_precision,
    bridge_preset,
    with_recipe_fp8_params,
)
from benchmarks.validation_runs import BRIDGE_PERF_GRAD_BYTES, Run
from planner.config import Training
from planner.errors import PlannerError
from planner.model import load_model
from planner.profile.calibration import default_calibration

__all__ = ["dense_rows", "dense_runs"]

_MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b"}
_HEADING = re.compile(r"#### (System|Model): (.+)")


@dataclass(frozen=True)
class DenseRow:
    """One dense pre-training row as a table states it (the first value where a cell gives an alternative)."""

    release: str
    system: str
    model: str
    precision: str
    gpus: int
    global_batch: int
    micro_batch: int
    seq_len: int
    fsdp: bool
    tp: int
    pp: int
    cp: int
    vp: int
    tokens_per_s_per_gpu: float


def _first(cell: str) -> str:
    """'31508 (29789)' → '31508': the tables put an alternative run in parentheses."""
    return cell.split("(")[0].strip()


def dense_rows(text: str) -> Iterator[DenseRow]:
    """The dense Llama pre-training rows of one or more performance-summary pages, tables of either layout (a
    System column under "#### Model:" headings, or a Model column under "#### System:" headings); rows without a
    Precision column (the 25.09 tables) are left out."""
    release = system = model = ""
    header: list[str] = []
    pretraining = True
    for line in text.splitlines():
        if line.startswith("## ") and "Container" in line:
            release, pretraining = line.split()[1], True
        elif line.startswith("### "):
            pretraining = "Pre-Training" in line
        heading = _HEADING.match(line)
        if heading:
            kind, name = heading.group(1), heading.group(2).strip()
            system, model = (name, model) if kind == "System" else (system, name)
            continue
        if not line.startswith("|") or line.startswith("|--"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] in ("System", "Model"):
            header = cells
            continue
        row = dict(zip(header, cells, strict=False))
        name = row.get("Model", model)
        if not pretraining or name not in _MODELS or "Precision" not in row:
            continue
        vp = _first(row["VP"])
        yield DenseRow(release, row.get("System", system), name, _first(row["Precision"]), int(_first(row["#-GPUs"])),
                       int(_first(row["GBS"])), int(_first(row["MBS"])), int(_first(row["Sequence Length"])),
                       int(_first(row.get("FSDP", "0")) or 0) > 0, int(_first(row["TP"])), int(_first(row["PP"])),
                       int(_first(row["CP"])), int(vp) if vp.isdigit() else 1,
                       float(_first(row["Tokens / sec / GPU"])))


def dense_runs(text: str) -> tuple[list[Run], list[str]]:
    """Planner inputs for the rows planner runs (precision and GPU known), once each, and why others are not."""
    runs: list[Run] = []
    skipped: list[str] = []
    seen: set[DenseRow] = set()
    for row in dense_rows(text):
        key = DenseRow(**{**vars(row), "release": ""})  # a row the archive repeats under a later release
        gpu = bridge_gpu(row.system.removeprefix("DGX-"))
        if row.precision not in ("BF16", "FP8", "FP8-CS", "MXFP8", "FP8-MX") or gpu is None or key in seen:
            skipped.append(f"{row.release} {row.system} {row.model} {row.precision}")
            continue
        seen.add(key)
        dp = row.gpus // (row.tp * row.pp * row.cp)
        config = bridge_config(dp, row.tp, row.pp, row.cp, row.vp, row.micro_batch, row.fsdp,
                               bridge_preset(row.model, gpu, row.precision))
        training = Training(global_batch=row.global_batch, seq_len=row.seq_len, attention="flash",
                            grad_bytes=BRIDGE_PERF_GRAD_BYTES, **bridge_precision(row.precision))
        config = with_recipe_fp8_params(config, training.fp8_recipe)
        iteration = training.tokens_per_iteration / (row.tokens_per_s_per_gpu * row.gpus)
        label = f"{row.release:8s} {row.system:10s} {row.model:13s} {row.precision:6s} {config.describe()}"
        try:
            runs.append(Run("Megatron-Bridge performance summary (held out)", label, load_model(_MODELS[row.model]),
                            bridge_cluster(row.gpus, gpu), training, config, iteration, None, row.release))
        except PlannerError as exc:
            skipped.append(f"{label}: {exc}")
    return runs, skipped


def main(argv: Sequence[str] | None = None) -> None:
    parser, texts, print_runs = held_out_pages(__doc__.splitlines()[0], "performance-summary.md and its archive",
                                               argv)
    runs, skipped = dense_runs("\n".join(texts))
    if not runs:
        parser.error("the pages hold no dense Llama pre-training rows planner runs")
    errors, refused, unfit = held_out_errors(runs, default_calibration())
    by_system: dict[str, dict[str, list[float]]] = {}
    for run, error in errors:
        _, system, model, *_ = run.label.split()
        by_system.setdefault(system, {}).setdefault(model, []).append(error)
        if print_runs:
            print(f"{run.label}  {100 * error:+6.1f} %")
    for system, models in sorted(by_system.items()):
        print(held_out_line(f"{system:10s}", [error for values in models.values() for error in values]))
        for model, values in sorted(models.items()):
            print(held_out_line(f"  {model:13s}", values))
    print(held_out_line(f"{'all':10s}", [error for _, error in errors])
          + f"  ({len(skipped) + len(refused)} rows not estimated)")
    print("\n".join(held_out_fit_lines(errors, unfit)))

if __name__ == "__main__":
    main()
