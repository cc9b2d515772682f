"""Where an estimate that fits stops being a promise: the published record behind TIGHT_MEMORY_SHARE, the warning
`plan` and `estimate` print above it, and `--memory-headroom`, which plans with room left."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from benchmarks.accuracy import margin_counts
from cli import main
from planner.cluster import load_cluster
from planner.config import Training
from planner.errors import PlannerError
from planner.gpu import GIB
from planner.model import load_model
from planner.profile.calibration import default_calibration
from planner.search.planning import plan

# llama3-70b on 64 H100 at 8K tokens: the fastest layout needs 98 % of the memory, a 0.6 % slower one 80 %
TIGHT = ("--model", "llama3-70b", "--cluster", "8x8xH100-80GB", "--global-batch", "512", "--seq-len", "8192")
TIGHT_LAYOUT = ("--dp", "4", "--tp", "4", "--pp", "4", "--micro-batch", "1", "--recompute", "none",
                "--sequence-parallel", "--tp-comm-overlap", "--distributed-optimizer", "--partition", "19,21,21,19")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_published_runs_estimated_above_the_tight_share_both_ran_and_ran_out_of_memory() -> None:
    """The evidence the threshold stands on: in (TIGHT_MEMORY_SHARE, 1] runs that ran and documented OOMs mix, in the
    band just below it no documented OOM lies, and above the whole memory no run that ran."""
    (_, ran_over, oom_over), (_, ran_tight, oom_tight), (_, _, oom_below), _ = margin_counts(default_calibration())
    assert ran_tight > 0 and oom_tight > 0
    assert oom_below == 0
    assert ran_over == 0 and oom_over > 0


def test_plan_warns_when_its_best_plan_is_tight_and_names_the_roomier_one() -> None:
    result = run("plan", *TIGHT)
    assert result.exit_code == 0, result.output
    assert "memory margin   needs 98.3 % of its GPUs' memory" in result.stdout
    assert "plan 2 is 0.6 % slower and needs 79.9 %" in result.stdout


def test_memory_headroom_plans_every_listed_plan_with_room_left_against_the_whole_memory() -> None:
    result = run("plan", *TIGHT, "--memory-headroom", "10", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["search"]["memory_headroom"] == 0.1
    for planned in (document, *document["alternatives"]):
        capacity = planned["stages"][0]["memory_bytes"]["capacity"]
        assert capacity == pytest.approx(79.15 * GIB, rel=1e-3)  # reported against the whole memory
        assert planned["estimate"]["peak_memory_bytes"] <= 0.9 * capacity
    assert "memory margin" not in run("plan", *TIGHT, "--memory-headroom", "10").stdout


def test_memory_headroom_plan_file_reestimates_exactly(tmp_path) -> None:
    path = tmp_path / "plan.json"
    assert run("plan", *TIGHT, "--memory-headroom", "10", "--out", str(path)).exit_code == 0
    result = run("estimate", "--plan", str(path))
    assert result.exit_code == 0, result.output
    assert "estimate reproduced exactly" in result.stdout


def test_library_plan_with_headroom_matches_the_cli_and_rejects_bad_shares() -> None:
    model, cluster = load_model("llama3-70b"), load_cluster("8x8xH100-80GB")
    training = Training(global_batch=512, seq_len=8192)
    planned = plan(model, cluster, training, top_k=2, memory_headroom=0.1)
    assert all(ranked.estimate.memory_share <= 0.9 for ranked in planned.plans)
    assert all(ranked.estimate.stages[0].memory.capacity == cluster.nodes[0].gpu.memory_bytes
               for ranked in planned.plans)
    for bad in (-0.1, 0.5, 0.9):
        with pytest.raises(PlannerError, match="memory headroom"):
            plan(model, cluster, training, top_k=1, memory_headroom=bad)


def test_estimate_warns_above_the_tight_share_only() -> None:
    tight = run("estimate", *TIGHT, *TIGHT_LAYOUT)
    assert tight.exit_code == 0, tight.output
    assert "memory margin   needs 98.3 %" in tight.stdout
    assert "--memory-headroom" not in tight.stdout  # a plan option: estimate names no alternative
    roomy = run("estimate", *TIGHT, "--dp", "4", "--tp", "4", "--pp", "4", "--micro-batch", "1", "--recompute", "full",
                "--sequence-parallel", "--tp-comm-overlap", "--distributed-optimizer")
    assert roomy.exit_code == 0, roomy.output
    assert "memory margin" not in roomy.stdout


@pytest.mark.parametrize("value", ["-1", "50", "nan", "many"])
def test_bad_memory_headroom_exits_2_with_one_line(value: str) -> None:
    for command in (("plan",), ("sweep", "--gpus", "8", "--tokens", "1e9")):
        result = run(*command, "--memory-headroom", value)
        assert result.exit_code == 2
        assert "--memory-headroom" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_headroom_that_leaves_too_little_is_infeasible_naming_it() -> None:
    result = run("plan", "--model", "llama3-405b", "--cluster", "4x8xH100-80GB", "--memory-headroom", "40")
    assert result.exit_code == 1
    assert "with 40 % of every GPU's memory left free: --memory-headroom" in result.stderr


def test_with_memory_share_scales_only_the_memory() -> None:
    cluster = load_cluster("2x8xH100-80GB")
    budget = cluster.with_memory_share(0.9)
    gpu, spec = cluster.nodes[0].gpu, budget.nodes[0].gpu
    assert spec.memory_bytes == int(0.9 * gpu.memory_bytes)
    assert (spec.name, spec.peak_flops_per_s, spec.hbm_bandwidth_bytes_per_s) == (
        gpu.name, gpu.peak_flops_per_s, gpu.hbm_bandwidth_bytes_per_s)
    assert budget.num_gpus == cluster.num_gpus


def test_explain_calls_a_plan_above_the_tight_share_tight_with_the_evidence(tmp_path) -> None:
    path = tmp_path / "tight.json"
    assert run("estimate", *TIGHT, *TIGHT_LAYOUT, "--out", str(path)).exit_code == 0
    result = run("explain", str(path))
    assert result.exit_code == 0, result.output
    assert "will not fit, and published runs estimated above 95 % of their GPUs' memory both ran" in result.stdout


def test_sweep_plans_with_the_headroom_and_records_it() -> None:
    result = run("sweep", "--model", "llama3-70b", "--gpus", "64", "--global-batch", "512", "--seq-len", "8192",
                 "--tokens", "1e9", "--memory-headroom", "10", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["memory_headroom"] == 0.1
    assert "cp=2" in document["points"][0]["parallelism"]  # the tight dp 4 tp 4 pp 4 layout is left out


def test_sweep_shows_each_best_plans_memory_and_marks_the_tight_ones() -> None:
    args = ("sweep", "--model", "llama3-70b", "--gpus", "64", "--global-batch", "512", "--seq-len", "8192", "--tokens",
            "1e9")
    tight = run(*args)
    assert tight.exit_code == 0, tight.output
    assert "98.3 % !" in tight.stdout and "! needs more than 95 % of its GPUs' memory; published runs" in tight.stdout
    roomy = run(*args, "--memory-headroom", "10")
    assert "79.9 %" in roomy.stdout and "! needs" not in roomy.stdout
    assert json.loads(run(*args, "--json").stdout)["points"][0]["memory_share"] == pytest.approx(0.983, abs=5e-4)
