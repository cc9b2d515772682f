"""`planner calibrate`: recover known efficiencies from a profile the analytic model generated, and
use the written GPU profile from a cluster file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import cli
from benchmarks import calibrate as benchmark_calibrate
from planner.cluster import load_cluster
from planner.errors import PlannerError
from planner.gpu import catalog_entry, catalog_gpu_names, gpu_from_dict, lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration, load_calibration
from planner.profile.fit import EfficiencyFit, fit_problems
from planner.resources import profiles_dir

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
    # everything the fit does not touch is the catalog's: FP8's transposed copies, FA2's share, power, host link
    catalog = lookup_gpu("H100-80GB")
    assert replace(cluster.gpu, name=catalog.name, matmul_efficiency=catalog.matmul_efficiency,
                   source=catalog.source) == replace(catalog, memory_bytes=cluster.gpu.memory_bytes)
    assert abs(cluster.gpu.memory_bytes - catalog.memory_bytes) <= 1


@pytest.mark.parametrize("name", catalog_gpu_names())
def test_a_catalog_entry_reads_back_as_the_same_gpu(name: str) -> None:
    """`catalog_entry` is `gpu_from_dict`'s inverse (memory to the byte it rounds), so a written profile keeps the
    part's attention shares, FP8 layout, power and links: an MI300X profile still costs AOTriton and CK's rate."""
    gpu = lookup_gpu(name)
    again = gpu_from_dict(name, catalog_entry(gpu), "test")
    assert abs(again.memory_bytes - gpu.memory_bytes) <= 1
    assert replace(again, memory_bytes=gpu.memory_bytes) == gpu


def test_gpu_profile_with_several_entries_is_refused(tmp_path) -> None:
    (tmp_path / "two.yaml").write_text(yaml.safe_dump({"gpus": {"a": {}, "b": {}}}))
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("node_groups: [{gpu_profile: two.yaml}]\n")
    with pytest.raises(PlannerError, match="must hold one entry under 'gpus'"):
        load_cluster(str(cluster_file))


# ---- plausibility bounds -------------------------------------------------------------------------

CPU_PROFILE = Path(__file__).parent.parent / "profiles" / "measured" / "tiny-llama-cpu-bf16-s128.json"


def calibrate_cpu_profile(tmp_path, *options: str):
    """The shipped 2-core CPU profile fitted against H100 peaks: rms error ~80 %, efficiencies 5e-5..2e-3."""
    out = tmp_path / "h100.yaml"
    result = CliRunner().invoke(cli.main, ["calibrate", str(CPU_PROFILE), "--gpu", "H100-80GB", "--out", str(out),
                                           *options])
    return result, out


def test_implausible_fit_is_refused_with_one_line_and_nothing_written(tmp_path) -> None:
    result, _ = calibrate_cpu_profile(tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1
    assert "matmul_efficiency 0.00" in result.stderr and "is outside [0.01, 1]" in result.stderr
    assert "of the fit exceeds 25 %" in result.stderr and "--force" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_forced_fit_warns_and_records_the_warnings_in_both_files(tmp_path) -> None:
    result, out = calibrate_cpu_profile(tmp_path, "--force")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 4 and all("written anyway (--force)" in line for line in warnings)
    entry = yaml.safe_load(out.read_text())["gpus"]["H100-80GB-calibrated"]
    assert entry["matmul_efficiency"] == 0.01 and len(entry["warnings"]) == 4
    calibration_file = tmp_path / "h100.calibration.yaml"
    assert yaml.safe_load(calibration_file.read_text())["warnings"] == entry["warnings"]
    assert load_calibration(calibration_file).memory_bound_efficiency == 0.01  # clipped, so it loads


def test_clean_fit_has_no_problems_and_no_warnings_field(tmp_path) -> None:
    result, out = calibrate(tmp_path, synthetic_profile())
    assert result.exit_code == 0 and "warning" not in result.stderr
    assert "warnings" not in yaml.safe_load(out.read_text())["gpus"]["H100-80GB-calibrated"]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"rms_relative_error": 0.30}, ("rms relative error 30.0 % of the fit exceeds 25 %",)),
    ({"memory_bound_efficiency": 1.2}, ("memory_bound_efficiency 1.2 is outside [0.01, 1]",)),
    ({"flash_attention_efficiency": 0.009}, ("flash_attention_efficiency 0.009 is outside [0.01, 1]",)),
    ({"rms_relative_error": 0.25, "matmul_efficiency": 1.0}, ()),
])
def test_fit_problems_name_the_value_and_the_bound(changes: dict, expected: tuple[str, ...]) -> None:
    fit = replace(EfficiencyFit(0.6, 0.5, 0.4, ("matmul_efficiency", "memory_bound_efficiency",
                                                "flash_attention_efficiency"), 36, 0.02), **changes)
    problems = fit_problems(fit)
    assert len(problems) == len(expected)
    assert all(text in problem for text, problem in zip(expected, problems, strict=True))


def test_unfitted_default_is_not_checked() -> None:
    """An unfused profile leaves flash attention unfitted: its value is the default, not a finding."""
    assert fit_problems(EfficiencyFit(0.6, 0.5, 5.0, ("matmul_efficiency", "memory_bound_efficiency"), 36, 0.02)) == ()


def test_benchmark_calibrate_writes_the_tracked_file_only_with_write() -> None:
    assert benchmark_calibrate.destination([]) is None  # prints only
    assert benchmark_calibrate.destination(["--out", "trial.yaml"]) == Path("trial.yaml")
    assert benchmark_calibrate.destination(["--write"]) == profiles_dir() / "calibration.yaml"
    with pytest.raises(SystemExit):
        benchmark_calibrate.destination(["--write", "--out", "trial.yaml"])


def test_benchmark_calibrate_default_run_prints_and_leaves_the_tracked_file(monkeypatch, capsys, tmp_path) -> None:
    """The 5-minute fit is replaced by its start point; everything around it runs."""
    tracked = profiles_dir() / "calibration.yaml"
    before = tracked.read_bytes()
    priors = {state.name: state.prior for state in benchmark_calibrate.CLUSTER_STATES.values()}
    monkeypatch.setattr(benchmark_calibrate, "fit", lambda start, bloom, h100: (start, priors))
    benchmark_calibrate.main([])
    assert "constants:" in capsys.readouterr().out and tracked.read_bytes() == before
    benchmark_calibrate.main(["--out", str(tmp_path / "trial.yaml")])
    assert load_calibration(tmp_path / "trial.yaml").gemm_efficiency == 1.0 and tracked.read_bytes() == before


def test_benchmark_calibrate_only_refits_the_named_constant_from_its_shipped_value(monkeypatch, tmp_path) -> None:
    """`--only NAME` moves that constant alone (here a stubbed descent sets it) and keeps every other constant, its
    source and the cluster state as shipped; an unknown name is argparse's error (exit 2)."""
    tracked = profiles_dir() / "calibration.yaml"
    before = tracked.read_bytes()
    monkeypatch.setattr(benchmark_calibrate, "coordinate_descent",
                        lambda start, constants, loss: start.updated(**{c.name: 0.75 for c in constants}))
    benchmark_calibrate.main(["--only", "gemm_efficiency", "--out", str(tmp_path / "only.yaml")])
    shipped, refit = default_calibration(), load_calibration(tmp_path / "only.yaml")
    assert refit.gemm_efficiency == 0.75 and tracked.read_bytes() == before
    assert refit.updated(gemm_efficiency=shipped.gemm_efficiency) == shipped
    with pytest.raises(SystemExit) as exit_info:
        benchmark_calibrate.destination(["--only", "warp_speed"])
    assert exit_info.value.code == 2


def test_benchmark_calibrate_only_refits_a_named_cluster_state_and_keeps_the_rest(monkeypatch, tmp_path) -> None:
    """`--only p2p_bandwidth_ratio` moves Jean Zay's pipeline ratio alone (a stubbed search sets it): the cost-model
    constants, the pre-fix NIC ratio and its source stay as shipped."""
    monkeypatch.setattr(benchmark_calibrate, "golden_section", lambda loss, low, high, start, steps=10: 0.5)
    out = tmp_path / "state.yaml"
    benchmark_calibrate.main(["--only", "p2p_bandwidth_ratio", "--out", str(out)])
    assert load_calibration(out) == default_calibration()
    written = yaml.safe_load(out.read_text())["cluster_states"]
    shipped = yaml.safe_load((profiles_dir() / "calibration.yaml").read_text())["cluster_states"]
    assert written["jean-zay-a100-48 pipeline transfers"]["p2p_bandwidth_ratio"] == 0.5
    assert "--only p2p_bandwidth_ratio" in written["jean-zay-a100-48 pipeline transfers"]["source"]
    before_fix = "jean-zay-a100-48 before the PCIe/NUMA fix"
    assert written[before_fix] == shipped[before_fix]


def test_benchmark_calibration_set_holds_nemos_h100_long_sequence_rows_as_a_group_of_their_own() -> None:
    """NeMo's H100 long-sequence runs (4K to 1M tokens) are the calibration's fourth group: the only one in which
    attention's share of the time varies enough to tell its rate from the GEMMs'."""
    runs = benchmark_calibrate.calibration_h100_runs()
    long = [run for run in runs if run.label.startswith("NLS-")]
    assert len(long) == 9 and {run.training.seq_len for run in long} == {4096 * 2**i for i in range(9)}
    groups = benchmark_calibrate.group_errors(default_calibration(), (), runs)
    assert len(groups["h100_long_sequence"]) == 9 and len(groups["h100"]) == len(runs) - 9
