"""Heterogeneous models (issue 18, phase 1): typed blocks, model files with repeats, HF import of Gemma 2/3,
Llama 4, DeepSeek-V3 with MTP, Nemotron-H and LLaVA, published parameter counts, and per-block-type costs
(sliding-window and chunked attention, Mamba-2 scan, vision tokens) that leave every uniform model's unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.memory import block_activation_bytes, block_type_activation_bytes
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import (
    AttentionSpec,
    BlockSpec,
    MambaSpec,
    ModelSpec,
    UnitKind,
    catalog_model_names,
    load_model,
    model_from_dict,
)
from planner.profile import analytic
from planner.profile.analytic import AnalyticProfile, UnitSetting, block_forward_flops, block_type_forward_flops
from planner.profile.calibration import default_calibration

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
H100 = lookup_gpu("H100-80GB")


def hf(name: str) -> ModelSpec:
    return load_model(str(FIXTURES / f"{name}.json"))


def setting(seq_len: int, tp: int = 1, attention: str = "flash") -> UnitSetting:
    return UnitSetting(tp=tp, micro_batch=1, seq_len=seq_len, sequence_parallel=tp > 1, dtype="bf16",
                       attention=attention)


# (num_parameters, active_parameters, parameters of all blocks, block_forward_flops(model, 8192, 4096)) of every
# catalog model before blocks were typed (git HEAD of 2026-12, the uniform ModelSpec).
BEFORE = {
    "gpt3-125m": (125950464, 125950464, 85054464, 219043332096.0),
    "gpt3-350m": (356837376, 356837376, 302309376, 343597383680.0),
    "gpt3-760m": (761748480, 761748480, 679956480, 670014898176.0),
    "gpt3-1.3b": (1317654528, 1317654528, 1208598528, 1099511627776.0),
    "gpt3-2.7b": (2653967360, 2653967360, 2517647360, 1632087572480.0),
    "gpt3-6.7b": (6662266880, 6662266880, 6444154880, 3848290697216.0),
    "gpt3-13b": (12858214400, 12858214400, 12585574400, 5841155522560.0),
    "gpt3-175b": (174615846912, 174615846912, 173961510912, 31336081391616.0),
    "megatron-gpt-1.7b": (1652230656, 1652230656, 1529542656, 1352914698240.0),
    "megatron-gpt-3.6b": (3562168320, 3562168320, 3398584320, 2267742732288.0),
    "megatron-gpt-7.5b": (7467786240, 7467786240, 7249674240, 3848290697216.0),
    "megatron-gpt-18b": (18449756160, 18449756160, 18122588160, 8246337208320.0),
    "megatron-gpt-39b": (39096041472, 39096041472, 38659817472, 14293651161088.0),
    "megatron-gpt-76b": (76050739200, 76050739200, 75505459200, 21990232555520.0),
    "megatron-gpt-146b": (145622261760, 145622261760, 144967925760, 31336081391616.0),
    "megatron-gpt-310b": (310130540544, 310130540544, 309258092544, 54975581388800.0),
    "megatron-gpt-530b": (529600819200, 529600819200, 528510259200, 85212151152640.0),
    "megatron-gpt-1t": (1008038758400, 1008038758400, 1006675558400, 132284992716800.0),
    # BLOOM gained its embedding norm's 2·14336 parameters afterwards (ModelSpec.embedding_norm)
    "bloom-176b": (176247242752 + 28672, 176247242752 + 28672, 172650598400, 42331197669376.0),
    "llama2-7b": (6738415616, 6738415616, 6476267520, 3865470566400.0),
    "llama2-13b": (13015864320, 13015864320, 12688179200, 5884105195520.0),
    "llama2-70b": (68976648192, 68976648192, 68452352000, 15118284881920.0),
    "llama3-8b": (8030261248, 8030261248, 6979584000, 4123168604160.0),
    "llama3-70b": (70553706496, 70553706496, 68452352000, 15118284881920.0),
    "llama3-405b": (405853388800, 405853388800, 401650679808, 54425825574912.0),
    "mistral-7b": (7241732096, 7241732096, 6979584000, 4123168604160.0),
    "mixtral-8x7b": (46702792704, 12879925248, 46440644608, 7009923497984.0),
    "mixtral-8x22b": (140630071296, 39161468928, 140227411968, 12164152688640.0),
    "deepseek-v3": (671026404352, 37552282624, 669173039104, 12336888704285.377),
    "qwen3-30b-a3b": (30532122624, 3353032704, 29909790720, 1481763717120.0),
    "qwen3-235b-a22b": (235093634560, 22190763520, 233848970752, 4750233829376.0),
    "qwen2.5-7b": (7615616512, 7615616512, 6525618176, 4299262263296.0),
    "qwen2.5-72b": (72706203648, 72706203648, 70214778880, 15479062134784.0),
    "tiny-llama": (3426560, 3426560, 2902016, 46238007296.0),
}


@pytest.mark.parametrize("name", BEFORE)
def test_uniform_catalog_models_are_unchanged(name: str) -> None:
    model = load_model(name)
    total, active, blocks, flops = BEFORE[name]
    units = model.units()
    assert model.layers is None and model.num_layers == len(units) - 2
    assert (model.num_parameters, model.active_parameters) == (total, active)
    assert sum(unit.num_parameters for unit in units[1:-1]) == blocks
    assert all(unit.block == model.blocks[unit.index] for unit in units[1:-1])
    assert block_forward_flops(model, 8192, 4096) == pytest.approx(flops, rel=1e-12)


@pytest.mark.parametrize("name", BEFORE)
def test_per_type_times_reproduce_the_per_kind_block(name: str) -> None:
    """Phase 2 can switch to per-type costs without moving any uniform model (Mistral at s <= its window)."""
    profile = AnalyticProfile(load_model(name), default_calibration())
    for attention in ("flash", "unfused"):
        at = setting(4096, tp=2, attention=attention)
        old, new = profile.times(UnitKind.BLOCK, at, H100), profile.mean_block_times(at, H100)
        assert new.forward_s == pytest.approx(old.forward_s, rel=1e-12)
        assert new.backward_s == pytest.approx(old.backward_s, rel=1e-12)
        assert new.linear_forward_s == pytest.approx(old.linear_forward_s, rel=1e-12)


def test_catalog_has_heterogeneous_models() -> None:
    assert {"gemma3-27b", "nemotron-h-8b", "nemotron-3-nano-30b-a3b", "llava-1.5-7b"} <= set(catalog_model_names())


# ---- published parameter counts ---------------------------------------------------------------------------

def test_gemma3_27b_matches_report() -> None:
    """Gemma 3 report Table 1 (27B): 25,600M non-embedding parameters; the 417M vision encoder is not in the
    language model. 62 layers, every sixth global, the rest 1024-token windows."""
    model = load_model("gemma3-27b")
    assert model.num_parameters == 27_009_346_304
    assert round((model.num_parameters - model.embedding_parameters()) / 1e6, -2) == 25_600
    kinds = [block.attention.kind for block in model.blocks]
    assert kinds.count("full") == 10 and kinds[5] == kinds[59] == "full" and kinds[60:] == ["sliding"] * 2
    assert model == model_from_dict(model.to_dict(), "round trip")
    assert hf("gemma3-27b").blocks == model.blocks


def test_nemotron_3_nano_matches_model_card() -> None:
    """nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 model card: 31.6B total, 3.6B active with embeddings; its
    hybrid_override_pattern gives 23 Mamba-2, 6 attention and 23 MoE layers (128 experts of 1856, top 6, a shared
    expert of 3712, squared ReLU); the HF import builds the catalog's blocks."""
    model = load_model("nemotron-3-nano-30b-a3b")
    assert round(model.num_parameters / 1e9, 1) == 31.6 and round(model.active_parameters / 1e9, 1) == 3.6
    symbols = "".join(block.hybrid_symbol for block in model.blocks)
    assert symbols == "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert (symbols.count("M"), symbols.count("*"), symbols.count("E")) == (23, 6, 23)
    moe = model.blocks[1].mlp
    assert (moe.num_experts, moe.moe_top_k, moe.ffn_hidden_size, moe.shared_expert_ffn_hidden_size,
            moe.activation) == (128, 6, 1856, 3712, "relu2")
    assert hf("nemotron-3-nano-30b-a3b").blocks == model.blocks


def test_gemma2_27b_alternates_windows() -> None:
    """google/gemma-2-27b: 27.2B parameters; even layers 4096-token windows, odd layers global."""
    model = hf("gemma2-27b")
    assert round(model.num_parameters / 1e9, 1) == 27.2
    assert [block.attention.window for block in model.blocks[:3]] == [4096, None, 4096]


def test_nemotron_h_8b_matches_checkpoint() -> None:
    """nvidia/Nemotron-H-8B-Base-8K: 8,100,852,736 parameters (safetensors); 24 Mamba-2, 4 attention, 24 MLP."""
    model = load_model("nemotron-h-8b")
    assert model.num_parameters == 8_100_852_736
    assert sum(block.mamba is not None for block in model.blocks) == 24
    assert sum(block.attention is not None for block in model.blocks) == 4
    assert model.blocks[0].mamba.in_proj_width == 18560  # in_proj 4096 → 18560 in the checkpoint
    assert hf("nemotron-h-8b").blocks == model.blocks


def test_llava_15_7b_matches_checkpoint() -> None:
    """llava-hf/llava-1.5-7b-hf: 7,063,427,072 parameters = CLIP ViT-L/14-336 303,507,456 + projector
    20,979,712 + Vicuna-7B (vocabulary 32064) 6,738,939,904; the ViT runs over 577 tokens per image."""
    model = load_model("llava-1.5-7b")
    assert model.num_parameters == 7_063_427_072
    roles = [block.role for block in model.blocks]
    assert roles == ["vision"] * 25 + ["projector"] + ["decoder"] * 32 and model.num_layers == 58
    assert sum(block.parameters() for block in model.blocks[:25]) == 303_507_456
    assert model.blocks[25].parameters() == 20_979_712 and model.blocks[1].tokens == 577
    assert hf("llava-1.5-7b").blocks == model.blocks


def test_llama4_scout_and_maverick_totals() -> None:
    """Meta's Llama 4 release: Scout 17B active / 109B total, Maverick 17B / 400B, both with the vision
    encoder; the language models alone are 107.8B and 400.7B. Scout: MoE on every layer, Maverick on
    alternate ones; three layers in four attend in 8192-token chunks, the fourth (NoPE) globally."""
    scout, maverick = hf("llama4-scout"), hf("llama4-maverick")
    assert round(scout.num_parameters / 1e9, 1) == 107.8 and round(scout.active_parameters / 1e9) == 17
    assert round(maverick.num_parameters / 1e9) == 401 and round(maverick.active_parameters / 1e9) == 17
    assert [block.attention.kind for block in scout.blocks[:4]] == ["chunked"] * 3 + ["full"]
    assert not scout.blocks[3].attention.rope and scout.blocks[0].attention.window == 8192
    assert [block.mlp.is_moe for block in maverick.blocks[:4]] == [False, True, False, True]


def test_deepseek_v3_mtp_is_a_block_outside_the_published_671b() -> None:
    """DeepSeek-V3 report §1: 671B main-model parameters; the MTP module (one MoE block, the 2h → h input
    projection and three norms; embedding and output head shared) comes after the 61st block."""
    model, main = hf("deepseek-v3"), load_model("deepseek-v3")
    mtp = model.blocks[-1]
    assert model.num_layers == 62 and mtp.role == "mtp" and mtp.output_head
    assert model.num_parameters - mtp.parameters() == main.num_parameters == 671_026_404_352
    assert mtp.parameters() == main.moe_block_parameters() + 2 * 7168 * 7168 + 3 * 7168


# ---- costs per block type -------------------------------------------------------------------------------

def attention_flops(model: ModelSpec, block: BlockSpec, s: int) -> float:
    """The attention core's share of a block's forward FLOPs over one s-token sequence."""
    return block_type_forward_flops(model, block, s, s) - block_type_forward_flops(
        model, BlockSpec(block.hidden_size, mlp=block.mlp), s, s) - 2 * s * sum(a * b for a, b in block.mixer_linears)


def test_sliding_window_flops_scale_with_s_times_w() -> None:
    """Model FLOPs of the attention core: a window of w costs s·w per sequence (unhalved), full s²."""
    gemma = load_model("gemma3-27b")
    local, full = gemma.blocks[0], gemma.blocks[5]
    assert attention_flops(gemma, local, 1024) == pytest.approx(attention_flops(gemma, full, 1024))
    assert attention_flops(gemma, local, 16384) / attention_flops(gemma, local, 4096) == pytest.approx(4)
    assert attention_flops(gemma, full, 16384) / attention_flops(gemma, full, 4096) == pytest.approx(16)
    assert attention_flops(gemma, full, 16384) / attention_flops(gemma, local, 16384) == pytest.approx(16)


def test_windowed_flash_attention_time_is_linear_in_s() -> None:
    profile = AnalyticProfile(load_model("gemma3-27b"), default_calibration())
    local, full = profile.model.blocks[0], profile.model.blocks[5]
    def core(block: BlockSpec, s: int) -> float:
        return profile.block_times(block, setting(s), H100).attention_core_forward_s
    assert core(local, 1024) == core(full, 1024)
    assert core(local, 65536) / core(local, 16384) == pytest.approx(4, rel=0.02)
    # full causal: 16x the FLOPs at the higher rate of 4x the streamed key tiles per query tile
    ramp = analytic._flash_tile_utilisation(analytic._causal_mean_keys(16384)) / analytic._flash_tile_utilisation(
        analytic._causal_mean_keys(65536))
    assert core(full, 65536) / core(full, 16384) == pytest.approx(16 * ramp, rel=0.02)
    assert profile.block_times(local, setting(32768), H100).forward_s < profile.block_times(
        full, setting(32768), H100).forward_s
    unfused = setting(4096, attention="unfused")  # an unfused kernel computes every score and masks the window
    assert profile.block_times(local, unfused, H100) == profile.block_times(full, unfused, H100)


def test_chunked_attention_costs_one_chunk_per_query() -> None:
    attention = AttentionSpec("chunked", 8, 8, 128, window=1024)
    assert attention.keys_per_query(8192, causal_halving=True) == 512
    assert attention.keys_per_query(512, causal_halving=True) == 256  # a chunk longer than the sequence: full


# state-spaces/mamba issue #904: a pure Mamba-2 model (d_model 2048, 48 layers, mamba_ssm defaults: expand 2, head
# dim 64, state 128, one group) training on batches of 4 × 4,096 tokens in BF16, TFLOP/s counted as 6·N·D
MAMBA2_MEASURED_TFLOPS = {"A100-80GB": 102.5, "H200": 239.2, "GB200": 360.4}


def _pure_mamba2_step_error(gpu: str) -> float:
    block = BlockSpec(2048, mamba=MambaSpec(64, 64, 128, 1, 4, 256))
    base = ModelSpec(name="mamba2-1.4b", num_layers=48, hidden_size=2048, num_attention_heads=16,
                     ffn_hidden_size=8192, vocab_size=50288, tie_embeddings=True)
    model = replace(base, layers=(block,) * 48)
    measured_s = 6 * model.num_parameters * 4 * 4096 / (MAMBA2_MEASURED_TFLOPS[gpu] * 1e12)
    result = estimate(model, load_cluster(f"1x1x{gpu}"), Training(global_batch=4, seq_len=4096, dtype="bf16"),
                      ParallelConfig(dp=1, tp=1, pp=1, micro_batch=4))
    return result.iteration_time_s / measured_s - 1


def test_mamba_scan_efficiency_reproduces_the_measured_h200_run_and_the_other_gpus_within_a_fifth() -> None:
    """`mamba_scan_efficiency` is set by the H200 run; the A100 and GB200 runs of the same issue are the check."""
    assert _pure_mamba2_step_error("H200") == pytest.approx(0.0, abs=0.01)
    assert abs(_pure_mamba2_step_error("A100-80GB")) < 0.10
    assert abs(_pure_mamba2_step_error("GB200")) < 0.20


def test_gpt_oss_alternates_128_token_windows_with_full_attention() -> None:
    """GPT-OSS-120B's layer_types: sliding (128 tokens) first, then full, 18 times; the counts stay the model card's
    and the windowed layers' attention core is linear in the sequence."""
    model = load_model("gpt-oss-120b")
    assert [block.attention.kind for block in model.blocks] == ["sliding", "full"] * 18
    assert {block.attention.window for block in model.blocks[::2]} == {128}
    assert (model.num_parameters, model.active_parameters) == (116829050688, 5711876928)
    profile = AnalyticProfile(model, default_calibration())
    window, full = model.blocks[0], model.blocks[1]
    core = [profile.block_times(window, setting(s), H100).attention_core_forward_s for s in (16384, 65536)]
    assert core[1] / core[0] == pytest.approx(4, rel=0.02)
    assert core[1] < profile.block_times(full, setting(65536), H100).attention_core_forward_s / 50


def test_mamba_costs_are_positive_and_linear_in_s() -> None:
    model = load_model("nemotron-h-8b")
    profile = AnalyticProfile(model, default_calibration())
    mamba = model.blocks[0]
    times = [profile.block_times(mamba, setting(s), H100) for s in (4096, 8192, 16384)]
    assert all(t.forward_s > 0 and t.backward_s > t.forward_s for t in times)
    assert times[2].forward_s / times[1].forward_s == pytest.approx(2, rel=0.03)
    assert times[1].forward_s / times[0].forward_s == pytest.approx(2, rel=0.03)
    assert times[0].attention_core_forward_s == 0 and times[0].linear_forward_s[2:] == (0.0, 0.0)
    flops = [block_type_forward_flops(model, mamba, s, s) for s in (4096, 8192)]
    assert flops[1] == pytest.approx(2 * flops[0])
    in_out = 2 * 4096 * (4096 * 18560 + 8192 * 4096)
    assert flops[0] == pytest.approx(in_out + 7 * 4096 * 8192 * 128)  # Megatron-LM's scan count


def test_vision_blocks_run_at_their_own_token_count() -> None:
    model = load_model("llava-1.5-7b")
    profile = AnalyticProfile(model, default_calibration())
    vit = model.blocks[1]
    assert profile.block_times(vit, setting(2048), H100) == profile.block_times(vit, setting(8192), H100)
    assert block_type_forward_flops(model, vit, 8192, 4096) == pytest.approx(
        2 * block_type_forward_flops(model, vit, 4096, 4096))  # twice the samples, one image each
    times = profile.times_by_type(setting(4096), H100)
    assert len(times) == 4 and all(t.forward_s > 0 for t in times.values())
    mean = profile.times(UnitKind.BLOCK, setting(4096), H100)
    assert mean.forward_s * model.num_layers == pytest.approx(sum(times[block].forward_s for block in model.blocks))


def test_activation_bytes_per_type() -> None:
    training, config = Training(seq_len=4096), ParallelConfig(dp=1, tp=2, pp=1, sequence_parallel=True)
    llama = load_model("llama3-8b")
    assert block_type_activation_bytes(llama, llama.blocks[0], training, config) == pytest.approx(
        block_activation_bytes(llama, 4096, 1, 2, True, Recompute.NONE, "flash"))
    nemotron = load_model("nemotron-h-8b")
    mamba = [block_type_activation_bytes(nemotron, nemotron.blocks[0], Training(seq_len=s), config)
             for s in (4096, 8192)]
    assert mamba[0] > 0 and mamba[1] == pytest.approx(2 * mamba[0])


# ---- model files ------------------------------------------------------------------------------------------

BASE = {"name": "m", "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 512, "vocab_size": 1000}


def test_model_file_repeats_groups_and_types() -> None:
    local = {"attention": {"kind": "sliding", "window": 64}}
    mamba = {"mamba": {"num_heads": 8, "head_dim": 64, "state_size": 16}, "mlp": "none"}
    pattern = {"repeat": 3, "layers": [{"type": "local", "repeat": 5}, {"attention": "full"}]}
    model = model_from_dict({**BASE, "block_types": {"local": local}, "layers": [pattern, mamba]}, "file")
    assert model.num_layers == 19
    assert [b.describe() for b in model.blocks[:6]] == ["sliding(64)+dense"] * 5 + ["full+dense"]
    assert model.blocks[-1].describe() == "mamba" and model.blocks[0].mlp.ffn_hidden_size == 512
    assert model == model_from_dict(json.loads(json.dumps(model.to_dict())), "round trip")


@pytest.mark.parametrize(("layers", "message"), [
    ([{"attention": "slide"}], r"layers\[0\]: attention kind 'slide' is not one of full, bidirectional"),
    ([{"attention": "sliding"}], r"layers\[0\]: attention kind 'sliding' needs a window"),
    ([{"attention": {"kind": "full", "window": 8}}], "takes no window"),
    ([{"mlp": "moe"}], "mlp kind moe needs num_experts"),
    ([{"mlp": "sparse"}], "mlp kind 'sparse' is not one of dense, moe"),
    ([{"repeat": 0}], r"layers\[0\]: repeat must be an integer in 1..4,096, got 0"),
    ([{"repeat": 4000}, {"repeat": 200}], r"layers\[1\]: repeats give more than 4,096 layers"),
    ([{"repeat": 2, "layers": [{}], "mlp": "none"}], "a group takes only repeat and layers"),
    ([{"type": "nope"}], "unknown block type 'nope'"),
    ([{"mixer": "mamba"}], r"unknown layer key\(s\) mixer; allowed:"),
    ([{"mamba": {"num_heads": 8}}], "mamba is missing head_dim, state_size"),
    ([{"mamba": {"num_heads": 8, "head_dim": 64, "state_size": 16}, "attention": "full"}], "one mixer"),
    ([{"attention": "none", "mlp": "none"}], "needs attention, mamba, an mlp or linears"),
    ([{"hidden_size": 100, "attention": {"num_attention_heads": 8}}], "100 is not divisible by num_attention_heads 8"),
    ([], "non-empty list"),
])
def test_bad_model_files_name_the_entry(layers: list, message: str) -> None:
    with pytest.raises(PlannerError, match=message):
        model_from_dict({**BASE, "layers": layers}, "file")


def test_num_layers_must_match_layers() -> None:
    with pytest.raises(PlannerError, match="num_layers is 3 but layers give 2 blocks"):
        model_from_dict({**BASE, "num_layers": 3, "layers": [{"repeat": 2}]}, "file")


@pytest.mark.parametrize(("name", "change", "message"), [
    ("nemotron-h-8b", {"hybrid_override_pattern": "M-E"}, "one character per layer"),
    ("nemotron-h-8b", {"hybrid_override_pattern": "M-E" * 17 + "X"}, r"E \(an MoE layer\); got"),
    ("nemotron-h-8b", {"hybrid_override_pattern": "M-E" * 17 + "M"}, "n_routed_experts"),
    ("llava-1.5-7b", {"text_config": {"model_type": "t5"}}, "text_config model_type 't5'"),
    ("llama4-maverick", {"no_rope_layers": [1, 0]}, "'no_rope_layers' must list one entry per layer"),
])
def test_bad_hf_configs(tmp_path, name: str, change: dict, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads((FIXTURES / f"{name}.json").read_text()), **change}))
    with pytest.raises(PlannerError, match=message):
        load_model(str(path))
