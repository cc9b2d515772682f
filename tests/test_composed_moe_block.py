"""A hybrid stack's MoE layer (Nemotron-3-Nano's E blocks, costed by `_composed_block`) is Megatron-Core's MoELayer,
as in a GPT block: its router kernels, dispatched-token path, dispatcher sync and host launches
(planner/profile/analytic.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.gpu import lookup_gpu
from planner.model import load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration
from tests.host_overlap import full_overlap

NEMOTRON = load_model("nemotron-3-nano-30b-a3b")  # E blocks: 128 squared-ReLU experts of 1856, top 6, one shared
MOE_BLOCK = next(block for block in NEMOTRON.block_types() if block.mlp is not None and block.mlp.is_moe)
B200 = lookup_gpu("B200")


def _setting(seq_len: int, dispatcher: str = "flex", cuda_graphs: str = "none") -> UnitSetting:
    return UnitSetting(tp=1, micro_batch=1, seq_len=seq_len, sequence_parallel=False, dtype="bf16",
                       attention="flash", ep=8, dispatcher=dispatcher, cuda_graphs=cuda_graphs)


def test_the_moe_block_is_the_moe_layer_alone() -> None:
    assert MOE_BLOCK.attention is None and MOE_BLOCK.mamba is None


def test_a_host_bound_moe_block_is_its_launches() -> None:
    """At 128 tokens every kernel runs faster than the host launches it: the forward is its 43 launches (norm and
    residual add, the router's GEMM, top-k and softmax, the permute and un-permute, the routed and shared activations,
    the shared experts' 2 GEMMs and 16 local experts × 2 grouped-linear GEMMs): the 32 grouped-linear GEMMs at
    grouped_gemm_host_s, the other 11 at host_kernel_s; the backward twice that; the alltoall dispatcher's two chunk
    sorts add 2 Python-level launches."""
    calibration = full_overlap()
    profile = AnalyticProfile(NEMOTRON, calibration)
    looped = 32 * calibration.grouped_gemm_host_s
    flex = profile.block_times(MOE_BLOCK, _setting(128), B200)
    assert flex.forward_s == pytest.approx(11 * calibration.host_kernel_s + looped, rel=1e-12)
    assert flex.backward_s == pytest.approx(2 * (11 * calibration.host_kernel_s + looped), rel=1e-12)
    alltoall = profile.block_times(MOE_BLOCK, _setting(128, "alltoall"), B200)
    assert alltoall.forward_s == pytest.approx(13 * calibration.host_kernel_s + looped, rel=1e-12)


def test_a_graphed_router_is_one_launch_of_the_moe_block() -> None:
    """Under Megatron-Core's moe_router CUDA graph the norm, the router's GEMM, top-k and softmax and the shared
    experts' 2 GEMMs (6 of the 11 Python-level launches) replay as one, forward and backward; an attention graph
    changes nothing in a block without attention."""
    calibration = full_overlap()
    profile = AnalyticProfile(NEMOTRON, calibration)
    looped = 32 * calibration.grouped_gemm_host_s
    graphed = profile.block_times(MOE_BLOCK, replace(_setting(128), graphed_modules=("attn", "moe_router")), B200)
    assert graphed.forward_s == pytest.approx(6 * calibration.host_kernel_s + looped, rel=1e-12)
    assert graphed.backward_s == pytest.approx((2 * 5 + 1) * calibration.host_kernel_s + 2 * looped, rel=1e-12)


def test_the_moe_block_moves_its_permutations() -> None:
    """The forward's GPU time (under a full-iteration CUDA graph, no host launches) pays the permute and un-permute
    of every routed copy, 6 copies × 2688 hidden values read and written; the alltoall dispatcher's two chunk sorts
    as much again, and their launches."""
    calibration = default_calibration()
    profile = AnalyticProfile(NEMOTRON, calibration)
    copies = 8192 * 6 * 2688
    flex, alltoall = (profile.block_times(MOE_BLOCK, _setting(8192, d, "full_iteration"), B200).forward_s
                      for d in ("flex", "alltoall"))
    sorts = profile.memory_time(B200, 2 * 2 * 2 * copies) + 2 * calibration.kernel_launch_s
    assert alltoall - flex == pytest.approx(sorts, rel=1e-9)


def test_a_dense_composed_block_keeps_its_gpu_time() -> None:
    """A composed block without an MoE layer (Nemotron-H's MLP-only F block) is not host-bound: at 128 tokens its
    forward is its GPU time, below its launches × host_kernel_s."""
    calibration = default_calibration()
    mlp = replace(MOE_BLOCK.mlp, num_experts=1, moe_top_k=1, shared_expert_ffn_hidden_size=None)
    dense = replace(MOE_BLOCK, mlp=mlp)
    forward = AnalyticProfile(NEMOTRON, calibration).block_times(dense, _setting(128), B200).forward_s
    assert forward < 5 * calibration.host_kernel_s
