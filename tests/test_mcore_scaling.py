"""The held-out Megatron-LM weak-scaling check (benchmarks/mcore_scaling.py): its transcription of the README's table
image and the conversion of the table's teraFLOP/s into seconds per iteration."""

from __future__ import annotations

import pytest

from benchmarks import mcore_scaling
from benchmarks.mcore_scaling import ROWS, SEQ_LEN, VOCAB, published_iteration_s, row_model, row_training
from planner.cost.estimate import model_flops_per_iteration


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.size)
def test_the_transcribed_row_agrees_with_the_tables_own_totals(row) -> None:
    """Each row's aggregate petaFLOP/s is its per-GPU rate times its GPUs, its GPUs its three degrees' product, and its
    GPT shape has the parameters its "Model size" names, to the label's last digit: a mistyped cell fails one."""
    assert row.tflops_per_gpu * row.gpus / 1000 == pytest.approx(row.aggregate_pflops, abs=0.05)
    assert row.tp * row.pp * row.dp == row.gpus
    label = row.size.removesuffix("B")
    unit = 10.0 ** -len(label.partition(".")[2])
    assert abs(row_model(row).num_parameters / 1e9 - float(label)) <= 0.6 * unit


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.size)
def test_planner_counts_the_flops_megatron_lm_reports_for_these_gpts(row) -> None:
    """Megatron-LM's num_floating_point_operations (core_r0.8.0 training.py) for a GPT without grouped queries or a
    gated MLP: 12·B·s·L·h²·(1 + 1 + s/h + ffn/h + V/(2·L·h)). The table's rates are in it, so its seconds are too."""
    h, layers, batch = row.hidden, row.layers, row.global_batch
    megatron = 12 * batch * SEQ_LEN * layers * h * h * (2 + SEQ_LEN / h + 4 + VOCAB / (2 * layers * h))
    assert model_flops_per_iteration(row_model(row), row_training(row)) == pytest.approx(megatron, rel=1e-12)
    assert published_iteration_s(row) == pytest.approx(megatron / (row.tflops_per_gpu * 1e12 * row.gpus), rel=1e-12)


def test_the_1_7b_row_runs_0_45_s_per_iteration() -> None:
    """192 sequences of 4,096 tokens of a 1.75B GPT at 408.8 TFLOP/s on each of 48 GPUs."""
    assert published_iteration_s(ROWS[0]) == pytest.approx(0.452, abs=0.001)


def test_the_check_compares_planners_fastest_plan_with_every_row(capsys) -> None:
    mcore_scaling.main(["--runs"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(ROWS) + 1
    assert all("planner's fastest" in line and f"tp={row.tp} pp={row.pp} dp={row.dp}" in line
               for row, line in zip(ROWS, lines[:-1], strict=True))
    assert lines[-1].startswith("Megatron-Core r0.8.0 weak scaling (H100), planner's fastest plan   9 runs")
