"""The planning entry point: known answers on cluster files with one slow pair, and CLI = library."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

import cli
from benchmarks.heterogeneous import CONFIGS, SHORTHAND, row
from benchmarks.heterogeneous import MODEL as BENCH_MODEL
from benchmarks.heterogeneous import TRAINING as BENCH_TRAINING
from planner.cluster import load_cluster, parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.model import load_model
from planner.placement import default_placement
from planner.plan import build_plan_document
from planner.search.placement import fast_ring, pinned_options
from planner.search.planning import needs_placement, plan
from planner.search.space import FixedOptions

MODEL = load_model("llama3-8b")
TRAINING = Training(global_batch=64, seq_len=4096)
SLOW = frozenset(("node0", "node1"))


def _cluster_file(tmp_path, nodes: int, slow: bool = True) -> str:
    """`nodes` × 8 × H100-80GB as a cluster file; node0–node1 at 1 % of the nominal 50 GB/s when `slow`."""
    document = {"name": f"slow-pair-{nodes}", "gpu": "H100-80GB", "nodes": nodes, "gpus_per_node": 8}
    if slow:
        document["links"] = [{"nodes": ["node0", "node1"], "gbps": 0.5}]
    path = tmp_path / f"cluster-{nodes}-{slow}.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def _hops(cluster, config: ParallelConfig, placement) -> tuple[set[frozenset], set[frozenset]]:
    """Node-name pairs joined by a pipeline hop and by a DP-ring hop (replicas in ring order)."""
    def name(d: int, p: int) -> str:
        return cluster.nodes[placement.gpu_of(config, d, p, 0)[0]].name

    pipeline = {frozenset((name(d, p), name(d, p + 1))) for d in range(config.dp) for p in range(config.pp - 1)}
    ring = {frozenset((name(d, p), name((d + 1) % config.dp, p))) for d in range(config.dp) for p in range(config.pp)
            if config.dp > 1}
    return pipeline, ring


@pytest.mark.parametrize("nodes, config, method", [
    (4, ParallelConfig(dp=4, tp=8, pp=1, sequence_parallel=True), "exact"),  # a pure DP ring
    (8, ParallelConfig(dp=8, tp=8, pp=1, sequence_parallel=True), "annealing"),
    (4, ParallelConfig(dp=2, tp=8, pp=2, sequence_parallel=True), "exact"),  # pp × dp
    (8, ParallelConfig(dp=4, tp=8, pp=2, sequence_parallel=True), "annealing"),
])
def test_slow_pair_is_neither_a_pipeline_nor_a_dp_ring_hop(tmp_path, nodes, config, method):
    cluster = load_cluster(_cluster_file(tmp_path, nodes))
    fixed = pinned_options(config)
    naive_pipeline, naive_ring = _hops(cluster, config, default_placement(cluster, config))
    assert SLOW in naive_pipeline | naive_ring  # the rank order uses the slow pair
    planned = plan(MODEL, cluster, TRAINING, fixed, top_k=1)
    assert planned.heterogeneity is not None and planned.heterogeneity["placement_method"] == method
    pipeline, ring = _hops(cluster, planned.best.config, planned.best.placement)
    assert SLOW not in pipeline | ring
    uniform = plan(MODEL, load_cluster(_cluster_file(tmp_path, nodes, slow=False)), TRAINING, fixed, top_k=1)
    assert uniform.heterogeneity is None
    assert planned.best.estimate.iteration_time_s == pytest.approx(uniform.best.estimate.iteration_time_s, rel=1e-9)
    assert planned.heterogeneity["rank_order_time_s"] > 1.05 * planned.best.estimate.iteration_time_s


def test_cli_plan_prints_what_the_library_plans(tmp_path):
    path = _cluster_file(tmp_path, 4)
    args = ["plan", "--cluster", path, "--global-batch", "64", "--seq-len", "4096", "--tp", "8", "--micro-batch", "1",
            "--top", "2", "--json"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    cluster = load_cluster(path)
    planned = plan(MODEL, cluster, TRAINING, FixedOptions(tp=8, micro_batch=1), top_k=2)
    best = planned.best
    expected = json.loads(json.dumps(build_plan_document(MODEL, cluster, TRAINING, best.config, best.placement,
                                                         best.estimate)))
    for key in ("parallelism", "stages", "placement", "estimate"):
        assert document[key] == expected[key], key
    assert document["heterogeneity"] == json.loads(json.dumps(planned.heterogeneity))
    assert len(document["alternatives"]) == len(planned.plans) - 1


def test_fast_ring_is_a_deterministic_tour_that_closes_around_the_slow_pair(tmp_path):
    cluster = load_cluster(_cluster_file(tmp_path, 8))
    ring = fast_ring(cluster, range(8))
    assert sorted(ring) == list(range(8)) and ring == fast_ring(cluster, range(8))
    assert frozenset((0, 1)) not in {frozenset((ring[i - 1], ring[i])) for i in range(len(ring))}
    assert needs_placement(cluster) and not needs_placement(parse_shorthand("8x8xH100-80GB"))


def test_benchmark_configurations_fit_and_a_config_that_does_not_is_reported_without_a_gain():
    model = load_model(BENCH_MODEL)
    for config in CONFIGS:
        assert estimate(model, parse_shorthand(SHORTHAND), BENCH_TRAINING, config).fits, config.describe()
    # Without sequence parallelism and with selective recompute the dp-only row overflows 80 GB.
    unsplit = ParallelConfig(dp=16, tp=8, pp=1, recompute="selective", distributed_optimizer=True)
    text = row(model, unsplit, seeds=1, evaluations=10)
    assert "does not fit" in text and "%" not in text.split("does not fit")[0]
    fitting = row(model, CONFIGS[0], seeds=1, evaluations=10)
    assert "does not fit" not in fitting and " % (" in fitting
