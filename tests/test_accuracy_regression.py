"""Accuracy regression: published runs through `estimate` with the shipped profiles/calibration.yaml.

Bounds are the figures benchmarks/accuracy.py reports today plus about one point of slack, so a
change that makes the cost model less accurate fails here; where a bound is looser than the issue's
target the README's "Accuracy" section says so.
"""

from __future__ import annotations

import pytest

from benchmarks.accuracy import bloom_memory_errors, run_errors, score
from benchmarks.calibrate import BEFORE_FIX_NIC_RATIO, FITTED, MEMORY_FITTED, _golden_section
from benchmarks.validation_runs import (
    bloom_runs,
    h100_runs,
    korthikanti_layer_rows,
    llmfoundry_runs,
    narayanan_zero3_runs,
    predict_layer,
    shipped_before_fix_nic_ratio,
    split_fit_hold,
)
from planner.profile.calibration import default_calibration

# Spread over tp 2/4/8, pp 6–24, micro-batch 1–4, global batch 512–2048 and three model shapes; 607 and 617
# ran before the PCIe/NUMA fix; 836 and 838 (hold-out half) have 108-wide heads (misaligned fp16 GEMMs).
BLOOM_LINES = {607: 0.03, 617: 0.03, 779: 0.07, 800: 0.04, 808: 0.03, 836: 0.03, 838: 0.09, 867: 0.04, 891: 0.02,
               950: 0.09}


@pytest.fixture(scope="module")
def bloom_time():
    return {run.source.split()[-1]: error for run, _, error in run_errors(bloom_runs(), default_calibration())}


def test_selected_bloom_rows(bloom_time):
    for line, tolerance in BLOOM_LINES.items():
        error = bloom_time[str(line)]
        assert abs(error) <= tolerance, f"BLOOM source_line {line}: {100 * error:+.1f} %"


def test_bloom_sweep_time_mape(bloom_time):
    assert score(list(bloom_time.values())).mape <= 0.076


def test_bloom_hold_out_half_is_not_worse_than_fit_half():
    fit, hold = split_fit_hold(bloom_runs())
    calibration = default_calibration()
    hold_score = score([e for *_, e in run_errors(hold, calibration)])
    fit_score = score([e for *_, e in run_errors(fit, calibration)])
    assert hold_score.count >= 40 and fit_score.count >= 40
    assert hold_score.mape <= max(fit_score.mape, 0.075) + 0.01


def test_bloom_peak_memory_mape():
    errors = [e for *_, e in bloom_memory_errors(bloom_runs(), default_calibration())]
    assert len(errors) >= 50
    assert score(errors).mape <= 0.06


def test_korthikanti_table4_layer_times():
    calibration = default_calibration()
    for row in korthikanti_layer_rows():
        forward, backward = predict_layer(row, calibration)
        assert forward == pytest.approx(row.forward_s, rel=0.05), row.experiment
        assert backward == pytest.approx(row.backward_s, rel=0.05), row.experiment


def test_h100_runs():
    runs, skipped = h100_runs()
    assert len(runs) == 9 and len(skipped) == 6
    errors = {f"{run.label.split()[0]}@{run.config.num_gpus}": e
              for run, _, e in run_errors(runs, default_calibration())}
    assert score(list(errors.values())).mape <= 0.091
    assert abs(errors["GPT3-175B@128"]) <= 0.02 and abs(errors["LLAMA3_70B@64"]) <= 0.11


def test_llmfoundry_fsdp_runs():
    """139 PyTorch FSDP FULL_SHARD runs (ZeRO-3) of MPT on 8–128 A100: the issue's target, MAPE ≤ 10 %."""
    errors = [e for *_, e in run_errors(llmfoundry_runs(), default_calibration())]
    assert len(errors) == 139
    assert score(errors).mape <= 0.091


def test_narayanan_zero3_rows_are_no_longer_free_but_still_too_fast():
    """Narayanan Table 2's DeepSpeed ZeRO-3 rows. The issue's target (each within 15 %) is NOT met: the
    NCCL-ring model over the node's 8 NICs is 32–76 % too fast (see README "Accuracy"); this bounds the
    regression and checks the one trend it gets right, 175B at 384 GPUs is the least wrong."""
    errors = {run.config.dp: e for run, _, e in run_errors(narayanan_zero3_runs(), default_calibration())}
    assert len(errors) == 6
    assert score(list(errors.values())).mape <= 0.57
    assert -0.33 <= errors[384] < 0


def test_shipped_calibration_is_physical_and_inside_the_fit_bounds():
    calibration = default_calibration()
    for constant in FITTED + MEMORY_FITTED:
        assert constant.low <= getattr(calibration, constant.name) <= constant.high, constant.name
    assert BEFORE_FIX_NIC_RATIO.low <= shipped_before_fix_nic_ratio() <= BEFORE_FIX_NIC_RATIO.high


def test_before_fix_ratio_scales_only_the_pre_fix_rows_inter_node_bandwidth():
    slower, neutral = bloom_runs(0.5), bloom_runs(1.0)
    pre_fix = [a.cluster.nodes[0].nic_bandwidth_bytes_per_s / b.cluster.nodes[0].nic_bandwidth_bytes_per_s
               for a, b in zip(slower, neutral, strict=True)]
    assert sorted(set(pre_fix)) == [0.5, 1.0]
    assert [r.source for r in slower] == [r.source for r in neutral]
    assert sum(ratio == 0.5 for ratio in pre_fix) == 32  # source_lines 607–761, logged before the fix


def test_golden_section_finds_a_minimum_and_keeps_a_better_start():
    assert _golden_section(lambda x: (x - 0.3) ** 2, 0.0, 1.0, 0.9) == pytest.approx(0.3, abs=0.01)
    assert _golden_section(lambda x: abs(x - 0.5), 0.0, 1.0, 0.5) == 0.5


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
