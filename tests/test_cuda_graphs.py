"""Full-iteration CUDA graphs (`Training.cuda_graphs`): a replayed graph launches no kernel from the host and its
dropless MoE layers (padded to a static capacity) read no token counts back, so a pass takes its GPU time
(planner/profile/analytic.py `_host_bound`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks.moe_runs import moe_runs
from planner.config import CUDA_GRAPH_MODES, Training
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.plan_sections import training_from_record, training_record
from planner.profile.analytic import AnalyticProfile, UnitSetting, unit_setting
from planner.profile.calibration import default_calibration
from tests.host_overlap import full_overlap

QWEN = load_model("qwen3-30b-a3b")


def _setting(seq_len: int, graphs: str) -> UnitSetting:
    return UnitSetting(tp=1, micro_batch=1, seq_len=seq_len, sequence_parallel=False, dtype="bf16",
                       attention="flash", ep=8, dispatcher="flex", cuda_graphs=graphs)


def test_modes_and_a_bad_mode_is_refused() -> None:
    assert CUDA_GRAPH_MODES == ("none", "full_iteration")
    assert Training().cuda_graphs == "none"
    with pytest.raises(PlannerError, match="cuda_graphs"):
        Training(cuda_graphs="partial")


def test_unit_setting_carries_the_training_mode() -> None:
    assert unit_setting(Training(cuda_graphs="full_iteration"), 1, 1, False).cuda_graphs == "full_iteration"
    assert unit_setting(Training(), 1, 1, False).cuda_graphs == "none"


def test_a_graph_replay_is_not_host_bound() -> None:
    """At 128 tokens every kernel of the MoE block runs faster than the host launches it: eagerly its forward is
    its 47 launches' host time; replayed from a graph it is its GPU time, well under that."""
    calibration = full_overlap()
    profile, gpu = AnalyticProfile(QWEN, calibration), lookup_gpu("B200")
    eager = profile.times(UnitKind.BLOCK, _setting(128, "none"), gpu)
    graph = profile.times(UnitKind.BLOCK, _setting(128, "full_iteration"), gpu)
    assert eager.forward_s == pytest.approx(15 * calibration.host_kernel_s + 32 * calibration.grouped_gemm_host_s,
                                            rel=1e-12)
    assert graph.forward_s < eager.forward_s / 2 and graph.backward_s < eager.backward_s


def test_a_gpu_bound_pass_is_the_same_either_way() -> None:
    """A dense block at 32K tokens runs longer than its launches: graphs change nothing."""
    profile, gpu = AnalyticProfile(load_model("llama3-8b"), full_overlap()), lookup_gpu("H100-80GB")
    eager, graph = (profile.times(UnitKind.BLOCK, replace(_setting(32768, mode), ep=1), gpu)
                    for mode in ("none", "full_iteration"))
    assert (eager.forward_s, eager.backward_s) == (graph.forward_s, graph.backward_s)


def test_the_synced_moe_forward_under_graphs_is_its_gpu_time() -> None:
    profile, gpu = AnalyticProfile(QWEN, default_calibration()), lookup_gpu("B200")
    setting = _setting(128, "full_iteration")
    assert profile._synced_forward(setting, gpu, 1e-3, 47) == pytest.approx(1e-3, rel=1e-12)


def test_plan_records_keep_the_mode() -> None:
    training = Training(cuda_graphs="full_iteration")
    assert training_from_record(training_record(training), "plan") == training
    assert training_from_record({k: v for k, v in training_record(Training()).items() if k != "cuda_graphs"},
                                "old plan").cuda_graphs == "none"


def test_moe_rows_of_full_iteration_presets_run_graphs() -> None:
    """Megatron-Bridge 0.5.0 (26.06) captures full-iteration graphs for Qwen3-30B-A3B MXFP8 on 8 GB300 (MB-007, 26.08),
    not in 26.04.01 (MB-066); DeepSeek-V3 on 256 GB300 at micro-batch 1 (MB-001) too, at micro-batch 2 (MB-057) not."""
    runs = {r.source.split()[-1]: r.training for r in moe_runs(rack_scale=True)[0]}
    assert runs["MB-007"].cuda_graphs == "full_iteration" and runs["MB-066"].cuda_graphs == "none"
    assert runs["MB-001"].cuda_graphs == "full_iteration" and runs["MB-057"].cuda_graphs == "none"


QWEN_ESTIMATE = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "1x8xB200", "--dtype", "fp8", "--fp8-recipe",
                 "mxfp8", "--ep", "8", "--tp", "1", "--pp", "1", "--dp", "8", "--micro-batch", "1", "--global-batch",
                 "64", "--seq-len", "4096", "--json"]


def test_cli_graphs_remove_the_host_time_and_are_named() -> None:
    from click.testing import CliRunner

    from cli import main
    runner = CliRunner()
    launched = runner.invoke(main, QWEN_ESTIMATE)
    graphed = runner.invoke(main, [*QWEN_ESTIMATE, "--cuda-graphs", "full_iteration"])
    assert launched.exit_code == graphed.exit_code == 0, graphed.output
    launched_doc, graphed_doc = json.loads(launched.output), json.loads(graphed.output)
    assert graphed_doc["training"]["cuda_graphs"] == "full_iteration"
    assert graphed_doc["estimate"]["iteration_time_s"] < launched_doc["estimate"]["iteration_time_s"]
    text = runner.invoke(main, [*QWEN_ESTIMATE[:-1], "--cuda-graphs", "full_iteration"]).output
    assert "full-iteration CUDA graphs" in text.splitlines()[0]


@pytest.mark.parametrize(("extra", "message"), [
    (["--cuda-graphs", "partial"], "'partial' is not one of 'none', 'full_iteration'"),
    (["--cuda-graphs", "full_iteration", "--framework", "torchtitan"], "cannot capture a whole iteration"),
    (["--cuda-graphs", "full_iteration", "--framework", "deepspeed"], "cannot capture a whole iteration"),
])
def test_cli_bad_or_unsupported_graphs_exit_2(extra: list[str], message: str) -> None:
    from click.testing import CliRunner

    from cli import main
    result = CliRunner().invoke(main, [*QWEN_ESTIMATE[:-1], *extra])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_megatron_export_captures_the_iteration_as_core_0_16_spells_it() -> None:
    from test_export_plans import parse_flags, plan_document

    from planner.export.megatron import export_megatron
    from planner.plan import parse_plan_document
    document = plan_document(cluster="1x8xH100-80GB", blocks=(32,), tp=1, pp=1, dp=8, distributed_optimizer=True)
    document["training"]["cuda_graphs"] = "full_iteration"
    flags = parse_flags(export_megatron(parse_plan_document(document)).files["megatron_args.txt"])
    assert flags["--cuda-graph-impl"] == ["local"] and flags["--cuda-graph-scope"] == ["full_iteration"]
    assert "--no-check-for-nan-in-loss-and-grad" in flags
