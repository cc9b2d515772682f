"""Placement search: known answers on clusters with one bad link, stragglers, and determinism."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.cluster import Link, cluster_from_dict, load_cluster, parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.model import load_model
from planner.placement import Placement, default_placement
from planner.search.placement import homogeneous_subset, placement_objective, search_placement, stage_nodes
from planner.slowdown import Slowdown, apply_slowdowns

MODEL = load_model("llama3-8b")
TRAINING = Training(global_batch=48, seq_len=4096)


def _slow_pair(cluster, a: int, b: int, factor: float = 100.0):
    nominal = cluster.link(a, b)
    return cluster.with_pair_links({(a, b): Link(nominal.bandwidth_bytes_per_s / factor, nominal.latency_s)})


def _search(cluster, config, **kwargs):
    return search_placement(cluster, config, placement_objective(MODEL, cluster, TRAINING, config), **kwargs)


def _pipeline_pairs(cluster, config, placement):
    """Node pairs joined by a pipeline hop (any replica, any TP rank)."""
    pairs = set()
    for d, p, t in itertools.product(range(config.dp), range(config.pp - 1), range(config.tp)):
        a = placement.gpu_of(config, d, p, t)[0]
        b = placement.gpu_of(config, d, p + 1, t)[0]
        pairs.add(frozenset((a, b)))
    return pairs


def test_pipeline_avoids_a_pair_100x_slower():
    cluster = _slow_pair(parse_shorthand("4x8xH100-80GB"), 1, 2)
    config = ParallelConfig(dp=1, tp=8, pp=4)
    naive = default_placement(cluster, config)
    assert frozenset((1, 2)) in _pipeline_pairs(cluster, config, naive)  # the rank order crosses it
    result = _search(cluster, config)
    assert result.method == "exact"
    assert frozenset((1, 2)) not in _pipeline_pairs(cluster, config, result.placement)
    assert result.iteration_time_s < 0.8 * result.naive_time_s
    assert result.gain == pytest.approx(1 - result.iteration_time_s / result.naive_time_s)
    uniform = estimate(MODEL, parse_shorthand("4x8xH100-80GB"), TRAINING, config)
    assert result.iteration_time_s == pytest.approx(uniform.iteration_time_s)  # nothing slow left


def test_dp_ring_avoids_one_slow_link():
    cluster = _slow_pair(parse_shorthand("4x8xH100-80GB"), 0, 1, factor=20.0)
    config = ParallelConfig(dp=4, tp=8, pp=1)
    result = _search(cluster, config)
    ring = [placement_gpu[0] for placement_gpu in result.placement.gpus[:: config.tp]]
    hops = {frozenset((ring[i], ring[(i + 1) % len(ring)])) for i in range(len(ring))}
    assert frozenset((0, 1)) not in hops
    assert result.iteration_time_s < result.naive_time_s


def test_annealing_finds_the_fast_pipeline_on_a_larger_cluster():
    cluster = parse_shorthand("9x8xH100-80GB")
    bad = [(0, 1), (3, 4), (6, 7), (2, 5)]
    for a, b in bad:
        cluster = _slow_pair(cluster, a, b)
    config = ParallelConfig(dp=3, tp=8, pp=3)
    result = _search(cluster, config, seed=3, max_evaluations=400)
    assert result.method == "annealing"
    pairs = _pipeline_pairs(cluster, config, result.placement)
    assert not pairs & {frozenset(p) for p in bad}
    assert result.gain > 0.3


def test_same_seed_same_placement_and_naive_is_the_rank_order():
    rng = random.Random(11)
    cluster = parse_shorthand("9x8xA100-80GB")
    nominal = cluster.link(0, 1)
    cluster = cluster.with_pair_links({
        (a, b): Link(nominal.bandwidth_bytes_per_s * rng.uniform(0.25, 1.0), nominal.latency_s)
        for a, b in itertools.combinations(range(9), 2)
    })
    config = ParallelConfig(dp=3, tp=8, pp=3)
    first = _search(cluster, config, seed=5, max_evaluations=150)
    again = _search(cluster, config, seed=5, max_evaluations=150)
    assert first.placement == again.placement and first.evaluations == again.evaluations == 150
    naive = estimate(MODEL, cluster, TRAINING, config)
    assert first.naive_time_s == pytest.approx(naive.iteration_time_s)
    assert first.iteration_time_s <= first.naive_time_s


def test_idle_node_absorbs_a_straggler():
    cluster = apply_slowdowns(parse_shorthand("5x8xH100-80GB"), [Slowdown("node1", None, 3.0)])
    config = ParallelConfig(dp=1, tp=8, pp=4)
    result = _search(cluster, config)
    assert "node1" not in {name for names in stage_nodes(cluster, config, result.placement) for name in names}
    assert result.iteration_time_s < 0.7 * result.naive_time_s


def test_slow_gpu_goes_to_the_lighter_stage_and_tp_groups_stay_in_a_node():
    # One node, two pipeline ranks of tp=4: the slow GPU is moved to the stage without the
    # embedding and head (less work), by a device order inside the node.
    cluster = apply_slowdowns(parse_shorthand("1x8xH100-80GB"), [Slowdown("node0", 6, 2.0)])
    config = ParallelConfig(dp=1, tp=4, pp=2, sequence_parallel=True)
    result = _search(cluster, config)
    gpus = result.placement.gpus
    assert len(set(gpus)) == len(gpus) == 8
    for start in range(0, len(gpus), config.tp):
        assert len({node for node, _ in gpus[start:start + config.tp]}) == 1
    slow_rank = next(r for r, gpu in enumerate(gpus) if gpu == (0, 6)) // (config.tp * config.dp)
    times = [stage.forward_s + stage.backward_s for stage in estimate(MODEL, parse_shorthand("1x8xH100-80GB"),
                                                                        TRAINING, config).stages]
    assert slow_rank == times.index(min(times))
    assert slow_rank == 0 and result.iteration_time_s < result.naive_time_s  # rank order had it on rank 1


def test_mixed_types_brute_force_over_node_assignments():
    cluster = cluster_from_dict({"name": "mixed", "node_groups": [
        {"gpu": "V100-32GB", "nodes": 3, "gpus_per_node": 8},
        {"gpu": "A100-80GB", "nodes": 3, "gpus_per_node": 8},
    ]}, "test")
    training = Training(global_batch=64, seq_len=2048, dtype="fp16", grad_bytes=2)
    config = ParallelConfig(dp=2, tp=8, pp=2)
    model = load_model("gpt3-2.7b")
    objective = placement_objective(model, cluster, training, config)
    result = search_placement(cluster, config, objective)
    assert result.method == "exact"
    best = min(
        objective(Placement(tuple((n, g) for n in nodes for g in range(8)))).iteration_time_s
        for nodes in itertools.permutations(range(cluster.num_nodes), 4)
    )
    assert result.iteration_time_s == pytest.approx(best)
    # Each pipeline rank runs on one GPU type: mixing would make every rank wait for a V100.
    for names in stage_nodes(cluster, config, result.placement):
        assert len({cluster.nodes[cluster.node_index(n)].gpu.name for n in names}) == 1


def test_homogeneous_subset_keeps_the_largest_type_and_remaps_links():
    cluster = cluster_from_dict({"name": "m", "node_groups": [
        {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
        {"gpu": "V100-32GB", "nodes": 3, "gpus_per_node": 8},
    ]}, "test")
    cluster = _slow_pair(_slow_pair(cluster, 3, 4), 0, 1)
    subset = homogeneous_subset(cluster)
    assert [node.name for node in subset.nodes] == ["node2", "node3", "node4"]
    assert subset.link(1, 2).bandwidth_bytes_per_s == cluster.link(3, 4).bandwidth_bytes_per_s
    assert set(subset.pair_links) == {(1, 2)}
    assert homogeneous_subset(parse_shorthand("2x8xH100-80GB")) is None
    tie = homogeneous_subset(load_cluster("mixed-a100-v100"))  # 32 GPUs each: the faster type wins
    assert {node.gpu.name for node in tie.nodes} == {"A100-80GB"}


@pytest.mark.parametrize("nodes", [4, 6])
def test_slowed_node_on_alike_nodes_is_placed_by_role_as_well_as_exhaustively(nodes):
    """Nodes that differ only by slowdowns are interchangeable within a role (the pipeline ranks they
    serve, or idle): trying each role once for the slowed node gives the exhaustive answer, and
    an idle node absorbs it when there is one."""
    cluster = apply_slowdowns(parse_shorthand(f"{nodes}x8xH100-80GB"), [Slowdown("node2", None, 2.0)])
    config = ParallelConfig(dp=1, tp=8, pp=4)
    by_role = _search(cluster, config, exact_limit=1)
    exhaustive = _search(cluster, config, exact_limit=10**9)
    assert by_role.method == "roles" and exhaustive.method == "exact"
    assert by_role.iteration_time_s == pytest.approx(exhaustive.iteration_time_s, rel=1e-12)
    assert by_role.evaluations <= 2 + config.pp
    if nodes > config.dp * config.pp:
        used = {name for names in stage_nodes(cluster, config, by_role.placement) for name in names}
        assert "node2" not in used
