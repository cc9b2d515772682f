"""NVLink domains larger than a host (issue 11 item 4): a GB200/GB300 NVL72 rack is one planner node of 72 GPUs
over 18 trays of 4. Shorthand and cluster files say so; groups inside a domain are priced on NVLink; launchers
start one process per GPU of a tray; the plan file keeps the tray size and `estimate --plan` reproduces it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_export_launch import FILL, _run, _value
from test_export_plans import parse_flags, plan_document

from planner.cluster import load_cluster, parse_shorthand
from planner.config import ParallelConfig, Partition, Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.export import TARGETS, export_plan, write_export
from planner.model import load_model
from planner.placement import default_placement
from planner.plan import parse_plan_document

ROOT = Path(__file__).resolve().parents[1]


def _shape(cluster) -> tuple[int, int, set[int], int]:
    """(domains, GPUs per domain, GPUs per host, GPUs)."""
    return cluster.num_nodes, cluster.gpus_per_node, {n.gpus_per_host for n in cluster.nodes}, cluster.num_gpus


@pytest.mark.parametrize(("text", "shape"), [
    ("2xNVL72xGB200", (2, 72, {4}, 144)),      # 2 domains; trays of 4 from the GPU catalog
    ("2x72xGB300", (2, 72, {4}, 144)),
    ("36x4xGB200:nvl72", (2, 72, {4}, 144)),   # 36 hosts of 4 in domains of 72
    ("72x4xGB200:NVL72", (4, 72, {4}, 288)),
    ("1x8xGB200", (1, 8, {4}, 8)),             # part of a rack: 2 trays, one domain
    ("1x2xGB200", (1, 2, {2}, 2)),             # part of a tray
    ("36x4xGB200", (36, 4, {4}, 144)),         # domains of 4: trays without the NVLink switch
    ("16x8xH100-80GB", (16, 8, {8}, 128)),     # an ordinary node is one host
    ("4x8xH100-80GB:nvl32", (1, 32, {8}, 32)),
])
def test_shorthand_forms(text, shape):
    assert _shape(parse_shorthand(text)) == shape
    assert _shape(load_cluster(text)) == shape


def test_the_domain_uses_nvlink_bandwidth_across_its_trays():
    rack, trays = parse_shorthand("2xNVL72xGB200"), parse_shorthand("36x4xGB200")
    eight = rack.ring_link([(0, g) for g in range(8)])
    assert eight.kind == "intra" and eight.bandwidth_bytes_per_s == 900e9
    split = trays.ring_link([(0, g) for g in range(4)] + [(1, g) for g in range(4)])
    assert split.kind == "inter" and split.bandwidth_bytes_per_s == 4 * 50e9  # 4 ConnectX-7 per tray
    assert rack.link(0, 1).kind == "inter" and rack.link(0, 1).bandwidth_bytes_per_s == 50e9


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300-nvl72"])
def test_rack_presets(name):
    assert _shape(load_cluster(name)) == (1, 72, {4}, 72)


def test_cluster_file_says_the_tray_size_or_takes_the_catalogs(tmp_path):
    path = tmp_path / "racks.yaml"
    path.write_text("node_groups:\n"
                    "  - {gpu: GB200, nodes: 2, names: [rackA, rackB]}\n"
                    "  - {gpu: B200, nodes: 1, gpus_per_node: 16, gpus_per_host: 8}\n"
                    "  - {gpu: H100-80GB, nodes: 1}\n")
    cluster = load_cluster(str(path))
    assert [(n.name, n.num_gpus, n.gpus_per_host, n.num_hosts) for n in cluster.nodes] == [
        ("rackA", 72, 4, 18), ("rackB", 72, 4, 18), ("node2", 16, 8, 2), ("node3", 8, 8, 1)]


@pytest.mark.parametrize(("text", "message"), [
    ("36x4xGB200:nvl70", "NVLink domain of 70 GPUs must be a whole number of 4-GPU hosts and divide the 144"),
    ("3x8xH100-80GB:nvl16", "NVLink domain of 16 GPUs must be a whole number of 8-GPU hosts and divide the 24"),
    ("2x8xH100-80GB:nvl4", "NVLink domain of 4 GPUs must be a whole number of 8-GPU hosts"),
    ("2xNVL72xGB200:nvl72", "give the NVLink domain once"),
    ("1x6xGB200", "GB200 hosts hold 4 GPUs, so a node \\(NVLink domain\\) of 6 GPUs must be a multiple of 4"),
    ("2x8xH100-80GB:nvl", "unknown cluster '2x8xH100-80GB:nvl'.*HOSTSxGPUSxGPU:nvlN"),
])
def test_bad_shorthand_names_the_values(text, message):
    with pytest.raises(PlannerError, match=message):
        load_cluster(text)


@pytest.mark.parametrize(("group", "message"), [
    ("{gpu: GB200, nodes: 1, gpus_per_node: 72, gpus_per_host: 5}", "'gpus_per_host' must be a positive integer "
                                                                   "dividing gpus_per_node \\(72\\), got 5"),
    ("{gpu: GB200, nodes: 1, gpus_per_node: 72, gpus_per_host: true}", "got True"),
    ("{gpu: GB200, nodes: 1, gpus_per_node: 10}", "a node \\(NVLink domain\\) of 10 GPUs must be a multiple of 4"),
])
def test_bad_cluster_file(tmp_path, group, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"node_groups:\n  - {group}\n")
    with pytest.raises(PlannerError, match=message):
        load_cluster(str(path))


def test_cli_refuses_a_domain_that_does_not_divide_the_gpus_with_exit_2():
    run = subprocess.run([sys.executable, "cli.py", "estimate", "--model", "llama3-8b", "--cluster",
                          "10x4xGB200:nvl72", "--global-batch", "40"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2
    assert "NVLink domain of 72 GPUs" in run.stderr and "divide the 40 GPUs" in run.stderr


def _estimate(model: str, cluster: str, global_batch: int = 64, **parallel):
    spec, machines = load_model(model), load_cluster(cluster)
    parallel.setdefault("tp", 1)
    parallel.setdefault("dp", machines.num_gpus // (parallel["tp"] * parallel["pp"]))
    config = ParallelConfig(**parallel)
    training = Training(global_batch=global_batch, seq_len=4096)
    return estimate(spec, machines, training, config, Partition.uniform(spec.num_layers, config.num_virtual_stages),
                    default_placement(machines, config))


def test_tp8_in_an_nvl72_costs_what_it_costs_inside_an_8_gpu_node():
    """A TP group over two trays of a rack runs on NVLink: the same tp_comm as in 8-GPU domains of that GPU."""
    rack = _estimate("llama3-70b", "2xNVL72xGB200", 72, tp=8, pp=2, sequence_parallel=True)
    nodes = _estimate("llama3-70b", "18x8xGB200", 72, tp=8, pp=2, sequence_parallel=True)
    assert rack.breakdown_s["tp_comm"] > 0
    assert rack.breakdown_s["tp_comm"] == pytest.approx(nodes.breakdown_s["tp_comm"])


def test_ep8_inside_a_domain_uses_nvlink_not_the_nics():
    """Mixtral EP=8 over two trays: all-to-all on NVLink in a 64-GPU domain, on InfiniBand between 4-GPU domains."""
    domain = _estimate("mixtral-8x7b", "16x4xGB200:nvl64", ep=8, pp=4)
    trays = _estimate("mixtral-8x7b", "16x4xGB200", ep=8, pp=4)
    inside, across = (r.breakdown_detail_s["ep_alltoall"] for r in (domain, trays))
    assert 0 < inside < across / 5  # 900 GB/s NVLink vs 4 × 50 GB/s NICs per tray
    assert domain.iteration_time_s < trays.iteration_time_s


def test_default_placement_keeps_tp_groups_inside_a_domain():
    cluster = parse_shorthand("2xNVL72xGB200")
    config = ParallelConfig(dp=18, tp=8, pp=1)
    placement = default_placement(cluster, config)
    for group in range(18):
        assert len({placement.gpus[group * 8 + t][0] for t in range(8)}) == 1


def _rack_plan(**parallel) -> dict:
    parallel.setdefault("tp", 8)
    parallel.setdefault("pp", 2)
    return plan_document(model="llama3-70b", cluster="2xNVL72xGB200", blocks=(40, 40), global_batch=72, **parallel)


@pytest.mark.parametrize("target", TARGETS)
def test_launchers_start_four_processes_per_tray(target):
    files = export_plan(parse_plan_document(_rack_plan()), target).files
    assert "NNODES=36" in files["torchrun.sh"] and "--nproc-per-node 4 " in files["torchrun.sh"]
    sbatch = files["slurm.sbatch"]
    assert "#SBATCH --nodes=36" in sbatch and "#SBATCH --gpus-per-node=4" in sbatch
    assert "--segment=18" in sbatch and "--nodelist" not in sbatch
    hosts = [line.split() for line in files["hostfile"].splitlines() if not line.startswith("#")]
    assert hosts == [[f"node{n}-h{k}", "slots=4"] for n in range(2) for k in range(18)]
    if target == "deepspeed":
        assert "--num_gpus 4 " in files["deepspeed.sh"]
    if target == "megatron":  # no Megatron-LM flag depends on the host size
        flags = parse_flags(files["megatron_args.txt"])
        assert flags["--tensor-model-parallel-size"] == ["8"]


def test_sbatch_gives_each_tray_its_node_rank(tmp_path):
    out = tmp_path / "megatron"
    write_export(export_plan(parse_plan_document(_rack_plan()), "megatron"), out)
    allocation = " ".join(f"tray{i:02d}" for i in range(36))
    run, calls = _run(tmp_path, out, "slurm.sbatch", FAKE_ALLOCATION=allocation, SLURM_JOB_NODELIST="tray[00-35]",
                      SLURM_JOB_ID="9", SLURM_SUBMIT_DIR=str(out), **FILL)
    assert run.returncode == 0, run.stderr
    assert [(c[0], _value(c, "--node-rank"), _value(c, "--nproc-per-node")) for c in calls] == [
        (f"tray{i:02d}", str(i), "4") for i in range(36)]


def test_permuted_gpus_inside_a_tray_become_visible_devices():
    document = _rack_plan()
    ranks = document["placement"]["ranks"]
    ranks[0]["gpu_index"], ranks[1]["gpu_index"] = ranks[1]["gpu_index"], ranks[0]["gpu_index"]
    files = export_plan(parse_plan_document(document), "torchtitan").files
    assert "0) export CUDA_VISIBLE_DEVICES=1,0,2,3 ;;" in files["torchrun.sh"]
    assert "node0-h0 slots=4  # CUDA_VISIBLE_DEVICES=1,0,2,3" in files["hostfile"]


def test_plan_file_round_trips_the_tray_size_and_reestimates_exactly(tmp_path):
    out = tmp_path / "plan.json"
    run = subprocess.run([sys.executable, "cli.py", "estimate", "--model", "llama3-70b", "--cluster",
                          "36x4xGB200:nvl72", "--tp", "8", "--pp", "2", "--global-batch", "72", "--seq-len", "4096",
                          "--json"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out.write_text(run.stdout)
    document = json.loads(run.stdout)
    groups = document["cluster"]["node_groups"]
    assert [(g["nodes"], g["num_gpus"], g["gpus_per_host"]) for g in groups] == [(2, 72, 4)]
    plan = parse_plan_document(document)
    assert plan.machines == load_cluster("36x4xGB200:nvl72")
    assert [n.gpus_per_host for n in plan.machines.nodes] == [4, 4]
    again = subprocess.run([sys.executable, "cli.py", "estimate", "--plan", str(out), "--json"],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["estimate"] == document["estimate"]
    assert json.loads(again.stdout)["cluster"] == document["cluster"]


def test_a_plan_file_without_tray_sizes_reads_each_node_as_one_host():
    """Plan files written before trays existed: every node is one host, as they were launched."""
    document = plan_document()
    for group in document["cluster"]["node_groups"]:
        del group["gpus_per_host"]
    plan = parse_plan_document(document)
    assert [n.gpus_per_host for n in plan.machines.nodes] == [8, 8]
    assert "--nproc-per-node 8 " in export_plan(plan, "megatron").files["torchrun.sh"]


def test_plan_file_refuses_a_tray_size_that_does_not_divide_the_node():
    document = _rack_plan()
    document["cluster"]["node_groups"][0]["gpus_per_host"] = 5
    with pytest.raises(PlannerError, match="gpus_per_host must divide its 72 GPUs, got 5"):
        parse_plan_document(document)
