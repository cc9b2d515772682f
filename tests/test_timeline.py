"""`planner timeline`: the simulated iteration as a Chrome trace-event file (the format of Chrome's
"Trace Event Format" document: metadata "M", complete "X" events with ts/dur in µs, counters "C")."""

from __future__ import annotations

import itertools
import json
import math
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from planner.plan import load_plan
from planner.replay import problem_of
from planner.timeline import chrome_trace, iteration_timeline

CASES = {
    "1f1b": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "32", "--seq-len", "2048",
             "--tp", "2", "--pp", "4", "--recompute", "selective"],
    "interleaved": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "16", "--seq-len",
                    "2048", "--pp", "4", "--vpp", "2", "--micro-batch", "2", "--recompute", "full"],
    "gpipe": ["--model", "tiny-llama", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len", "1024",
              "--pp", "2", "--tp", "2", "--schedule", "gpipe"],
    # sliding and global attention blocks: each unit's pieces come from its own block type
    "mixed-blocks": ["--model", "gemma3-27b", "--cluster", "1x8xH100-80GB", "--global-batch", "8", "--seq-len",
                     "4096", "--pp", "2", "--tp", "4", "--recompute", "full"],
    "zb-h1": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "32", "--seq-len", "2048",
              "--tp", "2", "--pp", "4", "--schedule", "zb-h1"],
    "zb-h2": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "32", "--seq-len", "2048",
              "--tp", "2", "--pp", "4", "--schedule", "zb-h2"],
    # the order built from the plan's stage times (Qi et al.'s automatic ZB-2p)
    "zb-2p": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "32", "--seq-len", "2048",
              "--tp", "2", "--pp", "4", "--schedule", "zb-2p"],
    # V layout: rank r draws stages r and 2pp − 1 − r
    "zb-v": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "16", "--seq-len", "2048",
             "--tp", "2", "--pp", "4", "--schedule", "zb-v"],
    "dualpipe-v": ["--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "16", "--seq-len", "2048",
                   "--tp", "2", "--pp", "4", "--schedule", "dualpipe-v"],
    "no-pipeline": ["--model", "tiny-llama", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len",
                    "1024", "--distributed-optimizer"],
}
TOLERANCE = 1e-9  # the simulator's periodic extrapolation is exact to rounding


def plan_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    result = CliRunner().invoke(main, ["estimate", *CASES[name], "--out", str(path)])
    assert result.exit_code in (0, 1), result.output
    return path


@pytest.fixture(params=list(CASES))
def traced(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict, dict, Path]:
    path = plan_file(tmp_path, request.param)
    out = tmp_path / "trace.json"
    result = CliRunner().invoke(main, ["timeline", str(path), "--out", str(out), "--svg", str(tmp_path / "t.svg")])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), json.loads(path.read_text()), tmp_path


def test_every_event_is_well_formed(traced: tuple[dict, dict, Path]) -> None:
    trace, _, _ = traced
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert event["ph"] in ("M", "X", "C") and isinstance(event["name"], str) and event["pid"] == 1
        if event["ph"] == "X":
            assert isinstance(event["tid"], int) and event["ts"] >= 0 and event["dur"] > 0
            assert math.isfinite(event["ts"] + event["dur"])
        if event["ph"] == "C":
            assert event["ts"] >= 0 and all(math.isfinite(v) and v >= 0 for v in event["args"].values())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    ranks = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(names) == len(ranks)


def test_events_of_one_rank_do_not_overlap(traced: tuple[dict, dict, Path]) -> None:
    trace, _, _ = traced
    by_rank = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            by_rank[event["tid"]].append((event["ts"], event["ts"] + event["dur"]))
    for spans in by_rank.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end * (1 - TOLERANCE) - 1e-6


def test_durations_add_up_to_the_estimate(traced: tuple[dict, dict, Path]) -> None:
    """The last slice ends at the estimate's iteration time; on the busiest rank compute, recompute,
    TP and p2p slices sum to the breakdown's terms, and the idle rest is the bubble."""
    trace, document, _ = traced
    estimate = document["estimate"]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    end_s = max(e["ts"] + e["dur"] for e in slices) / 1e6
    assert end_s == pytest.approx(estimate["iteration_time_s"], rel=TOLERANCE)
    busy = defaultdict(lambda: defaultdict(float))
    for e in slices:
        busy[e["tid"]][e["cat"]] += e["dur"] / 1e6
    work = ("forward", "backward", "weight_grad", "recompute", "tp_comm", "pp_comm")
    rank = max(busy, key=lambda tid: (sum(busy[tid][c] for c in work), -tid))
    terms = estimate["breakdown_s"]
    computed = busy[rank]["forward"] + busy[rank]["backward"] + busy[rank]["weight_grad"]
    assert computed == pytest.approx(terms["compute"], rel=1e-9)
    for term in ("recompute", "tp_comm", "pp_comm", "dp_comm", "optimizer", "other"):
        assert busy[rank][term] == pytest.approx(terms[term], rel=1e-9, abs=1e-12)
    idle = end_s - sum(busy[rank].values())
    assert idle == pytest.approx(terms["bubble"], rel=1e-6, abs=1e-9)


def test_memory_counters_peak_at_the_estimates_memory(traced: tuple[dict, dict, Path]) -> None:
    trace, document, _ = traced
    peaks = defaultdict(float)
    for event in trace["traceEvents"]:
        if event["ph"] == "C":
            peaks[event["name"]] = max(peaks[event["name"]], event["args"]["GiB"])
    for stage in document["stages"]:
        name = f"memory pp{stage['pp_rank']} (GiB)"
        assert peaks[name] == pytest.approx(stage["memory_bytes"]["total"] / 2**30, abs=1e-3)


def test_the_svg_is_one_well_formed_picture(traced: tuple[dict, dict, Path]) -> None:
    _, _, tmp_path = traced
    root = ET.parse(tmp_path / "t.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall("{http://www.w3.org/2000/svg}rect")) > 10


def test_one_forward_and_backward_per_microbatch_and_stage(tmp_path: Path) -> None:
    problem = problem_of(load_plan(plan_file(tmp_path, "interleaved")))
    result = problem.estimate()
    timeline = iteration_timeline(problem, result)
    passes = {(s.name[0], s.stage, s.microbatch) for s in timeline.slices if s.category in ("forward", "backward")}
    assert len(passes) == 2 * len(result.stages) * result.num_microbatches
    assert chrome_trace(timeline, "t")["otherData"]["iteration_time_s"] == timeline.iteration_s


def test_a_missing_plan_or_a_directory_out_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = CliRunner().invoke(main, ["timeline", str(tmp_path / "none.json"), "--out", str(tmp_path / "t.json")])
    assert missing.exit_code == 2 and missing.output.count("\n") == 1
    directory = CliRunner().invoke(main, ["timeline", str(plan_file(tmp_path, "gpipe")), "--out", str(tmp_path)])
    assert directory.exit_code == 2 and directory.output.startswith("error:")


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zb-2p", "zb-v", "dualpipe-v"])
def test_zero_bubble_draws_one_w_pass_per_microbatch_and_stage(tmp_path: Path, name: str) -> None:
    problem = problem_of(load_plan(plan_file(tmp_path, name)))
    result = problem.estimate()
    timeline = iteration_timeline(problem, result)
    weights = [s for s in timeline.slices if s.category == "weight_grad"]
    passes = len(result.stages) * result.num_microbatches
    assert len({(s.stage, s.microbatch) for s in weights}) == len(weights) == passes
    assert all(s.duration_s == pytest.approx(result.stages[s.stage].weight_s) for s in weights)
    assert all(s.pp_rank == result.stages[s.stage].pp_rank for s in timeline.slices if s.stage >= 0)
