"""`planner plan` through click's runner: table, --json, --out, --top, infeasible and bad options."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from cli import main
from planner.plan import load_plan

SMALL = ("--model", "gpt3-350m", "--cluster", "1x8xH100-80GB", "--global-batch", "32", "--seq-len", "1024")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_plan_without_arguments_prints_the_ranked_table_and_breakdown() -> None:
    result = run("plan")
    assert result.exit_code == 0, result.output
    for text in ("dp/tp/pp/vpp", "time/iter", "tokens/s", "MFU", "peak / capacity", "searched",
                 "proven optimal by the rank-load bound", "best plan:", "breakdown of one iteration"):
        assert text in result.stdout
    ranked = result.stdout.split("\n-  ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [row.split()[0] for row in ranked] == ["1", "2", "3", "4", "5"]  # default top 5


def test_plan_json_is_one_document_with_alternatives_and_search_stats() -> None:
    result = run("plan", *SMALL, "--top", "3", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)  # the whole of stdout: one JSON document
    assert document["schema_version"] == 2
    assert len(document["alternatives"]) == 2
    stats = document["search"]
    for key in ("configurations", "pruned_memory", "pruned_time", "ilps_solved", "proven_by_bound", "cache_hits",
                "time_limited", "solver", "wall_s"):
        assert key in stats
    times = [document["estimate"]["iteration_time_s"]] + [a["estimate"]["iteration_time_s"]
                                                           for a in document["alternatives"]]
    assert times == sorted(times)


def test_plan_out_writes_a_loadable_plan_file_and_top_limits_rows(tmp_path) -> None:
    out = tmp_path / "plan.json"
    result = run("plan", *SMALL, "--top", "2", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "\n2  " in result.stdout and "\n3  " not in result.stdout
    plan = load_plan(out)
    assert plan.parallel.num_gpus == 8 and plan.model.name == "gpt3-350m"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # written atomically: no temp file left
    document = json.loads(out.read_text())
    assert len(document["alternatives"]) == 1
    target = document["alternatives"][0]["runs_on"][0]
    assert result.stdout.rstrip().endswith(f"wrote {out}: plan #1 and its alternatives #2 "
                                           f"(e.g. planner export {out}#2 --to {target})")


def test_plan_with_fixed_options_keeps_them() -> None:
    result = run("plan", *SMALL, "--tp", "2", "--pp", "2", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    for plan in (document, *document["alternatives"]):
        assert plan["parallelism"]["tp"] == 2 and plan["parallelism"]["pp"] == 2


def test_plan_infeasible_exits_1_with_the_shortfall() -> None:
    result = run("plan", "--model", "llama3-405b", "--cluster", "1x8xA100-80GB", "--global-batch", "8",
                 "--seq-len", "2048")
    assert result.exit_code == 1
    assert "short by" in result.stderr and "GiB" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_plan_bad_fixed_option_exits_2_with_one_line() -> None:
    for args in (("--tp", "3"), ("--pp", "5"), ("--top", "0"), ("--micro-batch", "7")):
        result = run("plan", *SMALL, *args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_plan_csv_has_one_row_per_ranked_plan_matching_the_json(tmp_path) -> None:
    """--csv writes the ranked candidates (the DataFrame behind the table) with the JSON's numbers."""
    csv_path = tmp_path / "ranked.csv"
    result = run("plan", *SMALL, "--top", "3", "--json", "--csv", str(csv_path))
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    frame = pd.read_csv(csv_path)
    assert list(frame["rank"]) == [1, 2, 3]
    plans = [document, *document["alternatives"]]
    assert list(frame["iteration_time_s"]) == [p["estimate"]["iteration_time_s"] for p in plans]
    assert list(frame["split_optimal"]) == [p["split"]["optimal"] for p in plans]
    assert {"dp", "tp", "pp", "mfu", "peak_memory_bytes", "dp_comm_s"} <= set(frame.columns)


def test_plan_csv_into_a_missing_directory_exits_2_and_writes_nothing(tmp_path) -> None:
    result = run("plan", *SMALL, "--top", "1", "--csv", str(tmp_path / "missing" / "ranked.csv"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert not (tmp_path / "missing").exists()


def test_nemotron_3_nano_and_moonlight_plan_and_estimate_as_megatron_bridge_runs_them() -> None:
    """The catalog's hybrid Mamba/MoE and MLA/MoE models plan at EP 8 and estimate the recompute study's passing
    Nemotron-3-Nano run (MBS-016: 16 H100, BF16, EP 8, HybridEP, selective recompute of `moe`): it fits."""
    plan = run("plan", "--model", "nemotron-3-nano-30b-a3b", "--cluster", "2x8xH100-80GB", "--global-batch", "1024",
               "--seq-len", "8192", "--tp", "1", "--pp", "1", "--cp", "1", "--ep", "8", "--framework", "megatron",
               "--json")
    assert plan.exit_code == 0, plan.output
    document = json.loads(plan.stdout)
    assert document["model"]["name"] == "nemotron-3-nano-30b-a3b" and document["parallelism"]["ep"] == 8
    moonlight = run("plan", "--model", "moonlight-16b-a3b", "--cluster", "1x8xH100-80GB", "--global-batch", "64",
                    "--seq-len", "4096", "--tp", "2", "--pp", "1", "--cp", "1", "--ep", "8", "--framework", "megatron")
    assert moonlight.exit_code == 0, moonlight.output
    estimate = run("estimate", "--model", "nemotron-3-nano-30b-a3b", "--cluster", "2x8xH100-80GB", "--global-batch",
                   "16", "--seq-len", "8192", "--tp", "1", "--pp", "1", "--dp", "16", "--ep", "8", "--micro-batch", "1",
                   "--recompute", "selective", "--recompute-modules", "moe", "--moe-dispatcher", "flex",
                   "--distributed-optimizer", "--json")
    assert estimate.exit_code == 0, estimate.output
    assert json.loads(estimate.stdout)["estimate"]["fits"]
