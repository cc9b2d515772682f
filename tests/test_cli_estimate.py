"""`planner estimate` and `planner list` through click's runner: output, JSON, files, exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from planner.plan import load_plan


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_estimate_prints_breakdown_and_stages() -> None:
    result = run("estimate", "--model", "llama2-7b", "--cluster", "1x8xA100-80GB", "--global-batch", "64",
                 "--seq-len", "4096", "--tp", "2", "--pp", "2", "--recompute", "selective")
    assert result.exit_code == 0, result.output
    assert "iteration time" in result.output and "breakdown of one iteration" in result.output
    assert "bubble" in result.output and "tp_comm" in result.output


def test_estimate_json_is_one_plan_document(tmp_path) -> None:
    out = tmp_path / "plan.json"
    result = run("estimate", "--model", "llama2-7b", "--cluster", "2x8xA100-80GB", "--global-batch", "64",
                 "--seq-len", "2048", "--tp", "2", "--pp", "4", "--partition", "7,8,9,8", "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["schema_version"] == 2
    assert document["parallelism"]["dp"] * 2 * 4 == 16
    assert [s["blocks"] for s in document["stages"]] == [[0, 7], [7, 15], [15, 24], [24, 32]]
    assert len(document["placement"]["ranks"]) == 16
    for key in ("iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "breakdown_s",
                "peak_memory_bytes", "fits"):
        assert key in document["estimate"]
    plan = load_plan(out)  # the written file round-trips
    assert plan.partition.blocks_per_stage() == (7, 8, 9, 8)


def test_estimate_that_does_not_fit_exits_1_with_shortfall() -> None:
    result = run("estimate", "--model", "llama3-70b", "--cluster", "1x8xA100-80GB", "--global-batch", "8",
                 "--seq-len", "4096", "--tp", "1", "--dp", "8")
    assert result.exit_code == 1
    assert "does not fit" in result.stderr and "short by" in result.stderr
    assert "iteration time" in result.stdout  # the estimate is still shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope"], "unknown model 'nope'"),
        (["--cluster", "3x8"], "unknown cluster '3x8'"),
        (["--tp", "3"], "--tp 3 is not allowed"),  # checked as `plan` checks it (it was accepted and exported)
        (["--global-batch", "100", "--tp", "1", "--micro-batch", "3"], "--micro-batch 3 does not divide"),
        (["--global-batch", "100", "--dp", "4", "--tp", "2", "--micro-batch", "10"],
         "not divisible by micro_batch × dp"),
        (["--partition", "a,b"], "--partition 'a,b'"),
        (["--dtype", "int4"], "Invalid value for '--dtype'"),
        (["--global-batch", "0"], "Invalid value for '--global-batch': 0 is not in the range 1<=x<=1000000000"),
        (["--sequence-parallel", "--tp", "1"], "--sequence-parallel needs tp > 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = run("estimate", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_out_into_missing_directory_fails_cleanly(tmp_path) -> None:
    result = run("estimate", "--out", str(tmp_path / "missing" / "plan.json"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


@pytest.mark.parametrize("what", ["models", "gpus", "clusters"])
def test_list(what: str) -> None:
    table = run("list", what)
    assert table.exit_code == 0
    records = json.loads(run("list", what, "--json").output)
    assert records and all("name" in r for r in records)
    assert records[0]["name"] in table.output


@pytest.mark.parametrize("option", ["--tp", "--pp", "--dp", "--micro-batch", "--vpp"])
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_degrees_must_be_positive(command: str, option: str) -> None:
    result = run(command, option, "0")
    assert result.exit_code == 2 and option in result.stderr and "Traceback" not in result.output


def test_a_plan_that_does_not_fit_is_told_only_options_that_would_help() -> None:
    """States alone too big: more sharding or GPUs, never a smaller batch or more recompute; activations
    too big: what shrinks them, never --distributed-optimizer when it is already on."""
    states = run("estimate", "--model", "llama3-70b", "--cluster", "1x8xH100-80GB", "--tp", "8",
                 "--global-batch", "8", "--seq-len", "1024")
    assert states.exit_code == 1
    assert "model states alone" in states.stderr and "--recompute" not in states.stderr
    assert "--global-batch" not in states.stderr
    activations = run("estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--tp", "2",
                      "--distributed-optimizer", "--micro-batch", "8", "--global-batch", "32", "--seq-len", "8192")
    assert activations.exit_code == 1
    assert "activations need" in activations.stderr and "--recompute full" in activations.stderr
    assert "--distributed-optimizer" not in activations.stderr.split("try", 1)[1]
    assert "--cpu-offload-layers" in activations.stderr  # pp 1 without recompute: it can offload
    piped = run("estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--tp", "2", "--pp", "2",
                "--distributed-optimizer", "--micro-batch", "16", "--global-batch", "32", "--seq-len", "8192")
    assert piped.exit_code == 1 and "--cpu-offload-layers" not in piped.stderr


def _zero3_dp_comm_without_and_with(base: tuple[str, ...], option: tuple[str, ...], out) -> list[float]:
    """Exposed DP seconds of `base` under ZeRO-3, without and then with `option` (that plan written to `out`)."""
    times = []
    for extra in ((), (*option, "--out", str(out))):
        result = run(*base, "--zero", "3", "--json", *extra)
        assert result.exit_code == 0, result.output
        times.append(json.loads(result.output)["estimate"]["breakdown_s"]["dp_comm"])
    return times


def test_estimate_per_tensor_zero3_is_slower_round_trips_and_refuses_other_stages(tmp_path) -> None:
    """`--zero3-collectives per-tensor` (DeepSpeed ZeRO-3 of 2021) costs more DP time than the default per-unit
    FSDP semantics, is kept in the plan file, and is refused (exit 2, one line) without ZeRO-3."""
    base = ("estimate", "--model", "gpt3-175b", "--cluster", "48x8xA100-80GB", "--global-batch", "1536",
            "--seq-len", "2048", "--dp", "384", "--micro-batch", "4", "--recompute", "full", "--dtype", "fp16")
    out = tmp_path / "plan.json"
    times = _zero3_dp_comm_without_and_with(base, ("--zero3-collectives", "per-tensor"), out)
    assert times[1] > 10 * times[0]
    assert load_plan(out).parallel.zero3_collectives == "per-tensor"
    refused = run(*base, "--zero", "2", "--zero3-collectives", "per-tensor")
    assert refused.exit_code == 2
    assert "zero3_collectives 'per-tensor'" in refused.output and "Traceback" not in refused.output


def test_estimate_backward_post_prefetch_is_slower_round_trips_and_refuses_other_stages(tmp_path) -> None:
    """`--fsdp-backward-prefetch post` (FSDP1 BACKWARD_POST, Composer's default) waits for the backward gathers:
    more exposed DP time than the default, kept in the plan file and re-estimated from it; refused (exit 2, one
    line) without ZeRO-3 and, when bad, named with what is allowed."""
    base = ("estimate", "--model", "llama3-8b", "--cluster", "2x8xH100-80GB", "--global-batch", "32",
            "--seq-len", "2048", "--dp", "16", "--micro-batch", "2")
    out = tmp_path / "plan.json"
    times = _zero3_dp_comm_without_and_with(base, ("--fsdp-backward-prefetch", "post"), out)
    assert times[1] > times[0]
    assert load_plan(out).parallel.fsdp_backward_prefetch == "post"
    again = run("estimate", "--plan", str(out), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["estimate"]["breakdown_s"]["dp_comm"] == pytest.approx(times[1])
    refused = run(*base, "--zero", "2", "--fsdp-backward-prefetch", "post")
    assert refused.exit_code == 2
    assert "fsdp_backward_prefetch 'post'" in refused.output and "Traceback" not in refused.output
    bad = run(*base, "--zero", "3", "--fsdp-backward-prefetch", "late")
    assert bad.exit_code == 2 and "pre" in bad.output and "post" in bad.output


def test_fp8_param_gather_from_the_cli_is_faster_kept_in_the_plan_and_exported(tmp_path) -> None:
    base = ("estimate", "--model", "llama3-8b", "--cluster", "2x8xH100-80GB", "--global-batch", "64",
            "--seq-len", "4096", "--tp", "2", "--dp", "8", "--zero", "3", "--dtype", "fp8", "--json")
    out = tmp_path / "plan.json"
    plain = json.loads(run(*base).output)["estimate"]["breakdown_s"]["dp_comm"]
    result = run(*base, "--fp8-param-gather", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["estimate"]["breakdown_s"]["dp_comm"] < plain
    assert load_plan(out).parallel.fp8_param_gather
    refused = run(*base[:-3], "--fp8-param-gather")  # bf16
    assert refused.exit_code == 2 and "--fp8-param-gather needs FP8 training (--dtype fp8), got bf16" in refused.output
