"""Megatron-LM export checked against Megatron's own rules (../shared/REFERENCE.md §1), re-implemented
here: arguments.py (DP derivation, batch divisibility, flag exclusions, CUDA_DEVICE_MAX_CONNECTIONS),
TransformerConfig (uneven first/last split), pipeline_parallel_layer_layout.py (layout grammar), and
a round trip of the split back to the plan's blocks per virtual stage."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export_plans import make_plan, parse_flags

from planner.config import Partition
from planner.errors import PlannerError
from planner.export.megatron import export_megatron, layout_string, parse_layout, split_arguments
from planner.model import load_model
from planner.plan import Plan


def megatron_split(args: dict[str, list[str]], num_layers: int) -> list[int]:
    """Decoder layers per virtual stage as Megatron builds them, validating its split rules on the way."""
    pp = int(args["--pipeline-model-parallel-size"][0])
    split_flags = {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                   "--pipeline-model-parallel-layout"} & set(args)
    assert len(split_flags) <= 1, f"Megatron accepts at most one of {split_flags}"
    if "--pipeline-model-parallel-layout" in args:
        assert "--decoder-first-pipeline-num-layers" not in args and "--decoder-last-pipeline-num-layers" not in args
        stages = parse_layout(args["--pipeline-model-parallel-layout"][0])
        assert len(stages) % pp == 0, "layout stages must be a multiple of pp"
        flat = [token for stage in stages for token in stage]
        assert stages[0][:1] == ["E"] and stages[-1][-1:] == ["L"], "layout must start with E and end with L"
        assert flat.count("E") == 1 and flat.count("L") == 1
        assert flat.count("t") == num_layers, "layout must hold exactly num_layers decoder layers"
        return [stage.count("t") for stage in stages]
    vpp = int(args.get("--num-virtual-stages-per-pipeline-rank", ["1"])[0])
    first = args.get("--decoder-first-pipeline-num-layers")
    last = args.get("--decoder-last-pipeline-num-layers")
    if first or last:
        assert vpp == 1, "this exporter gives first/last only without virtual stages"
        rest, middle_stages = num_layers, pp
        for given_count in (first, last):
            if given_count:
                rest -= int(given_count[0])
                middle_stages -= 1
        assert middle_stages > 0 and rest % middle_stages == 0, (
            f"remaining {rest} layers must divide over {middle_stages} stages")
        middle = rest // middle_stages
        counts = [middle] * pp
        counts[0] = int(first[0]) if first else middle
        counts[-1] = int(last[0]) if last else middle
        return counts
    assert num_layers % (pp * vpp) == 0, "without a split flag num_layers must divide by pp (× vpp)"
    return [num_layers // (pp * vpp)] * (pp * vpp)


# TransformerConfig.recompute_modules' allowed choices (core 0.16+)
MEGATRON_RECOMPUTE_MODULES = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                              "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"}


def check_megatron_rules(plan: Plan, files: dict[str, str]) -> dict[str, list[str]]:
    args = parse_flags(files["megatron_args.txt"])
    tp, pp = int(args["--tensor-model-parallel-size"][0]), int(args["--pipeline-model-parallel-size"][0])
    world = plan.parallel.num_gpus
    assert world % (tp * pp) == 0
    dp = world // (tp * pp)
    mbs, gbs = int(args["--micro-batch-size"][0]), int(args["--global-batch-size"][0])
    assert gbs % (mbs * dp) == 0, "global batch must divide by micro-batch × dp"
    if "--sequence-parallel" in args:
        assert tp > 1
    granularity = args.get("--recompute-granularity", [None])[0]
    if "--recompute-modules" in args:  # TransformerConfig: a non-empty list of its allowed modules, read if selective
        assert granularity == "selective" and args["--recompute-modules"]
        assert set(args["--recompute-modules"]) <= MEGATRON_RECOMPUTE_MODULES
    if granularity == "full":
        assert args["--recompute-method"][0] in ("uniform", "block")
    else:
        assert "--recompute-num-layers" not in args and "--recompute-method" not in args
    if "--overlap-param-gather" in args:
        assert "--use-distributed-optimizer" in args and "--overlap-grad-reduce" in args
    if "--fp8-param-gather" in args:  # arguments.py: distributed optimizer or (Megatron/torch) FSDP only
        assert "--use-distributed-optimizer" in args or "--use-megatron-fsdp" in args
        assert "--fp8-format" in args
    launch = files["torchrun.sh"]
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in launch) == (tp > 1)
    assert f"--nproc-per-node {plan.document['cluster']['gpus_per_node']}" in launch
    # round trip: the split Megatron builds is the plan's
    assert megatron_split(args, int(args["--num-layers"][0])) == list(plan.blocks_per_stage)
    if len(plan.blocks_per_stage) > pp:
        m = gbs // (mbs * dp)
        assert m % pp == 0, "interleaved schedule needs num_microbatches % pp == 0"
    return args


PLANS = {
    "uneven 1f1b (layout)": dict(blocks=(7, 8, 9, 8)),
    "first/last": dict(blocks=(6, 9, 9, 8)),
    "last only": dict(blocks=(9, 9, 9, 5)),
    "uniform": dict(blocks=(8, 8, 8, 8), recompute="selective"),
    "selective modules": dict(blocks=(8, 8, 8, 8), recompute="selective", recompute_modules=("layernorm", "mlp")),
    "pp=2 first": dict(blocks=(15, 17), tp=4, pp=2),
    "interleaved uneven": dict(blocks=(3, 4, 4, 4, 4, 4, 5, 4), vpp=2, recompute="full", distributed_optimizer=True,
                               overlap_param_gather=True),
    "interleaved uniform": dict(blocks=(4,) * 8, vpp=2),
    "embedding-only first stage": dict(blocks=(0, 10, 11, 11)),
    "no pipeline": dict(blocks=(32,), tp=8, pp=1, dtype="fp8", sequence_parallel=True),
    "fp8 weights gathered in fp8": dict(blocks=(8, 8, 8, 8), dtype="fp8", distributed_optimizer=True,
                                        fp8_param_gather=True),
    "tp=1 gpt3 learned positions": dict(model="gpt3-1.3b", blocks=(6, 6, 6, 6), tp=1, dtype="fp16"),
    "qwen qkv bias": dict(model="qwen2.5-7b", blocks=(7, 7, 7, 7)),
}


@pytest.mark.parametrize("name", PLANS)
def test_export_follows_megatron_rules_and_round_trips(name):
    plan = make_plan(**PLANS[name])
    files = export_megatron(plan).files
    args = check_megatron_rules(plan, files)
    subprocess.run(["bash", "-n"], input=files["torchrun.sh"], text=True, check=True)
    assert int(args["--num-layers"][0]) == plan.model.num_layers


def test_split_uses_the_simplest_form_megatron_accepts():
    assert split_arguments(make_plan(blocks=(8, 8, 8, 8))) == ()
    assert split_arguments(make_plan(blocks=(6, 9, 9, 8))) == (
        ("--decoder-first-pipeline-num-layers", "6"), ("--decoder-last-pipeline-num-layers", "8"))
    assert split_arguments(make_plan(blocks=(9, 9, 9, 5))) == (("--decoder-last-pipeline-num-layers", "5"),)
    assert split_arguments(make_plan(blocks=(8, 7, 9, 8))) == (
        ("--pipeline-model-parallel-layout", "Et*8|t*7|t*9|t*8L"),)
    assert split_arguments(make_plan(blocks=(9, 8, 8, 7))) == (
        ("--decoder-first-pipeline-num-layers", "9"), ("--decoder-last-pipeline-num-layers", "7"))
    assert split_arguments(make_plan(blocks=(4,) * 8, vpp=2)) == (("--num-virtual-stages-per-pipeline-rank", "2"),)
    assert split_arguments(make_plan(blocks=(7, 8, 9, 8))) == (
        ("--pipeline-model-parallel-layout", "Et*7|t*8|t*9|t*8L"),)


def test_layout_matches_reference_examples():
    """REFERENCE.md §1 verified pretty-prints: 'Et*5|t*6|t*7|t*6L' (pp=4) and the same string at pp=2 → vpp=2."""
    stages = parse_layout("Et*5|t*6|t*7|t*6L")
    assert [len(s) for s in stages] == [6, 6, 7, 7] and stages[0][0] == "E" and stages[-1][-1] == "L"
    assert parse_layout("Et*5|t*6|t*7|t*6,L") == stages
    assert parse_layout("Et*3|(tt|)*29,m|L")[1:3] == [["t", "t"], ["t", "t"]]
    assert len(parse_layout("Et*3|(tt|)*29,m|L")) == 32
    assert parse_layout("E||t|L") == [["E"], [], ["t"], ["L"]]
    with pytest.raises(PlannerError, match="unknown symbol"):
        parse_layout("Ex*3|L")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=8),
       st.integers(min_value=0, max_value=1))
def test_layout_string_round_trips_any_split(counts, empty_first):
    """Any blocks-per-stage split (plans never leave a stage without units; the first may hold only
    the embedding) → layout → parse gives the split back, with E first and L last."""
    counts = [0 if empty_first else counts[0], *counts[1:]]
    model = replace(load_model("tiny-llama"), num_layers=sum(counts))
    plan = SimpleNamespace(partition=Partition.from_blocks(counts, sum(counts)), model=model)
    stages = parse_layout(layout_string(plan))
    assert [s.count("t") for s in stages] == counts
    assert stages[0][0] == "E" and stages[-1][-1] == "L"


def test_model_flags():
    args = parse_flags(export_megatron(make_plan()).files["megatron_args.txt"])
    assert args["--num-query-groups"] == ["8"] and "--group-query-attention" in args
    assert args["--normalization"] == ["RMSNorm"] and args["--position-embedding-type"] == ["rope"]
    assert "--swiglu" in args and "--untie-embeddings-and-output-weights" in args and "--bf16" in args
    assert "--kv-channels" not in args
    gpt = parse_flags(export_megatron(make_plan(model="gpt3-1.3b", blocks=(6,) * 4, tp=1, dtype="fp16"))
                     .files["megatron_args.txt"])
    assert gpt["--position-embedding-type"] == ["learned_absolute"] and gpt["--normalization"] == ["LayerNorm"]
    assert "--fp16" in gpt and "--swiglu" not in gpt and "--disable-bias-linear" not in gpt
    assert "--untie-embeddings-and-output-weights" not in gpt and "--attention-dropout" not in gpt
    qwen = parse_flags(export_megatron(make_plan(model="qwen2.5-7b", blocks=(7,) * 4)).files["megatron_args.txt"])
    assert "--add-qkv-bias" in qwen and qwen["--num-query-groups"] == ["4"]
    moe = parse_flags(export_megatron(make_plan(model="mixtral-8x7b", cluster="4x8xH100-80GB", blocks=(8,) * 4,
                                               tp=4)).files["megatron_args.txt"])
    assert moe["--num-experts"] == ["8"] and moe["--moe-router-topk"] == ["2"]
    fp8 = parse_flags(export_megatron(make_plan(blocks=(32,), tp=8, pp=1, dtype="fp8")).files["megatron_args.txt"])
    assert fp8["--fp8-format"] == ["hybrid"] and "--bf16" in fp8


def test_interleaved_plan_with_microbatches_not_divisible_by_pp_gets_a_note():
    plan = make_plan(blocks=(4,) * 8, vpp=2, global_batch=36, dp=2, micro_batch=1)
    assert any("num_microbatches (18) divisible by pp (4)" in note for note in export_megatron(plan).notes)


_MEGATRON_CHECK = """
import importlib.util, json, sys, types
# megatron/core/__init__ imports most of Megatron; the layout class needs only torch and parallel_state.
for name in ("megatron", "megatron.core"):
    package = types.ModuleType(name)
    package.__path__ = list(importlib.util.find_spec(name).submodule_search_locations)
    sys.modules[name] = package
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers
layouts, patterns = json.loads(sys.argv[1])
result = []
for text, pp, num_layers, mtp in layouts:
    layout = PipelineParallelLayerLayout(text, pp)
    try:
        layout.validate_layer_layout(num_layers, mtp)
    except AssertionError as error:
        result.append(str(error))
        continue
    result.append([[[sum(layer.name == kind for layer in stage) for kind in ("decoder", "mtp")] for stage in rank]
                   for rank in layout.layout])
hybrid = []
for pattern in patterns:
    try:
        hybrid.append("".join(allocate_layers(len(pattern), 0.0, 0.0, pattern)))
    except ValueError as error:
        hybrid.append(str(error))
print(json.dumps([result, hybrid]))
"""


def has_megatron_core() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


needs_megatron_core = pytest.mark.skipif(not has_megatron_core(),
                                         reason="megatron-core not installed (pip install --no-deps megatron-core)")


def megatron_core(layouts: list[tuple[str, int, int, int | None]], patterns: tuple[str, ...] = ()) -> tuple[list, list]:
    """megatron-core's own reading of layouts (text, pp, num_layers, mtp_num_layers): per pp rank, per virtual
    stage, [decoder, mtp] layers, or the validator's message; and of hybrid patterns (allocate_layers)."""
    run = subprocess.run([sys.executable, "-c", _MEGATRON_CHECK, json.dumps([layouts, patterns])],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    return tuple(json.loads(run.stdout.strip().splitlines()[-1]))


@needs_megatron_core
def test_megatrons_own_layout_parser_accepts_the_exports():
    """Megatron's PipelineParallelLayerLayout validates each exported layout and assigns its stages to
    (pp rank, virtual rank) exactly as the plan does: stage k on rank k mod pp, chunk k div pp."""
    plans = [make_plan(**PLANS[name]) for name in ("uneven 1f1b (layout)", "interleaved uneven",
                                                   "embedding-only first stage")]
    cases = [(dict(split_arguments(plan))["--pipeline-model-parallel-layout"], plan.parallel.pp,
              plan.model.num_layers, None) for plan in plans]
    wrong_layer_count = (cases[0][0], 4, 31, None)
    (*results, rejected), _ = megatron_core([*cases, wrong_layer_count])
    for plan, per_rank in zip(plans, results, strict=True):
        pp = plan.parallel.pp
        expected = [[[plan.blocks_per_stage[v * pp + r], 0] for v in range(plan.parallel.vpp)] for r in range(pp)]
        assert per_rank == expected
    assert "must match num_layers 31" in rejected


def test_fp8_param_gather_is_exported_as_megatrons_flag():
    plan = make_plan(**PLANS["fp8 weights gathered in fp8"])
    args = check_megatron_rules(plan, export_megatron(plan).files)
    assert "--fp8-param-gather" in args
    assert "--fp8-param-gather" not in check_megatron_rules(make_plan(**PLANS["no pipeline"]),
                                                            export_megatron(make_plan(**PLANS["no pipeline"])).files)
