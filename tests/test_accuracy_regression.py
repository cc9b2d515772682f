"""Accuracy regression: every source of benchmarks/accuracy.py through `estimate` with the shipped
profiles/calibration.yaml, against the figures it reported on 2026-12-01.

A source fails when its time MAPE (or its median peak-memory error) grows by more than 2 points over
the recorded value, or when fewer of its runs that really ran are predicted to fit (or fewer of its documented
out-of-memory runs not to fit). Improvements pass; record the new values here when they land, so the guard
tightens. Where a recorded value is worse than issue 10's target the README's "Accuracy" section says so.
"""

from __future__ import annotations

import pytest

from benchmarks.accuracy import outcomes, score_source
from benchmarks.calibrate import BEFORE_FIX_NIC_RATIO, FITTED, JEAN_ZAY_P2P_RATIO, MEMORY_FITTED, golden_section
from benchmarks.sources import sources
from benchmarks.validation_runs import bloom_runs, predict, shipped_before_fix_nic_ratio, shipped_jean_zay_p2p_ratio
from planner.profile.calibration import default_calibration

SLACK = 0.02  # two points
# source: (runs, time MAPE, median |memory error| or None, runs predicted to fit), measured 2026-12-01; 2026-12-02:
# gemm_efficiency refitted alone (0.8435 -> 0.8262) once the interleaved pipeline transfers are overlapped; later
# that day fused attention's rate ramps with the key tiles a query tile streams and falls at head dimension 64,
# and the long-context file's Blackwell rows are scored; memory: published figures counted as published (allocator
# peaks without context and NCCL, nvidia-smi's high-water with the optimizer step's segments), the loss as each
# framework runs it; 2026-12-02 (ninth session): each row's FP8 recipe (Training.fp8_recipe: NeMo's delayed scaling,
# Megatron-Bridge's current scaling on H100 and MXFP8 on Blackwell, torchao's as named) and the recipe's casts in
# composed blocks too (Nemotron-3-Nano's Mamba and MoE blocks): Megatron-Bridge 25.11 8.7 -> 9.6 % (current scaling's
# amax passes), long context 12.6 -> 12.3, torchtitan 11.7 -> 11.5, torchao 44.1 -> 42.7, MoE 14.6/16.5 -> 14.0/16.3;
# then flash_attention_efficiency and fp8_gemm_efficiency_ratio refitted with NeMo's H100 long-sequence rows in the
# calibration set (docs/accuracy.md, calibration): the figures below
RECORDED = {
    # bf16 rows: BF16_Optimizer's gradients; memory: the chronicles' CUDA context, DeepSpeed's after-flush segments;
    # 6.4 -> 6.7 % with DeepSpeed's partitioned pipeline transfers at Jean Zay's fitted pipeline ratio (fifteenth);
    # 6.7 -> 3.5 % with the legacy pipeline engine's cost per layer and micro-batch (twenty-fifth)
    "BLOOM-176B sweep (Megatron-DeepSpeed, A100)": (95, 0.035, 0.090, 95),
    # 2.0 -> 1.9 % (seventeenth session): tp_backward_overlap derived (1, each collective hidden up to its GEMM)
    "Korthikanti 2022 Table 4 (22B layer, A100)": (10, 0.019, None, 0),
    # NeMo / Megatron-Bridge: interleaved pipeline transfers overlapped as Megatron-LM runs them (2026-12-02)
    # 2026-12-02 (eighth session): the CP rows (ring CP) and NeMo's Nemotron-3 8B/22B and Nemotron-4 340B rows join
    # FP8 saved inputs in one byte; 340B's 16-bit gradients; 3.6 % with host and GPU overlapping in part (twelfth);
    # 3.4 -> 3.1 % with the embedding's data-parallel bucket exposed (twenty-fifth)
    "NeMo 24.07 (H100, FP8)": (12, 0.031, None, 12),
    # 16-bit gradient buffers of its perf recipes; 12.1 % (thirteenth session) once the 8B row recomputes the 5 blocks
    # its 25.11 preset does (LLAMA3_8B_H100_FP8_CS_BASE_CONFIG), a correction of the input, not of the model;
    # 12.4 % (sixteenth) with FP8 sequence-parallel all-gathers, its 70B row +11.8 -> +10.7 %, 405B -0.2 -> -2.2 %
    "Megatron-Bridge 25.11 (H100, FP8)": (3, 0.124, None, 3),
    "Narayanan 2021 Table 2 (DeepSpeed ZeRO-3, A100)": (6, 0.127, None, 6),  # per-tensor ZeRO-3 (DeepSpeed 2021)
    "llm-foundry MPT (PyTorch FSDP, A100)": (139, 0.051, None, 139),  # Composer's BACKWARD_POST (tenth session)
    # GB300 matmul efficiency; 7.0 -> 6.8 % with FP8 sequence-parallel all-gathers (sixteenth session)
    "NeMo / Megatron-Bridge long context CP (H100/B200/GB300, FP8)": (31, 0.068, None, 31),
    # eager rows 1, 8; 9dec370 PP split; eager loss; Grand Teton's 2.4 TB/s HBM2e and its 500 W limit on GEMMs
    # (2026-12-02, eleventh session); sixteenth: tensorwise TP gathers FP8, gathered inputs kept: 6.6 -> 6.0 %
    "torchtitan 2024-12 (FSDP2/TP, H100)": (18, 0.060, 0.080, 18),  # memory 7.7 -> 8.0 %: FP8 inputs kept under TP
    # its 405B Float8 rows gather in FP8 (FSDP, and since the sixteenth session TP: 9.2 -> 8.0 %)
    "torchtitan docs 2024 (FSDP2, A100/H100)": (9, 0.080, None, 9),
    # per-op SAC memory; FA2 on H100; eager loss on H100 (torchtitan 0.0.2), compiled on MI300X / B200 (Aug 2025);
    # B200's cuDNN attention outside 6fc499f's SAC save list, recomputed
    # torchao keeps BF16 inputs; seventeenth session: its H100s are Grand Teton's (titan_runs._GRAND_TETON_FILES),
    # 42.1 -> 39.9 % (H100 rows -16.8 / -14.6 / -24.1 -> -8.6 / -5.4 / -15.8 %)
    # nineteenth: MI300X's attention at Composable Kernel's share of Hopper's rate per peak, SDPA's AOTriton below it
    # (catalog fused_attention_share, flash_attention_2_share): 39.9 -> 27.2 %, MI300X rows -35..-47 -> -6..+3 %
    "torchao float8/MXFP8 (FSDP2, H100/MI300X/B200)": (12, 0.272, 0.047, 12),
    # issue 11 item 6 (2026-12-02; both under 12 % since the tenth session, docs/accuracy.md): rack-scale jobs in NVL72
    # racks as Megatron-Bridge launches them, BF16 gradient buffers, the recipes' EP overlap and DeepSeek-V3's flex
    # dispatcher, FP8 saved inputs in one byte; each row's recompute modules; GPT-OSS's eager expert-bias adds; the
    # recompute, EP overlap and dispatcher of the preset that ran each row's layout in its release (PRESETS)
    # 2026-12-02: Nemotron-3-Nano rows added (catalog model), 30-48 % too fast: 37 runs at 14.2 % -> 42 at 16.5 %,
    # 82 at 14.9 % -> 97 at 19.1 % (docs/accuracy.md); the other rows' errors are unchanged; 15.3 / 17.3 % with
    # fused attention's sequence ramp and head-dimension share; 13.5 / 14.8 % with the Mamba-2 scan's kernel efficiency;
    # 14.6 / 16.5 % with GPT-OSS's alternating 128-token windows (what ran, cuDNN skipping the masked tiles);
    # 14.6 / 16.9 % with the alltoall dispatcher's chunk sorts; 14.2 / 17.0 % with the rack-scale Qwen3 presets'
    # HybridEP; 13.6 / 17.2 % with the SMs HybridEP takes from overlapped compute; 13.6 / 16.0 % with full-iteration
    # CUDA graphs; 13.6 / 15.3 % over 95 rack-scale rows without the two footnoted as a cuDNN regression; 15.2 % with
    # HybridEP for every rack-scale Qwen3 row (all their presets name it); 13.2 / 14.5 -> 11.3 / 13.2 % with GPT-OSS's
    # eager activation clamp (and the host sync its offset tensor makes) and its unfused YaRN RoPE (only its rows move);
    # 10.8 / 11.5 % with Nemotron-3-Nano's MoE layers (composed blocks) costed as MoELayer: router kernels, permutes,
    # dispatcher sync, host launches (only its rows move)
    # memory: its 2 rows publish max_memory_allocated, compared without CUDA context and NCCL (0.074 -> 0.092);
    # 11.6 % once host_kernel_s is fitted on vTrain's sweep (53.5 µs; eleventh session: the Python-level launches of
    # small MoE blocks cost more, the grouped-linear GEMMs keep 40 µs as grouped_gemm_host_s); 11.9 % with
    # host_overlap_softness fitted with it (twelfth session: passes near the host/GPU crossover overlap in part)
    # fits: the 41 timed runs predicted to fit and, from 2026-12-02 (thirteenth session), the Nemotron-3-Nano sweep's
    # two completed runs at the load its hot-rank reading implies; 12.0 % and all 42 once MB-177 (GPT-OSS-120B, 25.11,
    # H100) runs its release's preset, micro-batch 1 with recompute, where its row copies the B200 row's figures;
    # 11.3 % with the per-layer CUDA graphs each row's preset captures (twenty-second session: the B200
    # Qwen3-30B-A3B rows +12..+27 -> +6..+20 %); 10.9 % with Megatron-LM's 1F1B boundary transfers crossing both ways
    # at once (ParallelConfig.p2p_duplex)
    "Megatron-Bridge MoE with EP (H100/B200, force-balanced)": (42, 0.109, 0.092, 44),
    # 11.9 % once GB300's matmul efficiency is fitted on the long-context file's GB300 rows (tenth session); 11.5 %
    # with host_kernel_s fitted on vTrain (eleventh); 9.5 % with host_overlap_softness (twelfth); 9.1 % with GB200's
    # matmul rate derived from B200's at GB200's 1,200 W (twenty-first); 9.9 % with the presets' per-layer CUDA graphs
    # (twenty-second: most rack-scale rows were already fast, and their graphed launches make them faster)
    "Megatron-Bridge MoE with EP (B300/GB200/GB300, force-balanced)": (95, 0.099, None, 95),
}
# source: documented OOM runs predicted not to fit (2026-12-02: the Nemotron-3-Nano sweep's MBS-012 and MBS-013 under a
# balanced router; all four once its rows run at the router load the sweep's hot-rank reading implies, thirteenth
# session, docs/accuracy.md; fourteenth: the BLOOM sweep's six OOM rows, three caught, and Narayanan's 530B on 560
# GPUs, not caught: predicted 2-4 % under the capacity)
OOMS_RECORDED = {"Megatron-Bridge MoE with EP (H100/B200, force-balanced)": (4, 4),
                 "BLOOM-176B sweep (Megatron-DeepSpeed, A100)": (6, 3),
                 "Narayanan 2021 Table 2 (DeepSpeed ZeRO-3, A100)": (1, 0)}
# sweep: (median Spearman, mean regret) of benchmarks/ranking.py, measured 2026-12-01 (host-bound passes modelled;
# 2026-12-02: the autotuning runs' ZeRO-3 per tensor, as DeepSpeed before v0.6.0 ran it; eleventh session:
# host_kernel_s fitted on vTrain's sweep, benchmarks/fit_host_overhead.py; twelfth: with host_overlap_softness;
# fifteenth: DeepSpeed's partitioned pipeline transfers, 1.042 -> 1.043)
RANKING_RECORDED = {"vTrain single-node (A100)": (0.98, 1.043), "DeepSpeed autotuning GPT-2 (V100)": (1.0, 1.0)}
# Spread over tp 2/4/8, pp 6–24, micro-batch 1–4, global batch 512–2048 and three model shapes; 607 and 617
# ran before the PCIe/NUMA fix; 836 and 838 (hold-out half) have 108-wide heads (misaligned fp16 GEMMs). Each
# tolerance is the row's error plus about two points; reset in the twenty-fifth session with the legacy pipeline
# engine's cost (607 -3.2 -> +7.6 %, 891 -0.2 -> +6.2 %, 838 -8.7 -> -3.2 %, 950 +8.1 -> +3.4 %).
BLOOM_LINES = {607: 0.09, 617: 0.02, 779: 0.05, 800: 0.06, 808: 0.08, 836: 0.04, 838: 0.05, 867: 0.02, 891: 0.08,
               950: 0.05}


@pytest.fixture(scope="module")
def scores():
    calibration = default_calibration()
    return {source.name: score_source(source, calibration) for source in sources()}


def test_every_recorded_source_is_scored(scores):
    assert set(scores) == set(RECORDED)


@pytest.mark.parametrize("name", RECORDED)
def test_source_error_does_not_grow_by_more_than_two_points(scores, name):
    runs, mape, memory, fits = RECORDED[name]
    result = scores[name]
    assert result.time.count == runs
    assert result.time.mape <= mape + SLACK, f"{name}: time MAPE {100 * result.time.mape:.1f} %"
    if memory is not None:
        assert result.memory.median <= memory + SLACK, f"{name}: memory {100 * result.memory.median:.1f} %"
    assert result.fits >= fits, f"{name}: {result.fits} runs predicted to fit, was {fits}"


def test_documented_ooms_caught_do_not_drop(scores):
    """Every documented OOM a source estimates counts; fewer of them predicted not to fit is a regression."""
    caught = {name: (len(s.source.ooms), s.ooms_caught) for name, s in scores.items() if s.source.ooms}
    assert set(caught) == set(OOMS_RECORDED)
    for name, (ooms, recorded) in OOMS_RECORDED.items():
        assert caught[name][0] == ooms and caught[name][1] >= recorded, f"{name}: {caught[name]}"


def test_layout_ranking_does_not_get_worse():
    """Neither sweep's median Spearman drops nor its mean regret grows by more than two points."""
    from benchmarks.ranking import group_scores, predicted_times, study_summary

    summary = study_summary(group_scores(predicted_times(default_calibration())))
    assert set(summary.index) == set(RANKING_RECORDED)
    for study, (spearman, regret) in RANKING_RECORDED.items():
        assert summary.loc[study, "median_spearman"] >= spearman - SLACK, study
        assert summary.loc[study, "mean_regret"] <= regret + SLACK, study


def test_selected_bloom_rows():
    errors = {o.run.source.split()[-1]: o.time_error for o in outcomes(bloom_runs(), default_calibration())}
    for line, tolerance in BLOOM_LINES.items():
        assert abs(errors[str(line)]) <= tolerance, f"BLOOM source_line {line}: {100 * errors[str(line)]:+.1f} %"


def test_shipped_calibration_is_physical_and_inside_the_fit_bounds():
    calibration = default_calibration()
    for constant in FITTED + MEMORY_FITTED:
        assert constant.low <= getattr(calibration, constant.name) <= constant.high, constant.name
    assert BEFORE_FIX_NIC_RATIO.low <= shipped_before_fix_nic_ratio() <= BEFORE_FIX_NIC_RATIO.high
    assert JEAN_ZAY_P2P_RATIO.low <= shipped_jean_zay_p2p_ratio() <= JEAN_ZAY_P2P_RATIO.high


def test_jean_zay_pipeline_ratio_slows_only_the_bloom_rows_pipeline_transfers():
    """The ratio scales p2p_efficiency_inter for the BLOOM rows alone: the p2p time grows by its inverse, the
    compute and the collectives do not move, and no other source's run carries it."""
    calibration = default_calibration()
    run = next(r for r in bloom_runs(1.0, 0.5) if r.label.startswith("L809 "))
    neutral = next(r for r in bloom_runs(1.0, 1.0) if r.label.startswith("L809 "))
    slow, plain = (predict(r, calibration).breakdown_s for r in (run, neutral))
    assert slow["pp_comm"] > plain["pp_comm"] > 0
    assert (slow["compute"], slow["dp_comm"]) == pytest.approx((plain["compute"], plain["dp_comm"]))
    assert all(r.p2p_bandwidth_ratio == 1.0 for s in sources()[1:] for r in s.runs)


def test_before_fix_ratio_scales_only_the_pre_fix_rows_inter_node_bandwidth():
    slower, neutral = bloom_runs(0.5), bloom_runs(1.0)
    pre_fix = [a.cluster.nodes[0].nic_bandwidth_bytes_per_s / b.cluster.nodes[0].nic_bandwidth_bytes_per_s
               for a, b in zip(slower, neutral, strict=True)]
    assert sorted(set(pre_fix)) == [0.5, 1.0]
    assert [r.source for r in slower] == [r.source for r in neutral]
    assert sum(ratio == 0.5 for ratio in pre_fix) == 32  # source_lines 607–761, logged before the fix


def testgolden_section_finds_a_minimum_and_keeps_a_better_start():
    assert golden_section(lambda x: (x - 0.3) ** 2, 0.0, 1.0, 0.9) == pytest.approx(0.3, abs=0.01)
    assert golden_section(lambda x: abs(x - 0.5), 0.0, 1.0, 0.5) == 0.5


def test_misaligned_gemm_leading_dimension_is_penalised():
    """A 16-bit leading dimension of 1028 (2056 B, not whole 16-byte vectors) runs at misaligned_gemm_efficiency,
    1024 or 1032 do not, nor do fractional (averaged) widths; FP8 needs multiples of 16 elements."""
    from benchmarks.validation_runs import GPT_22B
    from planner.cluster import load_cluster
    from planner.gpu import lookup_gpu
    from planner.profile.analytic import AnalyticProfile

    gpu = load_cluster("dgx-a100").gpu
    calibration = default_calibration().updated(misaligned_gemm_efficiency=0.25, kernel_launch_s=0.0)
    profile = AnalyticProfile(GPT_22B, calibration)
    per_flop = {k: profile.gemm_time(gpu, "bf16", 8192, 8192, k) / k for k in (1032, 1028, 1024, 1032.5)}
    assert per_flop[1028] == pytest.approx(4 * per_flop[1032], rel=1e-6)
    assert per_flop[1032] == pytest.approx(per_flop[1024], rel=1e-6) == pytest.approx(per_flop[1032.5], rel=1e-6)
    h100 = lookup_gpu("H100-80GB")
    assert profile.gemm_time(h100, "fp8", 8192, 8200, 8192) > 3 * profile.gemm_time(h100, "fp8", 8192, 8208, 8192)


def test_sequence_parallel_backward_exposes_the_output_gradient_all_gather():
    """With SP a block's backward pays one all-reduce-equivalent that no overlap hides (the all-gather
    behind each row-parallel reduce-scatter) and two that tp_backward_overlap may hide."""
    from benchmarks.validation_runs import GPT_22B
    from planner.cluster import load_cluster
    from planner.config import ParallelConfig, Recompute, Training
    from planner.cost.time import unit_costs
    from planner.model import UnitKind
    from planner.placement import GroupLinks, default_placement
    from planner.profile.analytic import AnalyticProfile

    cluster = load_cluster("dgx-a100")
    training = Training(global_batch=4, seq_len=2048, dtype="bf16", attention="unfused")
    backward = {}
    for hidden in (0.0, 1.0):
        calibration = default_calibration().updated(tp_backward_overlap=hidden)
        for sp in (False, True):
            config = ParallelConfig(dp=1, tp=8, pp=1, micro_batch=4, sequence_parallel=sp, recompute=Recompute.NONE)
            links = GroupLinks.from_placement(cluster, config, default_placement(cluster, config))
            block = unit_costs(GPT_22B, training, config, links.gpu[0], links.tp[0],
                               AnalyticProfile(GPT_22B, calibration), calibration)[UnitKind.BLOCK]
            backward[hidden, sp] = (block.tp_backward_s, block.tp_forward_s / 2)
    for (hidden, sp), (tp_backward, all_reduce) in backward.items():
        expected = (2 * (1 - hidden) + 1) if sp else 2 * (1 - hidden)
        assert tp_backward == pytest.approx(expected * all_reduce), (hidden, sp)
