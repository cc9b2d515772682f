"""The held-out torchtitan benchmark-page check (benchmarks/titan_heldout.py): what it reads from each page, the
runs it builds (as the validation's torchtitan rows are built) and its command line's refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.titan_heldout import async_tp_rows, heldout_runs, main, trainy_rows
from planner.config import Recompute

ASYNC_TP = """
Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth.

#### Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC,  local batch size 16

| Quantization      | Vanilla TP tokens/sec | Async TP tokens/sec |  Async TP speedup
| :---------------- | :---- | :---- | :--- |
| None (bfloat16)   | 597.3 | 652.4 | 1.09 |
| float8 tensorwise | 809.8 | 942.4 | 1.16 |

#### Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12

| Quantization      | Vanilla TP tokens/sec | Async TP tokens/sec |  Async TP speedup
| :---------------- | :----- | :----- | :--- |
| float8 rowwise    | 3708.5 | 3914.9 | 1.06 |
"""

TRAINY = """
- 8 NVIDIA H200 GPUs connected via NVLink.
    --training.local_batch_size=2 \\
    --model.converters="quantize.linear.float8" \\
    --quantize.linear.float8.enable_fsdp_float8_all_gather \\

| NUM_NODES | TPS/GPU | Memory(GiB) |
| ----- | ----: | ----: |
| 4 | 10938 | 47.96 |
| 8 | 10753 | 46.97 |
"""


def test_async_tp_page_gives_a_vanilla_and_an_async_run_per_table_row():
    rows = list(async_tp_rows(ASYNC_TP))
    assert [row["row_id"] for row in rows] == [
        "asyncTP-bf16-70B-vanilla", "asyncTP-bf16-70B-async", "asyncTP-tensorwise-70B-vanilla",
        "asyncTP-tensorwise-70B-async", "asyncTP-rowwise-8B-vanilla", "asyncTP-rowwise-8B-async"]
    assert rows[3]["tokens_per_sec_per_gpu"] == 942.4 and rows[3]["async_tp"] == "yes"
    assert rows[0]["global_batch_seqs"] == 16 * 32 and rows[4]["micro_batch"] == 12


def test_trainy_page_reads_its_command_and_its_memory():
    rows = list(trainy_rows(TRAINY))
    assert [(row["num_gpus"], row["dp_shard_degree"], row["peak_memory_gib"]) for row in rows] == [
        (32, 32, 47.96), (64, 64, 46.97)]
    assert all(row["micro_batch"] == 2 and "float8 fsdp all-gather" in str(row["low_precision_recipe"])
               for row in rows)
    assert not list(trainy_rows(ASYNC_TP))  # another page holds no Trainy run


def test_runs_are_built_as_torchtitan_runs_them():
    runs, refused = heldout_runs([ASYNC_TP, TRAINY])
    assert not refused and len(runs) == 8
    seventy = runs[1]
    assert seventy.cluster.gpu.name == "H100-96GB-HBM2e" and seventy.config.tp == 8 and seventy.config.dp == 32
    assert seventy.config.tp_comm_overlap and not runs[0].config.tp_comm_overlap
    assert seventy.config.recompute is Recompute.FULL and seventy.config.zero_stage == 3
    assert seventy.training.cross_entropy == "compiled" and seventy.training.attention == "flash2"
    assert runs[4].training.fp8_recipe == "rowwise" and runs[4].config.selective_recompute == "op"
    trainy = runs[-1]
    assert trainy.cluster.gpu.name == "H200" and trainy.config.fp8_param_gather
    assert trainy.iteration_s == pytest.approx(64 * 2 * 8192 / (10753 * 64))
    assert trainy.memory_bytes == pytest.approx(46.97 * 2**30)


def test_command_line_summarises_and_refuses_bad_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    page = tmp_path / "async.md"
    page.write_text(ASYNC_TP)
    main([str(page)])
    *_, summary, fits = capsys.readouterr().out.splitlines()
    assert "all" in summary and fits == "ran, predicted to fit: 6 of 6"
    for argv in ([str(tmp_path / "missing.md")], [str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    empty = tmp_path / "empty.md"
    empty.write_text("# nothing here\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(empty)])
    assert exit_info.value.code == 2
