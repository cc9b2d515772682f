"""DeepSpeed export checked against DeepSpeed's rules (../shared/REFERENCE.md §2), re-implemented here:
the batch assertion with dp as world size, GAS = pipeline micro-batches, ZeRO < 2 with PP, one
precision; its partitioners (deepspeed/runtime/utils.py) against known outputs and the exact optimum;
and the Megatron-DeepSpeed flags against ds_config.json."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export_plans import make_plan, plan_document

from planner.export.common import estimate_split
from planner.export.deepspeed import (
    export_deepspeed,
    method_split,
    partition_balanced,
    partition_options,
    partition_uniform,
)
from planner.model import load_model
from planner.plan import parse_plan_document


def flags(text: str) -> dict[str, str | None]:
    tokens = shlex.split("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    out: dict[str, str | None] = {}
    for token in tokens:
        if token.startswith("--"):
            out[token] = None
            last = token
        else:
            out[last] = token
    return out


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
    args = flags(files["megatron_deepspeed_args.txt"])
    assert int(args["--global-batch-size"]) == config["train_batch_size"]
    assert int(args["--micro-batch-size"]) == mbs
    assert int(args["--zero-stage"]) == config["zero_optimization"]["stage"]
    assert args["--deepspeed_config"] == "ds_config.json" and "--deepspeed" in args
    assert ("--no-pipeline-parallel" in args) == (plan.parallel.pp == 1)
    if args.get("--recompute-granularity") == "full":
        assert args["--recompute-method"] == "uniform", "DeepSpeed's pipeline has no block recompute"
        assert config["pipeline"]["activation_checkpoint_interval"] == int(args["--recompute-num-layers"])
    return config


PLANS = {
    "uneven 1f1b": dict(blocks=(7, 8, 9, 8)),
    "uniform": dict(blocks=(8, 8, 8, 8), recompute="selective"),
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
    assert notes == ("partition_method 'type:transformer' builds the plan's split exactly (8,8,8,8)",)


def test_interleaved_plan_is_flattened_to_1f1b_with_a_note():
    notes = export_deepspeed(make_plan(blocks=(4,) * 8, vpp=2)).notes
    assert notes[0].startswith("DeepSpeed's PipelineEngine has no interleaved schedule")


def test_a_cluster_the_cost_model_cannot_rebuild_still_exports_with_the_splits_listed():
    document = plan_document()
    document["cluster"].update(name="my-lab", gpu="NoSuchGPU")
    result = export_deepspeed(parse_plan_document(document))
    assert "splits not costed" in result.notes[-1] and "type:transformer: 8,8,8,8" in result.notes[-1]
    assert json.loads(result.files["ds_config.json"])["train_batch_size"] == 128
