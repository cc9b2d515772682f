"""Measured inputs through the CLI: nccl-tests import, `--links`, and `plan --profile`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli import load_problem, main
from planner.errors import PlannerError
from planner.profile.calibration import load_calibration
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


def calibration_with(tmp_path: Path, name: str, value: float) -> Path:
    """The shipped calibration with one constant replaced."""
    document = yaml.safe_load((profiles_dir() / "calibration.yaml").read_text())
    document["constants"][name]["value"] = value
    path = tmp_path / "calibration.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("memory_bound_efficiency", 0.0, "memory_bound_efficiency 0 is outside [0.01, 1]"),
    ("gemm_efficiency", 3e-5, "gemm_efficiency 3e-05 is outside [0.01, 1]"),
    ("collective_efficiency_inter", 1.5, "collective_efficiency_inter 1.5 is outside [0.01, 1]"),
    ("flash_attention_efficiency", math.nan, "flash_attention_efficiency.value is nan; numbers must be finite"),
    ("p2p_efficiency_intra", -0.5, "'p2p_efficiency_intra' must be a finite number >= 0, got -0.5"),
    ("iteration_overhead_s", math.inf, "constants.iteration_overhead_s.value is inf; numbers must be finite"),
])
def test_implausible_calibration_file_is_refused(tmp_path: Path, name: str, value: float, expected: str) -> None:
    path = calibration_with(tmp_path, name, value)
    with pytest.raises(PlannerError) as error:
        load_calibration(path)
    assert expected in str(error.value) and str(path) in str(error.value)


def test_zero_efficiency_calibration_exits_2_not_zero_division(tmp_path: Path) -> None:
    path = calibration_with(tmp_path, "memory_bound_efficiency", 0)
    result = CliRunner().invoke(main, ["estimate", "--model", "llama2-7b", "--tp", "2", "--calibration", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and "memory_bound_efficiency 0 is outside [0.01, 1]" in result.stderr


def write_links_json(path: Path, diagonal_bytes_per_s: float, pair_bytes_per_s: float) -> Path:
    path.write_text(json.dumps({"schema_version": 1, "nodes": ["node0", "node1"],
                                "bandwidth_bytes_per_s": [[diagonal_bytes_per_s, pair_bytes_per_s],
                                                          [pair_bytes_per_s, diagonal_bytes_per_s]],
                                "latency_s": [[5e-6, 1e-5], [1e-5, 5e-6]]}))
    return path


ESTIMATE_2_NODES = ["estimate", "--model", "llama2-7b", "--cluster", "2x8xH100-80GB", "--global-batch", "64",
                    "--seq-len", "2048", "--tp", "8", "--json"]


def test_links_with_gloo_speed_nvlink_diagonal_warn_on_stderr(tmp_path: Path) -> None:
    """A 0.31 GB/s diagonal (a gloo CPU probe) where the H100's NVLink is 450 GB/s."""
    links = write_links_json(tmp_path / "LINKS.json", 0.31e9, 45e9)
    result = CliRunner().invoke(main, [*ESTIMATE_2_NODES, "--links", str(links)])
    assert result.exit_code in (0, 1), result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2  # node0 and node1 diagonals; the 45 GB/s pair is 90 % of the NIC
    assert "inside node node0 measured 0.31 GB/s" in warnings[0] and "nvlink4 (450 GB/s)" in warnings[0]
    json.loads(result.stdout)  # stdout stays one JSON document


def test_plausible_links_give_no_warning(tmp_path: Path) -> None:
    links = write_links_json(tmp_path / "LINKS.json", 370e9, 45e9)
    result = CliRunner().invoke(main, [*ESTIMATE_2_NODES, "--links", str(links)])
    assert result.exit_code in (0, 1), result.output
    assert "warning" not in result.stderr


def test_load_problem_carries_link_warnings(tmp_path: Path) -> None:
    links = write_links_json(tmp_path / "LINKS.json", 0.31e9, 0.9e9)
    problem = load_problem("llama2-7b", "2x8xH100-80GB", 64, 2048, "bf16", "flash", None, None, links, ())
    assert len(problem.warnings) == 3 and "between node0 and node1 measured 0.9 GB/s" in problem.warnings[1]
    clean = load_problem("llama2-7b", "2x8xH100-80GB", 64, 2048, "bf16", "flash", None, None, None, ())
    assert clean.warnings == ()
