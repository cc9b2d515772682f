"""TP communication overlap (Megatron-LM --tp-comm-overlap / torchtitan async TP) and FP8 as practitioners run it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.time import _pipelined_exposed_s, unit_costs
from planner.errors import PlannerError
from planner.model import UnitKind, load_model
from planner.placement import GroupLinks, default_placement
from planner.profile.analytic import AnalyticProfile, unit_setting
from planner.profile.calibration import default_calibration
from planner.search.space import FixedOptions, complete_config, enumerate_configs

CALIBRATION = default_calibration()
MODEL = load_model("llama3-70b")
CLUSTER = parse_shorthand("8x8xH100-80GB")
TRAINING = Training(global_batch=128, seq_len=8192, dtype="bf16")


def _block(config: ParallelConfig, training: Training = TRAINING):
    links = GroupLinks.from_placement(CLUSTER, config, default_placement(CLUSTER, config))
    return unit_costs(MODEL, training, config, links.gpu[0], links.tp[0], AnalyticProfile(MODEL, CALIBRATION),
                      CALIBRATION)[UnitKind.BLOCK]


def test_overlap_needs_sequence_parallelism() -> None:
    with pytest.raises(PlannerError, match="sequence_parallel"):
        ParallelConfig(dp=8, tp=8, pp=1, tp_comm_overlap=True)
    with pytest.raises(PlannerError, match="--tp-comm-overlap"):
        complete_config(FixedOptions(tp=1, tp_comm_overlap=True), MODEL, CLUSTER, TRAINING)


def test_pipelined_collective_hides_at_most_its_gemm() -> None:
    """All-gather (ring exchange): nothing exposed while each transfer fits in a GEMM chunk; reduce-scatter:
    the last chunk's transfer always shows; with no GEMM the whole collective shows."""
    assert _pipelined_exposed_s(1.0, 10.0, 4, gather=True) == 0.0
    assert _pipelined_exposed_s(1.0, 10.0, 4, gather=False) == pytest.approx(0.25)
    for gather in (True, False):
        assert _pipelined_exposed_s(1.0, 0.0, 4, gather=gather) == pytest.approx(1.0)
        assert _pipelined_exposed_s(1.0, 0.5, 8, gather=gather) >= 0.5  # excess over the GEMM cannot hide


def test_overlap_hides_most_sequence_parallel_traffic_and_never_costs_time() -> None:
    plain = ParallelConfig(dp=2, tp=8, pp=4, sequence_parallel=True)
    overlapped = replace(plain, tp_comm_overlap=True)
    off, on = _block(plain), _block(overlapped)
    assert on.tp_forward_s < 0.3 * off.tp_forward_s
    assert on.tp_backward_s < off.tp_backward_s
    assert (on.forward_s, on.backward_s) == (off.forward_s, off.backward_s)
    for recompute in Recompute:
        assert _block(replace(overlapped, recompute=recompute)).tp_s <= _block(replace(plain, recompute=recompute)).tp_s


def test_search_takes_overlap_wherever_sequence_parallelism_runs_unless_fixed_off() -> None:
    """Overlap only hides time, so the search takes it where it can run rather than trying both."""
    configs = list(enumerate_configs(MODEL, CLUSTER, TRAINING, FixedOptions(pp=4, micro_batch=1)))
    assert {c.tp_comm_overlap for c in configs if c.sequence_parallel} == {True}
    assert not any(c.tp_comm_overlap for c in configs if not c.sequence_parallel)
    fixed = list(enumerate_configs(MODEL, CLUSTER, TRAINING, FixedOptions(pp=4, micro_batch=1, tp_comm_overlap=False)))
    assert not any(c.tp_comm_overlap for c in fixed)


def test_fp8_runs_only_the_linear_layers_in_fp8_and_pays_its_casts() -> None:
    """Attention core and logits stay BF16; the block's backward pays the cast/transpose traffic."""
    gpu = CLUSTER.gpu
    profile = AnalyticProfile(MODEL, CALIBRATION)
    bf16, fp8 = (unit_setting(replace(TRAINING, dtype=dtype), 8, 1, True) for dtype in ("bf16", "fp8"))
    assert profile._attention_core(bf16, gpu) == profile._attention_core(fp8, gpu)
    head16, head8 = (profile.times(UnitKind.HEAD, s, gpu) for s in (bf16, fp8))
    assert head16 == head8
    block16, block8 = (profile.times(UnitKind.BLOCK, s, gpu) for s in (bf16, fp8))
    assert sum(block8.linear_forward_s) < 0.75 * sum(block16.linear_forward_s)
    gemm_saving = sum(block16.linear_forward_s) - sum(block8.linear_forward_s)
    assert block16.backward_s - block8.backward_s < 2 * gemm_saving  # casts eat into the GEMM saving


def test_overlap_speeds_up_a_70b_estimate() -> None:
    config = ParallelConfig(dp=2, tp=8, pp=4, sequence_parallel=True, distributed_optimizer=True)
    off = estimate(MODEL, CLUSTER, TRAINING, config)
    on = estimate(MODEL, CLUSTER, TRAINING, replace(config, tp_comm_overlap=True))
    assert on.iteration_time_s < off.iteration_time_s
    assert on.breakdown_s["tp_comm"] < 0.5 * off.breakdown_s["tp_comm"]
    assert on.breakdown_s["compute"] == pytest.approx(off.breakdown_s["compute"])
