"""The search behind `planner plan`: enumerate, bound, partition, estimate, rank.

Every configuration of the space (space.py) first gets two cheap bounds from its unit costs:
a memory lower bound (model states plus the fewest in-flight activations, spread perfectly over
all pipeline ranks) rejects what cannot fit, and a time lower bound (the schedule's time with
perfectly balanced stages, plus the smallest possible optimizer step) orders the rest. Candidates
are then partitioned (partition.py) and estimated (cost/estimate.py) best bound first, and the
scan stops as soon as the next bound cannot beat the k-th best plan found — so only a handful of
ILPs run even on thousands of GPUs. Partitions are cached on their problem; GroupLinks, which cost
O(GPUs), are computed once per (dp, tp, pp).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.cluster import Cluster
from planner.config import ParallelConfig, Partition, Schedule, Training
from planner.cost.estimate import Estimate, estimate
from planner.cost.memory import in_flight_microbatches, model_state_bytes
from planner.cost.time import (
    UnitCost,
    UnitTimer,
    data_parallel_time,
    embedding_sync_time,
    optimizer_step_time,
    p2p_boundary_time,
    unit_costs,
)
from planner.errors import InfeasibleError, PlannerError
from planner.gpu import GIB
from planner.model import ModelSpec, UnitKind
from planner.placement import GroupLinks, Placement, default_placement
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import Calibration, default_calibration
from planner.search.partition import (
    PartitionProblem,
    PartitionResult,
    bound_partition,
    dp_partition,
    fits,
    ilp_partition,
    objective_s,
    relaxed_rank_counts,
    solver_name,
)
from planner.search.space import FixedOptions, enumerate_configs, require_nonempty

__all__ = ["PlacementFn", "RankedPlan", "SearchResult", "SearchStats", "search"]

# Maps a configuration to GPUs. Called once per (dp, tp, pp), so it must depend on those only.
PlacementFn = Callable[[Cluster, ParallelConfig], Placement]


@dataclass(frozen=True)
class RankedPlan:
    """One searched plan: configuration, stage split, placement, its estimate and the uniform split's."""

    config: ParallelConfig
    partition: Partition
    placement: Placement
    estimate: Estimate
    uniform: Estimate
    optimal: bool  # the partition was proven optimal (no solver time limit hit)


@dataclass(frozen=True)
class SearchStats:
    """What the search did, for the user and the speed benchmark."""

    configurations: int
    pruned_memory: int  # rejected by the memory lower bound
    pruned_time: int  # skipped: balanced-time lower bound no better than the k-th best plan
    infeasible: int  # partitioned, but no stage split fits in memory
    ilps_solved: int
    proven_by_bound: int  # partitions whose rank-load lower bound was met: no solver needed
    cache_hits: int
    time_limited: int
    solver: str
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SearchResult:
    plans: tuple[RankedPlan, ...]  # best first
    stats: SearchStats


@dataclass(frozen=True)
class _Candidate:
    """A configuration with its cheap bounds and what partitioning it needs."""

    order: int
    config: ParallelConfig
    time_bound_s: float
    memory_need_bytes: float
    memory_available_bytes: float
    rank_costs: tuple[dict[UnitKind, UnitCost], ...]
    boundary_s: tuple[float, ...]
    num_microbatches: int


class _Context:
    """Per-search caches: links per degree triple, unit costs per (GPU, TP link, setting), partitions."""

    def __init__(self, model: ModelSpec, cluster: Cluster, training: Training, placement_fn: PlacementFn,
                 timer: UnitTimer, calibration: Calibration) -> None:
        self.model, self.cluster, self.training = model, cluster, training
        self.placement_fn, self.timer, self.calibration = placement_fn, timer, calibration
        self.links: dict[tuple[int, int, int], tuple[Placement, GroupLinks]] = {}
        self.costs: dict[tuple, dict[UnitKind, UnitCost]] = {}
        self.boundaries: dict[tuple, float] = {}
        self.partitions: dict[PartitionProblem, PartitionResult | None] = {}
        self.rank_bounds: dict[tuple, tuple[float, ...]] = {}

    def placed(self, config: ParallelConfig) -> tuple[Placement, GroupLinks]:
        key = (config.dp, config.tp, config.pp)
        if key not in self.links:
            placement = self.placement_fn(self.cluster, config)
            links = GroupLinks.from_placement(self.cluster, config, placement)
            for rank, gpu in enumerate(links.gpu):
                if not gpu.supports(self.training.dtype):
                    raise PlannerError(f"{self.training.dtype} is not supported by {gpu.name} (pipeline rank {rank})")
            self.links[key] = (placement, links)
        return self.links[key]

    def rank_costs(self, config: ParallelConfig, links: GroupLinks) -> tuple[dict[UnitKind, UnitCost], ...]:
        out = []
        for gpu, tp_link in zip(links.gpu, links.tp, strict=True):
            key = (gpu, tp_link, config.tp, config.micro_batch, config.sequence_parallel, config.recompute)
            if key not in self.costs:
                self.costs[key] = unit_costs(self.model, self.training, config, gpu, tp_link, self.timer,
                                             self.calibration)
            out.append(self.costs[key])
        return tuple(out)

    def boundary(self, config: ParallelConfig, links: GroupLinks) -> tuple[float, ...]:
        out = []
        for link in links.pp:
            key = (link, config.tp, config.micro_batch)
            if key not in self.boundaries:
                self.boundaries[key] = p2p_boundary_time(self.model, self.training, config, link, self.calibration)
            out.append(self.boundaries[key])
        return tuple(out)


def _unit_kinds(model: ModelSpec) -> list[UnitKind]:
    return [UnitKind.EMBEDDING, *([UnitKind.BLOCK] * model.num_layers), UnitKind.HEAD]


def _bound(ctx: _Context, order: int, config: ParallelConfig) -> _Candidate:
    """Cheap lower bounds on time and memory, valid for every stage split: the pipeline's rank-load
    bound plus the terms of estimate() that do not depend on the split (least optimizer step, tied
    embedding all-reduce, fixed overhead); exposed DP communication counts as zero."""
    model, training, cal = ctx.model, ctx.training, ctx.calibration
    _, links = ctx.placed(config)
    costs = ctx.rank_costs(config, links)
    boundary = ctx.boundary(config, links)
    m = config.num_microbatches(training.global_batch)
    layers = model.num_layers
    a, b = (m - 1 / config.vpp, 1 / config.vpp) if config.schedule is Schedule.INTERLEAVED else (m - 1, 1.0)
    # Alike blocks on every rank make Σ loads fixed, so the least-max loads serve every (a, b).
    alike = len({cost[UnitKind.BLOCK].total_s for cost in costs}) == 1
    key = (config.pp, config.vpp, layers, tuple(map(id, costs)), boundary, *(() if alike else (a, b)))
    if key not in ctx.rank_bounds:
        ctx.rank_bounds[key] = _least_rank_loads(config, layers, costs, boundary, (1.0, 0.0) if alike else (a, b))
    loads = ctx.rank_bounds[key]
    pipeline = a * max(loads) + b * sum(loads)
    first = costs[0]
    params = first[UnitKind.EMBEDDING].params + layers * first[UnitKind.BLOCK].params + first[UnitKind.HEAD].params
    optimizer = min(optimizer_step_time(params / config.pp, config, gpu, cal) for gpu in links.gpu)
    activations = (first[UnitKind.EMBEDDING].activation_bytes + layers * first[UnitKind.BLOCK].activation_bytes
                   + first[UnitKind.HEAD].activation_bytes)
    state_per_param = model_state_bytes(1.0, config.dp, config.optimizer_sharding, training.grad_bytes).total
    in_flight = min(in_flight_microbatches(config, r, m) for r in range(config.pp))
    need = (1 + cal.memory_fragmentation) * (state_per_param * params + in_flight * activations)
    available = sum(c - cal.memory_overhead_bytes for c in links.capacity_bytes)
    embedding_sync = embedding_sync_time(model, training, config, links.pp[-1], cal)
    dp_exposed = 0.0
    if config.pp == 1:  # one stage: the split is fixed, so the DP traffic the schedule exposes is exact
        kinds = _unit_kinds(model)
        last_backward = sum(first[kind].backward_s + first[kind].recompute_s for kind in kinds)
        dp_exposed = data_parallel_time(params, training, config, links.dp[0], cal, last_backward,
                                        sum(first[kind].forward_s for kind in kinds), m).exposed_s
    time_bound_s = pipeline + optimizer + embedding_sync + dp_exposed + cal.iteration_overhead_s
    return _Candidate(order, config, time_bound_s, need, available, costs, boundary, m)


def _least_rank_loads(config: ParallelConfig, layers: int, costs: tuple[dict[UnitKind, UnitCost], ...],
                      boundary_s: tuple[float, ...], weights: tuple[float, float]) -> tuple[float, ...]:
    """Per-rank loads minimising weights·(max, Σ) in the rank-load relaxation (partition.py), from
    each rank's own unit costs; its pipeline time a·max + b·Σ is a lower bound for every split.

    Rank 0 holds the embedding, rank pp−1 the head, every rank vpp stages (so at least vpp blocks
    less the ends) and a p2p boundary after each but the very last stage. Per-rank costs keep the
    bound tight on slowed or mixed GPUs, where a fastest-rank bound lets hundreds of ILPs through.
    """
    pp, v = config.pp, config.vpp
    fixed, block, lower = [], [], []
    for r, cost in enumerate(costs):
        first, last = r == 0, r == pp - 1
        # estimate() charges a boundary at both ends: v − last outgoing, v − first incoming
        fixed.append(cost[UnitKind.EMBEDDING].total_s * first + cost[UnitKind.HEAD].total_s * last
                     + (v - last) * boundary_s[r] + (v - first) * boundary_s[r - 1])
        block.append(cost[UnitKind.BLOCK].total_s)
        lower.append(max(v - first - last, 0))
    relaxed = relaxed_rank_counts(fixed, block, lower, [math.inf] * pp, layers, *weights)
    if relaxed is None:  # fewer blocks than stages need: the space never yields this
        return (math.inf,)
    return tuple(f + n * t for f, n, t in zip(fixed, relaxed[1], block, strict=True))


def _problem(ctx: _Context, candidate: _Candidate) -> PartitionProblem:
    """The partition problem of a candidate: per-rank unit times and memory, budgets."""
    config, cal, m = candidate.config, ctx.calibration, candidate.num_microbatches
    _, links = ctx.placed(config)
    kinds = _unit_kinds(ctx.model)
    state_per_param = model_state_bytes(1.0, config.dp, config.optimizer_sharding, ctx.training.grad_bytes).total
    times, memories = [], []
    for r, costs in enumerate(candidate.rank_costs):
        in_flight = in_flight_microbatches(config, r, m)
        per_kind = {kind: (1 + cal.memory_fragmentation) * (state_per_param * cost.params
                                                             + in_flight * cost.activation_bytes)
                    for kind, cost in costs.items()}
        times.append(tuple(costs[kind].total_s for kind in kinds))
        memories.append(tuple(per_kind[kind] for kind in kinds))
    budgets = tuple(float(c) - cal.memory_overhead_bytes for c in links.capacity_bytes)
    return PartitionProblem(tuple(times), candidate.boundary_s, tuple(memories), budgets, config.vpp, m,
                            config.schedule)


def _partition(problem: PartitionProblem, time_limit_s: float) -> tuple[PartitionResult | None, str]:
    """(result, how: "bound", "ilp" or "none"). The rank-load bound settles most problems without a
    solver; otherwise the ILP runs with that bound from below and the best known split from above
    (the exact DP for one chunk per rank; the relaxation's or the uniform split when interleaved)."""
    lower_s, relaxed = bound_partition(problem)
    if relaxed is not None and relaxed.optimal:
        return relaxed, "bound"
    if math.isinf(lower_s):
        return None, "none"
    if problem.schedule is Schedule.INTERLEAVED:
        uniform = Partition.uniform(problem.num_units - 2, problem.num_stages).unit_counts
        known = [found for found in (relaxed, PartitionResult(Partition(uniform), objective_s(problem, uniform),
                                                               False, "uniform") if fits(problem, uniform) else None)
                 if found is not None]
        upper = min(known, key=lambda found: found.objective_s) if known else None
    else:
        upper = dp_partition(problem)
        if upper is None:
            return None, "none"
    return ilp_partition(problem, time_limit_s, upper, lower_s), "ilp"


def search(
    model: ModelSpec,
    cluster: Cluster,
    training: Training,
    fixed: FixedOptions | None = None,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    placement_fn: PlacementFn = default_placement,
    timer: UnitTimer | None = None,
    calibration: Calibration | None = None,
) -> SearchResult:
    """The top-k plans by estimated iteration time (ties: less memory, fewer GPUs, enumeration order).

    Raises InfeasibleError naming the closest configuration's tightest stage when nothing fits.
    """
    if top_k < 1:
        raise PlannerError(f"--top must be at least 1, got {top_k}")
    if time_limit_s <= 0:
        raise PlannerError(f"--time-limit must be positive, got {time_limit_s}")
    started = time.perf_counter()
    fixed = fixed or FixedOptions()
    calibration = calibration or default_calibration()
    ctx = _Context(model, cluster, training, placement_fn, timer or AnalyticProfile(model, calibration), calibration)
    configs = require_nonempty(list(enumerate_configs(model, cluster, training, fixed)), model, cluster, training,
                               fixed)
    candidates = [_bound(ctx, order, config) for order, config in enumerate(configs)]
    fitting = [c for c in candidates if c.memory_need_bytes <= c.memory_available_bytes]
    fitting.sort(key=lambda c: (c.time_bound_s, c.order))
    plans: list[RankedPlan] = []
    rejected: list[_Candidate] = [c for c in candidates if c.memory_need_bytes > c.memory_available_bytes]
    ilps = proven = hits = limited = pruned_time = 0
    for position, candidate in enumerate(fitting):
        if len(plans) >= top_k and candidate.time_bound_s > plans[top_k - 1].estimate.iteration_time_s * (1 + 1e-9):
            pruned_time = len(fitting) - position
            break
        problem = _problem(ctx, candidate)
        if problem in ctx.partitions:
            hits += 1
            found = ctx.partitions[problem]
        else:
            found, how = _partition(problem, time_limit_s)
            ilps += how == "ilp"
            proven += how == "bound"
            ctx.partitions[problem] = found
        plan = _evaluate(ctx, candidate, found)
        if plan is None:
            rejected.append(candidate)
            continue
        limited += not plan.optimal
        plans.append(plan)
        plans.sort(key=_rank_key)
        del plans[top_k:]
    stats = SearchStats(
        configurations=len(candidates), pruned_memory=len(candidates) - len(fitting), pruned_time=pruned_time,
        infeasible=len(rejected) - (len(candidates) - len(fitting)), ilps_solved=ilps, proven_by_bound=proven,
        cache_hits=hits,
        time_limited=limited, solver=solver_name(), wall_s=time.perf_counter() - started,
    )
    if not plans:
        raise InfeasibleError(_infeasible_message(ctx, rejected))
    return SearchResult(tuple(plans), stats)


def _rank_key(plan: RankedPlan) -> tuple:
    return (plan.estimate.iteration_time_s, plan.estimate.peak_memory_bytes, plan.config.num_gpus)


def _evaluate(ctx: _Context, candidate: _Candidate, found: PartitionResult | None) -> RankedPlan | None:
    """Estimate the partitioned plan and the uniform split; keep the faster one that fits."""
    config = candidate.config
    if found is None:  # no split fits the partition problem's memory model, the uniform one included
        return None
    placement, links = ctx.placed(config)
    args = (ctx.model, ctx.cluster, ctx.training, config)
    even = Partition.uniform(ctx.model.num_layers, config.num_virtual_stages)
    uniform = estimate(*args, even, placement, ctx.timer, ctx.calibration, links)
    best: tuple[Partition, Estimate, bool] | None = None
    if found is not None:
        result = (uniform if found.partition == even
                  else estimate(*args, found.partition, placement, ctx.timer, ctx.calibration, links))
        if result.fits:
            best = (found.partition, result, found.optimal)
    if uniform.fits and (best is None or uniform.iteration_time_s < best[1].iteration_time_s):
        best = (even, uniform, found.optimal if found else True)
    if best is None:
        return None
    return RankedPlan(config, best[0], placement, best[1], uniform, best[2])


def _infeasible_message(ctx: _Context, rejected: list[_Candidate]) -> str:
    """The configuration closest to fitting and its tightest stage under the uniform split."""
    closest = min(rejected, key=lambda c: (c.memory_need_bytes / c.memory_available_bytes, c.order))
    placement, _ = ctx.placed(closest.config)
    result = estimate(ctx.model, ctx.cluster, ctx.training, closest.config, None, placement, ctx.timer,
                      ctx.calibration)
    stage = result.tightest_stage()
    short = max(stage.memory.total - stage.memory.capacity, 0.0)
    return (
        f"no configuration fits in memory; the closest ({closest.config.describe()}) has stage {stage.index} "
        f"needing {stage.memory.total / GIB:.1f} GiB, {stage.gpu} has {stage.memory.capacity / GIB:.1f} GiB "
        f"(short by {short / GIB:.1f} GiB); try more GPUs, a smaller --global-batch/--seq-len or --recompute full"
    )
