"""torchtitan v0.2.2 export checked against torchtitan's rules (../shared/REFERENCE.md §3), re-implemented
here (world = replicate·shard·cp·tp·pp, stages a multiple of pp, n_microbatches = local / microbatch,
GAS = global / (local·dp), module FQNs cover the model once in order), with the split parsed back by
tomllib; and, where torchtitan 0.2.2 is installed, by torchtitan's own ConfigManager and ParallelDims."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import tomllib
from test_export_plans import invoke, make_plan

from planner.cluster import parse_shorthand
from planner.config import Training
from planner.errors import PlannerError
from planner.export import export_plan
from planner.export.torchtitan import export_torchtitan
from planner.frameworks import runs_on
from planner.model import load_model
from planner.search.space import FixedOptions, enumerate_configs

SINGLE_STAGE = {"1F1B", "GPipe"}


def check_torchtitan_rules(plan, text: str) -> dict:
    config = tomllib.loads(text)
    par, training = config["parallelism"], config["training"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    world = dp * par["context_parallel_degree"] * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
    assert world == plan.parallel.num_gpus, "ParallelDims: world = replicate·shard·cp·tp·pp"
    local, global_batch = training["local_batch_size"], training["global_batch_size"]
    assert global_batch % (local * dp) == 0, "global batch must be a multiple of local × dp"
    accumulation = global_batch // (local * dp)
    pp = par["pipeline_parallel_degree"]
    microbatches = 1
    if pp > 1:
        parts = par["module_fqns_per_model_part"]
        assert len(parts) % pp == 0
        if par["pipeline_parallel_schedule"] in SINGLE_STAGE:
            assert len(parts) == pp, "single-stage schedules take exactly one stage per rank"
        else:
            assert len(parts) >= 2 * pp, "multi-stage schedules need at least 2 stages per rank"
        assert local % par["pipeline_parallel_microbatch_size"] == 0
        microbatches = local // par["pipeline_parallel_microbatch_size"]
        flat = [name for part in parts for name in part]
        layers = plan.model.num_layers
        assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "output"]
        # round trip: the blocks per model part are the plan's blocks per virtual stage
        assert [sum(name.startswith("layers.") for name in part) for part in parts] == list(plan.blocks_per_stage)
        micro_batch = par["pipeline_parallel_microbatch_size"]
    else:
        micro_batch = local
    assert micro_batch == plan.parallel.micro_batch
    assert accumulation * microbatches == plan.parallel.num_microbatches(plan.training.global_batch)
    assert training["seq_len"] == plan.training.seq_len
    sharded = plan.parallel.optimizer_sharding >= 1
    assert par["data_parallel_shard_degree"] == (plan.parallel.dp if sharded else 1)
    return config


PLANS = {
    "uneven 1f1b": dict(blocks=(7, 8, 9, 8)),
    "interleaved, dist-opt, full recompute": dict(blocks=(3, 4, 4, 4, 4, 4, 5, 4), vpp=2, recompute="full",
                                                  distributed_optimizer=True),
    "gpipe, selective": dict(blocks=(8, 8, 8, 8), schedule="gpipe", recompute="selective", micro_batch=2),
    "no pipeline, ZeRO-3": dict(blocks=(32,), tp=8, pp=1, zero_stage=3, micro_batch=2),
}


@pytest.mark.parametrize("name", PLANS)
def test_export_follows_torchtitan_rules_and_round_trips(name):
    plan = make_plan(**PLANS[name])
    config = check_torchtitan_rules(plan, export_torchtitan(plan).files["torchtitan.toml"])
    expected_mode = {"none": "none", "selective": "selective", "full": "full"}[plan.parallel.recompute.value]
    assert config["activation_checkpoint"]["mode"] == expected_mode


def test_schedule_names():
    names = {name: tomllib.loads(export_torchtitan(make_plan(**PLANS[name])).files["torchtitan.toml"])
             ["parallelism"].get("pipeline_parallel_schedule") for name in PLANS}
    assert names == {"uneven 1f1b": "1F1B", "interleaved, dist-opt, full recompute": "Interleaved1F1B",
                     "gpipe, selective": "GPipe", "no pipeline, ZeRO-3": None}


_TORCHTITAN_CHECK = """
import importlib.util, sys, types
# torchtitan/__init__ pulls in tokenizers and datasets; the config classes need only torch and tyro.
package = types.ModuleType("torchtitan")
package.__path__ = list(importlib.util.find_spec("torchtitan").submodule_search_locations)
sys.modules["torchtitan"] = package
from torchtitan.config import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
config = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
p = config.parallelism
ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
             cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
             ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=int(sys.argv[2]))
print(p.module_fqns_per_model_part, config.training.local_batch_size, config.activation_checkpoint.mode)
"""


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("tyro") is None,
                    reason="torchtitan 0.2.2 not installed (pip install --no-deps torchtitan==0.2.2 tyro)")
def test_torchtitan_own_config_parser_accepts_the_export(tmp_path):
    plan = make_plan(**PLANS["interleaved, dist-opt, full recompute"])
    path = tmp_path / "torchtitan.toml"
    path.write_text(export_torchtitan(plan).files["torchtitan.toml"])
    run = subprocess.run([sys.executable, "-c", _TORCHTITAN_CHECK, str(path), str(plan.parallel.num_gpus)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "'norm', 'output']]" in run.stdout and " 64 full" in run.stdout
    wrong = subprocess.run([sys.executable, "-c", _TORCHTITAN_CHECK, str(path), str(2 * plan.parallel.num_gpus)],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "Invalid parallel dims" in wrong.stderr


# ---- MoE: qwen3 flavors with expert parallelism (issue 11 item 5) --------------------------------------------

def test_qwen3_moe_plan_exports_its_flavor_and_expert_degrees():
    plan = make_plan(model="qwen3-30b-a3b", blocks=(48,), pp=1, tp=2, ep=4, etp=1, zero_stage=3,
                     global_batch=64, seq_len=2048)
    config = tomllib.loads(export_torchtitan(plan).files["torchtitan.toml"])
    assert (config["model"]["name"], config["model"]["flavor"]) == ("qwen3", "30B-A3B")
    parallelism = config["parallelism"]
    assert (parallelism["expert_parallel_degree"], parallelism["expert_tensor_parallel_degree"]) == (4, 1)
    check_torchtitan_rules(plan, export_torchtitan(plan).files["torchtitan.toml"])


def test_dense_models_get_no_expert_keys():
    plan = make_plan(model="llama3-8b", blocks=(32,), pp=1, zero_stage=3)
    assert "expert_parallel_degree" not in export_torchtitan(plan).files["torchtitan.toml"]


@pytest.mark.parametrize(("changes", "named"), [
    (dict(pp=2, blocks=(24, 24)), "no pipeline parallelism"),
    (dict(pp=1, blocks=(48,), ep=4, moe_dispatcher="flex"), "no flex MoE token dispatcher")])
def test_what_torchtitans_qwen3_cannot_run_is_refused_in_one_line_and_never_searched(changes, named):
    plan = make_plan(model="qwen3-30b-a3b", global_batch=64, seq_len=2048, **changes)
    with pytest.raises(PlannerError) as error:
        export_plan(plan, "torchtitan")
    assert named in str(error.value) and "torchtitan 0.2.2's qwen3" in str(error.value)
    assert "\n" not in str(error.value) and "torchtitan" not in runs_on(plan.parallel, plan.model)
    model, cluster = load_model("qwen3-30b-a3b"), parse_shorthand("2x8xH100-80GB")
    space = list(enumerate_configs(model, cluster, Training(global_batch=64, seq_len=2048),
                                   FixedOptions(framework="torchtitan")))
    assert space and all(config.pp == 1 for config in space)
    assert all(config.moe_dispatcher == "alltoall" for config in space) and any(config.ep > 1 for config in space)


def test_a_flavor_with_another_rope_base_is_exported_with_a_note():
    plan = make_plan(model="qwen3-235b-a22b", blocks=(94,), pp=1, ep=8, global_batch=64, seq_len=2048)
    text = export_torchtitan(plan).files["torchtitan.toml"]
    assert 'flavor = "235B-A22B"' in text and "rope_theta 5e+06" in text


def test_planning_qwen3_for_torchtitan_with_a_pipeline_says_why_nothing_runs():
    result = invoke("plan", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB", "--global-batch", "256",
                    "--seq-len", "4096", "--framework", "torchtitan", "--pp", "2")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "torchtitan 0.2.2's qwen3 has no pipeline parallelism (pp=2)" in result.output


# ---- MoE: DeepSeek-V3 as torchtitan's deepseek_v3 671B -----------------------------------------------------

_DEEPSEEK = dict(model="deepseek-v3", cluster="32x8xH800", blocks=(16, 15, 15, 15), global_batch=256, seq_len=4096,
                 tp=1, pp=4, ep=32, etp=1, zero_stage=3)


def test_deepseek_v3_exports_torchtitans_671b_flavor_with_deepep():
    plan = make_plan(**_DEEPSEEK, moe_dispatcher="flex")
    text = export_torchtitan(plan).files["torchtitan.toml"]
    config = check_torchtitan_rules(plan, text)
    assert (config["model"]["name"], config["model"]["flavor"]) == ("deepseek_v3", "671B")
    parallelism = config["parallelism"]
    assert (parallelism["expert_parallel_degree"], parallelism["expert_tensor_parallel_degree"]) == (32, 1)
    assert parallelism["expert_parallel_comm_backend"] == "deepep"
    standard = export_torchtitan(make_plan(**_DEEPSEEK)).files["torchtitan.toml"]
    assert "expert_parallel_comm_backend" not in standard  # torchtitan's default, "standard", is the all-to-all
    assert "torchtitan" in runs_on(plan.parallel, plan.model)


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("tyro") is None,
                    reason="torchtitan 0.2.2 not installed (pip install --no-deps torchtitan==0.2.2 tyro)")
def test_torchtitan_own_config_parser_accepts_the_deepseek_export(tmp_path):
    plan = make_plan(**_DEEPSEEK, moe_dispatcher="flex")
    path = tmp_path / "torchtitan.toml"
    path.write_text(export_torchtitan(plan).files["torchtitan.toml"])
    run = subprocess.run([sys.executable, "-c", _TORCHTITAN_CHECK, str(path), str(plan.parallel.num_gpus)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "'layers.60', 'norm', 'output']]" in run.stdout


@pytest.mark.parametrize(("changes", "named"), [
    (dict(cp=2, cp_comm="all-gather", dp=32), "no all-gather context parallelism (cp=2)"),
    (dict(tp=2, etp=2, ep=8, moe_dispatcher="flex"), "runs DeepEP only without expert tensor parallelism (etp=2)")])
def test_what_torchtitans_deepseek_v3_cannot_run_is_refused_and_never_searched(changes, named):
    plan = make_plan(**{**_DEEPSEEK, **changes})
    with pytest.raises(PlannerError) as error:
        export_plan(plan, "torchtitan")
    assert named in str(error.value) and "torchtitan 0.2.2's deepseek_v3" in str(error.value)
    model, cluster = load_model("deepseek-v3"), parse_shorthand("32x8xH800")
    space = list(enumerate_configs(model, cluster, Training(global_batch=256, seq_len=4096),
                                   FixedOptions(framework="torchtitan", pp=4)))
    assert space and all(config.cp == 1 for config in space)
    assert not any(config.moe_dispatcher == "flex" and config.etp > 1 for config in space)
    assert any(config.moe_dispatcher == "flex" for config in space)
