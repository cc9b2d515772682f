"""MoE and MLA models: published total and active parameter counts, HF import of deepseek_v3, qwen3,
qwen3_moe, mixtral and gpt_oss configs, and the MoE fields' validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import PlannerError
from planner.model import ModelSpec, load_model

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

# (total, active) as published, in billions, at the precision each source gives them: DeepSeek-V3
# report §1 (671B total, 37B activated; the 14B multi-token-prediction module excluded), Qwen3 model
# cards (30.5B / 3.3B, 235B / 22B), Mistral AI's Mixtral 8x22B release (141B / 39B) and Mixtral 8x7B
# (46.7B / 12.9B). Sources round or truncate (DeepSeek-V3 37.55B is "37B"), so the counts must agree
# within one unit of the last digit given.
PUBLISHED_TOTAL_ACTIVE = {
    "deepseek-v3": (671, 37, 0),
    "qwen3-30b-a3b": (30.5, 3.3, 1),
    "qwen3-235b-a22b": (235, 22, 0),
    "mixtral-8x22b": (141, 39, 0),
    "mixtral-8x7b": (46.7, 12.9, 1),
}


@pytest.mark.parametrize(("name", "published"), PUBLISHED_TOTAL_ACTIVE.items())
def test_moe_total_and_active_parameters_match_published(name: str, published: tuple[float, float, int]) -> None:
    total, active, digits = published
    model = load_model(name)
    unit = 10.0 ** -digits
    assert abs(model.num_parameters / 1e9 - total) < unit
    assert abs(model.active_parameters / 1e9 - active) < unit


def test_gpt_oss_120b_matches_model_card_table() -> None:
    """gpt-oss model card Table 1: 116.83B total, 5.13B active; the card counts the unembedding
    among the active parameters but not the embedding lookup."""
    model = load_model("gpt-oss-120b")
    assert round(model.num_parameters / 1e9, 2) == 116.83
    assert round((model.active_parameters - model.embedding_parameters()) / 1e9, 2) == 5.13


def test_moonlight_matches_its_report_without_embeddings() -> None:
    """Moonlight report (arXiv:2502.16982): 15.29B total, 2.24B activated, embeddings excluded; 27 blocks, the
    first dense (MLP 11264), MLA with no query low-rank, 64 routed experts of 1408 (top 6) and two shared."""
    model = load_model("moonlight-16b-a3b")
    embeddings = model.embedding_parameters() + model.head_parameters()
    assert round((model.num_parameters - embeddings) / 1e9, 2) == 15.29
    assert round((model.active_parameters - embeddings) / 1e9, 2) == 2.24
    assert model.num_moe_layers == 26 and model.is_mla and model.blocks[0].attention.q_lora_rank is None
    assert load_model(str(FIXTURES / "moonlight-16b-a3b.json")).blocks == model.blocks


def test_deepseek_v3_exact_count_and_structure() -> None:
    """61 blocks: 3 dense (MLP 18432) then 58 MoE (256 routed + 1 shared expert of 2048, top-8), MLA."""
    model = load_model("deepseek-v3")
    assert model.num_parameters == 671_026_404_352
    assert model.num_moe_layers == 58 and model.is_mla
    # MLA per layer: q down 7168·1536, q up 1536·128·192, kv down 7168·576, kv up 512·128·256,
    # output 128·128·7168, plus the q and kv latent norms
    assert model.attention_parameters() == (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256
                                            + 128 * 128 * 7168 + 1536 + 512)
    blocks = [unit.num_parameters for unit in model.units()[1:-1]]
    assert blocks[:3] == [model.dense_block_parameters()] * 3
    assert blocks[3:] == [model.moe_block_parameters()] * 58
    assert model.block_parameters() * 61 == pytest.approx(sum(blocks))


DEEPSEEK_V3_HF = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61, "vocab_size": 129280,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 163840, "rope_scaling": {"type": "yarn", "factor": 40},
}
QWEN3_MOE_HF = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
    "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "tie_word_embeddings": False,
}
GPT_OSS_HF = {
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 36, "vocab_size": 201088,
    "num_local_experts": 128, "num_experts_per_tok": 4, "attention_bias": True, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}
MIXTRAL_8X22B_HF = {
    "model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384, "num_attention_heads": 48,
    "num_key_value_heads": 8, "num_hidden_layers": 56, "vocab_size": 32768, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 65536,
}
# Qwen3-8B (dense qwen3): 8,190,735,360 parameters (HF safetensors metadata)
QWEN3_8B_HF = {
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36, "vocab_size": 151936,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(("config", "catalog"), [
    (DEEPSEEK_V3_HF, "deepseek-v3"), (QWEN3_MOE_HF, "qwen3-30b-a3b"), (GPT_OSS_HF, "gpt-oss-120b"),
    (MIXTRAL_8X22B_HF, "mixtral-8x22b"),
])
def test_hf_moe_import_matches_catalog(tmp_path, config: dict, catalog: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    imported, expected = load_model(str(path)), load_model(catalog)
    assert (imported.num_parameters, imported.active_parameters) == (
        expected.num_parameters, expected.active_parameters)
    assert imported.sliding_window is None  # GPT-OSS's windows alternate with full layers


def test_hf_qwen3_dense_import(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B_HF))
    assert load_model(str(path)).num_parameters == 8_190_735_360


@pytest.mark.parametrize(("fields", "match"), [
    ({"num_experts": 8, "moe_top_k": 2, "first_dense_layers": 4}, "first_dense_layers"),
    ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
    ({"num_experts": 8, "moe_top_k": 2, "shared_expert_ffn_hidden_size": 0}, "shared_expert_ffn_hidden_size"),
])
def test_bad_moe_fields_are_refused(fields: dict, match: str) -> None:
    with pytest.raises(PlannerError, match=match):
        ModelSpec("bad", 4, 64, 8, 256, 100, **fields)
