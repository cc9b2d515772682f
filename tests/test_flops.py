"""FLOP counts against Narayanan et al. 2021 eq. 3 and Korthikanti et al. 2022 eqs. 7–8."""

from __future__ import annotations

import pytest

from planner.config import Training
from planner.cost.estimate import model_flops_per_iteration
from planner.gpu import lookup_gpu
from planner.model import ModelSpec, UnitKind, load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting, block_forward_flops, head_forward_flops
from planner.profile.calibration import Calibration, default_calibration
from tests.host_overlap import full_overlap

GPT_MODELS = ["gpt3-175b", "megatron-gpt-1t", "megatron-gpt-530b", "megatron-gpt-18b"]


@pytest.mark.parametrize("name", GPT_MODELS)
@pytest.mark.parametrize("batch", [1, 1536])
def test_narayanan_eq3_counts_forward_backward_and_recompute(name: str, batch: int) -> None:
    """Eq. 3: F = 96 B s l h² (1 + s/(6h) + V/(16 l h)), with full recompute (4 forwards of the blocks)."""
    model = load_model(name)
    s, layers, h, v = 2048, model.num_layers, model.hidden_size, model.vocab_size
    tokens = batch * s
    ours = 4 * layers * block_forward_flops(model, tokens, s) + 3 * head_forward_flops(model, tokens)
    expected = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    assert ours == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", GPT_MODELS)
def test_model_flops_are_korthikanti_eq7(name: str) -> None:
    """Eq. 7: 72 B L s h² (1 + s/(6h) + v/(12 h L)) — forward + backward, no recompute."""
    model = load_model(name)
    training = Training(global_batch=512, seq_len=2048)
    b, s, layers, h, v = 512, 2048, model.num_layers, model.hidden_size, model.vocab_size
    expected = 72 * b * layers * s * h**2 * (1 + s / (6 * h) + v / (12 * h * layers))
    assert model_flops_per_iteration(model, training) == pytest.approx(expected, rel=1e-12)


def test_gqa_and_swiglu_counts_follow_the_shapes() -> None:
    """Llama-3-8B block: QKV 2·t·h·(h + 2·1024), output 2·t·h², SwiGLU 3 matrices of h × 14336."""
    model = load_model("llama3-8b")
    t, s, h = 4096, 4096, 4096
    expected = 2 * t * h * (h + 2 * 1024) + 2 * t * h * h + 3 * 2 * t * h * 14336 + 4 * t * s * h
    assert block_forward_flops(model, t, s) == expected
    assert block_forward_flops(model, t, s, causal_halving=True) == expected - 2 * t * s * h


def _gpt_block(hidden: int) -> ModelSpec:
    """A GPT-2-shaped model (GELU, LayerNorm, learned positions, biases, dropout) of width `hidden`."""
    return ModelSpec(name=f"gpt-h{hidden}", num_layers=24, hidden_size=hidden, num_attention_heads=16,
                     ffn_hidden_size=4 * hidden, vocab_size=50257, activation="gelu", normalization="layernorm",
                     position_embedding="learned", linear_bias=True, dropout=True)


def _block_forward(model: ModelSpec, calibration: Calibration, tp: int, micro_batch: int) -> float:
    """Forward time of one fp16 block with unfused attention at sequence 1024 on an A100."""
    setting = UnitSetting(tp, micro_batch, 1024, False, "fp16", "unfused")
    return AnalyticProfile(model, calibration).times(UnitKind.BLOCK, setting, lookup_gpu("A100-80GB")).forward_s


def test_a_thin_block_is_host_bound_and_a_wide_one_is_not() -> None:
    """A 1024-wide block split 8 ways runs its kernels faster than eager PyTorch launches them: its forward is
    kernels × host_kernel_s (8 element-wise incl. softmax, dropout and transpose copy, 4 linears + 2 batched
    GEMMs, 2 all-reduces); a 12288-wide block at micro-batch 4 is GPU-bound, so the host cost changes nothing."""
    calibration = full_overlap()
    thin = _block_forward(_gpt_block(1024), calibration, tp=8, micro_batch=1)
    assert thin == pytest.approx(16 * calibration.host_kernel_s, rel=1e-12)
    assert _block_forward(_gpt_block(1024), calibration.updated(host_kernel_s=0.0), 8, 1) < thin / 2
    wide = _block_forward(_gpt_block(12288), calibration, tp=1, micro_batch=4)
    assert wide == _block_forward(_gpt_block(12288), calibration.updated(host_kernel_s=0.0), 1, 4)


def test_every_block_kernel_pays_the_launch_cost() -> None:
    """The 6 GEMMs (4 linears, 2 batched attention GEMMs) and the 8 memory-bound kernels of an unfused GPT
    block (2 norms, 2 bias-dropout-adds, GELU, softmax, attention dropout, output transpose copy) each pay
    kernel_launch_s once in the forward."""
    base = default_calibration().updated(host_kernel_s=0.0, kernel_launch_s=0.0)
    step = 1e-3
    model = _gpt_block(4096)
    extra = _block_forward(model, base.updated(kernel_launch_s=step), 1, 2) - _block_forward(model, base, 1, 2)
    assert extra == pytest.approx((6 + 8) * step, rel=1e-9)
