"""Held-out check: torchtitan's June-2025 benchmark pages, never fitted, estimated as the validation's torchtitan rows.

pytorch/torchtitan's benchmarks/ folder holds two pages that are not in ../shared/validation, so nothing is
calibrated on them:

* asyncTP_llama3_h100_2025-06_torchtitan.md (PyTorch team, torchtitan 820504e): Llama 3.1 70B on 256 and 8B on 64
  of Grand Teton's 96 GB HBM2e H100s (`H100-96GB-HBM2e`), FSDP × TP 8, torch.compile, vanilla and async TP, in
  BF16 and float8 tensorwise / rowwise: tests TP and its overlap, float8 and the HBM2e part;
* llama3-8b_h200_202506_trainy-whitefiber.md (Trainy, torchtitan e7c0cae): Llama 3.1 8B on 32 and 64 H200, FSDP
  over all of them, float8 tensorwise with float8 all-gathers; with torchtitan's reserved-memory figure.

What a page does not state is what its torchtitan commit's train_configs/llama3_{8b,70b}.toml set (sequence 8192,
per-op SAC for 8B unless a heading says otherwise) and what benchmarks/titan_runs.py assumes for every torchtitan
row (SDPA's FlashAttention-2 on Hopper, fp32 gradient reduction, the loss compiled with the model, bf16 FSDP
all-gathers unless the page names float8 ones). This script reads copies of the pages and reports each run's time
error (and memory error where published).

    PYTHONPATH=. python -m benchmarks.titan_heldout ASYNC_TP.md TRAINY.md [--runs]
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import replace

from benchmarks.accuracy import held_out_errors, held_out_fit_lines, held_out_line, held_out_pages, predict
from benchmarks.titan_runs import common_schema_run
from benchmarks.validation_runs import Run
from planner.errors import PlannerError
from planner.profile.calibration import default_calibration

__all__ = ["async_tp_rows", "heldout_runs", "trainy_rows"]

SEQ_LEN = 8192  # llama3_{8b,70b}.toml at 820504e and e7c0cae
ASYNC_TP_COMMIT = "820504e20d1149fbf0b98c567af24c4b0433b22d"
TRAINY_COMMIT = "e7c0cae934df78d6e9c2835f42ff1f757dc3fddc"
_ASYNC_HEADING = re.compile(r"#### Llama3 (\d+)b on (\d+) H100s with FSDP=(\d+), TP=(\d+), torch\.compile, "
                            r"(full AC|per op SAC),\s*local batch size (\d+)")
_FLOAT8 = "bf16 + low-precision linears"
# a table's Quantization cell: (precision, recipe) as the common schema writes them, and a short name for labels
_QUANTIZATION = {"none (bfloat16)": ("bf16", "", "bf16"),
                 "float8 tensorwise": (_FLOAT8, "float8 tensorwise", "tensorwise"),
                 "float8 rowwise": (_FLOAT8, "float8 rowwise", "rowwise")}


def _row(row_id: str, model_b: int, hardware: str, gpus: int, fsdp: int, tp: int, local_batch: int,
         checkpointing: str, quantization: str, async_tp: bool, tokens_per_s: float, memory_gib: float | None,
         commit: str) -> dict[str, object]:
    """One run in the common FSDP schema of ../shared/validation's torchtitan files."""
    precision, recipe, _ = _QUANTIZATION[quantization]
    return {"row_id": row_id, "model": f"Llama 3.1 {model_b}B", "hardware": hardware, "num_gpus": gpus,
            "dp_shard_degree": fsdp, "dp_replicate_degree": 1, "tp": tp, "pp": 1, "cp": 1, "ep": 1,
            "micro_batch": local_batch, "global_batch_seqs": local_batch * fsdp, "seq_len": SEQ_LEN,
            "activation_checkpointing": checkpointing, "precision": precision, "low_precision_recipe": recipe,
            "tokens_per_sec_per_gpu": tokens_per_s, "peak_memory_gib": memory_gib, "async_tp": "yes" if async_tp
            else "no", "pp_schedule": "", "compile": "yes", "framework_version": f"torchtitan {commit}"}


def _hardware(text: str, gpu: str) -> str:
    """The page's GPU as titan_runs names it: Grand Teton's H100s are the HBM2e part."""
    return f"NVIDIA {gpu} HBM2e (Grand Teton)" if gpu == "H100" and "HBM2e" in text else f"NVIDIA {gpu}"


def async_tp_rows(text: str) -> Iterator[dict[str, object]]:
    """The async-TP page's runs: for each table row (a quantization), its vanilla-TP and its async-TP run."""
    heading = None
    for line in text.splitlines():
        match = _ASYNC_HEADING.match(line.strip())
        if match:
            heading = match.groups()
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if heading is None or not line.startswith("|") or cells[0].lower() not in _QUANTIZATION:
            continue
        size, gpus, fsdp, tp, ac, local_batch = heading
        checkpointing = "full" if ac == "full AC" else "selective per-op (per-op SAC)"
        for async_tp, value in ((False, cells[1]), (True, cells[2])):
            short = _QUANTIZATION[cells[0].lower()][2]
            yield _row(f"asyncTP-{short}-{size}B-{'async' if async_tp else 'vanilla'}", int(size),
                       _hardware(text, "H100"), int(gpus), int(fsdp), int(tp), int(local_batch), checkpointing,
                       cells[0].lower(), async_tp, float(value), None, ASYNC_TP_COMMIT)


def trainy_rows(text: str) -> Iterator[dict[str, object]]:
    """The Trainy page's runs (one per NUM_NODES row): its command's local batch and float8 settings, FSDP over
    every GPU (llama3_8b.toml's data_parallel_shard_degree −1), per-op SAC (the toml's default)."""
    batch = re.search(r"--training\.local_batch_size=(\d+)", text)
    if batch is None or "H200" not in text:
        return
    float8 = "quantize.linear.float8" in text
    gather = "enable_fsdp_float8_all_gather" in text
    quantization = "float8 tensorwise" if float8 else "none (bfloat16)"
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        gpus = 8 * int(cells[0])
        name = f"Trainy-{_QUANTIZATION[quantization][2]}-{cells[0]}-nodes"
        row = _row(name, 8, _hardware(text, "H200"), gpus, gpus, 1, int(batch.group(1)),
                   "selective per-op (per-op SAC)", quantization, False, float(cells[1]), float(cells[2]),
                   TRAINY_COMMIT)
        if gather:
            row["low_precision_recipe"] = f"{row['low_precision_recipe']} with float8 fsdp all-gather"
        yield row


def heldout_runs(texts: Sequence[str]) -> tuple[list[Run], list[str]]:
    """Planner inputs for every run of the pages, and why any cannot be expressed."""
    runs, refused = [], []
    for text in texts:
        for fields in (*async_tp_rows(text), *trainy_rows(text)):
            try:
                run = common_schema_run("torchtitan benchmarks (held out)", fields)
                runs.append(replace(run, label=f"{fields['row_id']}: {run.cluster.gpu.name} {run.config.describe()}"))
            except PlannerError as exc:
                refused.append(str(exc))
    return runs, refused


def main(argv: Sequence[str] | None = None) -> None:
    parser, texts, print_runs = held_out_pages(__doc__.splitlines()[0], "torchtitan's benchmarks/*.md pages", argv)
    runs, refused = heldout_runs(texts)
    if not runs:
        parser.error("the pages hold no torchtitan benchmark runs planner reads (async TP or Trainy tables)")
    calibration = default_calibration()
    errors, refused_now, unfit = held_out_errors(runs, calibration)
    groups: dict[str, list[float]] = {}
    for run, error in errors:
        groups.setdefault(" ".join(run.label.split("-")[:2]), []).append(error)
        if print_runs:
            memory = run.memory_error(predict(run, calibration))
            print(f"{run.label}  {100 * error:+6.1f} %" + (f"  memory {100 * memory:+.1f} %" if memory is not None
                                                            else ""))
    for name, values in groups.items():
        print(held_out_line(f"{name:18s}", values))
    refusals = refused + refused_now
    print(held_out_line(f"{'all':18s}", [error for _, error in errors])
          + (f"  ({len(refusals)} not estimated: {'; '.join(refusals)})" if refusals else ""))
    print("\n".join(held_out_fit_lines(errors, unfit)))


if __name__ == "__main__":
    main()
