"""DeepSpeed export checked against DeepSpeed's rules (../shared/REFERENCE.md §2), re-implemented here:
the batch assertion with dp as world size, GAS = pipeline micro-batches, ZeRO < 2 with PP, one
precision; its partitioners (deepspeed/runtime/utils.py) against known outputs and the exact optimum;
and the Megatron-DeepSpeed flags against ds_config.json."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export_plans import make_plan, parse_flags, plan_document

from planner.config import Training
from planner.errors import PlannerError
from planner.export.common import estimate_split
from planner.export.deepspeed import (
    export_deepspeed,
    method_split,
    partition_balanced,
    partition_options,
    partition_uniform,
)
from planner.export.flags import Dialect, model_flags
from planner.export.megatron import export_megatron
from planner.model import catalog_model_names, load_model
from planner.plan import parse_plan_document


def check_deepspeed_rules(plan, files: dict[str, str]) -> dict:
    config = json.loads(files["ds_config.json"])
    dp = plan.parallel.dp
    mbs, gas = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == mbs * gas * dp, "DeepSpeed's batch assertion (world size = dp)"
    assert config["train_batch_size"] == plan.training.global_batch
    if plan.parallel.pp > 1:
        assert gas == plan.parallel.num_microbatches(plan.training.global_batch), "PipelineEngine: GAS = micro-batches"
        assert config["zero_optimization"]["stage"] < 2, "PipelineEngine asserts ZeRO stage < 2"
    assert not (config.get("bf16", {}).get("enabled") and config.get("fp16", {}).get("enabled"))
    args = parse_flags(files["megatron_deepspeed_args.txt"])
    assert args["--global-batch-size"] == [str(config["train_batch_size"])]
    assert args["--micro-batch-size"] == [str(mbs)]
    assert args["--zero-stage"] == [str(config["zero_optimization"]["stage"])]
    assert args["--deepspeed_config"] == ["ds_config.json"] and "--deepspeed" in args
    assert ("--no-pipeline-parallel" in args) == (plan.parallel.pp == 1)
    if args.get("--recompute-granularity") == ["full"]:
        assert args["--recompute-method"] == ["uniform"], "DeepSpeed's pipeline has no block recompute"
        assert config["pipeline"]["activation_checkpoint_interval"] == int(args["--recompute-num-layers"][0])
    if plan.parallel.pp > 1:  # boundary tensors partitioned over the TP ranks exactly when the plan was so costed
        partitioned = plan.parallel.p2p_scatter_gather
        assert (config["pipeline"]["pipe_partitioned"], config["pipeline"]["grad_partitioned"]) == (
            partitioned, partitioned)
    return config


PLANS = {
    "uneven 1f1b": dict(blocks=(7, 8, 9, 8)),
    "uniform": dict(blocks=(8, 8, 8, 8), recompute="selective"),
    "whole boundary tensors": dict(blocks=(8, 8, 8, 8), p2p_scatter_gather=False),
    "interleaved, dist-opt, full recompute": dict(blocks=(3, 4, 4, 4, 4, 4, 5, 4), vpp=2, recompute="full",
                                                  distributed_optimizer=True),
    "no pipeline, ZeRO-3, fp16": dict(blocks=(32,), tp=8, pp=1, zero_stage=3, dtype="fp16"),
}


@pytest.mark.parametrize("name", PLANS)
def test_export_follows_deepspeed_rules(name):
    plan = make_plan(**PLANS[name])
    check_deepspeed_rules(plan, export_deepspeed(plan).files)


def test_partitioners_match_deepspeed_outputs():
    """Hand-run through deepspeed/runtime/utils.py: uniform gives the first `residual` parts one more."""
    assert partition_uniform(10, 4) == [0, 3, 6, 8, 10]
    assert partition_uniform(3, 4) == [0, 1, 2, 3, 3]
    assert partition_balanced([1.0] * 32, 4) == [0, 8, 16, 24, 32]
    assert partition_balanced([0.0] + [1.0] * 32 + [0.0], 4) == [0, 9, 17, 25, 34]


# Outputs of DeepSpeed's own partition_balanced (deepspeed/runtime/utils.py, run on these inputs while
# writing this module; 3,000 random cases agreed), including its quirks: it can leave stages empty.
BALANCED = [
    ([5, 1, 1, 1, 1, 1, 1, 5], 3, [0, 1, 6, 8]),
    ([3, 1, 4, 1, 5, 9, 2, 6], 3, [0, 5, 7, 8]),
    ([2, 0, 1], 2, [0, 0, 3]),
    ([0, 0, 1, 1], 3, [0, 3, 4, 4]),
    ([10, 1, 1, 1, 1, 10], 4, [0, 1, 5, 6, 6]),
]


@pytest.mark.parametrize(("weights", "parts", "expected"), BALANCED)
def test_partition_balanced_reproduces_deepspeed(weights, parts, expected):
    assert partition_balanced([float(w) for w in weights], parts) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=12), st.integers(min_value=1, max_value=5))
def test_partition_balanced_boundaries_cover_every_item_in_order(weights, parts):
    bounds = partition_balanced([float(w) for w in weights], parts)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == len(weights)
    assert bounds == sorted(bounds)


def test_method_splits_for_llama3_8b():
    model = load_model("llama3-8b")
    assert method_split(model, 4, "type:transformer") == (8, 8, 8, 8)
    assert method_split(model, 4, "uniform") == (8, 9, 8, 7)  # 34 layers: 9, 9, 8, 8 incl. embedding/head
    split = method_split(model, 4, "parameters")
    assert sum(split) == 32 and split[0] < 8 and split[-1] < 8  # the big embedding/head weigh on the ends


def test_uneven_plan_says_deepspeed_cannot_take_it_and_costs_each_method():
    plan = make_plan(blocks=(7, 8, 9, 8))
    result = export_deepspeed(plan)
    text = "\n".join(result.notes)
    assert "cannot take explicit stage boundaries" in text and "fastest supported" in text
    options = partition_options(plan)
    assert [o.method for o in options] == ["uniform", "parameters", "type:transformer"]
    for option in options:
        assert option.iteration_time_s == pytest.approx(estimate_split(plan, option.blocks_per_stage))
        assert f"{option.method}: {','.join(map(str, option.blocks_per_stage))} → {option.iteration_time_s:.3f}" in text
    # the plan's own split re-estimated from the file reproduces the plan's estimate
    assert estimate_split(plan) == pytest.approx(plan.document["estimate"]["iteration_time_s"], rel=1e-9)
    assert "the plan's split (7,8,9,8" in result.files["megatron_deepspeed_args.txt"]


def test_uniform_plan_is_built_exactly_by_type_transformer():
    notes = export_deepspeed(make_plan(blocks=(8, 8, 8, 8))).notes
    assert notes[0] == "partition_method 'type:transformer' builds the plan's split exactly (8,8,8,8)"
    assert all("FlashAttention-2" in note for note in notes[1:])  # the H100 plan was costed with native attention


def test_interleaved_plan_is_flattened_to_1f1b_with_a_note():
    notes = export_deepspeed(make_plan(blocks=(4,) * 8, vpp=2)).notes
    assert notes[0].startswith("DeepSpeed's PipelineEngine has no interleaved schedule")


def test_a_cluster_the_cost_model_cannot_rebuild_still_exports_with_the_splits_listed():
    """A version 1 plan file names its cluster only; an unknown one cannot be rebuilt for the cost model."""
    document = {key: value for key, value in plan_document().items() if key != "calibration"}
    document.update(schema_version=1, cluster={"name": "my-lab", "num_nodes": 2, "gpus_per_node": 8,
                                               "gpu": "NoSuchGPU", "num_gpus": 16, "nodes": ["node0", "node1"]})
    result = export_deepspeed(parse_plan_document(document))
    assert "splits not costed" in result.notes[-1] and "type:transformer: 8,8,8,8" in result.notes[-1]
    assert json.loads(result.files["ds_config.json"])["train_batch_size"] == 128


# ---- one model mapping: both Megatron-family exports describe the same model --------------------

def common_model(args: dict[str, list[str]]) -> dict:
    """What both parsers spell alike, with their shared defaults (dropout 0.1, biases on)."""
    return {
        "layers": args["--num-layers"], "hidden": args["--hidden-size"], "ffn": args["--ffn-hidden-size"],
        "kv_channels": args.get("--kv-channels"), "seq": args["--seq-length"],
        "positions": args["--max-position-embeddings"], "swiglu": "--swiglu" in args,
        "untied": "--untie-embeddings-and-output-weights" in args, "linear_bias": "--disable-bias-linear" not in args,
        "dropout": tuple(float(args.get(flag, ["0.1"])[0]) for flag in ("--attention-dropout", "--hidden-dropout")),
        "dtype": "fp16" if "--fp16" in args else "bf16",
    }


def megatron_lm_model(args: dict[str, list[str]]) -> dict:
    """The model megatron_args.txt asks Megatron-LM for, read with its parser's defaults (REFERENCE.md §1)."""
    model = common_model(args)
    heads, experts = int(args["--num-attention-heads"][0]), int(args.get("--num-experts", ["1"])[0])
    return model | {
        "kv_heads": int(args["--num-query-groups"][0]) if "--group-query-attention" in args else heads,
        "rmsnorm": args.get("--normalization") == ["RMSNorm"],
        "rope": args.get("--position-embedding-type") == ["rope"],
        "qkv_bias": model["linear_bias"] or "--add-qkv-bias" in args,
        # dropless routing in every layer is Megatron-LM's default (no capacity factor)
        "moe": (experts, int(args["--moe-router-topk"][0]), "--moe-expert-capacity-factor" not in args)
        if experts > 1 else None,
        "dtype": "fp8" if "--fp8-format" in args else model["dtype"],
        "flash": args.get("--attention-backend") in (["fused"], ["flash"]),
    }


def megatron_deepspeed_model(args: dict[str, list[str]]) -> dict:
    """The model megatron_deepspeed_args.txt asks for, read with Megatron-DeepSpeed's defaults (its arguments.py)."""
    model = common_model(args)
    heads, experts = int(args["--num-attention-heads"][0]), int(args.get("--num-experts", ["1"])[0])
    in_every_layer = int(args.get("--expert-interval", ["2"])[0]) == 1
    return model | {
        "kv_heads": int(args.get("--num-key-value-heads", [heads])[0]),
        "rmsnorm": args.get("--normalization") == ["rmsnorm"],
        "rope": "--use-rotary-position-embeddings" in args and "--no-position-embedding" in args,
        "qkv_bias": model["linear_bias"],
        "moe": (experts if in_every_layer else "every 2nd layer", int(args.get("--topk", ["1"])[0]),
                "--disable-moe-token-dropping" in args) if experts > 1 else None,
        "flash": "--use-flash-attn-v2" in args,
    }


# What Megatron-DeepSpeed has no flag for, and the word its export's note uses for it.
NO_DEEPSPEED_FLAG = {"qkv_bias": "QKV", "dtype": "fp8"}
# Both parsers build the language model only; Megatron-DeepSpeed has no Mamba layers (tests/test_export_layout.py).
MODEL_CASES = [(name, "bf16") for name in catalog_model_names() if load_model(name).position_embedding != "alibi"
               and all(block.role == "decoder" and block.mamba is None for block in load_model(name).blocks)]
MODEL_CASES += [("gpt3-1.3b", "fp16"), ("llama3-8b", "fp8")]


@pytest.mark.parametrize(("name", "dtype"), MODEL_CASES)
def test_megatron_and_deepspeed_exports_describe_the_same_model(name, dtype):
    """One model→flag mapping: read back with each parser's defaults, both exports of a plan ask for the
    model the plan has; where Megatron-DeepSpeed has no flag, its export says so in a note."""
    model = load_model(name)
    plan = make_plan(model=name, cluster="1x8xH100-80GB", blocks=(model.num_layers,), tp=1, pp=1, dtype=dtype)
    megatron = megatron_lm_model(parse_flags(export_megatron(plan).files["megatron_args.txt"]))
    result = export_deepspeed(plan)
    deepspeed = megatron_deepspeed_model(parse_flags(result.files["megatron_deepspeed_args.txt"]))
    assert megatron["layers"] == [str(model.num_layers)] and megatron["kv_heads"] == model.num_key_value_heads
    assert megatron["qkv_bias"] == (model.qkv_bias or model.linear_bias)
    assert megatron["moe"] == ((model.num_experts, model.moe_top_k, True) if model.is_moe else None)
    assert megatron["rope"] == (model.position_embedding == "rope") and megatron["dtype"] == dtype
    differ = {key for key in megatron if megatron[key] != deepspeed[key]}
    assert differ <= set(NO_DEEPSPEED_FLAG), {key: (megatron[key], deepspeed[key]) for key in differ}
    for key in differ:
        assert any(NO_DEEPSPEED_FLAG[key] in note for note in result.notes)
        assert NO_DEEPSPEED_FLAG[key] in result.files["megatron_deepspeed_args.txt"].split("\n# parallelism")[0]


def test_mixtral_export_carries_the_moe_flags():
    plan = make_plan(model="mixtral-8x7b", cluster="4x8xH100-80GB", blocks=(8,) * 4, tp=4, ep=2, etp=4)
    args = parse_flags(export_deepspeed(plan).files["megatron_deepspeed_args.txt"])
    assert args["--num-experts"] == ["8"] and args["--topk"] == ["2"] and args["--expert-interval"] == ["1"]
    assert args["--moe-expert-parallel-size"] == ["2"]
    assert "--disable-moe-token-dropping" in args, "Mixtral routes every token (Megatron-LM's dropless default)"
    assert "--enable-expert-tensor-parallelism" in args, "the plan shards experts over TP (etp = tp)"
    dense = parse_flags(export_deepspeed(make_plan()).files["megatron_deepspeed_args.txt"])
    moe_flags = {"--num-experts", "--topk", "--enable-expert-tensor-parallelism", "--moe-expert-parallel-size"}
    assert not moe_flags & set(dense)


def test_expert_layout_deepspeed_cannot_build_is_refused() -> None:
    """DeepSpeed splits experts over all TP ranks or none: Megatron-LM's EP folded over the TP ranks (etp=1
    under tp=4, ep=8 over tp·dp = 8 ranks) has no DeepSpeed equivalent."""
    plan = make_plan(model="mixtral-8x7b", cluster="4x8xH100-80GB", blocks=(8,) * 4, tp=4, ep=8, etp=1)
    with pytest.raises(PlannerError, match=r"DeepSpeed cannot run etp=1 with tp=4: .* etp must equal tp"):
        export_deepspeed(plan)


def test_capacity_factor_is_exported_instead_of_dropless() -> None:
    model, training = load_model("mixtral-8x7b"), Training(moe_capacity_factor=1.25)
    lm = dict((f[0], f[1:]) for f in model_flags(model, training, Dialect.MEGATRON_LM).flags)
    ds = dict((f[0], f[1:]) for f in model_flags(model, training, Dialect.MEGATRON_DEEPSPEED).flags)
    assert lm["--moe-expert-capacity-factor"] == ("1.25",)
    assert ds["--moe-train-capacity-factor"] == ("1.25",) and "--disable-moe-token-dropping" not in ds


def test_qwen_export_states_its_qkv_bias():
    """Megatron-DeepSpeed has no --add-qkv-bias (its argparse would refuse the flag): the export says the
    QKV biases are missing instead of dropping them silently, while Megatron-LM's export carries the flag."""
    plan = make_plan(model="qwen2.5-7b", blocks=(7,) * 4)
    result = export_deepspeed(plan)
    args = parse_flags(result.files["megatron_deepspeed_args.txt"])
    assert "--add-qkv-bias" not in args and "--disable-bias-linear" in args and args["--num-key-value-heads"] == ["4"]
    assert any("QKV projection" in note for note in result.notes)
    assert "--add-qkv-bias" in parse_flags(export_megatron(plan).files["megatron_args.txt"])


def test_alibi_is_refused_by_both_megatron_family_exports():
    plan = make_plan(model="bloom-176b", cluster="8x8xH100-80GB", tp=8, pp=7, blocks=(10,) * 7, global_batch=64)
    for export in (export_megatron, export_deepspeed):
        with pytest.raises(PlannerError, match="ALiBi"):
            export(plan)
