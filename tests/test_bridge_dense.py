"""The held-out Megatron-Bridge performance-summary check (benchmarks/bridge_dense.py): both table layouts."""

from __future__ import annotations

import pytest

from benchmarks.bridge_dense import dense_rows, dense_runs

# ruff: noqa: E501 (the pages' table lines as published)

PAGES = """
## 26.06 NeMo Container

### Pre-Training Performance

#### Model: LLAMA3.1_405B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB200 | 256 | FP8 | 1536 | 1 | 8192 | 4 | 16 | 1 | 4 | n/a | 843 | 2129 |
| DGX-GB200 | 256 | NVFP4 | 1536 | 1 | 8192 | 4 | 16 | 1 | 8 | n/a | 1166 | 2944 |

### SFT Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 32 | FP8 | 32 | 1 | 4096 | 4 | 4 | 1 | 5 | n/a | 1638 | 710 |

## 26.04 NeMo Container

### Pre-Training Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB200 | 64 | FP8 | 256 | 2 | 8192 | 1 | 1 | 1 | 1 | n/a | n/a | 4215 | 1973 |

## 25.11 NeMo Container

### Pre-Training Performance

#### System: DGX-H100

| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|----|-----------------------|-------------------------|
| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 1 | 8192 | 8 | 1 | 1 | 1 | n/a | 1 | 16 | 14451 (14000) | 744 |
| GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 4 | 1 | 1 | 8 | 2 | 5630 | 153 |
"""


def test_reads_pretraining_rows_of_both_layouts_and_first_values():
    rows = list(dense_rows(PAGES))
    assert [(row.release, row.system, row.model, row.precision) for row in rows] == [
        ("26.06", "DGX-GB200", "LLAMA3.1_405B", "FP8"), ("26.06", "DGX-GB200", "LLAMA3.1_405B", "NVFP4"),
        ("26.04", "DGX-GB200", "LLAMA3_70B", "FP8"), ("25.11", "DGX-H100", "LLAMA3_8B", "FP8-CS")]
    eight = rows[-1]
    assert eight.fsdp and eight.tokens_per_s_per_gpu == 14451 and eight.vp == 1 and eight.micro_batch == 1
    assert rows[0].pp == 16 and rows[0].vp == 4 and not rows[0].fsdp


def test_runs_as_the_tables_state_them_and_skip_what_planner_does_not_run():
    runs, skipped = dense_runs(PAGES)
    assert len(runs) == 3 and any("NVFP4" in reason for reason in skipped)
    gb200, _, h100 = runs
    assert gb200.config.dp * gb200.config.tp * gb200.config.pp == 256 and gb200.config.vpp == 4
    assert gb200.training.fp8_recipe == "tensorwise" and gb200.cluster.gpu.name == "GB200"
    assert h100.config.zero_stage == 3 and not h100.config.distributed_optimizer
    assert h100.iteration_s == pytest.approx(128 * 8192 / (14451 * 8))


def test_runs_with_what_their_release_s_preset_sets_for_activations():
    """The pages do not state it: the 70B GB200 FP8 preset keeps 40 blocks' activations in host memory (Megatron-FSDP,
    micro-batch 2, no recompute), the 25.11 8B H100 FP8-CS preset recomputes 5 blocks; other rows neither."""
    runs, _ = dense_runs(PAGES)
    layouts = [(run.config.cpu_offload_layers, run.config.recompute_num_layers) for run in runs]
    assert layouts == [(0, None), (40, None), (0, 5)]
