"""Issue 17: every input checked at the boundary (exit 2, one line, no traceback), outputs that never
clobber what is not a regular file, stated scale limits, and a fuzz test over the file loaders and options.

The regression corpus is `CORPUS`: each case writes the files a hostile user gave and names the line the
CLI must answer with."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli import main
from planner.limits import MAX_GLOBAL_BATCH, MAX_GPUS
from planner.plan import LISTED_RANKS_MAX, parse_plan_document
from planner.resources import MAX_DEPTH, write_atomic

TINY = ["--model", "tiny-llama", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len", "512"]
HF = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
      "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 1024, "max_position_embeddings": 512}
CLUSTER = {"name": "lab", "node_groups": [{"gpu": "H100-80GB", "nodes": 2, "gpus_per_node": 8}]}
LINKS = {"schema_version": 1, "nodes": ["node0", "node1"], "bandwidth_bytes_per_s": [[4e11, 2e10], [2e10, 4e11]],
         "latency_s": [[5e-6, 1e-5], [1e-5, 5e-6]]}


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_contract(result, allowed: tuple[int, ...] = (0, 1, 2)) -> None:
    """Exit code documented, no traceback, and exit 2 answered by exactly one `error:` line."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in allowed, result.output
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def plan_file(tmp_path: Path, edit: Callable[[dict], None] = lambda d: None) -> Path:
    """A plan written by `estimate --out` (llama 2x8, tp2 pp4), edited by hand."""
    path = tmp_path / "plan.json"
    result = run("estimate", "--model", "tiny-llama", "--cluster", "2x8xH100-80GB", "--global-batch", "16",
                 "--seq-len", "512", "--tp", "2", "--pp", "4", "--out", str(path))
    assert result.exit_code == 0, result.output
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


def _deep(kind: str) -> str:
    return "[" * 100_000 + "]" * 100_000 if kind == "json" else "a: " + "[" * 1200 + "]" * 1200


def _set(path: list, value) -> Callable[[dict], None]:
    def edit(document: dict) -> None:
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


# ---- regression corpus ------------------------------------------------------------------------

CORPUS: dict[str, tuple[dict[str, str], list[str], str]] = {
    # name: ({file name: text}, CLI arguments ({dir} = the files' folder), expected message part)
    "hf head_dim string": ({"config.json": json.dumps({**HF, "head_dim": "32"})},
                           ["estimate", "--model", "{dir}/config.json"], "head_dim must be an integer"),
    "hf kv heads string": ({"config.json": json.dumps({**HF, "num_key_value_heads": "4"})},
                           ["estimate", "--model", "{dir}/config.json"], "num_key_value_heads"),
    "hf NaN": ({"config.json": json.dumps(HF).replace("688", "NaN")},
               ["estimate", "--model", "{dir}/config.json"], "numbers must be finite"),
    "hf 1e30 layers": ({"config.json": json.dumps({**HF, "num_hidden_layers": 1e30})},
                       ["estimate", "--model", "{dir}/config.json"], "num_hidden_layers"),
    "hf huge int layers": ({"config.json": json.dumps({**HF, "num_hidden_layers": 10**30})},
                           ["estimate", "--model", "{dir}/config.json"], "1..4,096"),
    "hf experts string": ({"config.json": json.dumps({**HF, "num_local_experts": "8"})},
                          ["estimate", "--model", "{dir}/config.json"], "num_local_experts"),
    "negative positions": ({"m.yaml": "{name: m, num_layers: 2, hidden_size: 64, num_attention_heads: 4, "
                                      "ffn_hidden_size: 128, vocab_size: 100, max_position_embeddings: -5}"},
                           ["estimate", "--model", "{dir}/m.yaml"], "max_position_embeddings"),
    "bool as int": ({"m.yaml": "{name: m, num_layers: true, hidden_size: 64, num_attention_heads: 4, "
                               "ffn_hidden_size: 128, vocab_size: 100}"},
                    ["estimate", "--model", "{dir}/m.yaml"], "num_layers must be an integer"),
    "names: 5": ({"c.yaml": "node_groups: [{gpu: A100-80GB, nodes: 2, gpus_per_node: 8, names: 5}]"},
                 ["estimate", "--model", "tiny-llama", "--cluster", "{dir}/c.yaml"], "'names' must be a list"),
    "links not a list": ({"c.yaml": "{gpu: A100-80GB, nodes: 2, links: 7}"},
                         ["estimate", "--model", "tiny-llama", "--cluster", "{dir}/c.yaml"], "'links' must be a list"),
    "million GPUs": ({}, ["plan", "--cluster", "125000x8xH100-80GB"], f"limit of {MAX_GPUS:,} GPUs"),
    "million GPUs file": ({"c.yaml": "{gpu: H100-80GB, nodes: 125000}"},
                          ["plan", "--cluster", "{dir}/c.yaml"], f"limit of {MAX_GPUS:,} GPUs"),
    "batch beyond limit": ({}, ["plan", "--global-batch", str(MAX_GLOBAL_BATCH + 1)], "--global-batch"),
    "time limit nan": ({}, ["plan", "--time-limit", "nan"], "not a finite number"),
    "zero calibration efficiency": (
        {"cal.yaml": "constants: {memory_bound_efficiency: 0}"},
        ["estimate", *TINY, "--calibration", "{dir}/cal.yaml"], "memory_bound_efficiency"),
    "links NaN latency": ({"LINKS.json": json.dumps(LINKS).replace("1e-05", "NaN", 1)},
                          ["estimate", *TINY[:2], "--cluster", "2x8xH100-80GB", "--links", "{dir}/LINKS.json"],
                          "must be finite"),
    "estimate tp 3": ({}, ["estimate", *TINY, "--tp", "3"], "--tp 3"),
    "unknown option": ({}, ["plan", "--bogus"], "No such option"),
    "empty out": ({}, ["estimate", *TINY, "--out", ""], "--out': is empty"),
    "out ending in a slash": ({}, ["plan", *TINY, "--out", "{dir}/sub/"], "ends in '/'"),
    "empty export dir": ({}, ["plan", *TINY, "--export", "megatron", "--export-out", ""], "--export-out': is empty"),
    "empty model": ({}, ["estimate", "--model", ""], "unknown model ''"),
    "empty cluster": ({}, ["estimate", "--cluster", ""], "unknown cluster ''"),
    "empty recompute modules": ({}, ["estimate", *TINY, "--recompute-modules", ""], "--recompute-modules"),
    "recompute module twice": ({}, ["estimate", *TINY, "--recompute-modules", "core_attn,core_attn"],
                               "names a module twice"),
    "recompute more blocks than the model has": (
        {}, ["estimate", *TINY, "--recompute", "full", "--recompute-num-layers", "1000"], "exceeds the model's 4"),
    "empty partition": ({}, ["estimate", *TINY, "--partition", ""], "--partition ''"),
    "unicode digits in a cluster": ({}, ["estimate", "--cluster", "\uff11x8xH100-80GB"], "unknown cluster"),
    "sweep size twice": ({}, ["sweep", "--gpus", "8,8", "--tokens", "1B"], "lists a value twice"),
    "sweep unicode size": ({}, ["sweep", "--gpus", "\uff11\uff16", "--tokens", "1B"], "GPU counts"),
    "price of a GPU not swept": ({}, ["sweep", "--gpus", "8", "--tokens", "1B", "--gpu-hour-price", "B200=4"],
                                 "which --gpu does not sweep"),
    "empty price": ({}, ["sweep", "--gpus", "8", "--tokens", "1B", "--gpu-hour-price", ""], "--gpu-hour-price"),
    "fractional tokens": ({}, ["sweep", "--gpus", "8", "--tokens", "1.5"], "whole number of tokens"),
    "alias bomb": ({"c.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))},
                   ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "unknown key(s) a, b"),
    "cluster key typo": ({"c.yaml": "node_groups: [{gpu: H100-80GB, nodes: 2, gpus_per_nod: 8}]"},
                         ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "unknown key(s) gpus_per_nod"),
    "node name with a line break": (
        {"c.yaml": json.dumps({"node_groups": [{"gpu": "H100-80GB", "nodes": 2, "gpus_per_node": 8,
                                                "names": ["a\nrm -rf /", "b;$(id)"]}]})},
        ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "must be a host name"),
    "thousands of digits": ({"c.yaml": "{gpu: H100-80GB, nodes: " + "9" * 5000 + "}"},
                            ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "more digits than planner reads"),
    "a date that is no date": ({"c.yaml": "{gpu: H100-80GB, nodes: 1, name: 2024-13-45}"},
                               ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"],
                               "a value cannot be read (month must be in 1..12)"),
    "bandwidth near zero": ({"c.yaml": "{gpu: H100-80GB, nodes: 1, intra_node_gbps: 1.0e-300}"},
                            ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "from 1e+06"),
    "power limit near zero": ({"c.yaml": "{gpu: H100-80GB, nodes: 1, power_limit_w: 1.0e-300}"},
                              ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "at least a tenth"),
    "links not a list but falsy": ({"c.yaml": "node_groups: [{gpu: H100-80GB, nodes: 2}]\nlinks: 0"},
                                   ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "'links' must be a list"),
    "the same link twice": ({"c.yaml": "node_groups: [{gpu: H100-80GB, nodes: 2}]\n"
                                       "links: [{nodes: [0, 1], gbps: 10}, {nodes: [1, 0], gbps: 20}]"},
                            ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "a second link between"),
    "gpu and gpu profile": ({"c.yaml": "node_groups: [{gpu: H100-80GB, gpu_profile: g.yaml, nodes: 2}]"},
                            ["estimate", *TINY[:2], "--cluster", "{dir}/c.yaml"], "not both"),
    "hf layer type planner does not cost": (
        {"config.json": json.dumps({**HF, "layer_types": ["linear_attention"] * 4})},
        ["estimate", "--model", "{dir}/config.json"], "layer_types entries must be among"),
    "calibration constant typo": ({"cal.yaml": "constants: {memory_bound_efficency: 0.9}"},
                                  ["estimate", *TINY, "--calibration", "{dir}/cal.yaml"],
                                  "unknown constant(s) memory_bound_efficency"),
    "calibration schema 99": ({"cal.yaml": "schema_version: 99\nconstants: {}"},
                              ["estimate", *TINY, "--calibration", "{dir}/cal.yaml"], "schema_version 99"),
    "hf flag as a string": ({"config.json": json.dumps({**HF, "tie_word_embeddings": "false"})},
                            ["estimate", "--model", "{dir}/config.json"], "must be true or false"),
    "local queue beyond the batch limit": (
        {}, ["estimate", *TINY, "--pp", "2", "--schedule", "local", "--local-queue-depth", str(MAX_GLOBAL_BATCH + 1)],
        "local_queue_depth must be at most"),
    **{f"deep {kind} {option}": ({f"deep.{kind}": _deep(kind)}, [*command, f"{{dir}}/deep.{kind}"], "nested deeper")
       for kind in ("json", "yaml")
       for option, command in (("--model", ["estimate", "--model"]),
                               ("--cluster", ["estimate", "--model", "tiny-llama", "--cluster"]),
                               ("--calibration", ["estimate", *TINY, "--calibration"]),
                               ("--profile", ["estimate", *TINY, "--profile"]),
                               ("--links", ["estimate", *TINY, "--links"]),
                               ("export", ["export", "--to", "megatron"]))
       if kind == "json" or option not in ("--links", "export")},
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_regression_corpus_exits_2_with_one_line(tmp_path, name) -> None:
    files, args, message = CORPUS[name]
    for file_name, text in files.items():
        (tmp_path / file_name).write_text(text)
    result = run(*(arg.replace("{dir}", str(tmp_path)) for arg in args))
    assert_contract(result, (2,))
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(("edit", "message"), [
    (_set(["stages", 1, "head"], True), "head"),
    (_set(["stages", 2, "embedding"], True), "embedding"),
    (_set(["placement", "ranks", 3, "gpu_index"], 99), "gpu_index 99"),
    (_set(["placement", "ranks", 3, "node"], "node9"), "'node9'"),
    (_set(["placement", "ranks", 3, "gpu_index"], 2), "two ranks"),
    (_set(["parallelism", "sequence_parallel"], "false"), "true or false"),
    (_set(["stages", 0, "blocks"], [0, 99]), "blocks"),
])
def test_hand_edited_plans_are_refused_before_export(tmp_path, edit, message) -> None:
    result = run("export", str(plan_file(tmp_path, edit)), "--to", "megatron")
    assert_contract(result, (2,))
    assert message in result.stderr, result.stderr


def _delete(path: list) -> Callable[[dict], None]:
    def edit(document: dict) -> None:
        target = document
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return edit


GPU0, GROUP0 = ["cluster", "gpus", 0], ["cluster", "node_groups", 0]


@pytest.mark.parametrize(("edit", "message"), [
    # values a cost divides by or sizes a loop with (2026-12-07 fuzz report: tracebacks, a hang, a memory kill)
    (_set([*GPU0, "peak_flops_per_s", "bf16"], 0), "peak_flops_per_s"),
    (_set([*GPU0, "matmul_efficiency"], 0), "matmul_efficiency must be positive"),
    (_set([*GPU0, "matmul_efficiency"], 5), "matmul_efficiency 5 is outside [0.01, 1]"),
    (_set([*GPU0, "hbm_bandwidth_bytes_per_s"], 0), "hbm_bandwidth_bytes_per_s"),
    (_set([*GPU0, "fused_attention_share"], 0), "fused_attention_share"),
    (_set([*GPU0, "memory_bytes"], 2**70), "memory_bytes must be a positive number below 1e+18"),
    (_set(["calibration", "constants", "gemm_tile"], 0), "gemm_tile 0"),
    (_set(["calibration", "constants", "kernel_launch_s"], 2**70), "kernel_launch_s"),
    (_set(["cluster", "intra_latency_s"], 2**70), "intra_latency_s"),
    (_set(["training", "moe_load_imbalance"], None), "moe_load_imbalance"),
    (_delete([*GROUP0, "num_gpus"]), "lacks num_gpus"),
    (_set([*GROUP0, "num_gpus"], 2**70), f"limit of {MAX_GPUS:,} GPUs"),
    (_set([*GROUP0, "nodes"], 2**70), f"limit of {MAX_GPUS:,} GPUs"),
    (_set(["parallelism", "ep"], 2**70), f"ep must be at most {MAX_GPUS:,}"),
    (_set(["cluster", "gpus_per_node"], -1), "cluster.gpus_per_node is -1"),
    # the written estimate `estimate --plan` and `compare` print
    (_delete(["estimate"]), "missing 'estimate'"),
    (_set(["estimate", "iteration_time_s"], "12"), "estimate.iteration_time_s must be a finite number"),
    (_set(["estimate", "breakdown_s", "compute"], None), "estimate.breakdown_s.compute"),
    (_set(["estimate", "fits"], "yes"), "estimate.fits must be true or false"),
    (_delete(["stages", 0, "memory_bytes"]), "stages[0].memory_bytes"),
])
def test_plan_file_values_a_cost_needs_are_checked(tmp_path, edit, message) -> None:
    """Each hand edit is one line, exit 2, for every command that reads plan files, and within seconds."""
    path = str(plan_file(tmp_path, edit))
    for args in (["estimate", "--plan", path], ["compare", path, path], ["timeline", path, "--out",
                                                                          str(tmp_path / "t.json")]):
        result = run(*args)
        assert_contract(result, (2,))
        assert message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "t.json").exists()


def test_plan_file_breakdown_terms_may_be_negative(tmp_path) -> None:
    """A breakdown term can be a credit (time hidden behind another term), so a negative one is read; an infinite
    one that is not a number is not."""
    negative = _set(["estimate", "breakdown_s", "compute"], -0.5)
    assert run("estimate", "--plan", str(plan_file(tmp_path, negative))).exit_code == 0
    text = _set(["estimate", "breakdown_s", "compute"], "0.5")
    result = run("estimate", "--plan", str(plan_file(tmp_path, text)))
    assert_contract(result, (2,))
    assert "estimate.breakdown_s.compute must be a finite number, got '0.5'" in result.stderr, result.stderr


def test_outputs_written_together_are_all_or_nothing(tmp_path) -> None:
    """timeline's trace and SVG: an SVG path that cannot be written leaves no trace behind, and both land when
    both can be written."""
    plan, trace = str(plan_file(tmp_path)), tmp_path / "t.json"
    result = run("timeline", plan, "--out", str(trace), "--svg", str(tmp_path / "missing" / "t.svg"))
    assert_contract(result, (2,))
    assert "missing" in result.stderr and not trace.exists()
    assert run("timeline", plan, "--out", str(trace), "--svg", str(tmp_path / "t.svg")).exit_code == 0
    assert trace.exists() and (tmp_path / "t.svg").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_plan_with_its_options_names_the_options_as_typed(tmp_path) -> None:
    result = run("estimate", "--plan", str(plan_file(tmp_path)), "--model", "tiny-llama", "--tp", "2")
    assert_contract(result, (2,))
    assert result.stderr.strip().endswith("drop --model, --tp"), result.stderr


def test_a_sweep_where_nothing_fits_exits_1_and_writes_nothing(tmp_path) -> None:
    csv = tmp_path / "sweep.csv"
    result = run("sweep", "--model", "llama3-405b", "--gpus", "8", "--tokens", "1B", "--csv", str(csv))
    assert_contract(result, (1,))
    assert "no swept cluster fits llama3-405b" in result.stderr and "short by" in result.stderr
    assert not csv.exists()


def _profile(tmp_path: Path, edit: Callable[[dict], None]) -> str:
    document = json.loads((Path(__file__).parents[1] / "profiles/measured/tiny-llama-cpu-bf16-s128.json").read_text())
    edit(document)
    path = tmp_path / "PROFILE.json"
    path.write_text(json.dumps(document))
    return str(path)


def _zero_times(document: dict) -> None:
    for unit in document["units"]:
        unit.update({key: 0 for key, value in unit.items() if key.endswith("_s") and isinstance(value, float)})


@pytest.mark.parametrize(("edit", "message"), [
    (_set(["settings", "seq_len"], 0), "settings.seq_len must be in [1,"),
    (_set(["settings", "seq_len"], 2**40), "settings.seq_len must be in [1,"),
    (_set(["settings", "attention"], "weird"), "settings.attention must be one of"),
    (_zero_times, "every measured time is 0"),
])
def test_calibrate_checks_a_profile_as_estimate_does(tmp_path, edit, message) -> None:
    """`calibrate` reads the profile's settings through the same checks, and an empty fit writes nothing."""
    out = tmp_path / "gpu.yaml"
    result = run("calibrate", _profile(tmp_path, edit), "--gpu", "H100-80GB", "--force", "--out", str(out))
    assert_contract(result, (2,))
    assert message in result.stderr, result.stderr
    assert not out.exists()


def test_plan_with_a_profile_searches_the_tp_degrees_it_measured() -> None:
    """The shipped CPU profile measured tp 1 and 2: `plan` on 8 GPUs searches those, not tp 4 or 8."""
    result = run("plan", "--profile", "profiles/measured/tiny-llama-cpu-bf16-s128.json", "--cluster",
                 "1x8xH100-80GB", "--global-batch", "8", "--json")
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)
    assert {p["parallelism"]["tp"] for p in [plans, *plans.get("alternatives", [])]} <= {1, 2}


def test_deep_but_legal_nesting_limit_is_stated(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text("[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2))
    result = run("estimate", "--model", "tiny-llama", "--cluster", str(path))
    assert_contract(result, (2,))
    assert f"nested deeper than {MAX_DEPTH}" in result.stderr


def test_usage_errors_are_one_line() -> None:
    for args in (["plan", "--tp", "x"], ["nosuch"], ["export"], ["plan", "--dtype", "fp64"]):
        assert_contract(run(*args), (2,))
    bare = run("profile")
    assert bare.exit_code == 2 and "Commands:" in bare.stderr and "error:" not in bare.stderr


# ---- outputs that never clobber ---------------------------------------------------------------

def test_out_refuses_devices_directories_and_dangling_links(tmp_path) -> None:
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "missing" / "x.json")
    for target in ("/dev/null", str(tmp_path), str(dangling)):
        result = run("estimate", *TINY, "--out", target)
        assert_contract(result, (2,))
        assert "refusing" in result.stderr or "directory" in result.stderr, result.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert dangling.is_symlink() and not list(tmp_path.glob(".*.tmp"))


def test_unwritable_out_is_one_line(tmp_path) -> None:
    assert_contract(run("estimate", *TINY, "--out", "/proc/planner-test.json"), (2,))
    assert_contract(run("estimate", *TINY, "--out", str(tmp_path / "absent" / "x.json")), (2,))


def test_out_through_a_symlink_writes_its_target_and_keeps_modes(tmp_path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert_contract(run("estimate", *TINY, "--out", str(link)), (0,))
    assert link.is_symlink() and json.loads(target.read_text())["schema_version"] == 2
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.json"
    umask = os.umask(0o027)
    try:
        write_atomic(fresh, "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "new")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


# ---- scale limits -----------------------------------------------------------------------------

def test_largest_cluster_and_batch_finish_in_seconds_with_compact_json() -> None:
    """At MAX_GPUS (16,384 × 8) and a 10^9-sequence batch: well under the README's 30 s, JSON of a few MB."""
    started = time.perf_counter()
    result = run("plan", "--model", "llama3-405b", "--cluster", "16384x8xH100-80GB", "--global-batch",
                 str(MAX_GLOBAL_BATCH // 1024 * 1024), "--tp", "8", "--pp", "16", "--top", "2", "--json")
    elapsed = time.perf_counter() - started
    assert_contract(result, (0,))
    assert elapsed < 30, elapsed
    document = json.loads(result.stdout)
    assert "ranks" not in document["placement"] and len(document["placement"]["runs"]) == 1
    assert len(result.stdout) < 4e6, len(result.stdout)


def test_placement_full_lists_every_rank_and_runs_expand_to_the_same_table() -> None:
    args = ["estimate", "--model", "llama3-8b", "--cluster", "256x8xH100-80GB", "--global-batch", "2048",
            "--seq-len", "2048", "--tp", "8", "--json"]
    compact, full = json.loads(run(*args).stdout), json.loads(run(*args, "--placement", "full").stdout)
    assert "ranks" not in compact["placement"] and len(full["placement"]["ranks"]) == 2048 > LISTED_RANKS_MAX
    assert parse_plan_document(compact).document["placement"]["ranks"] == full["placement"]["ranks"]


# ---- infeasibility names the true nearest configuration --------------------------------------

def _short_by_gib(stderr: str) -> float:
    return float(re.search(r"short by ([0-9.]+) GiB", stderr)[1])


def test_infeasible_names_the_smallest_shortfall_and_the_gpus_states_need() -> None:
    """Issue 17: llama3-405b on one 8×A100 node once named a configuration short by ~9,600 GiB while
    `--tp 8 --recompute full` is short by far less; the named one is short by no more than any of these."""
    problem = ["--model", "llama3-405b", "--cluster", "1x8xA100-80GB"]
    result = run("plan", *problem)
    assert_contract(result, (1,))
    assert "tp=8 pp=1 mb=1 recompute=full" in result.stderr, result.stderr
    assert re.search(r"the model states alone need at least \d+ A100-80GB GPUs, the cluster has 8", result.stderr)
    for fixed in (["--tp", "8"], ["--tp", "4", "--pp", "2"], ["--pp", "8"], ["--tp", "2", "--pp", "4"]):
        other = run("estimate", *problem, *fixed, "--recompute", "full", "--micro-batch", "1")
        assert_contract(other, (1,))
        assert _short_by_gib(result.stderr) <= _short_by_gib(other.stderr) + 0.05, (fixed, other.stderr)


# ---- fuzz: the file loaders and options ------------------------------------------------------

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.sampled_from([0, -1, 3, 2**31, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.just([]), st.just({}),
    st.lists(st.integers(-3, 20), max_size=3), st.just({"a": [1, {"b": None}]}),
)
DOCUMENTS = {
    "config.json": (HF, ["estimate", "--model", "{path}", "--cluster", "1x8xH100-80GB", "--global-batch", "16",
                         "--seq-len", "512"]),
    "cluster.json": (CLUSTER, ["estimate", "--model", "tiny-llama", "--cluster", "{path}", "--global-batch", "16",
                               "--seq-len", "512"]),
    "group.json": ({"gpu": "H100-80GB", "nodes": 2, "gpus_per_node": 8, "names": ["a", "b"], "inter_node_gbps": 50,
                    "inter_node_latency_us": 10, "links": [{"nodes": ["a", 1], "gbps": 3}]},
                   ["estimate", "--model", "tiny-llama", "--cluster", "{path}", "--global-batch", "16",
                    "--seq-len", "512"]),
    "LINKS.json": (LINKS, ["estimate", "--model", "tiny-llama", "--cluster", "2x8xH100-80GB", "--global-batch", "16",
                           "--seq-len", "512", "--links", "{path}"]),
}


def _mutations(document: dict) -> st.SearchStrategy:
    """A document with one field (top level or one level down) replaced, removed, or the whole thing replaced."""
    keys = sorted(document)
    return st.one_of(
        st.tuples(st.sampled_from(keys), VALUES).map(lambda kv: {**document, kv[0]: kv[1]}),
        st.sampled_from(keys).map(lambda k: {key: v for key, v in document.items() if key != k}),
        VALUES,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_file_loaders(tmp_path, data) -> None:
    name = data.draw(st.sampled_from(sorted(DOCUMENTS)))
    document, args = DOCUMENTS[name]
    path = tmp_path / name
    path.write_text(json.dumps(data.draw(_mutations(document))))
    assert_contract(run(*(arg.replace("{path}", str(path)) for arg in args)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_plan_files_given_to_export(tmp_path, data) -> None:
    good = json.loads(plan_file(tmp_path).read_text())
    section = data.draw(st.sampled_from(["parallelism", "training", "cluster", "model"]))
    edited = {**good, section: data.draw(_mutations(good[section]))}
    path = tmp_path / "fuzzed.json"
    path.write_text(json.dumps(edited))
    assert_contract(run("export", str(path), "--to", data.draw(st.sampled_from(["megatron", "deepspeed"]))))


OPTION_VALUES = st.one_of(st.sampled_from(["0", "-1", "3", "1e9", "nan", "inf", "", "2,2", "x", "99999999999999"]),
                          st.integers(-5, 300).map(str), st.text(max_size=6))


@settings(max_examples=60, deadline=None)
@given(options=st.lists(st.tuples(st.sampled_from(["--tp", "--pp", "--dp", "--micro-batch", "--vpp", "--global-batch",
                                                   "--seq-len", "--partition", "--slowdown", "--zero", "--cluster",
                                                   "--model", "--recompute", "--schedule"]), OPTION_VALUES),
                        max_size=3))
def test_fuzz_estimate_options(options) -> None:
    args = ["estimate", "--model", "tiny-llama", "--cluster", "1x8xH100-80GB", "--global-batch", "16",
            "--seq-len", "512"]
    for option, value in options:
        args += [option, value]
    assert_contract(run(*args))
