"""Measured inputs through the CLI: nccl-tests import, `--links`, and `plan --profile`."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from cli import main
from planner.resources import profiles_dir

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def test_import_nccl_tests_writes_links_and_estimate_uses_them(tmp_path) -> None:
    out = tmp_path / "LINKS.json"
    runner = CliRunner()
    result = runner.invoke(main, ["profile", "import-nccl-tests", str(FIXTURES / "sendrecv_perf_2hosts.log"),
                                  str(FIXTURES / "all_reduce_perf_8gpu_v2.19.log"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = json.loads(out.read_text())
    assert table["schema_version"] == 1 and len(table["nodes"]) >= 2
    args = ["estimate", "--model", "llama2-7b", "--cluster", f"{len(table['nodes'])}x8xA100-80GB",
            "--global-batch", "64", "--seq-len", "2048", "--tp", "8", "--json"]
    plain = json.loads(runner.invoke(main, args).stdout)
    measured = runner.invoke(main, [*args, "--links", str(out)])
    assert measured.exit_code in (0, 1), measured.output
    assert json.loads(measured.stdout)["estimate"]["breakdown_s"]["dp_comm"] != plain["estimate"]["breakdown_s"][
        "dp_comm"]


def test_truncated_log_exits_2() -> None:
    result = CliRunner().invoke(main, ["profile", "import-nccl-tests", str(FIXTURES / "all_reduce_perf_truncated.log"),
                                       "--out", "x.json"])
    assert result.exit_code == 2 and "truncated" in result.stderr and "Traceback" not in result.output


def test_missing_log_exits_2(tmp_path) -> None:
    result = CliRunner().invoke(main, ["profile", "import-nccl-tests", str(tmp_path / "none.log"), "--out",
                                       str(tmp_path / "x.json")])
    assert result.exit_code == 2
    assert not (tmp_path / "x.json").exists()


def test_plan_with_measured_profile_uses_its_model_and_sequence(tmp_path) -> None:
    profile = Path(__file__).parent.parent / "profiles" / "measured" / "tiny-llama-cpu-bf16-s128.json"
    result = CliRunner().invoke(main, ["plan", "--profile", str(profile), "--cluster", "1x2xH100-80GB",
                                       "--global-batch", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["model"]["name"] == "tiny-llama" and document["training"]["seq_len"] == 128
    assert document["profile"]["notes"]


def test_calibration_file_changes_the_estimate(tmp_path) -> None:
    document = yaml.safe_load((profiles_dir() / "calibration.yaml").read_text())
    document["constants"]["gemm_efficiency"]["value"] /= 2
    path = tmp_path / "calibration.yaml"
    path.write_text(yaml.safe_dump(document))
    args = ["estimate", "--model", "llama2-7b", "--cluster", "1x8xH100-80GB", "--tp", "2", "--json"]
    runner = CliRunner()
    base = json.loads(runner.invoke(main, args).stdout)["estimate"]["iteration_time_s"]
    slower = json.loads(runner.invoke(main, [*args, "--calibration", str(path)]).stdout)["estimate"]
    assert slower["iteration_time_s"] > 1.5 * base
    planned = runner.invoke(main, ["plan", "--model", "llama2-7b", "--calibration", str(path), "--json"])
    assert planned.exit_code == 0, planned.output


def test_bad_calibration_file_exits_2(tmp_path) -> None:
    path = tmp_path / "calibration.yaml"
    path.write_text("constants: {gemm_efficiency: fast}\n")
    result = CliRunner().invoke(main, ["estimate", "--calibration", str(path)])
    assert result.exit_code == 2 and "must be a number" in result.stderr
