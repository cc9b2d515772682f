"""FLOP counts against Narayanan et al. 2021 eq. 3 and Korthikanti et al. 2022 eqs. 7–8."""

from __future__ import annotations

import pytest

from planner.config import Training
from planner.cost.estimate import model_flops_per_iteration
from planner.model import load_model
from planner.profile.analytic import block_forward_flops, head_forward_flops

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
