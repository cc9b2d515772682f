"""Model specs: published parameter counts, HF config import, catalog and bad input."""

from __future__ import annotations

import json

import pytest

from planner.errors import PlannerError
from planner.model import ModelSpec, UnitKind, catalog_model_names, load_model

# Published counts: Meta's model cards / HF safetensors metadata, Mistral AI's Mixtral release, bigscience/bloom's
# model card (its embedding LayerNorm included).
PUBLISHED_PARAMETERS = {
    "bloom-176b": 176_247_271_424,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
    "llama2-7b": 6_738_415_616,
    "llama2-70b": 68_976_648_192,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-72b": 72_706_203_648,
}


@pytest.mark.parametrize(("name", "count"), PUBLISHED_PARAMETERS.items())
def test_parameter_counts_match_published(name: str, count: int) -> None:
    assert load_model(name).num_parameters == count


def narayanan_eq2(layers: int, hidden: int, vocab: int = 51200, seq: int = 2048) -> float:
    """Narayanan et al. 2021 eq. 2: P = 12 l h² (1 + 13/(12h) + (V + s)/(12 l h))."""
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "published_billions"),
    [  # Narayanan et al. 2021 Table 1 (params column) and GPT-3 175B
        ("megatron-gpt-1.7b", 24, 2304, 1.7),
        ("megatron-gpt-7.5b", 36, 4096, 7.5),
        ("megatron-gpt-39b", 48, 8192, 39.1),
        ("megatron-gpt-146b", 80, 12288, 145.6),
        ("megatron-gpt-530b", 105, 20480, 529.6),
        ("megatron-gpt-1t", 128, 25600, 1008.0),
        ("gpt3-175b", 96, 12288, 174.6),
    ],
)
def test_gpt_family_matches_narayanan_eq2(name: str, layers: int, hidden: int, published_billions: float) -> None:
    model = load_model(name)
    # eq. 2 leaves out the final LayerNorm (2h: weight and bias); everything else matches exactly
    assert model.num_parameters == pytest.approx(narayanan_eq2(layers, hidden) + 2 * hidden, abs=1)
    assert round(model.num_parameters / 1e9, 1) == published_billions


def test_units_are_embedding_blocks_head_in_order() -> None:
    model = load_model("llama3-8b")
    units = model.units()
    assert [u.kind for u in units] == [UnitKind.EMBEDDING] + [UnitKind.BLOCK] * 32 + [UnitKind.HEAD]
    assert [u.index for u in units[1:-1]] == list(range(32))
    assert sum(u.num_parameters for u in units) == model.num_parameters


def test_catalog_has_required_models() -> None:
    required = {"gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
                "mistral-7b", "mixtral-8x7b", "qwen2.5-72b"}
    assert required <= set(catalog_model_names())


HF_CONFIGS = {
    "llama": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "max_position_embeddings": 8192, "tie_word_embeddings": False}, 8_030_261_248),
    "mistral": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                 "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                 "vocab_size": 32000, "max_position_embeddings": 32768}, 7_241_732_096),
    "mixtral": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                 "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                 "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}, 46_702_792_704),
    "qwen2": ({"model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568, "num_attention_heads": 64,
               "num_hidden_layers": 80, "num_key_value_heads": 8, "vocab_size": 152064,
               "tie_word_embeddings": False}, 72_706_203_648),
    # GPT-2 small: 124,439,808 parameters (HF gpt2 checkpoint)
    "gpt2": ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
              "vocab_size": 50257}, 124_439_808),
    # Pythia-160M (gpt_neox): 162,322,944 parameters
    "gpt_neox": ({"model_type": "gpt_neox", "hidden_size": 768, "intermediate_size": 3072,
                  "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50304,
                  "max_position_embeddings": 2048, "tie_word_embeddings": False}, 162_322_944),
}


@pytest.mark.parametrize("model_type", HF_CONFIGS)
def test_hf_config_import(tmp_path, model_type: str) -> None:
    config, expected = HF_CONFIGS[model_type]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert load_model(str(path)).num_parameters == expected


def test_hf_config_unsupported_type(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(PlannerError, match="model_type 't5' is not supported"):
        load_model(str(path))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("{not json", "not valid JSON"),
        ('{"model_type": "llama", "num_attention_heads": 8}', "'num_hidden_layers' must be a positive integer"),
        ("[1, 2]", "expected a mapping"),
    ],
)
def test_bad_model_files(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(PlannerError, match=message):
        load_model(str(path))


def test_unknown_model_name() -> None:
    with pytest.raises(PlannerError, match="unknown model 'llama9'"):
        load_model("llama9")


def test_invalid_architecture_is_rejected() -> None:
    with pytest.raises(PlannerError, match="num_key_value_heads 5 must divide"):
        ModelSpec("bad", 2, 64, 8, 256, 100, num_key_value_heads=5)
    with pytest.raises(PlannerError, match="moe_top_k"):
        ModelSpec("bad", 2, 64, 8, 256, 100, num_experts=2, moe_top_k=3)


def test_vocab_is_padded_like_megatron() -> None:
    """Megatron-LM pads the vocabulary to a multiple of 128 × tp (GPT-2's 50257 → 50304)."""
    gpt2 = ModelSpec("gpt2", 12, 768, 12, 3072, 50257)
    assert gpt2.padded_vocab_size(1) == 50304
    assert gpt2.padded_vocab_size(8) == 51200
    assert load_model("llama3-8b").padded_vocab_size(1) == 128256


@pytest.mark.parametrize("name", catalog_model_names())
def test_parameter_tensors_add_up_to_the_parameters(name: str) -> None:
    """Tensor by tensor (what per-tensor ZeRO-3 issues collectives for), every unit adds up to its count."""
    model = load_model(name)
    for block in model.block_types():
        assert sum(block.tensor_sizes()) == block.parameters(), block.describe()
    assert sum(model.embedding_tensor_sizes()) == model.embedding_parameters()
    assert sum(model.head_tensor_sizes()) == model.head_parameters()


def test_gpt_block_has_twelve_tensors_four_of_them_weight_matrices() -> None:
    """A GPT-3 block in Megatron-LM's layout: 2 LayerNorms (weight, bias), fused QKV and output projection,
    fc1 and fc2, each with a bias; only the 4 weight matrices exceed DeepSpeed's 1e5-element persistence
    threshold."""
    sizes = next(iter(load_model("gpt3-175b").block_types())).tensor_sizes()
    h = 12288
    assert len(sizes) == 12
    assert sorted(size for size in sizes if size >= 100_000) == sorted([3 * h * h, h * h, 4 * h * h, 4 * h * h])
