"""The token dispatchers' reorderings of the routed tokens (planner/profile/analytic.py `_permutations`):
Megatron-Core's alltoall dispatcher sorts the received tokens by local expert and back ("Permutation 2" /
"Unpermutation 2") on top of the permute and un-permute every dispatcher runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting, unit_setting
from planner.profile.calibration import default_calibration
from tests.host_overlap import full_overlap

QWEN = load_model("qwen3-30b-a3b")  # 128 experts, top-8, h 2048


def _setting(dispatcher: str, ep: int = 8, micro_batch: int = 1) -> UnitSetting:
    return UnitSetting(tp=1, micro_batch=micro_batch, seq_len=4096, sequence_parallel=False, dtype="bf16",
                       attention="flash", ep=ep, dispatcher=dispatcher)


def test_alltoall_with_several_local_experts_sorts_twice_more() -> None:
    """16 local experts: alltoall permutes, sorts, sorts back and un-permutes (4 passes); flex permutes twice."""
    profile = AnalyticProfile(QWEN, default_calibration())
    assert profile._permutations(_setting("alltoall")) == 4
    assert profile._permutations(_setting("flex")) == 2


def test_one_local_expert_or_no_expert_parallelism_has_no_chunk_sort() -> None:
    """ep = 128 leaves one expert per rank, nothing to sort; ep = 1 has no all-to-all (Megatron-Core's allgather
    dispatcher there)."""
    profile = AnalyticProfile(QWEN, default_calibration())
    assert profile._permutations(_setting("alltoall", ep=128)) == 2
    assert profile._permutations(_setting("alltoall", ep=1)) == 2


def test_chunk_sorts_move_every_routed_copy_and_launch_a_kernel_each() -> None:
    """Each extra pass reads and writes top-k · h 16-bit values per token (8 · 2048 · 4 B) and is one kernel."""
    profile = AnalyticProfile(QWEN, default_calibration())
    alltoall, flex = _setting("alltoall"), _setting("flex")
    extra = profile._permute_bytes_per_token(alltoall) - profile._permute_bytes_per_token(flex)
    assert extra == 2 * 2 * 2 * 8 * 2048
    assert profile._routed_kernels(alltoall)[0] - profile._routed_kernels(flex)[0] == 2
    assert profile._routed_kernels(alltoall)[1] == profile._routed_kernels(flex)[1]


def test_alltoall_block_costs_the_chunk_sorts_forward_and_backward() -> None:
    """The MoE block's forward grows by the two passes' HBM time and launches; its backward (their gradients) by
    twice that. B200 at 8 × 4,096 tokens is GPU-bound, so with host and GPU overlapping fully no host term hides the
    difference."""
    calibration = full_overlap()
    profile, gpu = AnalyticProfile(QWEN, calibration), lookup_gpu("B200")
    alltoall, flex = (profile.times(UnitKind.BLOCK, _setting(d, micro_batch=8), gpu) for d in ("alltoall", "flex"))
    passes = profile.memory_time(gpu, 8 * 4096 * 2 * 2 * 2 * 8 * 2048) + 2 * calibration.kernel_launch_s
    assert alltoall.forward_s - flex.forward_s == pytest.approx(passes, rel=1e-9)
    assert alltoall.backward_s - flex.backward_s == pytest.approx(2 * passes, rel=1e-9)


def test_the_moe_recompute_module_repeats_the_chunk_sorts() -> None:
    """Selective recompute of "moe" re-runs every permutation the forward ran."""
    profile, gpu = AnalyticProfile(QWEN, default_calibration()), lookup_gpu("B200")
    moe = {d: dict(profile.times(UnitKind.BLOCK, _setting(d), gpu).module_forward_s)["moe"]
           for d in ("alltoall", "flex")}
    assert moe["alltoall"] - moe["flex"] == pytest.approx(profile.memory_time(gpu, 4096 * 8 * 8 * 2048), rel=1e-9)


def test_the_cost_model_passes_the_configured_dispatcher() -> None:
    """`unit_setting` carries ParallelConfig.moe_dispatcher into the profile (default alltoall), so on one node an
    alltoall configuration's compute exceeds the same flex one's by the chunk sorts of every MoE layer."""
    training = Training(global_batch=64, seq_len=4096)
    assert unit_setting(training, 1, 1, False, ep=8).dispatcher == "alltoall"
    assert unit_setting(training, 1, 1, False, ep=8, dispatcher="flex").dispatcher == "flex"
    cluster, config = load_cluster("1x8xB200"), ParallelConfig(dp=8, tp=1, pp=1, ep=8)
    compute = {d: estimate(QWEN, cluster, training, replace(config, moe_dispatcher=d)).breakdown_s["compute"]
               for d in ("alltoall", "flex")}
    assert compute["alltoall"] > compute["flex"]


def test_bad_dispatcher_is_refused() -> None:
    """A dispatcher outside MOE_DISPATCHERS is a one-line PlannerError, as before."""
    with pytest.raises(PlannerError, match="moe_dispatcher"):
        ParallelConfig(dp=8, tp=1, pp=1, ep=8, moe_dispatcher="deepep")


def test_dense_models_do_not_depend_on_the_dispatcher() -> None:
    """A dense block's times are the same under either dispatcher setting."""
    dense, gpu = AnalyticProfile(load_model("llama3-8b"), default_calibration()), lookup_gpu("B200")
    a, f = (dense.times(UnitKind.BLOCK, replace(_setting(d), ep=1), gpu) for d in ("alltoall", "flex"))
    assert (a.forward_s, a.backward_s) == (f.forward_s, f.backward_s)
