"""Lossless plan files (issue 12 item 2, schema_version 2): the file alone rebuilds the model, the whole cluster
(GPU profiles, node names, pair links, slowdowns), training, calibration and framework, so `planner estimate
--plan` reproduces the iteration time and every stage's memory exactly; version 1 files are still read."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from test_export_plans import plan_document

import cli
from planner.cluster import load_cluster
from planner.config import Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.model import catalog_model_names, load_model
from planner.placement import default_placement
from planner.plan import build_plan_document, load_plan, parse_plan_document
from planner.profile.calibration import default_calibration
from planner.replay import problem_of
from planner.search.space import FixedOptions, complete_config


def run(*args: str):
    return CliRunner().invoke(cli.main, list(args))


def _tp(name: str) -> int:
    model = load_model(name)
    return max(t for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0 and model.num_key_value_heads % t == 0)


@pytest.mark.parametrize("name", catalog_model_names())
def test_every_catalog_model_is_reproduced_exactly_from_its_plan_file(name):
    model, cluster = load_model(name), load_cluster("2x8xH100-80GB")
    training = Training(global_batch=32, seq_len=2048)
    config = complete_config(FixedOptions(tp=_tp(name), pp=2, framework="deepspeed"), model, cluster, training)
    calibration = default_calibration().updated(gemm_efficiency=0.7)  # not the shipped constants
    placement = default_placement(cluster, config)
    result = estimate(model, cluster, training, config, None, placement, calibration=calibration)
    document = json.loads(json.dumps(build_plan_document(model, cluster, training, config, placement, result,
                                                         framework="deepspeed", calibration=calibration)))
    plan = parse_plan_document(document)
    inputs = problem_of(plan)
    again = estimate(inputs.model, inputs.cluster, inputs.training, inputs.config, inputs.partition,
                     inputs.placement, calibration=plan.calibration)
    assert plan.framework == "deepspeed" and inputs.config == config and inputs.training == training
    assert again.iteration_time_s == document["estimate"]["iteration_time_s"]
    assert [round(s.memory.total) for s in again.stages] == [s["memory_bytes"]["total"] for s in document["stages"]]


LAB = {"name": "lab", "inter_node_latency_us": 12,
       "node_groups": [{"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8, "names": ["a0", "a1"]},
                       {"gpu": "H100-80GB", "nodes": 2, "gpus_per_node": 8, "inter_node_gbps": 20}],
       "links": [{"nodes": ["a0", 3], "gbps": 2.0, "latency_us": 40}, {"nodes": ["a1", "node2"], "gbps": 6.0}]}


def test_a_heterogeneous_cluster_with_pair_links_and_a_slowdown_is_reproduced_by_estimate_plan(tmp_path):
    cluster_file = tmp_path / "lab.yaml"
    cluster_file.write_text(yaml.safe_dump(LAB))
    calibration = tmp_path / "calibration.yaml"
    calibration.write_text(yaml.safe_dump({"constants": {
        f: getattr(default_calibration(), f) * (0.9 if f == "gemm_efficiency" else 1)
        for f in default_calibration().__dataclass_fields__}}))
    plan_file = tmp_path / "plan.json"
    made = run("estimate", "--model", "llama3-8b", "--cluster", str(cluster_file), "--global-batch", "32",
               "--seq-len", "4096", "--tp", "2", "--pp", "4", "--zero", "1", "--framework", "deepspeed",
               "--partition", "10,8,8,6", "--slowdown", "a1:3=2", "--calibration", str(calibration),
               "--out", str(plan_file))
    assert made.exit_code in (0, 1), made.output
    document = json.loads(plan_file.read_text())
    assert document["cluster"]["pair_links"] and document["cluster"]["gpu_overrides"]
    assert document["framework"] == "deepspeed" and document["parallelism"]["overlap_tp_backward"] is False
    cluster_file.unlink()  # the plan file alone must do
    calibration.unlink()
    again = run("estimate", "--plan", str(plan_file), "--json")
    assert again.exit_code == made.exit_code, again.output
    redone = json.loads(again.stdout)
    assert redone["estimate"]["iteration_time_s"] == document["estimate"]["iteration_time_s"]
    assert [s["memory_bytes"] for s in redone["stages"]] == [s["memory_bytes"] for s in document["stages"]]
    text = run("estimate", "--plan", str(plan_file))
    assert "estimate reproduced exactly" in text.stdout
    assert load_plan(plan_file).machines == load_plan(plan_file).machines  # deterministic rebuild


def test_estimate_plan_refuses_options_that_would_change_the_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_document()))
    result = run("estimate", "--plan", str(path), "--tp", "4", "--seq-len", "128")
    assert result.exit_code == 2
    assert "drop --seq-len, --tp" in result.output or "drop --tp, --seq-len" in result.output


def test_plan_files_stay_compact_at_scale():
    result = run("estimate", "--model", "llama3-70b", "--cluster", "512x8xH100-80GB", "--global-batch", "4096",
                 "--tp", "8", "--pp", "8", "--json")
    document = json.loads(result.stdout)
    assert "ranks" not in document["placement"] and len(document["placement"]["runs"]) == 1
    assert len(document["cluster"]["node_groups"]) == 1 and "names" not in document["cluster"]["node_groups"][0]
    assert len(result.stdout) < 20_000


def test_version_1_files_are_still_read():
    document = {k: v for k, v in plan_document().items() if k not in ("calibration", "framework", "runs_on")}
    document.update(schema_version=1, cluster={"name": "2x8xH100-80GB", "num_nodes": 2, "gpus_per_node": 8,
                                               "gpu": "H100-80GB", "num_gpus": 16, "nodes": ["node0", "node1"]})
    plan = parse_plan_document(document)
    assert plan.framework == "any" and plan.machines is None and plan.calibration is None
    assert problem_of(plan).cluster == load_cluster("2x8xH100-80GB")


@pytest.mark.parametrize(("path", "value", "message"), [
    (["cluster", "gpus", 0, "memory_bytes"], "80GB", "cluster.gpus\\[0\\].memory_bytes must be int"),
    (["cluster", "node_groups", 0, "gpu"], 7, "must index cluster.gpus"),
    (["cluster", "pair_links"], [{"nodes": [0, 9]}], "must name nodes by index"),
    (["calibration", "constants", "gemm_efficiency"], -1, "gemm_efficiency"),
    (["training", "grad_bytes"], 3, "grad_bytes must be 2 or 4"),
    (["framework"], "jax", "framework 'jax' is not one of"),
])
def test_a_bad_v2_section_is_one_line_naming_the_field(path, value, message):
    document = json.loads(json.dumps(plan_document()))
    document["cluster"]["pair_links"] = [{"nodes": [0, 1], "bandwidth_bytes_per_s": 1e9, "latency_s": 1e-5,
                                          "kind": "inter"}]
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(PlannerError, match=message):
        parse_plan_document(document)
