"""The one planning entry point: search the layouts, then place them on the cluster's links and devices.

`planner plan` prints exactly what `plan` returns, so a script calling the library gets the
CLI's answer. The policy lives here: on a cluster whose nodes are not interchangeable (measured
pair links, per-GPU slowdowns or mixed GPU types) the best searched plan is re-planned — placement
and stage split (`planner.search.placement.place_plans`) — and the plans are re-ranked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.cluster import Cluster
from planner.config import Partition, Recompute, Training
from planner.cost.estimate import Estimate, estimate
from planner.cost.time import UnitTimer
from planner.errors import InfeasibleError, PlannerError
from planner.frameworks import Framework, framework_named
from planner.model import ModelSpec
from planner.profile.calibration import Calibration
from planner.search.placement import heterogeneity_record, place_plans
from planner.search.search import RankedPlan, SearchResult, SearchStats, distinct_layouts, search
from planner.search.space import FixedOptions

__all__ = ["BLOCK_RECOMPUTE_CANDIDATES", "MAX_MEMORY_HEADROOM", "MEMORY_SAVING_OPTIMIZER_STATES",
           "PLACEMENT_EVALUATIONS", "Planned", "block_recompute", "lighter_recompute", "needs_placement", "plan"]

PLACEMENT_EVALUATIONS = 300  # annealing budget beyond exact placement (cost-model calls, ~ seconds)
# Full-recompute layouts refined to a block recompute when memory is tight (a plan found recomputes in full): with 30
# the refinement reaches the best layout an exhaustive check over every full-recompute layout finds in the README's
# and tests/test_block_recompute.py's cases (llama3-70b on 2x8 A100: the 1F1B layout recomputing 28 blocks per stage,
# 17th of the 27 full-recompute layouts that fit in the 79.15 GiB CUDA lets a process allocate; 23rd of 40 at the
# datasheet's 80 GiB, after the last stage came to hold the head's activations for the micro-batches its schedule keeps,
# not its rank's mean, which let more interleaved layouts fit; 20 sufficed before that)
BLOCK_RECOMPUTE_CANDIDATES = 30
# Optimizer states tried when nothing fits with fp32 Adam on the GPU and the caller lets the search choose them:
# 8-bit states first change the numerics a little, offload none but costs host-link and CPU time; the faster wins.
MEMORY_SAVING_OPTIMIZER_STATES = ("8bit", "cpu")
MAX_MEMORY_HEADROOM = 0.5  # a plan leaving more than half of every GPU's memory free is not a plan for that GPU


@dataclass(frozen=True)
class Planned:
    """The ranked plans as they are printed (best first), the search's stats, and the placement record."""

    plans: tuple[RankedPlan, ...]
    stats: SearchStats
    heterogeneity: dict[str, object] | None  # `heterogeneity_record`; None on interchangeable nodes
    training: Training | None = None  # the training planned for: the caller's, or with the optimizer states chosen

    @property
    def best(self) -> RankedPlan:
        return self.plans[0]


def needs_placement(cluster: Cluster) -> bool:
    """Whether which node runs which rank can change the time: pair links, slow GPUs or mixed types."""
    return bool(cluster.pair_links or cluster.gpu_overrides or not cluster.is_homogeneous)


def plan(
    model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions | None = None, top_k: int = 5,
    time_limit_s: float = 10.0, *, unslowed: Cluster | None = None, timer: UnitTimer | None = None,
    calibration: Calibration | None = None, placement_evaluations: int = PLACEMENT_EVALUATIONS,
    choose_optimizer_states: bool = False, memory_headroom: float = 0.0,
) -> Planned:
    """The top-k plans for `model` on `cluster`, the best one placed where placement matters; only
    configurations `fixed.framework` runs, each estimated as that framework runs it.

    `unslowed` is the cluster before --slowdown (the record then says what ignoring it costs).
    `choose_optimizer_states`: when nothing fits with `training`'s optimizer states, also search each of
    MEMORY_SAVING_OPTIMIZER_STATES the framework runs and keep the faster best plan (`Planned.training` says which);
    the search space of a plan that fits as asked does not grow.
    `memory_headroom`: the share of every GPU's memory the plans leave free (below MAX_MEMORY_HEADROOM): the search
    sees the rest as the capacity, and the plans are estimated against the whole memory.
    Raises InfeasibleError when nothing fits, PlannerError on bad options.
    """
    if memory_headroom:
        return _with_headroom(model, cluster, training, fixed, top_k, time_limit_s, memory_headroom, unslowed=unslowed,
                              timer=timer, calibration=calibration, placement_evaluations=placement_evaluations,
                              choose_optimizer_states=choose_optimizer_states)
    framework = framework_named(fixed.framework if fixed and fixed.framework else "any").for_model(model)
    framework.require_training(training)
    try:
        found = search(model, cluster, training, fixed, top_k, time_limit_s, timer=timer, calibration=calibration)
    except InfeasibleError as infeasible:
        if not choose_optimizer_states:
            raise
        found, training = _with_memory_saving_states(model, cluster, training, fixed, top_k, time_limit_s, timer,
                                                     calibration, infeasible)
    found = _with_block_recompute(model, cluster, training, found, fixed, top_k, time_limit_s, framework, timer,
                                  calibration)
    if not needs_placement(cluster):
        return Planned(found.plans, found.stats, None, training)
    placed = place_plans(model, cluster, training, found.plans[:1], max_evaluations=placement_evaluations,
                         timer=timer, calibration=calibration, framework=fixed.framework if fixed else None)
    record = heterogeneity_record(model, cluster, training, placed, unslowed=unslowed, fixed=fixed,
                                  time_limit_s=time_limit_s, timer=timer, calibration=calibration)
    return Planned((placed[0][0], *found.plans[1:]), found.stats, record, training)


def _with_headroom(model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions | None, top_k: int,
                   time_limit_s: float, headroom: float, *, unslowed: Cluster | None, timer: UnitTimer | None,
                   calibration: Calibration | None, placement_evaluations: int,
                   choose_optimizer_states: bool) -> Planned:
    """`plan` on `cluster` with `headroom` of every GPU's memory left free: planned on the rest, estimated on all."""
    if not 0 < headroom < MAX_MEMORY_HEADROOM:
        raise PlannerError(f"memory headroom {100 * headroom:g} % must be at least 0 and below "
                           f"{100 * MAX_MEMORY_HEADROOM:g} % of a GPU's memory")
    share = 1 - headroom
    try:
        planned = plan(model, cluster.with_memory_share(share), training, fixed, top_k, time_limit_s,
                       unslowed=unslowed.with_memory_share(share) if unslowed else None, timer=timer,
                       calibration=calibration, placement_evaluations=placement_evaluations,
                       choose_optimizer_states=choose_optimizer_states)
    except InfeasibleError as infeasible:
        raise InfeasibleError(f"{infeasible} (with {100 * headroom:g} % of every GPU's memory left free: "
                              f"--memory-headroom)") from None
    trained = planned.training or training

    def on_whole_memory(ranked: RankedPlan) -> RankedPlan:
        def again(partition: Partition) -> Estimate:
            return estimate(model, cluster, trained, ranked.config, partition, ranked.placement, timer=timer,
                            calibration=calibration)

        return replace(ranked, estimate=again(ranked.partition),
                       uniform=again(Partition.uniform(model.num_layers, ranked.config.num_virtual_stages)))

    return replace(planned, plans=tuple(on_whole_memory(ranked) for ranked in planned.plans))


def _with_block_recompute(model: ModelSpec, cluster: Cluster, training: Training, found: SearchResult,
                          fixed: FixedOptions | None, top_k: int, time_limit_s: float, framework: Framework,
                          timer: UnitTimer | None, calibration: Calibration | None) -> SearchResult:
    """`found` with its full-recompute plans refined (`block_recompute`). When one of them recomputes in full (memory
    is tight) and the recompute is not pinned to another kind, the BLOCK_RECOMPUTE_CANDIDATES best full-recompute
    layouts are searched and refined too: a layout the search ranked low under full recompute of every block can lead
    once it keeps most blocks' activations. The stats stay the first search's."""
    runs = framework.for_model(model)
    plans = block_recompute(model, cluster, training, found.plans, runs, timer, calibration)
    pinned = fixed.recompute if fixed else None
    if pinned not in (None, Recompute.FULL) or all(p.config.recompute is not Recompute.FULL for p in found.plans):
        return replace(found, plans=plans)
    full = search(model, cluster, training, replace(fixed or FixedOptions(), recompute=Recompute.FULL),
                  max(BLOCK_RECOMPUTE_CANDIDATES, top_k), time_limit_s, timer=timer, calibration=calibration)
    refined = {(ranked.config, ranked.partition) for ranked in found.plans}  # the first search's: refined above
    more = tuple(ranked for ranked in full.plans if (ranked.config, ranked.partition) not in refined)
    merged = distinct_layouts((*plans, *block_recompute(model, cluster, training, more, runs, timer, calibration)),
                              top_k)
    return replace(found, plans=merged)


def block_recompute(model: ModelSpec, cluster: Cluster, training: Training, plans: tuple[RankedPlan, ...],
                    framework: Framework, timer: UnitTimer | None = None,
                    calibration: Calibration | None = None) -> tuple[RankedPlan, ...]:
    """`plans` with each full-recompute plan recomputing only as many blocks per model chunk as it needs to fit
    (`lighter_recompute`), re-ranked. The search costs full recompute as every block; a plan that keeps some blocks'
    activations is faster whenever memory allows (Megatron-LM's --recompute-method block), so the plans it found
    get that refinement (`_with_block_recompute` widens the set when memory is tight)."""
    refined = [lighter_recompute(model, cluster, training, ranked, framework, timer, calibration) for ranked in plans]
    return tuple(sorted(refined, key=lambda ranked: ranked.estimate.iteration_time_s))


def lighter_recompute(model: ModelSpec, cluster: Cluster, training: Training, ranked: RankedPlan,
                      framework: Framework, timer: UnitTimer | None = None,
                      calibration: Calibration | None = None) -> RankedPlan:
    """`ranked` recomputing the fewest blocks per model chunk that still fit (`ParallelConfig.recompute_num_layers`,
    among the counts `framework` runs for its split; memory only grows as fewer are recomputed, so a bisection finds
    it), or `ranked` unchanged when it does not recompute every block in full or no fewer fit."""
    config = ranked.config
    if config.recompute is not Recompute.FULL or config.recompute_num_layers is not None:
        return ranked
    counts = framework.block_recompute_counts(ranked.partition.blocks_per_stage())
    if not counts or framework.why_not(replace(config, recompute_num_layers=counts[0])):
        return ranked

    def estimated(layers: int, partition: Partition | None = ranked.partition) -> Estimate:
        return estimate(model, cluster, training, replace(config, recompute_num_layers=layers), partition,
                        ranked.placement, timer, calibration)

    low, high, best = 0, len(counts), None  # counts[high] (if any) fits; counts below low do not
    while low < high:
        middle = (low + high) // 2
        result = estimated(counts[middle])
        if result.fits:
            high, best = middle, result
        else:
            low = middle + 1
    if best is None or best.iteration_time_s >= ranked.estimate.iteration_time_s:
        return ranked
    layers = counts[high]
    return RankedPlan(replace(config, recompute_num_layers=layers), ranked.partition, ranked.placement, best,
                      estimated(layers, None), optimal=False, lower_bound_s=None)


def _with_memory_saving_states(model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions | None,
                               top_k: int, time_limit_s: float, timer: UnitTimer | None,
                               calibration: Calibration | None,
                               infeasible: InfeasibleError) -> tuple[SearchResult, Training]:
    """The fastest search result over MEMORY_SAVING_OPTIMIZER_STATES the framework runs, with its training;
    `infeasible` (what the caller's states lack) when none fits."""
    framework = framework_named(fixed.framework if fixed and fixed.framework else "any").for_model(model)
    best: tuple[SearchResult, Training] | None = None
    tried = []
    for states in MEMORY_SAVING_OPTIMIZER_STATES:
        candidate = replace(training, optimizer_states=states)
        if framework.training_why_not(candidate):
            continue
        tried.append(states)
        try:
            found = search(model, cluster, candidate, fixed, top_k, time_limit_s, timer=timer,
                           calibration=calibration)
        except InfeasibleError:
            continue
        if best is None or found.plans[0].estimate.iteration_time_s < best[0].plans[0].estimate.iteration_time_s:
            best = (found, candidate)
    if best is None:
        if not tried:
            raise infeasible
        states = " or ".join(tried)
        raise InfeasibleError(f"{infeasible}; with --optimizer-states {states} nothing fits either") from None
    return best
