"""GPT-OSS's eager element-wise chains in Megatron-Core: the routed experts' activation clamp, with the host sync its
offset tensor makes, and RoPE under YaRN scaling, which Megatron runs unfused (planner/profile/analytic.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.cost.memory import recompute_module_bytes
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import ModelSpec, load_model, model_from_hf_config
from planner.profile.analytic import AnalyticProfile, UnitSetting, _block_view
from planner.profile.calibration import Calibration, default_calibration
from tests.host_overlap import full_overlap

GPT_OSS = load_model("gpt-oss-120b")
QWEN = load_model("qwen3-30b-a3b")
B200 = lookup_gpu("B200")


def _setting(micro_batch: int = 1, ep: int = 8, elementwise: str = "fused") -> UnitSetting:
    return UnitSetting(tp=1, micro_batch=micro_batch, seq_len=4096, sequence_parallel=False, dtype="bf16",
                       attention="flash", ep=ep, dispatcher="flex", elementwise=elementwise)


def _view(model: ModelSpec, calibration: Calibration | None = None) -> AnalyticProfile:
    """The profile of `model`'s first block, as `block_times` costs it (under the shipped calibration by default)."""
    return AnalyticProfile(_block_view(model, model.blocks[0]), calibration or default_calibration())


def _unclamped(model: ModelSpec) -> ModelSpec:
    """`model` with no activation clamp in any block."""
    blocks = tuple(replace(block, mlp=replace(block.mlp, activation_clamp=None)) for block in model.blocks)
    return replace(model, activation_clamp=None, layers=blocks)


def test_gpt_oss_clamps_its_experts_activation_at_seven() -> None:
    """The catalog's GPT-OSS-120B states its swiglu_limit; every block's MoE MLP carries it; Qwen3 has none."""
    assert GPT_OSS.activation_clamp == 7.0
    assert {block.mlp.activation_clamp for block in GPT_OSS.blocks} == {7.0}
    assert QWEN.activation_clamp is None


def test_hf_import_reads_gpt_oss_swiglu_limit(tmp_path: Path) -> None:
    config = {"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 2880, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088,
              "num_local_experts": 128, "num_experts_per_tok": 4, "swiglu_limit": 7.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert model_from_hf_config(config, path).activation_clamp == 7.0
    with pytest.raises(PlannerError, match="activation_clamp"):
        model_from_hf_config({**config, "swiglu_limit": -1.0}, path)


def test_the_clamp_adds_three_kernels_and_sixteen_bytes_per_routed_channel() -> None:
    """Two clamps and a concatenation per routed copy and intermediate channel, 16 B, 3 kernels more than the same
    block without the clamp."""
    clamped, plain = _view(GPT_OSS), _view(_unclamped(GPT_OSS))
    setting = _setting()
    assert clamped._routed_kernels(setting)[0] == plain._routed_kernels(setting)[0] + 3
    channels = GPT_OSS.moe_top_k * GPT_OSS.expert_ffn_hidden_size
    assert (clamped._routed_activation_bytes_per_token(setting)
            - plain._routed_activation_bytes_per_token(setting)) == pytest.approx(16 * channels)


def test_the_clamps_backward_moves_its_own_twenty_bytes_not_twice_the_forward() -> None:
    """The block's element-wise backward is twice its forward but for the clamp, whose autograd backward moves 20 B
    per routed channel in 3 kernels (not 2 × 16 B in 6)."""
    view, setting = _view(GPT_OSS), _setting()
    calibration = default_calibration()
    channels = setting.tokens * GPT_OSS.moe_top_k * GPT_OSS.expert_ffn_hidden_size
    clamp_forward = view.memory_time(B200, 16 * channels) + 3 * calibration.kernel_launch_s
    clamp_backward = view.memory_time(B200, 20 * channels) + 3 * calibration.kernel_launch_s
    rope = replace(view, model=replace(view.model, rope_scaling=None))  # the clamp alone
    assert rope._elementwise_backward(setting, B200, 1.0, moe=True) == pytest.approx(
        2 * (1.0 - clamp_forward) + clamp_backward, rel=1e-12)
    assert rope._elementwise_backward(setting, B200, 1.0, moe=False) == pytest.approx(2.0, rel=1e-12)


def test_the_clamps_blocking_copy_splits_the_routed_path_after_the_first_gemms() -> None:
    """After the dispatcher's sync the routed side runs as two host-bound passes, split by the clamp's blocking copy
    after the permute and the 16 local experts' first GEMMs (flex: one permutation on each side); at 4 × 4,096 tokens
    on B200 (MB-064's micro-batch) the first is GPU-bound and the second host-bound, so the split costs time over one
    pass."""
    calibration = full_overlap()
    view, setting = _view(GPT_OSS, calibration), _setting(micro_batch=4)
    host, looped, launch = calibration.host_kernel_s, calibration.grouped_gemm_host_s, calibration.kernel_launch_s
    memory, gemms = view._routed_kernels(setting)
    assert (memory, gemms) == (1 + 3 + 2 + 2 * 16 + 1, 32)  # activation, clamp, permutes, bias adds; 2 × 16 GEMMs
    up, down = view._routed_expert_linears(setting, B200)
    routed = (up + down + view.memory_time(B200, setting.tokens * view._routed_bytes_per_token(setting))
              + memory * launch)
    first = up + view.memory_time(B200, setting.tokens * view._permute_bytes_per_token(setting) / 2) + launch
    # the permute at host_kernel_s and the first grouped linear's 16 GEMMs at grouped_gemm_host_s; then the rest
    first_host = host + 16 * looped
    rest_host = (memory - 1) * host + 16 * looped
    expected = (1.0 - routed) + max(first, first_host) + max(routed - first, rest_host)
    assert view._synced_forward(setting, B200, 1.0, 200) == pytest.approx(expected, rel=1e-12)
    assert first > first_host and routed - first < rest_host
    assert expected > (1.0 - routed) + max(routed, memory * host + gemms * looped)


def test_gpt_oss_rotates_q_and_k_unfused_under_yarn() -> None:
    """YaRN outside MLA turns Megatron's RoPE fusion off: 20 B per rotated value and 11 kernels per rotated tensor
    (q and k) more than the fused kernel; DeepSeek-V3's YaRN (MLA) and Qwen3's plain RoPE stay fused, and eager
    element-wise training counts its own RoPE instead."""
    view, setting = _view(GPT_OSS), _setting()
    plain = replace(view, model=replace(view.model, rope_scaling=None))
    assert view._unfused_rope(setting) and not plain._unfused_rope(setting)
    assert not view._unfused_rope(_setting(elementwise="eager"))
    assert not AnalyticProfile(load_model("deepseek-v3"), default_calibration())._unfused_rope(setting)
    width = GPT_OSS.query_width + GPT_OSS.kv_width
    assert (view._elementwise_bytes_per_token(setting, moe=True)
            - plain._elementwise_bytes_per_token(setting, moe=True)) == pytest.approx(20 * width)
    assert view._block_kernels(setting, moe=True)[0] == plain._block_kernels(setting, moe=True)[0] + 22


def test_gpt_oss_blocks_cost_more_with_their_eager_chains() -> None:
    """Both chains make a GPT-OSS block slower, forward and backward, on every layer type."""
    profile = AnalyticProfile(GPT_OSS, default_calibration())
    plain = AnalyticProfile(replace(_unclamped(GPT_OSS), rope_scaling=None), default_calibration())
    setting = _setting()
    for block, plain_block in zip(profile.model.block_types(), plain.model.block_types(), strict=True):
        times, plain_times = profile.block_times(block, setting, B200), plain.block_times(plain_block, setting, B200)
        assert times.forward_s > plain_times.forward_s
        assert times.backward_s > plain_times.backward_s


def test_the_clamped_copy_is_kept_unless_moe_act_recomputes_it() -> None:
    """The fused activation keeps the clamps' concatenation, both halves (4 B per routed channel) beside the first
    matrix's output the clamps keep: freed by the moe and moe_act recompute modules, as the activation output is."""
    training = Training(global_batch=64, seq_len=4096, dtype="bf16")
    config = ParallelConfig(dp=8, tp=1, pp=1, ep=8, micro_batch=1)
    block, plain = GPT_OSS.blocks[0], _unclamped(GPT_OSS).blocks[0]
    extra = 4 * 4096 * GPT_OSS.moe_top_k * GPT_OSS.expert_ffn_hidden_size
    for module in ("moe", "moe_act"):
        assert (recompute_module_bytes(block, training, config, module)
                - recompute_module_bytes(plain, training, config, module)) == pytest.approx(extra)
    assert recompute_module_bytes(block, training, config, "layernorm") == recompute_module_bytes(
        plain, training, config, "layernorm")
