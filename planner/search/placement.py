"""Placement search: which GPUs run each rank, chosen to minimise the estimated iteration time.

The unit placed is a *TP slot*: `tp` consecutive GPUs of one node, so every tensor-parallel group
stays inside an NVLink island. A placement gives each (dp, pp) cell — cell c = dp + DP·pp, which
holds ranks c·tp … c·tp + tp − 1 in Megatron-LM's tp-dp-pp order — one slot. That decides which
nodes form each pipeline and in which order (pipeline p2p sits on the critical path every
micro-batch), which replicas share a DP ring (its slowest hop bounds it), which GPU types and
stragglers each pipeline rank gets, and which nodes stay idle when the job needs fewer.

Only placements a stock launcher can realise are considered: each node keeps the contiguous block
of ranks the rank order gives a node position (torchrun numbers ranks host by host), so a
placement is a *host order* — which physical node plays each node position — plus, where a node
has known slow GPUs, which of its slots each of its cells uses (CUDA_VISIBLE_DEVICES).
Every candidate is scored by the full cost model (`planner.cost.estimate`), so link speeds, mixed
GPU types and slow devices count exactly as the estimate counts them.

* **exact**: when host orders number at most `exact_limit` (e.g. up to 7 nodes, or 8 nodes of which
  4 are used), every one is scored.
* **annealing** beyond: seeded simulated annealing over swaps of two nodes, started from the best
  of the naive rank order and the naive layout laid along a fast ring of nodes (a networkx TSP
  tour by Σ 1/bandwidth, cut at its slowest hop) pipeline by pipeline or DP ring by DP ring.
  Bounded by `max_evaluations` (deterministic for a seed) and by `time_limit_s`.
* Either way, when per-GPU slowdowns exist, a final pass swaps slots inside nodes while that helps.

The result always carries the naive rank order's time (`default_placement`), so the gain is known.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from planner.cluster import Cluster
from planner.config import ParallelConfig, Partition, Training
from planner.cost.estimate import Estimate, estimate
from planner.cost.time import UnitTimer
from planner.errors import InfeasibleError, PlannerError
from planner.model import ModelSpec
from planner.placement import Placement, default_placement
from planner.profile.calibration import Calibration
from planner.search.search import RankedPlan, search
from planner.search.space import FixedOptions

__all__ = [
    "PlacementResult",
    "Replan",
    "fast_ring",
    "heterogeneity_record",
    "homogeneous_best",
    "homogeneous_subset",
    "mixed_rank_notes",
    "pinned_options",
    "place_plans",
    "placement_objective",
    "repartition",
    "replan",
    "search_placement",
    "stage_nodes",
]

Slot = tuple[int, int]
"""A TP slot: (node index, first GPU index); it spans GPUs first … first + tp − 1."""

Evaluate = Callable[[Placement], Estimate]

_DEFAULT_EXACT_LIMIT = 5040
_T_START = 0.05  # annealing temperature as a fraction of the current time: accept ~5 % worse early
_T_END = 1e-4
_TIE_WEIGHT = 1e-3  # link pressure counts like a 0.1 % time change when the time itself is equal


@dataclass(frozen=True)
class PlacementResult:
    """The best placement found, its estimate, the naive rank order's time and how it was found."""

    placement: Placement
    estimate: Estimate
    naive_time_s: float
    method: str  # "exact", "annealing", "roles" (only slowdowns differ) or "rank-order" (nothing to move)
    evaluations: int
    search_time_s: float
    time_capped: bool = False  # the annealing stopped at time_limit_s, not at max_evaluations

    @property
    def iteration_time_s(self) -> float:
        return self.estimate.iteration_time_s

    @property
    def gain(self) -> float:
        """Fraction of the naive rank order's iteration time saved (0.2 = 20 % faster)."""
        return 1.0 - self.iteration_time_s / self.naive_time_s


def placement_objective(
    model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig,
    partition: Partition | None = None, timer: UnitTimer | None = None, calibration: Calibration | None = None,
) -> Evaluate:
    """The cost model with everything but the placement fixed."""
    return lambda placement: estimate(model, cluster, training, config, partition, placement, timer, calibration)


def _score(result: Estimate) -> tuple[int, float]:
    """Lower is better: every fitting plan beats every non-fitting one; then time, or the overshoot."""
    if result.fits:
        return 0, result.iteration_time_s
    return 1, max(stage.memory.required / stage.memory.capacity for stage in result.stages)


def _cells_of(placement: Placement, tp: int) -> list[Slot] | None:
    """The slot of each cell, or None when some TP group is not `tp` consecutive GPUs of one node."""
    cells = []
    for start in range(0, len(placement.gpus), tp):
        node, first = placement.gpus[start]
        if first % tp or any(placement.gpus[start + t] != (node, first + t) for t in range(tp)):
            return None
        cells.append((node, first))
    return cells


def _placement_of(cells: Sequence[Slot], tp: int) -> Placement:
    return Placement(tuple((node, first + t) for node, first in cells for t in range(tp)))


def stage_nodes(cluster: Cluster, config: ParallelConfig, placement: Placement) -> tuple[tuple[str, ...], ...]:
    """Per pipeline rank, the names of the nodes its GPUs sit on (in dp-replica order, no repeats)."""
    out = []
    for pp in range(config.pp):
        names: list[str] = []
        for dp in range(config.dp):
            for tp in range(config.tp):
                name = cluster.nodes[placement.gpu_of(config, dp, pp, tp)[0]].name
                if name not in names:
                    names.append(name)
        out.append(tuple(names))
    return tuple(out)


class _Scorer:
    """Memoised scoring of cell assignments, counting distinct evaluations."""

    def __init__(self, evaluate: Evaluate, tp: int) -> None:
        self.evaluate, self.tp = evaluate, tp
        self.cache: dict[tuple[Slot, ...], tuple[tuple[int, float], Estimate]] = {}

    def __call__(self, cells: Sequence[Slot]) -> tuple[tuple[int, float], Estimate]:
        key = tuple(cells)
        if key not in self.cache:
            result = self.evaluate(_placement_of(key, self.tp))
            self.cache[key] = (_score(result), result)
        return self.cache[key]

    @property
    def evaluations(self) -> int:
        return len(self.cache)


def search_placement(
    cluster: Cluster, config: ParallelConfig, evaluate: Evaluate, *, seed: int = 0,
    max_evaluations: int = 3000, time_limit_s: float = 30.0, exact_limit: int = _DEFAULT_EXACT_LIMIT,
) -> PlacementResult:
    """The placement minimising `evaluate` (see the module docstring for the method)."""
    started = time.perf_counter()
    naive = default_placement(cluster, config)
    naive_estimate = evaluate(naive)
    cells = _cells_of(naive, config.tp)
    if cells is None:
        # TP groups straddle nodes (tp does not divide a node): nothing can move without splitting them.
        return PlacementResult(naive, naive_estimate, naive_estimate.iteration_time_s, "rank-order", 1,
                               time.perf_counter() - started)
    scorer = _Scorer(evaluate, config.tp)
    scorer.cache[tuple(cells)] = (_score(naive_estimate), naive_estimate)
    positions = list(dict.fromkeys(node for node, _ in cells))
    if _only_slowdowns_differ(cluster) and math.perm(cluster.num_nodes, len(positions)) > exact_limit:
        best, method, capped = _move_slowed_nodes(cluster, config, cells, scorer), "roles", False
    elif math.perm(cluster.num_nodes, len(positions)) <= exact_limit:
        best = _exact(cluster, cells, positions, scorer)
        method, capped = "exact", False
    else:
        best, capped = _anneal(cluster, config, cells, positions, scorer, random.Random(seed), max_evaluations,
                               started + time_limit_s)
        method = "annealing"
    best = _polish_within_nodes(cluster, best, config.tp, scorer)
    result = scorer(best)[1]
    return PlacementResult(_placement_of(best, config.tp), result, naive_estimate.iteration_time_s, method,
                           scorer.evaluations, time.perf_counter() - started, capped)


def _only_slowdowns_differ(cluster: Cluster) -> bool:
    """Whether the nodes are alike (one GPU type, the same links) but for slowed GPUs: then nodes with
    the same role in a placement are interchangeable, and only where the slowed nodes go matters."""
    first = cluster.nodes[0]
    return bool(cluster.gpu_overrides) and not cluster.pair_links and all(
        (n.gpu, n.num_gpus, n.intra_bandwidth_bytes_per_s, n.nic_bandwidth_bytes_per_s)
        == (first.gpu, first.num_gpus, first.intra_bandwidth_bytes_per_s, first.nic_bandwidth_bytes_per_s)
        for n in cluster.nodes)


def _move_slowed_nodes(cluster: Cluster, config: ParallelConfig, cells: list[Slot], scorer: _Scorer) -> list[Slot]:
    """Each slowed node in turn swapped with one node of every role (the pipeline ranks a node's cells
    serve, or idle) and the best kept: O(slowed nodes × (pp + 1)) estimates instead of a search over
    host orders, exact on a cluster whose nodes differ only by slowdowns."""
    best, best_score = cells, scorer(cells)[0]
    for slowed in sorted({node for node, _ in cluster.gpu_overrides}):
        roles: dict[tuple[int, ...], int] = {}
        for node in range(cluster.num_nodes):
            role = tuple(sorted({c // config.dp for c, (n, _) in enumerate(best) if n == node}))
            roles.setdefault(role, node)
        for other in roles.values():
            if other == slowed:
                continue
            candidate = _remap(best, {slowed: other, other: slowed})
            score = scorer(candidate)[0]
            if score < best_score:
                best, best_score = candidate, score
    return best


def _exact(cluster: Cluster, cells: list[Slot], positions: list[int], scorer: _Scorer) -> list[Slot]:
    """Score every injective map of the naive layout's nodes onto physical nodes of the same size."""
    best, best_score = cells, scorer(cells)[0]
    sizes = [cluster.nodes[n].num_gpus for n in positions]
    for chosen in itertools.permutations(range(cluster.num_nodes), len(positions)):
        if any(cluster.nodes[n].num_gpus != size for n, size in zip(chosen, sizes, strict=True)):
            continue
        candidate = _remap(cells, dict(zip(positions, chosen, strict=True)))
        score = scorer(candidate)[0]
        if score < best_score:
            best, best_score = candidate, score
    return best


def _remap(cells: Sequence[Slot], mapping: dict[int, int]) -> list[Slot]:
    return [(mapping.get(node, node), first) for node, first in cells]


def fast_ring(cluster: Cluster, nodes: Sequence[int]) -> list[int]:
    """A short ring through `nodes` by Σ 1/bandwidth (a TSP tour), as a path that drops its slowest hop.

    The shortest of networkx's Christofides tour and its greedy tours from every start; both are
    deterministic for a given cluster. Walking the path, then closing it, gives the ring back.
    """
    if len(nodes) < 3:
        return list(nodes)
    import networkx as nx  # imported here, as in Cluster.node_graph: only uneven links need it
    from networkx.algorithms import approximation

    graph = cluster.node_graph(nodes)
    tours = [approximation.christofides(graph, weight="seconds_per_gb")]
    tours += [approximation.greedy_tsp(graph, weight="seconds_per_gb", source=n) for n in nodes]
    tour = min(tours, key=lambda t: nx.path_weight(graph, t, "seconds_per_gb"))[:-1]
    slowest = max(range(len(tour)), key=lambda i: graph[tour[i - 1]][tour[i]]["seconds_per_gb"])
    return tour[slowest:] + tour[:slowest]


def _path_seeds(cluster: Cluster, config: ParallelConfig, cells: list[Slot], positions: list[int]) -> list[list[Slot]]:
    """The naive layout laid along a fast ring, pipeline by pipeline and DP ring by DP ring.

    Position v holds pipeline stage v // w, where w = positions per stage, and pipeline group v % w.
    Pipeline-major, group g gets path nodes g·pp … g·pp + pp − 1 (fast pipeline hops); ring-major,
    position v gets path node v (fast DP-ring hops). Needs every position to hold cells of one stage
    only (w whole) and nodes of one size; otherwise there are no seeds.
    """
    width, rest = divmod(len(positions), config.pp)
    size = cluster.nodes[positions[0]].num_gpus
    same = [n for n in range(cluster.num_nodes) if cluster.nodes[n].num_gpus == size]
    if rest or any(cluster.nodes[n].num_gpus != size for n in positions):
        return []
    path = fast_ring(cluster, same)
    by_pipeline = {node: path[(v % width) * config.pp + v // width] for v, node in enumerate(positions)}
    by_ring = {node: path[v] for v, node in enumerate(positions)}
    return [_remap(cells, by_pipeline), _remap(cells, by_ring)]


def _link_pressure(cluster: Cluster, config: ParallelConfig, cells: Sequence[Slot]) -> float:
    """Σ 1/bandwidth over every pipeline hop and DP-ring hop between nodes: a tie-breaker that gives
    the annealing a slope where the iteration time is flat (only a ring's slowest hop counts there)."""
    def node(d: int, p: int) -> int:
        return cells[d + config.dp * p][0]

    hops = [(node(d, p), node(d, p + 1)) for d in range(config.dp) for p in range(config.pp - 1)]
    hops += [(node(d, p), node((d + 1) % config.dp, p)) for p in range(config.pp) for d in range(config.dp)]
    return sum(1.0 / cluster.link(a, b).bandwidth_bytes_per_s for a, b in hops if a != b)


def _swap_nodes(cluster: Cluster, cells: list[Slot], rng: random.Random) -> list[Slot]:
    a, b = rng.sample(range(cluster.num_nodes), 2)
    if cluster.nodes[a].num_gpus != cluster.nodes[b].num_gpus:
        return cells
    return _remap(cells, {a: b, b: a})


def _anneal(cluster: Cluster, config: ParallelConfig, cells: list[Slot], positions: list[int], scorer: _Scorer,
            rng: random.Random, max_evaluations: int, deadline: float) -> tuple[list[Slot], bool]:
    """Simulated annealing over node swaps with a geometric temperature schedule over the budget."""
    current = min([cells, *_path_seeds(cluster, config, cells, positions)], key=lambda c: scorer(c)[0])
    current_score = scorer(current)[0]
    best, best_score = current, current_score
    cooling = (_T_END / _T_START) ** (1.0 / max(max_evaluations, 1))
    temperature, steps = _T_START, 0
    while scorer.evaluations < max_evaluations and steps < 20 * max_evaluations:
        if time.perf_counter() > deadline:
            return best, True
        steps += 1
        candidate = _swap_nodes(cluster, current, rng)
        score = scorer(candidate)[0]
        if score[0] == current_score[0]:
            worse = (score[1] - current_score[1]) / current_score[1]
            if worse == 0:
                pressure = _link_pressure(cluster, config, current)
                worse = _TIE_WEIGHT * (_link_pressure(cluster, config, candidate) - pressure) / max(pressure, 1e-30)
            accept = worse <= 0 or rng.random() < math.exp(-worse / temperature)
        else:
            accept = score < current_score
        if accept:
            current, current_score = candidate, score
            if score < best_score:
                best, best_score = candidate, score
        temperature *= cooling
    return best, False


def _polish_within_nodes(cluster: Cluster, cells: list[Slot], tp: int, scorer: _Scorer) -> list[Slot]:
    """Swap cells between slots of the same node (used or idle) while that lowers the score.

    Only slots on nodes with per-GPU overrides can differ, so only those are tried.
    """
    slowed = {node for node, _ in cluster.gpu_overrides}
    best, best_score = list(cells), scorer(cells)[0]
    improved = True
    while improved:
        improved = False
        for i, (node, first) in enumerate(best):
            if node not in slowed:
                continue
            for other in range(0, cluster.nodes[node].num_gpus, tp):
                if other == first:
                    continue
                candidate = list(best)
                holder = next((j for j, slot in enumerate(best) if slot == (node, other)), None)
                if holder is not None:
                    candidate[holder] = (node, first)
                candidate[i] = (node, other)
                score = scorer(candidate)[0]
                if score < best_score:
                    best, best_score, improved = candidate, score, True
                    break
            if improved:
                break
    return best


@dataclass(frozen=True)
class Replan:
    """One configuration on one cluster before (rank order, given split) and after re-planning."""

    before: Estimate
    after: Estimate
    placement: Placement
    partition: Partition
    search: PlacementResult  # the last placement search

    @property
    def gain(self) -> float:
        """Fraction of the iteration time the re-plan saves."""
        return 1.0 - self.after.iteration_time_s / self.before.iteration_time_s


def pinned_options(config: ParallelConfig, framework: str | None = None) -> FixedOptions:
    """Every searched dimension fixed to `config`'s, run by `framework` (its execution semantics): the search
    then only splits stages."""
    return FixedOptions(framework=framework,
        tp=config.tp, pp=config.pp, dp=config.dp, micro_batch=config.micro_batch, vpp=config.vpp,
        recompute=config.recompute, schedule=config.schedule, zero_stage=config.zero_stage,
        distributed_optimizer=config.distributed_optimizer, sequence_parallel=config.sequence_parallel,
        tp_comm_overlap=config.tp_comm_overlap,
    )


def repartition(model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig,
                placement: Placement, timer: UnitTimer | None = None,
                calibration: Calibration | None = None, framework: str | None = None,
                ) -> tuple[Partition, Estimate] | None:
    """The search's ILP stage split for `config` on `placement` (each rank's own speed and memory).

    None when no split fits.
    """
    try:
        found = search(model, cluster, training, pinned_options(config, framework), top_k=1,
                       placement_fn=lambda _c, _k: placement, timer=timer, calibration=calibration)
    except InfeasibleError:
        return None
    best = found.plans[0]
    return best.partition, best.estimate


def reversed_pipeline(config: ParallelConfig, placement: Placement) -> Placement:
    """The same GPUs with the pipeline ranks in reverse order (pp is the outermost rank dimension)."""
    size = config.num_gpus // config.pp
    stages = [placement.gpus[r * size:(r + 1) * size] for r in range(config.pp)]
    return Placement(tuple(gpu for stage in reversed(stages) for gpu in stage))


def replan(
    model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig,
    partition: Partition | None = None, *, fixed_partition: bool = False, seed: int = 0,
    max_evaluations: int = 1500, time_limit_s: float = 30.0, timer: UnitTimer | None = None,
    calibration: Calibration | None = None, framework: str | None = None,
) -> Replan:
    """Re-plan placement and (unless `fixed_partition`) the stage split of `config` on `cluster`.

    Alternates a placement search under the current split with the ILP split for the placement found
    (two rounds at most; the split changes little after the first) and keeps the best estimate.
    """
    split = partition or Partition.uniform(model.num_layers, config.num_virtual_stages)
    naive = default_placement(cluster, config)
    before = estimate(model, cluster, training, config, split, naive, timer, calibration)
    best: tuple[Estimate, Placement, Partition] = (before, naive, split)
    found: PlacementResult | None = None
    for _round in range(2):
        objective = placement_objective(model, cluster, training, config, split, timer, calibration)
        found = search_placement(cluster, config, objective, seed=seed, max_evaluations=max_evaluations,
                                 time_limit_s=time_limit_s)
        options = [(found.estimate, found.placement, split)]
        if not fixed_partition:
            # the placement search keeps the split, so it cannot see that another GPU type should run the first
            # stages (the most in-flight micro-batches) with a different split: try the reversed pipeline too
            for placement in dict.fromkeys((found.placement, reversed_pipeline(config, found.placement))):
                better = repartition(model, cluster, training, config, placement, timer, calibration, framework)
                if better is not None:
                    options.append((better[1], placement, better[0]))
        round_best = min(options, key=lambda option: _score(option[0]))
        if _score(round_best[0]) < _score(best[0]):
            best = round_best
        if fixed_partition or round_best[2] == split:
            break
        split = round_best[2]
    assert found is not None
    return Replan(before, best[0], best[1], best[2], found)


def replan_record(cluster: Cluster, config: ParallelConfig, result: Replan) -> dict[str, object]:
    """The plan-JSON view of a re-plan: times with and without it, and where each stage now runs."""
    return {
        "iteration_time_s_without_replan": result.before.iteration_time_s,
        "iteration_time_s_with_replan": result.after.iteration_time_s,
        "gain": result.gain,
        "blocks_per_stage": list(result.partition.blocks_per_stage()),
        "stage_nodes": [list(names) for names in stage_nodes(cluster, config, result.placement)],
        "placement_method": result.search.method,
        "placement_evaluations": result.search.evaluations,
        "fits": result.after.fits,
    }


def place_plans(model: ModelSpec, cluster: Cluster, training: Training, plans: Sequence[RankedPlan], *,
                seed: int = 0, max_evaluations: int = 1500, timer: UnitTimer | None = None,
                calibration: Calibration | None = None, framework: str | None = None,
                ) -> list[tuple[RankedPlan, Replan]]:
    """Re-plan the placement and split of each searched plan on this cluster's links and devices,
    best first. Each plan comes back with its re-plan (whose `before` is the rank-order estimate)."""
    out = []
    for plan in plans:
        result = replan(model, cluster, training, plan.config, plan.partition, seed=seed,
                        max_evaluations=max_evaluations, timer=timer, calibration=calibration, framework=framework)
        if _score(result.after) < _score(plan.estimate):
            plan = replace(plan, placement=result.placement, partition=result.partition, estimate=result.after)
        out.append((plan, result))
    out.sort(key=lambda pair: (_score(pair[0].estimate), pair[0].estimate.peak_memory_bytes,
                               pair[0].config.num_gpus))
    return out


def homogeneous_best(model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions | None = None,
                     time_limit_s: float = 10.0, timer: UnitTimer | None = None,
                     calibration: Calibration | None = None) -> tuple[Cluster, RankedPlan | None] | None:
    """The best plan on the largest single-type subset of a mixed cluster (None: not mixed).

    The plan is None when nothing fits on the subset. Used to show what mixing GPU types buys.
    """
    subset = homogeneous_subset(cluster)
    if subset is None:
        return None
    try:
        found = search(model, subset, training, fixed, top_k=1, time_limit_s=time_limit_s, timer=timer,
                       calibration=calibration)
    except (InfeasibleError, PlannerError):
        return subset, None
    return subset, found.plans[0]


def heterogeneity_record(
    model: ModelSpec, cluster: Cluster, training: Training, placed: Sequence[tuple[RankedPlan, Replan]], *,
    unslowed: Cluster | None = None, fixed: FixedOptions | None = None, time_limit_s: float = 10.0,
    timer: UnitTimer | None = None, calibration: Calibration | None = None,
) -> dict[str, object]:
    """The plan-JSON `heterogeneity` section for the best of `placed` (from `place_plans`).

    Rank order versus placed time; with `unslowed` (the cluster before --slowdown) also the time of
    the plan made ignoring the slowdown, run on the slow cluster; on a mixed cluster the notes on
    mixed pipeline ranks and the best plan on the largest single-type subset.
    """
    best, replanned = placed[0]
    record: dict[str, object] = {
        "rank_order_time_s": replanned.before.iteration_time_s,
        "placed_time_s": best.estimate.iteration_time_s,
        "placement_gain": 1.0 - best.estimate.iteration_time_s / replanned.before.iteration_time_s,
        "placement_method": replanned.search.method,
        "placement_evaluations": replanned.search.evaluations,
        "stage_nodes": [list(names) for names in stage_nodes(cluster, best.config, best.placement)],
        "notes": mixed_rank_notes(cluster, best.config, best.placement),
    }
    if unslowed is not None:
        try:
            naive = search(model, unslowed, training, fixed, top_k=1, time_limit_s=time_limit_s, timer=timer,
                           calibration=calibration).plans[0]
        except InfeasibleError:
            naive = None
        if naive is not None:
            record["without_replan_time_s"] = estimate(
                model, cluster, training, naive.config, naive.partition, default_placement(cluster, naive.config),
                timer, calibration).iteration_time_s
    subset = homogeneous_best(model, cluster, training, fixed, time_limit_s, timer, calibration)
    if subset is not None:
        sub_cluster, sub_plan = subset
        record["homogeneous_subset"] = {
            "cluster": sub_cluster.name, "num_gpus": sub_cluster.num_gpus,
            "iteration_time_s": sub_plan.estimate.iteration_time_s if sub_plan else None,
            "parallelism": sub_plan.config.describe() if sub_plan else None,
        }
    return record


def mixed_rank_notes(cluster: Cluster, config: ParallelConfig, placement: Placement) -> list[str]:
    """Pipeline ranks whose GPUs are not all of one type (speed or memory), and what that costs.

    Megatron-LM gives every data-parallel replica the same micro-batches and every TP rank the same
    shard, so the slowest GPU of a pipeline rank sets its pace and the smallest its memory.
    """
    notes = []
    for pp in range(config.pp):
        names = sorted({cluster.gpu_spec(placement.gpu_of(config, d, pp, t)).name
                        for d in range(config.dp) for t in range(config.tp)})
        if len(names) > 1:
            notes.append(f"pipeline rank {pp} mixes {', '.join(names)}: the batch is split equally over "
                         "data-parallel replicas (Megatron-LM cannot split it unevenly), so the slowest GPU "
                         "bounds the rank")
    return notes


def homogeneous_subset(cluster: Cluster) -> Cluster | None:
    """The nodes of the GPU type with the most GPUs (ties: the faster type) as a cluster (None if not mixed).

    Pair links are carried over with their indices remapped, so measured links still apply.
    """
    types = cluster.gpu_types
    if len(types) < 2:
        return None
    totals = {t.name: sum(n.num_gpus for n in cluster.nodes if n.gpu.name == t.name) for t in types}
    winner = max(types, key=lambda t: (totals[t.name], max(dict(t.peak_flops_per_s).values()), t.name))
    keep = [i for i, node in enumerate(cluster.nodes) if node.gpu.name == winner.name]
    index = {old: new for new, old in enumerate(keep)}
    links = {(index[a], index[b]): link for (a, b), link in cluster.pair_links.items()
             if a in index and b in index}
    overrides = {(index[n], g): spec for (n, g), spec in cluster.gpu_overrides.items() if n in index}
    subset = replace(cluster, name=f"{cluster.name}[{winner.name}]", nodes=tuple(cluster.nodes[i] for i in keep),
                     pair_links=links, gpu_overrides=overrides)
    return subset
