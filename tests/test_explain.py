"""`planner explain` and `planner compare`: the one change that buys the most agrees with the search,
and a comparison's term deltas add up to the difference in iteration time."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from planner.config import Recompute
from planner.explain import (
    HOST_BOUND_SHARE,
    WORTH_IT,
    _graphed_what_if,
    bottleneck,
    explain,
    host_launch_s,
    neighbours,
)
from planner.plan import build_plan_document, load_plan
from planner.replay import problem_of
from planner.search.planning import plan

SMALL = ["--model", "tiny-llama", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len", "1024"]
POOR = [*SMALL, "--tp", "2", "--pp", "4", "--recompute", "full"]


def write_plan(tmp_path: Path, name: str, *args: str) -> Path:
    """`planner estimate ARGS --out`, or the search's best plan (`plan` as the first argument)."""
    path = tmp_path / f"{name}.json"
    if args[0] == "plan":
        problem = problem_of(load_plan(write_plan(tmp_path, f"{name}-seed", "estimate", *args[1:])))
        best = plan(problem.model, problem.cluster, problem.training, None, 1).best
        path.write_text(json.dumps(build_plan_document(problem.model, problem.cluster, problem.training, best.config,
                                                       best.placement, best.estimate)))
        return path
    result = CliRunner().invoke(main, [*args, "--out", str(path)])
    assert result.exit_code == 0, result.output
    return path


GRAPHS = "cuda graphs none→full_iteration"  # changes how the host launches, outside the layout search


def _graphs(change: str) -> bool:
    """Whether a what-if changes how the host launches (a full-iteration or per-layer CUDA graphs), not the layout."""
    return change.startswith("cuda graph")


def test_a_poor_plans_best_change_is_its_fastest_neighbour_and_no_faster_than_the_search(tmp_path: Path) -> None:
    """The best change is the fastest what-if; the fastest layout step is no faster than the search's best plan
    (the CUDA-graphs what-if, for this host-bound tiny model, may be: the search plans eager launches)."""
    problem = problem_of(load_plan(write_plan(tmp_path, "poor", "estimate", *POOR)))
    result = problem.estimate()
    explanation = explain(problem, result)
    best = explanation.best_change
    assert best is not None and best.delta_s < 0
    assert best.iteration_time_s == min(w.iteration_time_s for w in explanation.what_ifs if w.iteration_time_s)
    layout = min(w.iteration_time_s for w in explanation.what_ifs if w.iteration_time_s and not _graphs(w.change))
    searched = plan(problem.model, problem.cluster, problem.training, None, 1).best.estimate.iteration_time_s
    assert layout >= searched * (1 - 1e-9)
    assert explanation.alternatives[0].iteration_time_s == pytest.approx(searched)


def test_the_searchs_best_plan_has_no_single_layout_change_that_buys_anything(tmp_path: Path) -> None:
    problem = problem_of(load_plan(write_plan(tmp_path, "best", "plan", *SMALL)))
    result = problem.estimate()
    explanation = explain(problem, result)
    assert explanation.best_change is None or _graphs(explanation.best_change.change)
    assert all(w.delta_s is None or w.delta_s >= -WORTH_IT * result.iteration_time_s
               for w in explanation.what_ifs if not _graphs(w.change))


def test_neighbours_are_one_step_of_one_knob_on_the_same_gpus(tmp_path: Path) -> None:
    config = load_plan(write_plan(tmp_path, "poor", "estimate", *POOR)).parallel
    labels = {label.split()[0] for label, _ in neighbours(config)}
    assert {"tp", "pp", "micro-batch", "recompute", "sharding"} <= labels
    for label, other in neighbours(config):
        assert other.num_gpus == config.num_gpus, label
        assert other != config
    assert ("recompute full→selective", Recompute.SELECTIVE) in [
        (label, other.recompute) for label, other in neighbours(config) if label.startswith("recompute")]


def test_the_bottleneck_is_named_in_words(tmp_path: Path) -> None:
    problem = problem_of(load_plan(write_plan(tmp_path, "poor", "estimate", *POOR)))
    result = problem.estimate()
    key, words = bottleneck(result, problem.config)
    assert key in result.breakdown_s and words.split(":")[0] in (
        "compute", "activation recompute", "pipeline bubble", "tensor-parallel communication", "pipeline p2p",
        "data-parallel communication", "optimizer step", "fixed per-iteration overhead")


def test_a_host_bound_plan_is_named_so_and_a_gpu_bound_one_is_not(tmp_path: Path) -> None:
    """A 350M GPT split 8 ways launches its kernels slower than the GPUs run them: the verdict names the host and the
    launches' share, which is what freeing them (host_kernel_s 0) saves; Llama-3-8B at 8K tokens per GPU is
    compute-bound on its own math, where the launches add under 1 %."""
    thin = problem_of(load_plan(write_plan(
        tmp_path, "thin", "estimate", "--model", "gpt3-350m", "--cluster", "1x8xA100-80GB", "--global-batch", "8",
        "--seq-len", "1024", "--tp", "8")))
    result = thin.estimate()
    host = host_launch_s(thin, result)
    assert host >= HOST_BOUND_SHARE * result.iteration_time_s
    free = replace(thin, calibration=thin.calibration.updated(host_kernel_s=0.0, grouped_gemm_host_s=0.0))
    assert host == pytest.approx(result.iteration_time_s - free.estimate().iteration_time_s)
    key, words = bottleneck(result, thin.config, host)
    assert key == "compute" and words.startswith("compute, held back by the host")
    assert f"{100 * host / result.iteration_time_s:.1f} %" in words and "tp=8" in words
    wide = problem_of(load_plan(write_plan(
        tmp_path, "wide", "estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "8",
        "--seq-len", "8192", "--zero", "3")))
    wide_result = wide.estimate()
    wide_host = host_launch_s(wide, wide_result)
    assert wide_host < 0.01 * wide_result.iteration_time_s
    assert bottleneck(wide_result, wide.config, wide_host)[1].startswith("compute: the GPUs spend")
    assert not _graphed_what_if(wide, wide_result.iteration_time_s, wide_host, 1.0)


def test_a_host_bound_plans_what_ifs_include_cuda_graphs_which_save_the_launches(tmp_path: Path) -> None:
    """Replayed from one CUDA graph the thin plan launches nothing from the host: the what-if saves what the
    launches add (its layout and split stay), and it is the change that buys the most."""
    thin = problem_of(load_plan(write_plan(
        tmp_path, "thin", "estimate", "--model", "gpt3-350m", "--cluster", "1x8xA100-80GB", "--global-batch", "8",
        "--seq-len", "1024", "--tp", "8")))
    result = thin.estimate()
    explanation = explain(thin, result)
    graphed = [w for w in explanation.what_ifs if w.change == GRAPHS]
    assert len(graphed) == 1 and graphed[0].config == thin.config
    assert graphed[0].delta_s == pytest.approx(-explanation.host_launch_s, rel=1e-6)
    assert explanation.best_change == graphed[0]
    assert explanation.as_dict()["host_launch_s"] == explanation.host_launch_s
    # per-layer graphs of attention and the MLP save part of it: the embedding and head stay launched one by one
    per_layer = [w for w in explanation.what_ifs if w.change == "cuda graph modules none→attn,mlp"]
    assert len(per_layer) == 1 and graphed[0].delta_s < per_layer[0].delta_s < 0
    # DeepSpeed cannot capture a whole iteration or per-layer parts: no such step for a plan it is to run
    assert not _graphed_what_if(thin, result.iteration_time_s, explanation.host_launch_s, 1.0, "deepspeed")
    assert [w.change for w in _graphed_what_if(thin, result.iteration_time_s, explanation.host_launch_s, 1.0,
                                               "megatron")] == [GRAPHS, "cuda graph modules none→attn,mlp"]


def test_graphable_parts_follow_the_model_and_the_recompute() -> None:
    from planner.config import ParallelConfig, Recompute, Training
    from planner.explain import graphable_parts
    from planner.model import load_model

    def parts(model: str, **config: object) -> tuple[str, ...]:
        return graphable_parts(load_model(model), Training(), ParallelConfig(dp=8, tp=1, pp=1, **config))

    assert parts("llama3-8b") == ("attn", "mlp")
    assert parts("qwen3-30b-a3b") == ("attn", "moe_router", "moe_preprocess")
    assert parts("deepseek-v3") == ("attn", "mlp", "moe_router", "moe_preprocess")
    assert parts("llama3-8b", recompute=Recompute.FULL) == ()
    dropping = Training(moe_capacity_factor=1.25)  # the alltoall dispatcher's preprocessing syncs there
    assert graphable_parts(load_model("qwen3-30b-a3b"), dropping, ParallelConfig(dp=8, tp=1, pp=1)) == (
        "attn", "moe_router")


def test_explain_json_is_one_document(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["explain", str(write_plan(tmp_path, "poor", "estimate", *POOR)), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert {"bottleneck", "verdict", "host_launch_s", "breakdown_s", "memory", "what_ifs", "alternatives",
            "best_change"} <= set(document)


def test_compare_names_the_faster_plan_and_its_terms_add_up(tmp_path: Path) -> None:
    fast = write_plan(tmp_path, "fast", "plan", *SMALL)
    slow = write_plan(tmp_path, "slow", "estimate", *POOR)
    result = CliRunner().invoke(main, ["compare", str(slow), str(fast), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["fastest"] == str(fast)
    times = [json.loads(p.read_text())["estimate"]["iteration_time_s"] for p in (slow, fast)]
    assert sum(document["deltas_s"][str(slow)].values()) == pytest.approx(times[0] - times[1], rel=1e-9)
    differing = {row["field"] for row in document["rows"] if row["differs"]}
    assert {"pp", "recompute", "iteration time"} <= differing and "model" not in differing
    text = CliRunner().invoke(main, ["compare", str(slow), str(fast)]).output
    assert f"{fast} is" in text and "faster than" in text


def test_compare_needs_two_plans_and_readable_files(tmp_path: Path) -> None:
    one = write_plan(tmp_path, "fast", "plan", *SMALL)
    assert CliRunner().invoke(main, ["compare", str(one)]).exit_code == 2
    assert CliRunner().invoke(main, ["compare", str(one), str(tmp_path / "missing.json")]).exit_code == 2
