"""The held-out check on Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Table 5, MT-NLG 530B and the Llama 3
paper's Table 4 (benchmarks/published_scaling.py): the transcriptions, the FLOP conventions that turn their rates into
seconds, and the Megatron-LM of 2021-22 the search is held to."""

from __future__ import annotations

import pytest

from benchmarks import published_scaling
from benchmarks.published_scaling import (
    KORTHIKANTI_ROWS,
    LLAMA3_ROWS,
    LLAMA3_TOKENS_PER_BATCH,
    MEGATRON_2021_ROWS,
    MEGATRON_2021_SEQ_LEN,
    MEGATRON_2021_VOCAB,
    MT_NLG_GLOBAL_BATCH,
    MT_NLG_ROWS,
    early_megatron_layouts,
    korthikanti_runs,
    llama3_published_s,
    llama3_training,
    megatron_2021_model,
    megatron_2021_published_s,
    megatron_2021_run,
    mt_nlg_layouts,
    mt_nlg_model,
)
from benchmarks.validation_runs import narayanan_eq3_flops
from planner.config import Recompute, Schedule
from planner.cost.estimate import model_flops_per_iteration
from planner.errors import PlannerError
from planner.model import load_model

DAY_S = 86400


@pytest.mark.parametrize("row", MEGATRON_2021_ROWS, ids=lambda row: row.size)
def test_the_2021_rows_agree_with_the_tables_own_totals(row) -> None:
    """Each row's aggregate petaFLOP/s is its per-GPU rate (printed to the teraFLOP) times its GPUs, its GPUs its
    degrees' product, and its GPT shape has the parameters its first column names to the last digit (12·l·h² plus
    biases, norms and the 51,200-token and 2,048-position embeddings): a mistyped cell fails one."""
    assert abs(row.aggregate_pflops * 1000 / row.gpus - row.tflops_per_gpu) <= 0.5 + 50 / row.gpus
    assert row.tp * row.pp * row.dp == row.gpus
    h, layers, embeddings = row.hidden, row.layers, MEGATRON_2021_VOCAB + MEGATRON_2021_SEQ_LEN
    by_hand = 12 * layers * h * h * (1 + 13 / (12 * h) + embeddings / (12 * layers * h))
    stated = float(row.size.removesuffix("B"))
    assert by_hand / 1e9 == pytest.approx(stated, abs=0.06)
    assert megatron_2021_model(row).num_parameters / 1e9 == pytest.approx(stated, abs=0.06)


def test_the_1t_row_trains_450b_tokens_in_the_84_days_the_paper_estimates() -> None:
    """Section 5.1 of the paper: the 1T model on 3,072 GPUs at its measured rate would take about 84 days for 450B
    tokens (estimated there as 8·T·P / (n·X), which eq. 3's terms beyond 8·T·P raise by about 1 %)."""
    row = MEGATRON_2021_ROWS[-1]
    iterations = 450e9 / (row.global_batch * MEGATRON_2021_SEQ_LEN)
    assert iterations * megatron_2021_published_s(row) / DAY_S == pytest.approx(84, rel=0.02)


def test_the_search_runs_only_what_megatron_lm_ran_in_2021() -> None:
    """Every layout the 39.1B row is planned over recomputes every layer and runs without sequence parallelism,
    distributed optimizer or TP overlap, with the gradient all-reduce after the backward, interleaved only over a
    multiple of pp micro-batches; and among them are both schedules."""
    row = MEGATRON_2021_ROWS[4]
    layouts = list(early_megatron_layouts(megatron_2021_run(row)))
    assert layouts
    for config in layouts:
        assert (config.tp, config.pp, config.dp) == (row.tp, row.pp, row.dp)
        assert config.recompute is Recompute.FULL and config.recompute_num_layers is None
        assert not (config.sequence_parallel or config.distributed_optimizer or config.tp_comm_overlap)
        assert config.zero_stage == 0 and not config.overlap_grad_reduce
        if config.vpp > 1:
            assert (row.global_batch // (row.dp * config.micro_batch)) % row.pp == 0
    assert {config.schedule for config in layouts} == {Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED}


@pytest.mark.parametrize("row", KORTHIKANTI_ROWS, ids=lambda row: row.size)
def test_the_2022_rows_agree_with_the_tables_own_columns(row) -> None:
    """Table 5's throughput increase is the ratio of its two times, and its MFU the model's FLOPs (recompute not
    counted) over the selective run's time on the GPUs at A100's 312 TFLOP/s, each to its printed digits."""
    full, selective = korthikanti_runs(row)
    assert 100 * (row.full_recompute_s / row.selective_s - 1) == pytest.approx(row.throughput_increase_percent, abs=0.5)
    mfu = model_flops_per_iteration(full.model, full.training) / (row.selective_s * row.gpus * 312e12)
    assert 100 * mfu == pytest.approx(row.mfu_percent, abs=0.3)
    assert full.tp * full.pp * full.dp == row.gpus and full.dp == 1
    assert (full.recompute, full.sequence_parallel) == (Recompute.FULL, False)
    assert (selective.recompute, selective.sequence_parallel) == (Recompute.SELECTIVE, True)


def test_the_2022_selective_runs_are_searched_with_sequence_parallelism_only() -> None:
    """The 175B selective run is planned over selective-recompute layouts with sequence parallelism, nothing else."""
    _, selective = korthikanti_runs(KORTHIKANTI_ROWS[1])
    layouts = list(early_megatron_layouts(selective))
    assert layouts and all(config.recompute is Recompute.SELECTIVE and config.sequence_parallel
                           and config.selective_recompute == "attention" for config in layouts)


@pytest.mark.parametrize("row", MT_NLG_ROWS, ids=lambda row: f"{row.nodes}-nodes")
def test_the_mt_nlg_columns_agree_with_their_own_rates(row) -> None:
    """Each column's teraFLOP/s is eq. 3's FLOPs of a 1,920-sequence batch of the 530B GPT over its seconds and its
    nodes' 8 GPUs, to the printed teraFLOP: a mistyped time, rate or node count fails it."""
    flops = narayanan_eq3_flops(mt_nlg_model(), MT_NLG_GLOBAL_BATCH, MEGATRON_2021_SEQ_LEN)
    assert flops / (row.iteration_s * row.nodes * 8) / 1e12 == pytest.approx(row.tflops_per_gpu, abs=0.6)


def test_mt_nlg_is_planned_as_deepspeeds_2021_pipeline_engine_ran_it() -> None:
    """1F1B only, every layer recomputed, no sequence parallelism, DeepSpeed's semantics (no gradient reduction
    overlapped with a pipeline), at tp 8 and pp 35."""
    layouts = list(mt_nlg_layouts(MT_NLG_ROWS[0]))
    assert layouts
    for config in layouts:
        assert (config.tp, config.pp, config.dp) == (8, 35, 8)
        assert config.schedule is Schedule.ONE_F_ONE_B and config.recompute is Recompute.FULL
        assert not config.sequence_parallel and not config.overlap_grad_reduce


@pytest.mark.parametrize("row", LLAMA3_ROWS, ids=lambda row: f"{row.gpus}-cp{row.cp}")
def test_the_llama3_rows_agree_with_the_tables_own_totals(row) -> None:
    """The degrees multiply to the GPUs, and the replicas' sequences hold the table's 16M tokens per batch."""
    assert row.tp * row.cp * row.pp * row.dp == row.gpus
    assert row.dp * row.sequences_per_replica * row.seq_len == LLAMA3_TOKENS_PER_BATCH


@pytest.mark.parametrize("row", LLAMA3_ROWS, ids=lambda row: f"{row.gpus}-cp{row.cp}")
def test_llama3_rates_are_read_in_palms_flop_convention(row) -> None:
    """PaLM's model FLOPs per token, 6 × the parameters every token multiplies (126 blocks of grouped-query attention
    and SwiGLU, the untied output projection) + 12·layers·hidden·sequence for attention, counted by hand for the
    Llama 3.1 405B shape; planner's count is the same, and a row's seconds are it over rate × GPUs."""
    model = load_model("llama3-405b")
    h, kv, ffn, layers = 16384, 8 * 128, 53248, 126
    matmul_parameters = layers * (2 * h * h + 2 * h * kv + 3 * h * ffn) + h * 128256
    per_token = 6 * matmul_parameters + 12 * layers * h * row.seq_len
    flops = per_token * LLAMA3_TOKENS_PER_BATCH
    assert model_flops_per_iteration(model, llama3_training(row)) == pytest.approx(flops, rel=1e-3)
    assert llama3_published_s(row, model) == pytest.approx(flops / (row.tflops_per_gpu * 1e12 * row.gpus), rel=1e-3)


def test_the_check_compares_planners_fastest_plan_with_every_row(capsys) -> None:
    """One line per run naming its published degrees, and a summary after each table."""
    published_scaling.main(["--runs"])
    lines = capsys.readouterr().out.splitlines()
    korthikanti = [f"tp={row.tp} pp={row.pp}" for row in KORTHIKANTI_ROWS for _ in range(2)]
    expected = [*(f"tp={row.tp} pp={row.pp} dp={row.dp}" for row in MEGATRON_2021_ROWS), None, *korthikanti, None,
                *(["tp=8 pp=35"] * len(MT_NLG_ROWS)), None,
                *(f"tp={row.tp} pp={row.pp} cp={row.cp} dp={row.dp}" for row in LLAMA3_ROWS), None]
    assert len(lines) == len(expected)
    for degrees, line in zip(expected, lines, strict=True):
        if degrees is not None:
            assert "planner's fastest" in line and degrees in line
    summaries = [line for degrees, line in zip(expected, lines, strict=True) if degrees is None]
    assert summaries[0].startswith("Narayanan 2021 Table 1") and " 10 runs " in summaries[0]
    assert summaries[1].startswith("Korthikanti 2022 Table 5") and "  8 runs " in summaries[1]
    assert summaries[2].startswith("MT-NLG 530B") and "  3 runs " in summaries[2]
    assert summaries[3].startswith("Llama 3 405B Table 4") and "  3 runs " in summaries[3]


def test_a_run_no_layout_of_which_fits_is_named() -> None:
    """The 1T GPT on one A100 node at tp 8: nothing fits, and the error says so rather than min() of nothing."""
    row = MEGATRON_2021_ROWS[-1]
    run = published_scaling.EarlyMegatronRun(megatron_2021_model(row), published_scaling.megatron_2021_training(row),
                                            8, 8, 1, 1, Recompute.FULL)
    with pytest.raises(PlannerError, match=r"none of the \d+ layouts searched fits 8 GPUs"):
        published_scaling.early_megatron_fastest(run)
