"""MoE blocks' per-expert kernels and the dispatcher's host-device sync (planner/profile/analytic.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration
from tests.host_overlap import full_overlap

QWEN = load_model("qwen3-30b-a3b")  # 128 experts, top-8, h 2048, expert ffn 768, 2 attention linears, RoPE


def _setting(seq_len: int = 4096, dtype: str = "bf16", ep: int = 8) -> UnitSetting:
    """The flex dispatcher's setting: one permute and one un-permute (the alltoall dispatcher's extra chunk sorts are
    tests/test_moe_permutations.py's)."""
    return UnitSetting(tp=1, micro_batch=1, seq_len=seq_len, sequence_parallel=False, dtype=dtype,
                       attention="flash", ep=ep, dispatcher="flex")


def test_routed_experts_launch_one_gemm_per_local_expert_and_linear() -> None:
    """128 experts over ep 8: 16 local experts × 2 grouped linears = 32 GEMMs; FP8 adds one quantisation of each
    expert's input split per linear (64); the permute, un-permute and activation are the 3 memory-bound kernels."""
    profile = AnalyticProfile(QWEN, default_calibration())
    assert profile._routed_kernels(_setting()) == (3, 32)
    assert profile._routed_kernels(_setting(dtype="fp8")) == (3, 64)
    assert profile._routed_kernels(_setting(ep=128)) == (3, 2)


def test_moe_block_kernel_count() -> None:
    """Qwen3-30B-A3B block at tp 1, ep 8: memory-bound 5 + 2 RoPE + top-k, softmax, permute, un-permute = 11
    (its activation is one of the 5); all = 11 + 2 attention GEMMs + router + 32 expert GEMMs + FlashAttention = 47."""
    assert AnalyticProfile(QWEN, default_calibration())._block_kernels(_setting(), moe=True) == (11, 47)


def test_a_host_bound_moe_forward_is_its_launches() -> None:
    """A 128-token micro-batch runs every kernel faster than the host launches it, on both sides of the dispatcher's
    sync: the forward is its 47 launches, the 32 expert GEMMs at grouped_gemm_host_s (Transformer Engine's C++ loop)
    and the other 15 at host_kernel_s (Python-level modules)."""
    calibration = full_overlap()
    setting = _setting(seq_len=128)
    forward = AnalyticProfile(QWEN, calibration).times(UnitKind.BLOCK, setting, lookup_gpu("B200")).forward_s
    assert forward == pytest.approx(15 * calibration.host_kernel_s + 32 * calibration.grouped_gemm_host_s, rel=1e-12)
    assert calibration.grouped_gemm_host_s < calibration.host_kernel_s  # no Python between the looped launches


def test_the_dispatcher_sync_exposes_the_routed_sides_launches() -> None:
    """A forward with 1 s of GPU work before the sync cannot hide the routed side's 35 launches behind it: after the
    sync the routed side (its GEMMs and memory-bound kernels, r seconds of GPU work) takes max(r, 3 Python launches
    + 32 looped ones), where a pass without the sync would take 1 s."""
    calibration = full_overlap()
    profile, setting, gpu = AnalyticProfile(QWEN, calibration), _setting(seq_len=128), lookup_gpu("B200")
    up, down = profile._routed_expert_linears(setting, gpu)
    routed = up + down + profile.memory_time(gpu, 128 * profile._routed_bytes_per_token(setting)) \
        + 3 * calibration.kernel_launch_s
    host = 3 * calibration.host_kernel_s + 32 * calibration.grouped_gemm_host_s
    assert routed < host
    assert profile._synced_forward(setting, gpu, 1.0, 47) == pytest.approx(1.0 - routed + host, rel=1e-12)


def test_moe_permute_bytes_count_for_every_activation() -> None:
    """A GELU MoE block (not SwiGLU) still permutes and un-permutes its routed copies: per token, norms 8·2048
    + residuals 12·2048 + permutes 8·8·2048 + activation 4·8·768 + RoPE 4·(4096 + 512) = 215,040 bytes."""
    gelu = AnalyticProfile(replace(QWEN, activation="gelu"), default_calibration())
    assert gelu._elementwise_bytes_per_token(_setting(), moe=True) == 215_040


GPT_OSS = load_model("gpt-oss-120b")  # 128 experts, top-4, h 2880, biases on every expert linear


def test_expert_biases_add_a_multiply_and_an_add_per_local_expert_and_one_concatenation() -> None:
    """Megatron-Core's TEGroupedMLP adds linear_fc2's probability-weighted bias one local expert at a time: 128 experts
    over ep 8 are 16 local experts, 2 kernels each + the concatenation = 33 memory-bound kernels beside the permute,
    un-permute, activation and the activation's 3 clamp kernels (tests/test_gpt_oss_eager_kernels.py); a model
    without expert biases (Qwen3) launches none."""
    profile = AnalyticProfile(GPT_OSS, default_calibration())
    assert profile._routed_kernels(_setting()) == (3 + 3 + 33, 32)
    assert profile._routed_kernels(_setting(ep=64)) == (3 + 3 + 5, 4)
    assert AnalyticProfile(QWEN, default_calibration())._expert_bias_bytes_per_token(_setting()) == 0.0
    assert AnalyticProfile(QWEN, default_calibration())._expert_bias_kernels(_setting()) == 0.0


def test_moe_recompute_re_runs_the_expert_bias_add() -> None:
    """The 'moe' recompute module re-runs the whole layer, the expert-bias add included: its bytes at HBM bandwidth
    and one launch per kernel (16 local experts × 2 + 1)."""
    calibration = default_calibration()
    profile, setting, gpu = AnalyticProfile(GPT_OSS, calibration), _setting(), lookup_gpu("B200")
    without = AnalyticProfile(replace(GPT_OSS, moe_bias=False), calibration)
    moe = dict(profile._module_forward_s(setting, gpu, moe=True))["moe"]
    moe_without = dict(without._module_forward_s(setting, gpu, moe=True))["moe"]
    bias = profile.memory_time(gpu, 4096 * 138_240) + 33 * calibration.kernel_launch_s
    assert moe - moe_without == pytest.approx(bias, rel=1e-3)


def test_expert_bias_bytes_are_six_accesses_of_each_routed_copy() -> None:
    """Per token: top-4 routed copies × h 2880 × 2 bytes × 6 accesses (product written; GEMM output and product read,
    sum written; sum copied by the concatenation) = 138,240 bytes, part of the dispatched-token path's bytes."""
    profile = AnalyticProfile(GPT_OSS, default_calibration())
    setting = _setting()
    assert profile._expert_bias_bytes_per_token(setting) == 4 * 2880 * 2 * 6 == 138_240
    assert profile._routed_bytes_per_token(setting) == pytest.approx(
        profile._permute_bytes_per_token(setting) + profile._routed_activation_bytes_per_token(setting) + 138_240)
