"""MoE token dispatch (issue 11 item 6): the flex dispatcher (DeepEP / HybridEP) sends a token through the NIC once
per destination node, node-limited routing caps those nodes, EP communication overlap hides the all-to-alls behind
another micro-batch's compute; flags, plan files and the Megatron export carry both settings."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Recompute, Schedule, Training
from planner.cost.time import (
    alltoall_fabric_bytes,
    expected_holders,
    expert_parallel_s,
    flex_fabric_bytes,
    token_destination_nodes,
)
from planner.errors import PlannerError
from planner.export.flags import Dialect, model_flags, moe_dispatch_flags
from planner.frameworks import framework_named
from planner.model import load_model
from planner.placement import ExpertLink
from planner.profile.analytic import UnitTimes, unit_setting
from planner.profile.calibration import default_calibration
from planner.search.space import FixedOptions, enumerate_configs

DEEPSEEK = load_model("deepseek-v3")  # 256 experts, top-8, node-limited: 8 router groups, top-4
QWEN = load_model("qwen3-30b-a3b")  # 128 experts, top-8, no router groups
TOKEN_BYTES = 4096 * 7168 * 2.0


@pytest.mark.parametrize("ep", [16, 32, 64])
def test_flex_sends_fewer_bytes_across_nodes_than_alltoall_for_top8_over_two_or_more_nodes(ep: int) -> None:
    mlp = QWEN.mlp_spec(True)
    _, alltoall = alltoall_fabric_bytes(TOKEN_BYTES * mlp.moe_top_k, ep, 8)
    _, flex = flex_fabric_bytes(TOKEN_BYTES, mlp, ep, 8)
    nodes = ep // 8
    assert 0 < flex <= TOKEN_BYTES * (nodes - 1) / nodes * min(nodes, 8) and flex < alltoall
    assert alltoall == pytest.approx(TOKEN_BYTES * 8 * (ep - 8) / ep)  # every routed copy, 1 − 8/ep of them remote


def test_within_one_node_neither_dispatcher_uses_the_nic_and_flex_sends_one_copy_per_gpu() -> None:
    mlp = QWEN.mlp_spec(True)
    alltoall = alltoall_fabric_bytes(TOKEN_BYTES * 8, 8, 8)
    flex = flex_fabric_bytes(TOKEN_BYTES, mlp, 8, 8)
    assert alltoall[1] == flex[1] == 0.0
    assert flex[0] == pytest.approx(TOKEN_BYTES * expected_holders(128, 8, 8) * 7 / 8) and flex[0] < alltoall[0]


def test_expected_holders_matches_the_closed_form_and_its_limits() -> None:
    assert expected_holders(128, 8, 1) == 1.0
    assert expected_holders(128, 8, 128) == pytest.approx(8.0)  # one expert per holder: every pick is distinct
    assert expected_holders(128, 1, 16) == pytest.approx(1.0)
    # two nodes of 64 experts: only the C(64, 8)/C(128, 8) tokens whose experts all sit on one node miss the other
    assert expected_holders(128, 8, 2) == pytest.approx(2 * (1 - 4426165368 / 1429702652400), rel=1e-9)


def test_node_limited_routing_caps_the_destination_nodes() -> None:
    limited = DEEPSEEK.mlp_spec(True)
    free = replace(limited, router_groups=None, router_group_topk=None)
    for nodes in (4, 8, 16, 32):  # the 4 picked groups span 4·nodes/8 nodes when a group spans several
        cap = 4 * max(1, nodes // 8)
        assert token_destination_nodes(limited, nodes) <= cap and token_destination_nodes(
            limited, nodes) < token_destination_nodes(free, nodes)
    assert token_destination_nodes(limited, 8) == pytest.approx(4.0)  # one group per node: the 4 picked groups
    assert token_destination_nodes(limited, 2) == pytest.approx(2 * (1 - 1 / 70))  # C(4,4)/C(8,4): all 4 on the other
    assert token_destination_nodes(free, 2) > 1.99
    assert flex_fabric_bytes(TOKEN_BYTES, limited, 64, 8)[1] < flex_fabric_bytes(TOKEN_BYTES, free, 64, 8)[1]


def _ep_times(config: ParallelConfig, times: UnitTimes) -> tuple[float, float]:
    cluster, cal = parse_shorthand("4x8xH100-80GB"), default_calibration()
    link = ExpertLink(cluster.link(0, 0), cluster.link(0, 1), 8)
    setting = unit_setting(Training(global_batch=256, seq_len=4096), config.tp, config.micro_batch,
                           config.sequence_parallel, config.cp, config.ep, config.etp)
    return expert_parallel_s(QWEN.mlp_spec(True), QWEN.hidden_size, setting, config, link, cluster.link(0, 0), cal,
                             times)


@pytest.mark.parametrize("scale", [0.0, 1e-4, 1e-3, 1e-2, 0.1, 1.0])
@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_overlap_never_goes_negative_nor_above_the_exposed_all_to_alls(scale: float, dispatcher: str) -> None:
    config = ParallelConfig(dp=32, tp=1, pp=1, ep=32, moe_dispatcher=dispatcher)
    times = UnitTimes(forward_s=scale, backward_s=2 * scale, attention_core_forward_s=0.2 * scale,
                      linear_forward_s=(0.1 * scale, 0.05 * scale, 0.3 * scale, 0.3 * scale))
    exposed = _ep_times(config, times)
    hidden = _ep_times(replace(config, moe_ep_overlap=True), times)
    assert all(0.0 <= h <= e for h, e in zip(hidden, exposed, strict=True))
    if scale == 0.0:
        assert hidden == pytest.approx(exposed)  # nothing to hide behind
    if scale == 1.0:
        assert hidden == (0.0, 0.0)


def test_flex_is_faster_than_alltoall_across_nodes() -> None:
    times = UnitTimes(forward_s=1e-3, backward_s=2e-3)
    config = ParallelConfig(dp=32, tp=1, pp=1, ep=32)
    assert sum(_ep_times(replace(config, moe_dispatcher="flex"), times)) < sum(_ep_times(config, times)) / 2


# ---- configuration, frameworks and search ----------------------------------------------------------------------

def test_bad_dispatcher_and_overlap_settings_name_the_value() -> None:
    with pytest.raises(PlannerError, match="moe_dispatcher must be one of alltoall, flex, got 'deepep'"):
        ParallelConfig(dp=8, tp=1, pp=1, ep=8, moe_dispatcher="deepep")
    why = ParallelConfig(dp=8, tp=1, pp=2, ep=8, moe_ep_overlap=True).ep_overlap_why_not()
    assert why and "interleaved" in why
    assert "full recompute" in ParallelConfig(dp=8, tp=1, pp=1, ep=8, recompute=Recompute.FULL).ep_overlap_why_not()
    assert ParallelConfig(dp=8, tp=1, pp=2, vpp=2, ep=8, schedule=Schedule.INTERLEAVED).ep_overlap_why_not() is None


def test_frameworks_run_what_their_versions_have() -> None:
    flex = ParallelConfig(dp=16, tp=1, pp=1, ep=16, moe_dispatcher="flex")
    overlapped = replace(flex, moe_ep_overlap=True)
    assert framework_named("megatron").why_not(overlapped) is None
    assert framework_named("torchtitan").why_not(flex) is None  # parallelism.expert_parallel_comm_backend deepep
    assert "overlaps EP communication only under the dualpipe-v schedule" in framework_named("torchtitan").why_not(
        overlapped)
    assert "no flex MoE token dispatcher" in framework_named("deepspeed").why_not(flex)
    full = replace(overlapped, recompute=Recompute.FULL)
    assert "full recompute" in framework_named("megatron").why_not(full)


def _space(framework: str, **fixed) -> list[ParallelConfig]:
    return list(enumerate_configs(QWEN, parse_shorthand("2x8xH100-80GB"), Training(global_batch=64, seq_len=4096),
                                  FixedOptions(framework=framework, ep=16, micro_batch=1, **fixed)))


def test_search_uses_flex_and_overlap_where_the_framework_runs_them() -> None:
    megatron = _space("megatron")
    assert megatron and all(c.moe_dispatcher == "flex" for c in megatron)
    assert {c.moe_ep_overlap for c in megatron} == {True, False}
    assert all(c.moe_ep_overlap == (c.ep_overlap_why_not() is None) for c in megatron)
    deepspeed = _space("deepspeed")
    assert deepspeed and all(c.moe_dispatcher == "alltoall" and not c.moe_ep_overlap for c in deepspeed)
    fixed = _space("megatron", moe_dispatcher="alltoall", moe_ep_overlap=True)
    assert fixed and all(c.moe_dispatcher == "alltoall" and c.moe_ep_overlap for c in fixed)


# ---- CLI and plan files ----------------------------------------------------------------------------------------

_QWEN_ON_16 = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB", "--global-batch", "64",
               "--seq-len", "4096", "--distributed-optimizer"]
_ESTIMATE = [*_QWEN_ON_16, "--ep", "16"]


def test_cli_flags_reach_the_estimate_and_bad_values_exit_2(tmp_path) -> None:
    runner = CliRunner()
    plain = runner.invoke(main, [*_ESTIMATE, "--json"])
    flex = runner.invoke(main, [*_ESTIMATE, "--moe-dispatcher", "flex", "--moe-ep-overlap", "--json"])
    assert plain.exit_code == flex.exit_code == 0, flex.output
    plain_doc, flex_doc = json.loads(plain.output), json.loads(flex.output)
    assert flex_doc["parallelism"]["moe_dispatcher"] == "flex" and flex_doc["parallelism"]["moe_ep_overlap"]
    assert flex_doc["estimate"]["iteration_time_s"] < plain_doc["estimate"]["iteration_time_s"]
    for options, message in ((["--moe-dispatcher", "deepep"], "'deepep' is not one of 'alltoall', 'flex'"),
                             (["--moe-ep-overlap", "--recompute", "full"], "full recompute"),
                             (["--moe-ep-overlap", "--pp", "2", "--ep", "8"], "interleaved schedule")):
        result = runner.invoke(main, [*_QWEN_ON_16, *options] if "--ep" in options else [*_ESTIMATE, *options])
        assert result.exit_code == 2 and message in result.output, result.output
    dense = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB",
                                 "--moe-ep-overlap"])
    assert dense.exit_code == 2 and "no routed experts" in dense.output


def test_plan_file_round_trips_the_dispatcher_and_overlap(tmp_path) -> None:
    path = tmp_path / "plan.json"
    runner = CliRunner()
    written = runner.invoke(main, [*_ESTIMATE, "--moe-dispatcher", "flex", "--moe-ep-overlap", "--json",
                                   "--out", str(path)])
    assert written.exit_code in (0, 1), written.output  # 1: does not fit, still written
    again = runner.invoke(main, ["estimate", "--plan", str(path)])
    assert "reproduced exactly" in again.output and "ep=16/flex/overlap" in again.output
    document = json.loads(path.read_text())
    document["parallelism"]["moe_dispatcher"] = "allgather"
    path.write_text(json.dumps(document))
    bad = runner.invoke(main, ["estimate", "--plan", str(path)])
    assert bad.exit_code == 2 and "moe_dispatcher must be one of alltoall, flex, got 'allgather'" in bad.output


# ---- Megatron export -------------------------------------------------------------------------------------------

def test_megatron_dispatch_flags() -> None:
    config = ParallelConfig(dp=16, tp=1, pp=1, ep=16, moe_dispatcher="flex", moe_ep_overlap=True)
    assert moe_dispatch_flags(config) == (("--moe-token-dispatcher-type", "flex"),
                                          ("--overlap-moe-expert-parallel-comm",))
    assert moe_dispatch_flags(replace(config, moe_dispatcher="alltoall", moe_ep_overlap=False)) == (
        ("--moe-token-dispatcher-type", "alltoall"),)


_MEGATRON_CORE = """
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
import torch
from megatron.core.transformer.transformer_config import TransformerConfig
fields = {f.name for f in dataclasses.fields(TransformerConfig)}
out = []
for flags, extra in json.loads(sys.argv[1]):
    values = {}
    for flag in flags:
        name = flag[0][2:].replace("-", "_")
        assert name in fields, name  # core 0.16's ArgumentGroupFactory makes each TransformerConfig field a flag
        values[name] = flag[1] if len(flag) > 1 else True
    values["moe_router_num_groups"] = int(values["moe_router_num_groups"])
    values["moe_router_group_topk"] = int(values["moe_router_group_topk"])
    try:
        TransformerConfig(num_layers=4, hidden_size=256, num_attention_heads=8, num_moe_experts=256,
                          moe_router_topk=8, moe_ffn_hidden_size=128, bf16=True, params_dtype=torch.bfloat16,
                          pipeline_dtype=torch.bfloat16, moe_grouped_gemm=True, **values, **extra)
        out.append(None)
    except (AssertionError, ValueError) as error:
        out.append(str(error))
print(json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
                    reason="megatron-core not installed (pip install --no-deps megatron-core)")
def test_megatron_core_accepts_the_dispatch_flags_and_refuses_what_planner_refuses() -> None:
    """megatron-core 0.16's TransformerConfig validation takes the exported dispatcher, overlap and router-group
    settings, and refuses EP overlap exactly where `ep_overlap_why_not` does."""
    model = model_flags(DEEPSEEK, Training(), Dialect.MEGATRON_LM).flags
    routing = [list(flag) for flag in model if flag[0] in ("--moe-router-num-groups", "--moe-router-group-topk")]
    assert routing == [["--moe-router-num-groups", "8"], ["--moe-router-group-topk", "4"]]
    configs = [ParallelConfig(dp=16, tp=1, pp=1, ep=16, moe_dispatcher="flex", moe_ep_overlap=True),
               ParallelConfig(dp=16, tp=1, pp=1, ep=16),
               ParallelConfig(dp=8, tp=1, pp=2, vpp=2, ep=8, schedule=Schedule.INTERLEAVED, moe_ep_overlap=True),
               ParallelConfig(dp=8, tp=1, pp=2, ep=8, moe_ep_overlap=True),
               ParallelConfig(dp=16, tp=1, pp=1, ep=16, moe_ep_overlap=True, recompute=Recompute.FULL)]
    cases = []
    for config in configs:
        extra = {"expert_model_parallel_size": config.ep, "pipeline_model_parallel_size": config.pp,
                 "virtual_pipeline_model_parallel_size": config.vpp if config.vpp > 1 else None}
        if config.recompute is Recompute.FULL:
            extra |= {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
        cases.append(([list(flag) for flag in moe_dispatch_flags(config)] + routing, extra))
    run = subprocess.run([sys.executable, "-c", _MEGATRON_CORE, json.dumps(cases)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    refused = json.loads(run.stdout.strip().splitlines()[-1])
    assert [error is None for error in refused] == [not c.moe_ep_overlap or c.ep_overlap_why_not() is None
                                                     for c in configs], refused
