"""--framework (issue 12 item 1): each target's capabilities at its stated version (planner/frameworks.py, from
../shared/REFERENCE.md and Megatron-LM core_v0.16.1 arguments.py), the search exploring only what it runs with
its engine's execution semantics, `runs_on` in plan files, and export refusing what the target cannot run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_export_plans import plan_document, write_plan

import cli
from planner.cluster import load_cluster
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS, runs_on
from planner.model import load_model
from planner.search import space
from planner.search.space import FixedOptions, enumerate_configs

SP = dict(sequence_parallel=True)

# configuration → the targets that run it exactly as planned
RUNS_ON = [
    (dict(dp=8, tp=1, pp=1, zero_stage=3), ["megatron", "deepspeed", "torchtitan"]),  # Megatron-FSDP, ZeRO-3, FSDP2
    (dict(dp=8, tp=1, pp=1, zero_stage=2), ["megatron", "deepspeed", "torchtitan"]),
    (dict(dp=2, tp=2, pp=2, distributed_optimizer=True, **SP), ["megatron"]),  # Megatron's own
    (dict(dp=2, tp=2, pp=2, zero_stage=1, **SP), ["deepspeed"]),  # DeepSpeed's ZeRO-1 (its reduce bucket)
    (dict(dp=2, tp=2, pp=2, zero_stage=3, **SP), ["torchtitan"]),  # FSDP + PP: PipelineEngine asserts stage < 2
    (dict(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved", **SP), ["megatron", "torchtitan"]),
    (dict(dp=2, tp=2, pp=2, schedule="gpipe", **SP), ["torchtitan"]),
    (dict(dp=2, tp=2, pp=2), ["megatron", "deepspeed"]),  # torchtitan's TP always shards the sequence
    (dict(dp=2, tp=2, pp=2, tp_comm_overlap=True, **SP), ["megatron", "torchtitan"]),
    (dict(dp=2, tp=2, pp=1, cp=2, **SP), ["megatron", "torchtitan"]),
    (dict(dp=2, tp=2, pp=1, cp=2, cp_comm="a2a", **SP), ["megatron"]),
    (dict(dp=4, tp=2, pp=1, zero_stage=3, hsdp_replicas=2, **SP), ["torchtitan"]),
]


@pytest.mark.parametrize(("fields", "targets"), RUNS_ON)
def test_runs_on_lists_the_targets_that_run_the_configuration_exactly(fields, targets):
    config = ParallelConfig(**fields)
    assert runs_on(config) == targets
    for name in ("megatron", "deepspeed", "torchtitan"):
        why = FRAMEWORKS[name].why_not(config)
        assert (why is None) == (name in targets)
        assert why is None or "\n" not in why


def test_execution_semantics_are_each_engines():
    """DeepSpeed's PipelineEngine: 1/tp of a boundary tensor per TP rank (is_pipe_partitioned), gradients reduced
    after the flush, no overlapped TP backward; torchtitan: synchronous DTensor TP backward; Megatron-LM: the
    defaults."""
    config = ParallelConfig(dp=2, tp=2, pp=2, zero_stage=1, **SP)
    deepspeed = FRAMEWORKS["deepspeed"].runs(config)
    assert (deepspeed.p2p_scatter_gather, deepspeed.overlap_grad_reduce, deepspeed.overlap_tp_backward) == (
        True, False, False)
    without_pp = ParallelConfig(dp=8, tp=1, pp=1, zero_stage=1)
    assert FRAMEWORKS["deepspeed"].runs(without_pp).overlap_grad_reduce  # ZeRO's overlap_comm
    titan = FRAMEWORKS["torchtitan"].runs(ParallelConfig(dp=2, tp=2, pp=2, **SP))
    assert (titan.p2p_scatter_gather, titan.overlap_grad_reduce, titan.overlap_tp_backward) == (True, True, False)
    plain = ParallelConfig(dp=2, tp=2, pp=2, **SP)
    assert FRAMEWORKS["megatron"].runs(plain) is plain and FRAMEWORKS["any"].runs(plain) is plain


MODEL, CLUSTER = load_model("llama3-8b"), load_cluster("2x8xH100-80GB")
TRAINING = Training(global_batch=64, seq_len=4096)


def test_megatron_gathers_the_updated_weights_behind_the_next_forward():
    """With sharded optimizer states Megatron-LM runs --overlap-param-gather (every NVIDIA recipe does): the
    all-gather after the step hides behind the first forward, so less DP time shows; DeepSpeed's ZeRO-1 gathers
    in its step, and replicated states have nothing to gather."""
    sharded = ParallelConfig(dp=8, tp=2, pp=1, distributed_optimizer=True, **SP)
    megatron = FRAMEWORKS["megatron"].runs(sharded)
    assert megatron.overlap_param_gather and FRAMEWORKS["any"].runs(sharded).overlap_param_gather
    assert not FRAMEWORKS["deepspeed"].runs(replace(sharded, distributed_optimizer=False,
                                                    zero_stage=1)).overlap_param_gather
    assert not FRAMEWORKS["megatron"].runs(replace(sharded, distributed_optimizer=False)).overlap_param_gather
    hidden = estimate(MODEL, CLUSTER, TRAINING, megatron).breakdown_s["dp_comm"]
    waited = estimate(MODEL, CLUSTER, TRAINING, replace(megatron, overlap_param_gather=False)).breakdown_s["dp_comm"]
    assert waited > hidden >= 0


@pytest.mark.parametrize("name", ["megatron", "deepspeed", "torchtitan"])
def test_the_search_explores_only_what_the_framework_runs_as_it_runs_it(name):
    framework = FRAMEWORKS[name]
    configs = list(enumerate_configs(MODEL, CLUSTER, TRAINING, FixedOptions(framework=name)))
    assert configs and all(framework.why_not(c) is None and framework.runs(c) == c for c in configs)
    shardings = {(c.zero_stage, c.distributed_optimizer) for c in configs if c.pp > 1}
    assert shardings == {"megatron": {(0, False), (0, True)}, "deepspeed": {(0, False), (1, False)},
                         "torchtitan": {(0, False), (2, False), (3, False)}}[name]


def test_any_keeps_the_whole_space_with_megatron_semantics():
    fixed = FixedOptions()
    assert list(enumerate_configs(MODEL, CLUSTER, TRAINING, fixed)) == list(
        space._layouts(MODEL, CLUSTER, TRAINING, fixed))


def test_the_framework_is_a_cost_model_input():
    """The same layout is slower as DeepSpeed's engine runs it: exposed gradient reduction and TP backward."""
    config = FRAMEWORKS["deepspeed"].runs(ParallelConfig(dp=2, tp=2, pp=4, zero_stage=1, **SP))
    as_megatron = FRAMEWORKS["megatron"].runs(config)
    slow = estimate(MODEL, CLUSTER, TRAINING, config).iteration_time_s
    fast = estimate(MODEL, CLUSTER, TRAINING, as_megatron).iteration_time_s
    assert slow > fast


def run(*args: str):
    return CliRunner().invoke(cli.main, list(args))


SMALL = ("--model", "tiny-llama", "--cluster", "1x4xH100-80GB", "--global-batch", "16", "--seq-len", "512")


@pytest.mark.parametrize("name", ["megatron", "deepspeed", "torchtitan"])
def test_plan_records_its_framework_and_where_it_runs(name):
    result = run("plan", *SMALL, "--framework", name, "--top", "2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    for plan in (document, *document["alternatives"]):
        assert plan["framework"] == name and name in plan["runs_on"]


def test_plan_export_plans_for_its_target_and_export_never_substitutes(tmp_path):
    result = run("plan", *SMALL, "--export", "megatron", "--export-out", str(tmp_path / "m"), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["framework"] == "megatron"
    path = write_plan(tmp_path, plan_document(zero_stage=1), "zero1.json")
    refused = run("export", str(path), "--to", "megatron")
    assert refused.exit_code == 2
    line, = refused.output.strip().splitlines()
    assert "cannot run ZeRO-1" in line and "runs on deepspeed" in line and "--framework megatron" in line


def test_estimate_refuses_what_the_framework_cannot_run_in_one_line():
    result = run("estimate", *SMALL, "--tp", "2", "--pp", "2", "--distributed-optimizer", "--framework", "deepspeed")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "distributed optimizer" in result.output


def test_export_notes_a_plan_estimated_with_another_engines_semantics(tmp_path):
    """An `any` plan (Megatron's semantics) exported to torchtitan: the note gives torchtitan's estimate."""
    path = write_plan(tmp_path, plan_document())
    result = run("export", str(path), "--to", "torchtitan")
    assert result.exit_code == 0, result.output
    assert "as torchtitan 0.2.2 runs it" in result.output and "--framework torchtitan" in result.output


def test_fixing_what_the_framework_cannot_run_is_refused():
    with pytest.raises(PlannerError, match="no valid configuration"):
        space.require_nonempty(list(enumerate_configs(MODEL, CLUSTER, TRAINING, FixedOptions(
            framework="deepspeed", tp_comm_overlap=True, tp=2))), MODEL, CLUSTER, TRAINING, FixedOptions())
