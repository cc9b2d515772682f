"""EP communication overlap with the flex dispatcher's SMs (planner/cost/time.py): HybridEP / DeepEP kernels hold
FLEX_DISPATCH_SMS of the GPU's SMs while they run, so the compute beside them slows and an overlapped all-to-all
shows at least that share of its duration (Megatron-Bridge's measured Qwen3-30B-A3B EP-overlap run on 16 H100:
HybridEP with 32 SMs, only 36.55 % of the communication time concurrent with GEMMs or attention)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.time import (
    FLEX_DISPATCH_SMS,
    _overlapped_exposed_s,
    ep_comm_sm_share,
    expert_parallel_s,
)
from planner.model import load_model
from planner.placement import ExpertLink
from planner.profile.analytic import UnitTimes, unit_setting
from planner.profile.calibration import default_calibration

QWEN = load_model("qwen3-30b-a3b")


def test_the_communication_shows_its_sm_share_when_compute_outlasts_it() -> None:
    """1 ms of all-to-all on a quarter of the SMs beside 5 ms of compute: the compute loses a quarter of the SMs for
    1 ms, 0.25 ms; beside 0.5 ms of compute, which finishes under it on the other SMs, 0.5 ms shows."""
    assert _overlapped_exposed_s(1e-3, 5e-3, 0.25) == pytest.approx(0.25e-3)
    assert _overlapped_exposed_s(1e-3, 0.5e-3, 0.25) == pytest.approx(0.5e-3)
    assert _overlapped_exposed_s(1e-3, 5e-3, 0.0) == 0.0  # SMs not shared: hidden whole
    assert _overlapped_exposed_s(0.0, 5e-3, 0.25) == 0.0


def test_the_share_is_the_flex_dispatchers_sms_of_the_gpu() -> None:
    """32 of the H100's 132 SMs under flex; NCCL's all-to-all (alltoall) and an unknown GPU take none."""
    flex, alltoall = ParallelConfig(dp=8, tp=1, pp=1, ep=8, moe_dispatcher="flex"), ParallelConfig(dp=8, tp=1, pp=1,
                                                                                                   ep=8)
    assert FLEX_DISPATCH_SMS == 32
    assert ep_comm_sm_share(flex, 132) == pytest.approx(32 / 132)
    assert ep_comm_sm_share(alltoall, 132) == 0.0
    assert ep_comm_sm_share(flex, None) == 0.0


def _ep_times(config: ParallelConfig, times: UnitTimes, sm_count: int | None) -> tuple[float, float]:
    cluster, cal = parse_shorthand("4x8xH100-80GB"), default_calibration()
    link = ExpertLink(cluster.link(0, 0), cluster.link(0, 1), 8)
    setting = unit_setting(Training(global_batch=256, seq_len=4096), config.tp, config.micro_batch,
                           config.sequence_parallel, config.cp, config.ep, config.etp, config.moe_dispatcher)
    return expert_parallel_s(QWEN.mlp_spec(True), QWEN.hidden_size, setting, config, link, cluster.link(0, 0), cal,
                             times, sm_count)


def test_overlapped_flex_all_to_alls_behind_ample_compute_show_their_sm_share() -> None:
    """Behind a block that outlasts them, each pass's two all-to-alls (2 · one way) show 32/132 of their time; the
    exposed no-overlap time is 2 · one way per pass."""
    config = ParallelConfig(dp=32, tp=1, pp=1, ep=32, moe_dispatcher="flex")
    long = UnitTimes(forward_s=1.0, backward_s=2.0, attention_core_forward_s=0.2,
                     linear_forward_s=(0.1, 0.05, 0.3, 0.3))
    exposed = _ep_times(config, long, 132)
    hidden = _ep_times(replace(config, moe_ep_overlap=True), long, 132)
    assert hidden == pytest.approx(tuple(e * 32 / 132 for e in exposed), rel=1e-9)
    assert _ep_times(replace(config, moe_ep_overlap=True), long, None) == (0.0, 0.0)


def test_overlap_with_sm_sharing_never_exceeds_the_exposed_all_to_alls() -> None:
    config = ParallelConfig(dp=32, tp=1, pp=1, ep=32, moe_dispatcher="flex")
    overlapped = replace(config, moe_ep_overlap=True)
    for scale in (0.0, 1e-4, 1e-3, 1e-2, 1.0):
        times = UnitTimes(forward_s=scale, backward_s=2 * scale, attention_core_forward_s=0.2 * scale,
                          linear_forward_s=(0.1 * scale, 0.05 * scale, 0.3 * scale, 0.3 * scale))
        exposed, hidden = _ep_times(config, times, 132), _ep_times(overlapped, times, 132)
        assert all(0.0 <= h <= e + 1e-15 for h, e in zip(hidden, exposed, strict=True))
