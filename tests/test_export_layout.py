"""Exports carry the heterogeneous layout (issue 18 item 5): a plan's stage split and its models' unit types
reach each framework in its own representation, read back by the framework's own code where it is installed
(megatron-core's PipelineParallelLayerLayout and hybrid allocate_layers, torchtitan's ConfigManager), and what
a framework cannot state is refused with a PlannerError that names it."""

from __future__ import annotations

import json
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_export_frameworks import TORCHTITAN_CHECK, needs_torchtitan, run_script
from test_export_megatron import check_megatron_rules, megatron_core, needs_megatron_core
from test_export_plans import make_plan, parse_flags

from planner.errors import PlannerError
from planner.export import export_plan
from planner.export.deepspeed import export_deepspeed, method_split
from planner.export.flags import decoder_blocks, layer_pattern
from planner.export.megatron import export_megatron, parse_layout, split_arguments
from planner.export.torchtitan import module_fqns
from planner.model import load_model

DEEPSEEK_V3 = "tests/fixtures/hf/deepseek-v3.json"  # HF import: 61 layers, then the MTP module as an `mtp` block
NEMOTRON_H = Path("tests/fixtures/hf/nemotron-h-8b.json")
UNEVEN = (7, 8, 9, 8)  # llama3-8b over pp = 4, neither uniform nor first/last-only


def megatron_args_of(plan) -> dict[str, list[str]]:
    return parse_flags(export_megatron(plan).files["megatron_args.txt"])


def deepseek_plan(blocks: tuple[int, ...], **parallel):
    return make_plan(model=DEEPSEEK_V3, cluster="16x8xH100-80GB", tp=8, ep=8, etp=1, blocks=blocks, **parallel)


def core_plans() -> dict[str, object]:
    """The plans whose layouts megatron-core reads, by name."""
    return {"llama": make_plan(blocks=UNEVEN), "gemma": make_plan(model="gemma3-27b", blocks=(14, 17, 16, 15)),
            "deepseek": deepseek_plan((15, 16, 16, 15), pp=4),
            "deepseek vpp": deepseek_plan((7, 8, 8, 8, 8, 8, 8, 7), pp=4, vpp=2, global_batch=128),
            "nemotron": make_plan(model="nemotron-h-8b", blocks=(12, 14, 14, 12))}


@cache
def core_reading() -> tuple[dict[str, object], dict[str, list], str]:
    """One megatron-core run (it takes seconds to load) over every plan above: plans, layouts read per plan
    (per pp rank, per virtual stage, [decoder, mtp] layers), and the hybrid pattern as allocate_layers builds it."""
    plans = core_plans()
    layouts = {name: megatron_args_of(plan)["--pipeline-model-parallel-layout"][0]
               for name, plan in plans.items() if name != "nemotron"}
    cases = [(text, plans[name].parallel.pp, len(decoder_blocks(plans[name].model)),
              1 if name.startswith("deepseek") else None) for name, text in layouts.items()]
    pattern = megatron_args_of(plans["nemotron"])["--hybrid-override-pattern"][0]
    read, (allocated,) = megatron_core(cases, (pattern,))
    return plans, dict(zip(layouts, read, strict=True)), allocated


# ---- llama3-8b, a non-uniform split, in each framework's representation -------------------------

@needs_megatron_core
def test_uneven_llama_split_round_trips_through_megatron_cores_layout():
    plans, read, _ = core_reading()
    args = check_megatron_rules(plans["llama"], export_megatron(plans["llama"]).files)
    assert args["--pipeline-model-parallel-layout"] == ["Et*7|t*8|t*9|t*8L"]
    assert read["llama"] == [[[blocks, 0]] for blocks in UNEVEN]


@needs_torchtitan
def test_uneven_llama_split_round_trips_through_torchtitans_config_manager(tmp_path):
    plan = make_plan(blocks=UNEVEN)
    path = tmp_path / "uneven.toml"
    path.write_text(export_plan(plan, "torchtitan").files["torchtitan.toml"])
    (parsed,) = run_script(TORCHTITAN_CHECK, [(str(path), plan.parallel.num_gpus)])
    starts = [0, 7, 15, 24, 32]
    expected = [[f"layers.{i}" for i in range(a, b)] for a, b in pairwise(starts)]
    expected[0].insert(0, "tok_embeddings")
    expected[-1] += ["norm", "output"]
    assert parsed["parts"] == expected == module_fqns(plan)
    assert parsed["pp"] == 4 and parsed["blocks"] == list(UNEVEN)


def test_deepspeed_says_which_split_each_partition_method_builds_instead_of_the_uneven_one():
    """DeepSpeed takes no stage boundaries: the export keeps the plan's split out of its files and its notes
    say so, with the split each partition_method builds."""
    notes = "\n".join(export_deepspeed(make_plan(blocks=UNEVEN)).notes)
    assert "no partition_method builds the plan's split (7,8,9,8" in notes and "DeepSpeed#2974" in notes
    model = load_model("llama3-8b")
    for method in ("uniform", "parameters", "type:transformer"):
        assert f"{method}: {','.join(map(str, method_split(model, 4, method)))} →" in notes


# ---- DeepSeek-V3: dense then MoE layers, and its MTP module -------------------------------------

@needs_megatron_core
def test_deepseek_mtp_sits_on_the_last_stage_and_megatron_core_accepts_it():
    plans, read, _ = core_reading()
    for name in ("deepseek", "deepseek vpp"):
        args = megatron_args_of(plans[name])
        assert args["--num-layers"] == ["61"] and args["--mtp-num-layers"] == ["1"]
        assert eval(args["--moe-layer-freq"][0]) == [0] * 3 + [1] * 58  # moe_freq_type evaluates the expression
        layout = args["--pipeline-model-parallel-layout"][0]
        assert layout.endswith("mL") and parse_layout(layout)[-1][-2:] == ["m", "L"]
    assert read["deepseek"] == [[[15, 0]], [[16, 0]], [[16, 0]], [[14, 1]]]
    assert read["deepseek vpp"][3] == [[8, 0], [6, 1]]  # the last virtual stage of the last rank


def test_mtp_even_with_a_uniform_decoder_split_is_given_as_a_layout():
    plan = deepseek_plan((16, 15, 15, 16), pp=4)  # 15 decoder layers on the last stage, then MTP
    assert split_arguments(plan) == (("--pipeline-model-parallel-layout", "Et*16|t*15|t*15|t*15mL"),)


def test_mtp_off_the_last_stage_is_refused():
    plan = deepseek_plan((16, 16, 30, 0), pp=4)  # MTP on stage 2, the last stage holds only the head
    with pytest.raises(PlannerError, match=r"multi-token-prediction block\(s\) must sit on the last pipeline "
                                           r"stage.*stage\(s\) 2 of 0\.\.3"):
        export_megatron(plan)


def test_mtp_models_are_refused_by_the_targets_that_cannot_build_them():
    plan = make_plan(model=DEEPSEEK_V3, cluster="16x8xH100-80GB", tp=8, ep=4, etp=8, blocks=(15, 16, 16, 15))
    # (DeepSpeed splits experts over every TP rank: etp = tp)
    with pytest.raises(PlannerError, match=r"multi-token-prediction .* Megatron-DeepSpeed does not build"):
        export_deepspeed(plan)
    with pytest.raises(PlannerError, match=r"torchtitan 0\.2\.2 has no model"):
        export_plan(plan, "torchtitan")


# ---- Gemma 3: five sliding-window layers per global one ----------------------------------------

@needs_megatron_core
def test_gemma3_window_pattern_and_uneven_split_reach_megatron():
    model = load_model("gemma3-27b")
    plans, read, _ = core_reading()
    plan = plans["gemma"]
    args = check_megatron_rules(plan, export_megatron(plan).files)
    sliding = [int(block.attention.kind == "sliding") for block in model.blocks]
    assert args["--window-size"] == ["1023,0"] and eval(args["--window-attn-skip-freq"][0]) == sliding
    assert args["--window-attn-skip-freq"] == ["([1]*5+[0]*1)*10+[1]*2"] and "--qk-layernorm" in args
    assert read["gemma"] == [[[14, 0]], [[17, 0]], [[16, 0]], [[15, 0]]]
    notes = "\n".join(export_megatron(plan).notes)
    assert "geglu" in notes and "post-norms" in notes  # no Megatron-LM flag: said, not dropped silently


def test_gemma3_on_deepspeed_says_it_has_no_sliding_window():
    result = export_deepspeed(make_plan(model="gemma3-27b", blocks=(16, 15, 15, 16)))
    assert any("no sliding-window attention" in note and "1024 tokens" in note for note in result.notes)


# ---- Nemotron-H: Mamba-2, attention and MLP layers ---------------------------------------------

@needs_megatron_core
def test_nemotron_h_pattern_is_hfs_and_megatron_cores_allocation_reads_it():
    plans, _, allocated = core_reading()
    plan = plans["nemotron"]
    files = export_megatron(plan).files
    args = check_megatron_rules(plan, files)
    pattern = args["--hybrid-override-pattern"][0]
    assert pattern == json.loads(NEMOTRON_H.read_text())["hybrid_override_pattern"]
    assert allocated == pattern and args["--num-layers"] == [str(len(pattern))]
    assert (args["--decoder-first-pipeline-num-layers"], args["--decoder-last-pipeline-num-layers"]) == (["12"], ["12"])
    assert args["--mamba-num-heads"] == ["128"] and args["--mamba-state-dim"] == ["128"] and "--squared-relu" in args
    assert args["--spec"] == ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
    assert "pretrain_mamba.py" in files["torchrun.sh"] and "pretrain_gpt.py" not in files["torchrun.sh"]


def test_nemotron_h_splits_megatrons_hybrid_stack_cannot_take_are_refused():
    with pytest.raises(PlannerError, match=r"hybrid .* evenly or with only the first and last .* 12,13,14,13"):
        export_megatron(make_plan(model="nemotron-h-8b", blocks=(12, 13, 14, 13)))
    with pytest.raises(PlannerError, match="no virtual pipeline stages; the plan has vpp=2"):
        export_megatron(make_plan(model="nemotron-h-8b", blocks=(7, 6, 7, 6, 7, 6, 7, 6), vpp=2))
    with pytest.raises(PlannerError, match="Mamba layers, which Megatron-DeepSpeed does not build"):
        export_deepspeed(make_plan(model="nemotron-h-8b", blocks=(13,) * 4))


# ---- LLaVA: a vision tower and projector before the language model -----------------------------

@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_llava_is_refused_naming_what_is_missing(target):
    plan = make_plan(model="llava-1.5-7b", blocks=(28, 10, 10, 10))
    expected = r"torchtitan 0\.2\.2 has no model" if target == "torchtitan" else (
        r"vision encoder and projector .*no encoder unit.*examples/multimodal")
    with pytest.raises(PlannerError, match=expected):
        export_plan(plan, target)


# ---- the pieces ---------------------------------------------------------------------------------

def test_decoder_blocks_leave_out_vision_projector_and_mtp_blocks():
    assert len(decoder_blocks(load_model("llava-1.5-7b"))) == 32
    assert len(decoder_blocks(load_model(DEEPSEEK_V3))) == 61
    assert len(decoder_blocks(load_model("gemma3-27b"))) == 62


@given(st.lists(st.integers(min_value=0, max_value=1), min_size=1, max_size=80))
def test_layer_pattern_evaluates_to_the_layers_it_describes(bits):
    assert eval(layer_pattern(bits)) == bits  # Megatron's moe_freq_type evaluates it the same way
