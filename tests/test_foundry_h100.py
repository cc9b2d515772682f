"""The held-out llm-foundry H100 check (benchmarks/foundry_h100.py): table parsing and the runs it builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.foundry_h100 import h100_rows, h100_runs

HEADER = ("|  Model | SeqLen (T) | # GPUs | GPU | MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | "
          "GlobalBatchSize | Throughput (S/s) | Throughput (T/s) | Throughput (T/s/GPU) | GlobalBatchSize (T) | "
          "Precision | MP Mode | Sharding Strategy | Activation Checkpointing | Activation CPUOffload | NumParams |")
README = "\n".join([
    "## A100 80GB BF16", HEADER, "|  --- |" * 1,
    "|  7b | 2048 | 8 | a100_80gb | 50 | 60 | 150 | 6 | 1 | 48 | 10 | 20000 | 2500 | 98304 | amp_bf16 | DEFAULT | "
    "FULL_SHARD | False | False | 6658859008 |",
    "## H100 80GB BF16", HEADER,
    "|  7b | 2048 | 8 | h100_80gb | 40 | 50 | 400 | 6 | 1 | 48 | 20 | 54000 | 6750 | 98304 | amp_bf16 | DEFAULT | "
    "FULL_SHARD | False | False | 6658859008 |",
    "|  9b | 2048 | 8 | h100_80gb | 40 | 50 | 400 | 6 | 1 | 48 | 20 | 54000 | 6750 | 98304 | amp_bf16 | PURE | "
    "FULL_SHARD | True | False | 1 |",
])


def test_reads_only_the_h100_sections_rows():
    rows = list(h100_rows(README))
    assert [(row.model, row.gpus, row.micro_batch, row.global_batch, row.checkpointing) for row in rows] == [
        ("7b", 8, 6, 48, False), ("9b", 8, 6, 48, True)]
    assert rows[0].tokens_per_s_per_gpu == 6750 and rows[1].mp_mode == "PURE"


def test_runs_are_composer_fsdp_of_the_a100_files_shapes():
    """Models the A100 file does not shape (9b) are left out; the run is FULL_SHARD with Composer's BACKWARD_POST,
    fp32 gradient reduction under DEFAULT mixed precision, and the table's throughput as iteration time."""
    (run,) = h100_runs(README)
    assert run.config.zero_stage == 3 and run.config.fsdp_backward_prefetch == "post"
    assert run.config.dp == 8 and run.training.grad_bytes == 4
    assert run.iteration_s == pytest.approx(48 * 2048 / (6750 * 8))
    assert run.model.hidden_size == 4096 and run.cluster.num_gpus == 8


ROOT = Path(__file__).resolve().parent.parent


def _script(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.foundry_h100", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_refuses_an_unreadable_or_empty_file_with_exit_2(tmp_path):
    missing = _script(tmp_path / "none.md")
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    empty = tmp_path / "empty.md"
    empty.write_text("## A100\n")
    none = _script(empty)
    assert none.returncode == 2 and "no H100 table rows" in none.stderr
