"""The accuracy harness itself: every validation file is accounted for, copies are verbatim, scores
and ranking measures mean what the README says (benchmarks/accuracy.py, ranking.py, loso.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.accuracy import score, score_source, summary_lines, verdict_load
from benchmarks.bridge_systems import rack_segment_gpus
from benchmarks.loso import fit_sources, source_objective
from benchmarks.moe_runs import MOE_FILE, _release, hot_rank_load, moe_runs
from benchmarks.ranking import AUTOTUNING_FILE, VTRAIN_FILE, group_scores, study_summary
from benchmarks.sources import skipped_files, sources
from benchmarks.titan_runs import TITAN_FILES, titan_runs
from benchmarks.validation_runs import DATA
from planner.config import Recompute
from planner.cost.estimate import estimate
from planner.placement import GroupLinks, default_placement
from planner.profile.calibration import default_calibration

SHARED = Path(__file__).resolve().parents[2] / "shared" / "validation"
# reference tables the cost model reads as constants or formulas, not runs to estimate
REFERENCE = {"hardware_peak_tflops.csv", "max_achievable_matmul_bf16.csv", "intranode_links.csv",
             "cluster_nodes_interconnect.csv", "measured_bandwidths.csv", "korthikanti2022_table4_layer_time_22b.csv"}


def test_every_copied_file_is_a_source_a_sweep_or_skipped_with_reasons() -> None:
    accounted = ({s.file for s in sources()} | {k.file for k in skipped_files()}
                 | {VTRAIN_FILE, AUTOTUNING_FILE, "alpa_intra_op_ablation_gpt.csv"})
    assert {p.name for p in DATA.glob("*.csv")} <= accounted


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/validation not present")
def test_copies_hold_the_same_rows_and_cover_every_shared_run_file() -> None:
    shared = {p.name: p for p in [*SHARED.glob("*.csv"), *SHARED.glob("sweeps/*.csv")]}
    for copy in DATA.glob("*.csv"):
        assert pd.read_csv(copy).equals(pd.read_csv(shared[copy.name])), copy.name  # line endings may differ
    assert set(shared) - {p.name for p in DATA.glob("*.csv")} <= REFERENCE


def test_every_skipped_row_says_why() -> None:
    skipped = [k for s in sources() for k in s.skipped] + list(skipped_files())
    assert all(k.reason and k.row for k in skipped)
    assert not any("documented OOM" in k.reason for k in skipped)  # the Nemotron-3-Nano sweep's 4 are estimated


def test_torchtitan_context_and_pipeline_rows_are_scored_as_torchtitan_runs_them() -> None:
    """Table 2 (FSDP + CP) and Tables 5-6 (FSDP + TP + PP (+ CP)): torchtitan's all-gather KV rotation, FSDP
    sharded over dp_shard·cp, PP micro-batches of one sequence."""
    runs, skipped = titan_runs(TITAN_FILES[0])
    assert not skipped
    with_cp = [run for run in runs if run.config.cp > 1]
    assert len(with_cp) == 6 and all(run.config.cp_comm == "all-gather" for run in with_cp)
    assert sum(run.config.pp > 1 and run.config.zero_stage == 3 for run in runs) == 6
    # Grand Teton's 96 GB HBM2e H100s, as the benchmark text states them: capacity and the 2.4 TB/s of HBM2e
    assert {(run.cluster.gpu.name, run.cluster.gpu.hbm_bandwidth_bytes_per_s) for run in runs} == {
        ("H100-96GB-HBM2e", 2.4e12)}


def test_torchaos_h100_rows_run_on_grand_teton_and_its_other_gpus_as_named() -> None:
    """torchao's rows say only "H100": Grand Teton's 500 W parts like the same team's torchtitan rows
    (benchmarks/titan_runs.py `_GRAND_TETON_FILES`); its MI300X and B200 rows keep their own GPUs."""
    runs, _ = titan_runs(TITAN_FILES[2])
    by_gpu = Counter(run.cluster.gpu.name for run in runs)
    assert by_gpu == {"H100-96GB-HBM2e": 3, "MI300X": 4, "B200": 5}
    teton = next(run for run in runs if run.cluster.gpu.name == "H100-96GB-HBM2e")
    assert teton.cluster.gpu.gemm_clock_ratio < 0.9 and "H100-96GB-HBM2e" in teton.label


def test_moe_rows_are_each_estimated_once_or_skipped_and_timed_only_when_force_balanced() -> None:
    """Every row of moe_ep_throughput.csv lands in exactly one of the two MoE sources (H100/B200, rack-scale),
    as a run or a skip; runs are force-balanced (load 1.0), dropless, and carry the row's degrees."""
    frame = pd.read_csv(DATA / MOE_FILE).set_index("row_id")
    (runs, skipped, ooms, completions), rack = moe_runs(), moe_runs(rack_scale=True)
    ids = ([r.source.split()[-1] for r in (*runs, *rack.runs, *ooms, *rack.ooms, *completions, *rack.completions)]
           + [k.row.split()[-1] for k in (*skipped, *rack.skipped)])
    assert sorted(ids) == sorted(frame.index)
    assert runs and all("balanc" in str(frame.loc[r.source.split()[-1], "dispatcher_routing"]) for r in runs)
    for run in runs:
        row = frame.loc[run.source.split()[-1]]
        assert run.training.moe_expert_load == 1.0 and run.training.moe_capacity_factor is None
        assert run.training.grad_bytes == 2  # the performance recipes' BF16 gradient buffer (grad_reduce_in_fp32 off)
        assert (run.config.tp, run.config.pp, run.config.ep) == (int(row["tp"]), int(row["pp"]), int(row["ep"]))
        assert run.config.num_gpus == int(row["num_gpus"]) and run.cluster.num_gpus == int(row["num_gpus"])
    reasons = {k.reason for k in skipped}
    assert "router not force-balanced: its load imbalance is not stated" in reasons
    assert "token-dropping run: its capacity factor is not stated" in reasons


def test_documented_ooms_are_estimated_and_scored_on_not_fitting() -> None:
    """The Megatron-Bridge activation-recompute study's Nemotron-3-Nano sweep (MBS-012..015: 16 H100, BF16, EP 8,
    HybridEP) ran out of memory: each is estimated with its recompute modules and scored on whether it is predicted
    not to fit; the summary says how many of the documented OOMs are caught."""
    ooms = moe_runs().ooms
    assert [r.label.split()[0] for r in ooms] == ["MBS-012", "MBS-013", "MBS-014", "MBS-015"]
    assert {r.model.name for r in ooms} == {"nemotron-3-nano-30b-a3b"}
    assert all(r.config.moe_dispatcher == "flex" and r.config.ep == 8 and r.training.dtype == "bf16" for r in ooms)
    assert [r.config.recompute_modules if r.config.recompute is Recompute.SELECTIVE else () for r in ooms] == [
        (), ("core_attn",), ("moe_act",), ("moe_act", "layernorm")]
    moe = next(s for s in sources() if s.file == MOE_FILE and s.ooms)
    caught = score_source(moe, default_calibration()).ooms_caught
    assert f"(documented OOMs: 4, 4 estimated, {caught} of them predicted not to fit) |" in summary_lines(
        [score_source(moe, default_calibration())])[-1]


def test_nemotron_3_nano_h100_fp8_rows_run_their_presets_recompute_and_hybridep() -> None:
    """NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1 (Megatron-Bridge v0.3.1 through v0.5.1): recompute moe,
    layernorm, core_attn and moe_act, HybridEP; the B200 and rack-scale presets recompute nothing."""
    runs = {r.source.split()[-1]: r.config for rack in (False, True) for r in moe_runs(rack)[0]}
    for row in ("MB-050", "MB-081", "MB-111", "MB-142"):
        assert runs[row].recompute is Recompute.SELECTIVE and runs[row].moe_dispatcher == "flex"
        assert runs[row].recompute_modules == ("core_attn", "moe_act", "layernorm", "moe")
    assert runs["MB-080"].recompute is Recompute.NONE and runs["MB-080"].moe_dispatcher == "flex"


def test_rack_scale_moe_runs_keep_their_expert_groups_inside_one_nvl72_rack() -> None:
    """Megatron-Bridge's launcher asks Slurm for segments of up to 18 trays (one NVL72 rack) and HybridEP places
    up to 72 EP ranks per NVLink domain: DeepSeek-V3 on 256 GB200 (EP 64, MB-002) runs on racks of 64 GPUs, so its
    all-to-all stays on NVLink; 8 GPUs are one segment of 2 trays, 288 GPUs four full racks."""
    assert [rack_segment_gpus(n, "GB200") for n in (8, 64, 256, 288)] == [8, 64, 64, 72]
    run = next(r for r in moe_runs(rack_scale=True)[0] if r.label.startswith("MB-002 "))
    assert run.config.ep == 64
    links = GroupLinks.from_placement(run.cluster, run.config, default_placement(run.cluster, run.config))
    assert {link.ranks_per_node for link in links.ep} == {64}


def test_moe_rows_quoting_a_head_recipe_take_its_ep_overlap() -> None:
    """Qwen3-235B-A22B FP8 on 256 H100 (MB-075) quotes qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config, which sets
    overlap_moe_expert_parallel_comm; Qwen3-30B-A3B FP8 on 16 H100 (MB-043) quotes a recipe with moe_a2a_overlap off."""
    runs = {r.source.split()[-1]: r for r in moe_runs()[0]}
    assert runs["MB-075"].config.moe_ep_overlap and runs["MB-075"].config.moe_dispatcher == "alltoall"
    assert not runs["MB-043"].config.moe_ep_overlap and runs["MB-043"].config.moe_dispatcher == "flex"


def test_moe_rows_that_state_nothing_run_the_preset_of_their_layout() -> None:
    """DeepSeek-V3 MXFP8 on 256 B200 at pp 8 × vpp 2, EP 32 (MB-060) ran DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2:
    EP overlap and recompute of mla_up_proj and mlp; on 256 GB300 at micro-batch 1 (MB-001) the full-iteration preset
    with EP overlap and no recompute, at micro-batch 2 (MB-057) the one without overlap; GPT-OSS-120B BF16 on B200 and
    GB200 (MB-064, MB-062) recomputes layernorm and moe_act as every preset there sets, on GB300 (MB-061) nothing;
    Qwen3-235B-A22B FP8-CS on 256 H100 (MB-179, 25.11) and Qwen3-30B-A3B FP8 on 16 H100 at pp 2 × vpp 12 (MB-134)
    run their H100 presets' EP overlap."""
    runs = {r.source.split()[-1]: r.config for rack in (False, True) for r in moe_runs(rack)[0]}
    assert runs["MB-060"].moe_ep_overlap and runs["MB-060"].recompute_modules == ("mla_up_proj", "mlp")
    assert runs["MB-001"].moe_ep_overlap and runs["MB-001"].recompute is Recompute.NONE
    assert not runs["MB-057"].moe_ep_overlap and runs["MB-057"].recompute_modules == ("mla_up_proj",)
    for row in ("MB-064", "MB-062"):
        assert runs[row].recompute is Recompute.SELECTIVE
        assert set(runs[row].recompute_modules) == {"layernorm", "moe_act"}
    assert runs["MB-061"].recompute is Recompute.NONE and not runs["MB-061"].moe_ep_overlap
    assert runs["MB-179"].moe_ep_overlap and runs["MB-134"].moe_ep_overlap  # the H100 Qwen3 presets' moe_a2a_overlap
    assert not runs["MB-178"].moe_ep_overlap  # vpp 24, micro-batch 2: no preset ran that layout


def test_moe_presets_from_the_26_06_release_on_overlap_ep_at_layouts_older_releases_ran_without() -> None:
    """Megatron-Bridge 0.5.0 (NeMo 26.06) turned the MXFP8 GB200/GB300 presets to full-iteration CUDA graphs with EP
    overlap: Qwen3-30B-A3B on 8 GB300 at micro-batch 8 overlaps in 26.08 (MB-007), not in 26.04.01 (MB-066), the same
    layout; DeepSeek-V3 on 256 GB200 also recomputes mla_up_proj from then (MB-002, 26.08; MB-058, 26.04.01: none)."""
    runs = {r.source.split()[-1]: r.config for r in moe_runs(rack_scale=True)[0]}
    assert runs["MB-007"].moe_ep_overlap and not runs["MB-066"].moe_ep_overlap
    assert runs["MB-002"].moe_ep_overlap and runs["MB-002"].recompute_modules == ("mla_up_proj",)
    assert not runs["MB-058"].moe_ep_overlap and runs["MB-058"].recompute is Recompute.NONE


def test_gpt_oss_bf16_rows_of_26_04_run_that_releases_hybridep_presets() -> None:
    """Megatron-Bridge 0.4.x (26.04, 26.04.01) ran GPT-OSS-120B BF16 on GB200 with HybridEP and EP overlap (MB-062),
    0.3.x (26.02) with alltoall and none (MB-149); on B200 at EP 8 with HybridEP (MB-064)."""
    runs = {r.source.split()[-1]: r.config for rack in (False, True) for r in moe_runs(rack)[0]}
    assert runs["MB-062"].moe_dispatcher == "flex" and runs["MB-062"].moe_ep_overlap
    assert runs["MB-149"].moe_dispatcher == "alltoall" and not runs["MB-149"].moe_ep_overlap
    assert runs["MB-149"].recompute is Recompute.SELECTIVE  # every release's GB200 preset recomputes
    assert runs["MB-064"].moe_dispatcher == "flex" and not runs["MB-064"].moe_ep_overlap


def test_a_rows_release_is_its_nemo_container() -> None:
    row = pd.Series({"framework_version": "Megatron-Bridge, NeMo 26.04.01 container"})
    assert _release(row) == (26, 4, 1) < (26, 6) <= _release(pd.Series({"framework_version": "NeMo 26.06 container"}))
    assert _release(pd.Series({"framework_version": "Megatron-Bridge (2026-07-25 run; container not stated)"})) == ()


def test_deepseek_v3_rows_that_name_no_dispatcher_run_its_presets_flex_backend() -> None:
    """Every Megatron-Bridge DeepSeek-V3 preset names HybridEP or DeepEP: MB-060 (256 B200, EP 32 over four nodes)
    states no dispatcher and is costed with flex; Qwen3 rows that name none stay on alltoall."""
    runs = {r.source.split()[-1]: r for r in moe_runs()[0]}
    assert runs["MB-060"].config.moe_dispatcher == "flex"
    assert runs["MB-074"].config.moe_dispatcher == "alltoall"  # Qwen3-235B-A22B on 256 B200, none named


def test_score_is_mean_median_and_worst_of_magnitudes() -> None:
    result = score([0.1, -0.3, 0.2])
    assert (result.count, result.mape, result.median, result.worst) == (3, pytest.approx(0.2), 0.2, 0.3)


def test_summary_has_a_row_per_source_and_a_total() -> None:
    calibration = default_calibration()
    from benchmarks.accuracy import score_source

    lines = summary_lines([score_source(s, calibration) for s in sources()[1:2]])
    assert len(lines) == 4 and lines[2].startswith("| Korthikanti") and lines[3].startswith("| all |")


def test_ranking_measures_perfect_and_reversed_orders() -> None:
    measured = [1.0, 2.0, 3.0, 4.0]
    times = pd.DataFrame({"study": "s", "group": ["right"] * 4 + ["wrong"] * 4,
                          "measured": measured * 2, "predicted": [1.5, 2.5, 3.5, 4.5, 4.0, 3.0, 2.0, 1.0]})
    groups = group_scores(times).set_index("group")
    assert groups.loc["right", "spearman"] == pytest.approx(1.0) and groups.loc["right", "regret"] == 1.0
    assert groups.loc["wrong", "spearman"] == pytest.approx(-1.0) and groups.loc["wrong", "regret"] == 4.0
    # where planner puts the measured fastest layout: first (no gap), or last, predicted 4.0 / 1.0 − 1 slower
    assert groups.loc["right", "fastest_rank"] == 1 and groups.loc["right", "fastest_gap"] == 0.0
    assert groups.loc["wrong", "fastest_rank"] == 4 and groups.loc["wrong", "fastest_gap"] == pytest.approx(3.0)


def test_ranking_summary_counts_the_fastest_in_the_first_three() -> None:
    """Of ten groups whose measured fastest planner ranks 1st..10th (predicted 0 %..90 % slower than its first
    pick), three have it among the first three, and 90 % stay within the ninth's gap, 80 %."""
    rows = []
    for place in range(10):
        predicted = [1.0 + 0.1 * k for k in range(10)]  # planner's order: layout k predicted (1 + k/10) s
        measured = [2.0] * 10
        measured[place] = 1.0  # the measured fastest is planner's place-th pick
        rows += [{"study": "s", "group": f"g{place}", "measured": m, "predicted": p}
                 for m, p in zip(measured, predicted, strict=True)]
    summary = study_summary(group_scores(pd.DataFrame(rows))).loc["s"]
    assert summary["fastest_in_top3"] == pytest.approx(0.3)
    assert summary["fastest_gap"] == pytest.approx(0.8)


def test_loso_fit_on_one_source_does_not_worsen_it() -> None:
    """The refit minimises the chosen sources' mean MAPE: on Korthikanti Table 4 alone it ends at
    least as good as its start (the priors)."""
    korthikanti = (sources()[1],)
    from benchmarks.loso import LOSO_CONSTANTS

    prior = default_calibration().updated(**{c.name: c.prior for c in LOSO_CONSTANTS})
    assert source_objective(fit_sources(korthikanti), korthikanti) <= source_objective(prior, korthikanti)


def test_qwen3_rack_scale_rows_run_their_presets_hybridep() -> None:
    """Qwen3 presets on GB300 / GB200 name moe_flex_dispatcher_backend "hybridep" in every release, Qwen3-30B-A3B's
    MXFP8 ones on B300 from 0.3.0 (26.02) and on B200 from 0.4.0 (26.04): Qwen3-30B-A3B on 8 GB300 (MB-066, 26.04.01;
    MB-007, 26.08 with the full-iteration preset's EP overlap), on 8 B300 (MB-132, 26.02.01), on 8 B200 in 26.04.01
    (MB-069) but not in 26.02.01 (MB-133), Qwen3-235B-A22B on 256 GB200 at pp 8 without (MB-136) and with vpp 3
    (MB-072) and BF16 on 256 GB300 in 25.11 at a layout no preset ran (MB-167) run flex; Qwen3-235B-A22B on 256 B300
    in 26.04 (MB-106) stays on alltoall."""
    runs = {r.source.split()[-1]: r.config for rack in (False, True) for r in moe_runs(rack)[0]}
    for row in ("MB-066", "MB-007", "MB-132", "MB-069", "MB-136", "MB-072", "MB-167"):
        assert runs[row].moe_dispatcher == "flex", row
    assert runs["MB-007"].moe_ep_overlap and not runs["MB-066"].moe_ep_overlap
    assert runs["MB-133"].moe_dispatcher == "alltoall" and runs["MB-106"].moe_dispatcher == "alltoall"


def test_rows_footnoted_as_a_known_regression_are_skipped_with_the_reason() -> None:
    """GPT-OSS-120B MXFP8 in the 26.06.01 container (MB-021 on GB300, MB-022 on GB200) carries the performance
    summary's cudnn-frontend issue 256 footnote: skipped, while the same layouts' 26.08 rows (MB-005, MB-006) are
    scored."""
    runs, skipped, *_ = moe_runs(rack_scale=True)
    reasons = {k.row: k.reason for k in skipped}
    for row in ("MB-021", "MB-022"):
        assert "cudnn-frontend issue 256" in reasons[f"row_id {row}"]
    scored = {r.source.split()[-1] for r in runs}
    assert {"MB-005", "MB-006"} <= scored and not {"MB-021", "MB-022"} & scored


def test_the_nemotron_sweep_runs_at_the_load_its_hot_rank_reading_implies() -> None:
    """MBS-012 publishes rank 0's peak (66.297 GB after iteration 1) and its hot ranks' (about 72.9 GiB allocated);
    the sweep's router was not force-balanced. The gap is the busiest rank's extra routed tokens, so the load is
    1 + gap / (planner's memory per unit of load): its four OOMs (MBS-012..015) are estimated at that load, as are
    the two runs of the sweep that completed (MBS-016, MBS-017), scored on being predicted to fit."""
    frame = pd.read_csv(DATA / MOE_FILE).set_index("row_id", drop=False)
    load = hot_rank_load(frame.loc["MBS-012"])
    gap = 72.9 * 2**30 - 66.297e9
    per_load = next(r for r in moe_runs().ooms if r.label.startswith("MBS-012 "))
    calibration = default_calibration()
    peaks = [estimate(per_load.model, per_load.cluster, replace(per_load.training, moe_load_imbalance=f),
                      per_load.config, calibration=calibration).peak_memory_bytes for f in (1.0, 1.5)]
    assert load == pytest.approx(1 + 0.5 * gap / (peaks[1] - peaks[0]), rel=1e-9)
    assert 1.5 < load < 2.5  # the hot ranks hold about 11 GiB more than rank 0
    assert all(hot_rank_load(row) is None for key, row in frame.iterrows() if key != "MBS-012")
    moe = moe_runs()
    assert [r.label.split()[0] for r in moe.completions] == ["MBS-016", "MBS-017"]
    assert {r.training.moe_load_imbalance for r in (*moe.ooms, *moe.completions)} == {load}
    outcomes = {r.label.split()[0]: estimate(r.model, r.cluster, r.training, r.config, calibration=calibration).fits
                for r in (*moe.ooms, *moe.completions)}
    assert outcomes == {"MBS-012": False, "MBS-013": False, "MBS-014": False, "MBS-015": False,
                        "MBS-016": True, "MBS-017": True}
    # the verdicts hold well away from that load: the OOMs flip only under 1.4, the completions only past 20
    flips = {r.label.split()[0]: verdict_load(r, calibration) for r in (*moe.ooms, *moe.completions)}
    assert all(flips[row] < 1.4 for row in ("MBS-012", "MBS-013", "MBS-014", "MBS-015"))
    assert all(flips[row] > 20 for row in ("MBS-016", "MBS-017"))


def test_gpt_oss_h100_row_of_25_11_runs_its_presets_micro_batch() -> None:
    """MB-177 states micro-batch 4, global batch 512 and accumulation 2, the B200 row's figures (at its pp 4 they
    would need accumulation 8); the release's only H100 GPT-OSS preset (GPT_OSS_120B_H100_BF16_BASE_CONFIG, v0.2.0)
    runs micro-batch 1 with layernorm and moe_act recomputed: the row runs that, and fits an 80 GB H100."""
    frame = pd.read_csv(DATA / MOE_FILE).set_index("row_id")
    row = frame.loc["MB-177"]
    assert (int(row["micro_batch"]), int(row["global_batch"]), int(row["grad_accum"])) == (4, 512, 2)
    dp = int(row["num_gpus"]) // int(row["pp"])
    assert int(row["global_batch"]) // (dp * int(row["micro_batch"])) != int(row["grad_accum"])
    run = next(r for r in moe_runs().runs if r.label.startswith("MB-177 "))
    assert run.config.micro_batch == 1 and run.config.recompute is Recompute.SELECTIVE
    assert set(run.config.recompute_modules) == {"layernorm", "moe_act"}
    assert estimate(run.model, run.cluster, run.training, run.config, calibration=default_calibration()).fits
