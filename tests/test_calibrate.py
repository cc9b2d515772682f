"""`planner calibrate`: recover known efficiencies from a profile the analytic model generated, and
use the written GPU profile from a cluster file."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

import cli
from planner.cluster import load_cluster
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration, load_calibration

TRUE = {"matmul_efficiency": 0.62, "memory_bound_efficiency": 0.55, "flash_attention_efficiency": 0.45}


def synthetic_profile(attention: str = "flash", gpu: str | None = "H100-80GB") -> dict:
    """What a perfect H100 with the TRUE efficiencies would measure for llama3-8b (tp 1, 2; b 1, 2, 4)."""
    model = load_model("llama3-8b")
    analytic = AnalyticProfile(model, default_calibration().updated(
        memory_bound_efficiency=TRUE["memory_bound_efficiency"],
        flash_attention_efficiency=TRUE["flash_attention_efficiency"]))
    device = replace(lookup_gpu("H100-80GB"), matmul_efficiency=TRUE["matmul_efficiency"])
    units = []
    for tp in (1, 2):
        for batch in (1, 2, 4):
            for kind in UnitKind:
                times = analytic.times(kind, UnitSetting(tp, batch, 4096, False, "bf16", attention), device)
                units.append({"kind": kind.value, "tp": tp, "micro_batch": batch, "forward_s": times.forward_s,
                              "backward_s": times.backward_s,
                              "attention_core_forward_s": times.attention_core_forward_s})
    return {"schema_version": 1, "model": model.to_dict(), "gpu": gpu, "device": {"type": "cuda", "name": "synthetic"},
            "settings": {"seq_len": 4096, "dtype": "bf16", "attention": attention}, "units": units}


def calibrate(tmp_path, document: dict, *options: str):
    profile = tmp_path / "PROFILE.json"
    profile.write_text(json.dumps(document))
    out = tmp_path / "h100.yaml"
    result = CliRunner().invoke(cli.main, ["calibrate", str(profile), "--out", str(out), *options])
    return result, out


def test_calibrate_recovers_known_efficiencies_within_5_percent(tmp_path) -> None:
    result, out = calibrate(tmp_path, synthetic_profile())
    assert result.exit_code == 0, result.output
    entry = yaml.safe_load(out.read_text())["gpus"]["H100-80GB-calibrated"]
    assert entry["matmul_efficiency"] == pytest.approx(TRUE["matmul_efficiency"], rel=0.05)
    calibration = load_calibration(tmp_path / "h100.calibration.yaml")
    assert calibration.memory_bound_efficiency == pytest.approx(TRUE["memory_bound_efficiency"], rel=0.05)
    assert calibration.flash_attention_efficiency == pytest.approx(TRUE["flash_attention_efficiency"], rel=0.05)
    assert calibration.kernel_launch_s == default_calibration().kernel_launch_s
    assert "rms relative error 0.0 %" in result.stdout


def test_unfused_profile_keeps_the_flash_default(tmp_path) -> None:
    result, out = calibrate(tmp_path, synthetic_profile(attention="unfused"), "--name", "h100-lab")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["gpus"]["h100-lab"]["matmul_efficiency"] == pytest.approx(0.62, rel=0.05)
    calibration = load_calibration(tmp_path / "h100.calibration.yaml")
    assert calibration.flash_attention_efficiency == default_calibration().flash_attention_efficiency
    assert calibration.memory_bound_efficiency == pytest.approx(0.55, rel=0.05)


def test_profile_without_gpu_needs_gpu_option(tmp_path) -> None:
    result, _ = calibrate(tmp_path, synthetic_profile(gpu=None))
    assert result.exit_code == 2
    assert "give --gpu NAME" in result.stderr
    result, out = calibrate(tmp_path, synthetic_profile(gpu=None), "--gpu", "H100-80GB")
    assert result.exit_code == 0 and out.exists()


def test_cluster_file_may_reference_the_written_gpu_profile(tmp_path) -> None:
    result, _ = calibrate(tmp_path, synthetic_profile())
    assert result.exit_code == 0, result.output
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("node_groups: [{gpu_profile: h100.yaml, nodes: 2, gpus_per_node: 8}]\n")
    cluster = load_cluster(str(cluster_file))
    assert cluster.num_gpus == 16
    assert cluster.gpu.name == "H100-80GB-calibrated"
    assert cluster.gpu.matmul_efficiency == pytest.approx(0.62, rel=0.05)
    assert cluster.gpu.peak_flops("bf16") == lookup_gpu("H100-80GB").peak_flops("bf16")


def test_gpu_profile_with_several_entries_is_refused(tmp_path) -> None:
    (tmp_path / "two.yaml").write_text(yaml.safe_dump({"gpus": {"a": {}, "b": {}}}))
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("node_groups: [{gpu_profile: two.yaml}]\n")
    with pytest.raises(PlannerError, match="must hold one entry under 'gpus'"):
        load_cluster(str(cluster_file))
