"""Clusters: shorthand, files, presets, link overrides, collective bandwidth, and bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import load_cluster, parse_shorthand
from planner.errors import PlannerError
from planner.gpu import catalog_gpu_names, gpu_from_dict, lookup_gpu, sustained_clock_ratio
from planner.model import load_model
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration
from planner.training_cost import training_cost


def test_gpu_catalog_covers_required_types_with_sources() -> None:
    required = {"V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "L40S", "A10", "RTX4090",
                "MI250X", "MI300X", "B300", "GB200", "GB300", "H800"}
    assert required <= set(catalog_gpu_names())
    for name in required:
        gpu = lookup_gpu(name)
        assert gpu.source and gpu.memory_bytes > 0 and 0 < gpu.matmul_efficiency <= 1


def test_published_peaks() -> None:
    """validation/hardware_peak_tflops.csv: A100 312, H100 989 (bf16 dense), H100 FP8 1979."""
    assert lookup_gpu("A100-80GB").peak_flops("bf16") == 312e12
    assert lookup_gpu("H100-80GB").peak_flops("bf16") == 989e12
    assert lookup_gpu("H100-80GB").peak_flops("fp8") == 1979e12
    with pytest.raises(PlannerError, match="no bf16"):
        lookup_gpu("V100-32GB").peak_flops("bf16")


def test_blackwell_and_h800_entries() -> None:
    """Dense peaks are half the datasheets' 2:4-sparse headlines; H800 is H100 SXM compute with 400 GB/s NVLink
    (bidirectional) and DeepSeek-V3's 50 GB/s InfiniBand per GPU; NVL72 GPUs sit in 72-GPU domains of 4-GPU trays."""
    h100, h800 = lookup_gpu("H100-80GB"), lookup_gpu("H800")
    assert h800.peak_flops_per_s == h100.peak_flops_per_s and h800.memory_bytes == h100.memory_bytes
    links = (h800.intra_node_bandwidth_bytes_per_s, h800.nic_bandwidth_bytes_per_s, h800.gpus_per_node)
    assert links == (200e9, 50e9, 8)
    for name, bf16, fp8, fp4 in (("B200", 2250, 4500, 9000), ("B300", 2250, 4500, 13125),
                                 ("GB200", 2500, 5000, 10000), ("GB300", 2500, 5000, 15000)):
        gpu = lookup_gpu(name)
        assert [gpu.peak_flops(d) / 1e12 for d in ("bf16", "fp8", "fp4")] == [bf16, fp8, fp4], name
        assert gpu.intra_node_bandwidth_bytes_per_s == 900e9 and gpu.tdp_w is not None
    for name in ("GB200", "GB300"):
        assert (lookup_gpu(name).gpus_per_node, lookup_gpu(name).gpus_per_host) == (72, 4)
    assert lookup_gpu("B300").gpus_per_host is None  # an HGX/DGX node is one host


def test_catalog_tray_size_must_divide_the_domain() -> None:
    entry = {"sm_count": 148, "peak_tflops": {"bf16": 1}, "memory_gib": 1, "hbm_gbps": 1, "matmul_efficiency": 0.5,
             "intra_node": {"link": "nvlink5", "gbps": 900}, "gpus_per_node": 72, "nic_gbps": 50, "gpus_per_host": 5}
    with pytest.raises(PlannerError, match="gpus_per_host must divide gpus_per_node \\(72\\), got 5"):
        gpu_from_dict("X", entry, "test")


def test_shorthand() -> None:
    cluster = parse_shorthand("16x8xH100-80GB")
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.num_gpus) == (16, 8, 128)
    assert cluster.gpu.name == "H100-80GB"
    graph = cluster.node_graph()
    assert graph.number_of_nodes() == 16 and graph.number_of_edges() == 16 * 15 // 2
    assert graph[0][1]["bandwidth_bytes_per_s"] == cluster.link(0, 1).bandwidth_bytes_per_s


@pytest.mark.parametrize("text", ["16x8", "0x8xH100-80GB", "axbxc"])
def test_bad_shorthand(text: str) -> None:
    with pytest.raises(PlannerError):
        load_cluster(text)


def test_unknown_gpu_in_shorthand() -> None:
    with pytest.raises(PlannerError, match="unknown GPU type 'Z100'"):
        load_cluster("2x8xZ100")


def test_ring_bandwidth_inside_and_across_nodes() -> None:
    cluster = parse_shorthand("4x8xA100-80GB")
    inside = cluster.ring_link([(0, g) for g in range(8)])
    assert inside.bandwidth_bytes_per_s == 300e9 and inside.kind == "intra"
    one_per_node = cluster.ring_link([(n, 0) for n in range(4)])
    assert one_per_node.bandwidth_bytes_per_s == 25e9  # one HDR NIC per GPU
    full = cluster.ring_link([(n, g) for n in range(4) for g in range(8)])
    assert full.bandwidth_bytes_per_s == 200e9  # 8 NICs per node in parallel rings


def test_cluster_file_with_mixed_groups_and_overrides(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: lab\n"
        "node_groups:\n"
        "  - {gpu: A100-80GB, nodes: 2, gpus_per_node: 8, names: [a0, a1]}\n"
        "  - {gpu: V100-32GB, nodes: 1, gpus_per_node: 4, inter_node_gbps: 12.5}\n"
        "inter_node_latency_us: 8\n"
        "links:\n"
        "  - {nodes: [a0, 2], gbps: 1.0, latency_us: 100}\n"
    )
    cluster = load_cluster(str(path))
    assert cluster.num_gpus == 20 and not cluster.is_homogeneous
    assert cluster.gpu_label == "A100-80GB+V100-32GB"
    assert cluster.link(0, 1).bandwidth_bytes_per_s == 25e9
    assert cluster.link(0, 1).latency_s == pytest.approx(8e-6)
    assert cluster.link(2, 0).bandwidth_bytes_per_s == 1e9
    assert cluster.link(2, 0).latency_s == pytest.approx(100e-6)
    assert cluster.link(1, 2).bandwidth_bytes_per_s == 12.5e9
    with pytest.raises(PlannerError, match="mixes GPU types"):
        _ = cluster.gpu


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("node_groups: [{nodes: 2}]", "needs a 'gpu' type"),
        ("node_groups: [{gpu: A100-80GB, nodes: 0}]", "'nodes' must be a positive integer"),
        ("node_groups: [{gpu: A100-80GB, intra_node_gbps: -3}]", "'intra_node_gbps' must be a positive number"),
        ("node_groups: [{gpu: A100-80GB, nodes: 2}]\nlinks: [{nodes: [0, 5], gbps: 1}]", "outside 0..1"),
        ("node_groups: [{gpu: A100-80GB, nodes: 2}]\nlinks: [{nodes: [0, 1]}]", "needs 'gbps'"),
        ("- just a list", "must be a mapping"),
        ("", "is empty"),
        ("node_groups: [", "not valid YAML"),
    ],
)
def test_bad_cluster_files(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(content)
    with pytest.raises(PlannerError, match=message):
        load_cluster(str(path))


def test_presets_load() -> None:
    assert load_cluster("selene-128").num_gpus == 1024
    assert load_cluster("jean-zay-a100-48").link(0, 1).bandwidth_bytes_per_s == 6.25e9


def test_a_power_capped_part_runs_its_gemms_at_the_cube_root_of_its_power_share() -> None:
    """Grand Teton's H100 at 500 W of the SXM part's rated 700 W: GEMMs at (5/7)^(1/3); an uncapped part, or one at
    or above its rated power, keeps its rate; a bad wattage is refused naming it."""
    teton, sxm = lookup_gpu("H100-96GB-HBM2e"), lookup_gpu("H100-80GB")
    assert teton.gemm_clock_ratio == pytest.approx((500 / 700) ** (1 / 3)) and sxm.gemm_clock_ratio == 1.0
    assert teton.hbm_bandwidth_bytes_per_s == 2.4e12 and teton.matmul_efficiency == sxm.matmul_efficiency
    entry = {"sm_count": 132, "peak_tflops": {"bf16": 989}, "memory_gib": 80, "hbm_gbps": 3350,
             "matmul_efficiency": 0.8, "intra_node": {"link": "nvlink4", "gbps": 450}, "gpus_per_node": 8,
             "nic_gbps": 50, "tdp_w": 700, "rated_power_w": 600}
    assert gpu_from_dict("X", entry, "test").gemm_clock_ratio == 1.0  # 700 W limit over a 600 W rating
    with pytest.raises(PlannerError, match=r"rated_power_w must be a positive number below 1e\+18, got -1"):
        gpu_from_dict("X", {**entry, "rated_power_w": -1}, "test")


def test_gb200_is_b200s_gpu_at_1200_w_so_its_gemm_rate_is_b200s_at_the_clock_that_power_sustains() -> None:
    """No matmul benchmark of GB200 exists: its rate is B200's measured one (MAMF, at 1,000 W) at the clock 1,200 W
    sustains, so GB200 capped to B200's 1,000 W runs its GEMMs at B200's rate, not at B200's share of GB200's higher
    datasheet peak."""
    b200, gb200 = lookup_gpu("B200"), lookup_gpu("GB200")
    b200_rate = b200.peak_flops("bf16") * b200.matmul_efficiency
    gb200_rate = gb200.peak_flops("bf16") * gb200.matmul_efficiency
    assert sustained_clock_ratio(1200, 1000) == pytest.approx(1.0627, abs=1e-4)
    assert gb200_rate == pytest.approx(b200_rate * sustained_clock_ratio(gb200.tdp_w, b200.tdp_w), rel=1e-3)
    capped = gb200.power_limited(b200.tdp_w)
    assert capped.peak_flops("bf16") * capped.matmul_efficiency * capped.gemm_clock_ratio == pytest.approx(
        b200_rate, rel=1e-3)


def test_gemms_of_a_capped_part_slow_by_its_clock_ratio_and_attention_keeps_its_rate() -> None:
    teton, sxm = lookup_gpu("H100-96GB-HBM2e"), lookup_gpu("H100-80GB")
    profile = AnalyticProfile(load_model("llama3-8b"), default_calibration())
    big = profile.gemm_time(sxm, "bf16", 8192, 8192, 8192), profile.gemm_time(teton, "bf16", 8192, 8192, 8192)
    launch = default_calibration().kernel_launch_s
    assert (big[1] - launch) == pytest.approx((big[0] - launch) / teton.gemm_clock_ratio, rel=1e-9)
    setting = UnitSetting(tp=1, micro_batch=1, seq_len=8192, sequence_parallel=False, dtype="bf16", attention="flash2")
    assert profile._attention_core(setting, teton) == profile._attention_core(setting, sxm)


def test_a_cluster_runs_its_gpus_under_a_stated_power_limit(tmp_path) -> None:
    """`GPU@WATTSW` in the shorthand and `power_limit_w` in a cluster file cap the catalog part: 500 W on an H100 SXM
    (700 W) gives Grand Teton's GEMM clock ratio; 700 W on Grand Teton's own 500 W part lifts it to the full rate."""
    capped = parse_shorthand("2x8xH100-80GB@500W")
    assert capped.name == "2x8xH100-80GB@500W" and capped.gpu.name == "H100-80GB@500W"
    assert capped.gpu.gemm_clock_ratio == pytest.approx(lookup_gpu("H100-96GB-HBM2e").gemm_clock_ratio)
    assert capped.gpu.tdp_w == 500 and capped.num_gpus == 16
    assert parse_shorthand("1x8xH100-96GB-HBM2e@700W").gpu.gemm_clock_ratio == 1.0
    assert parse_shorthand("36x4xGB200@1000W:nvl72").gpu.gemm_clock_ratio == pytest.approx((1000 / 1200) ** (1 / 3))
    path = tmp_path / "capped.yaml"
    path.write_text("node_groups: [{gpu: B200, nodes: 2, power_limit_w: 750}]")
    assert load_cluster(str(path)).gpu.gemm_clock_ratio == pytest.approx(0.75 ** (1 / 3))
    # energy at the limit: 16 GPUs at 500 W for one hour-long iteration
    assert training_cost(1000, 1000, 3600.0, [capped.gpu] * 16).energy_kwh == pytest.approx(16 * 0.5)


@pytest.mark.parametrize(("spec", "message"), [
    ("1x8xH100-80GB@800W", r"power limit 800.0 W for H100-80GB must be a number of watts in \[70, 700\]"),
    ("1x8xH100-80GB@50W", r"power limit 50.0 W for H100-80GB must be .* at least a tenth of it"),
    ("1x8xH100-80GB@0W", r"power limit 0.0 W for H100-80GB must be"),
    ("1x8xH100-80GB@1.2.3W", "power limit '1.2.3' W is not a number"),
])
def test_a_power_limit_the_gpu_cannot_run_is_refused(spec: str, message: str) -> None:
    with pytest.raises(PlannerError, match=message):
        load_cluster(spec)


@pytest.mark.parametrize("value", ["'high'", "-5", "2000"])
def test_a_cluster_files_bad_power_limit_names_the_group(tmp_path, value: str) -> None:
    path = tmp_path / "capped.yaml"
    path.write_text(f"node_groups: [{{gpu: B200, nodes: 2, power_limit_w: {value}}}]")
    with pytest.raises(PlannerError, match=r"node group 0: power limit .* W for B200 must be a number of watts"):
        load_cluster(str(path))


def test_cli_plans_a_power_limited_cluster_and_refuses_a_bad_limit(tmp_path) -> None:
    """A capped cluster estimates slower, records the cap in its plan file (export rebuilds it), and a limit above the
    part's rated power exits 2 with one line."""
    runner = CliRunner()
    common = ["estimate", "--model", "llama3-8b", "--global-batch", "16", "--seq-len", "8192", "--dp", "8",
              "--micro-batch", "1", "--zero", "3"]
    full = runner.invoke(main, [*common, "--cluster", "1x8xH100-80GB", "--out", str(tmp_path / "full.json")])
    capped = runner.invoke(main, [*common, "--cluster", "1x8xH100-80GB@500W", "--out", str(tmp_path / "capped.json")])
    assert full.exit_code == capped.exit_code == 0, capped.output
    times = [json.loads((tmp_path / f"{name}.json").read_text())["estimate"]["iteration_time_s"]
             for name in ("full", "capped")]
    assert times[0] < times[1] < times[0] / lookup_gpu("H100-96GB-HBM2e").gemm_clock_ratio
    explained = runner.invoke(main, ["explain", str(tmp_path / "capped.json")])  # re-costs the file's cluster
    assert explained.exit_code == 0 and f"iteration time  {times[1]:.4f} s" in explained.output
    assert "H100-80GB@500W" in (tmp_path / "capped.json").read_text()
    bad = runner.invoke(main, [*common, "--cluster", "1x8xH100-80GB@900W"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "900.0 W" in bad.output
