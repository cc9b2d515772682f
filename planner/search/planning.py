"""The one planning entry point: search the layouts, then place them on the cluster's links and devices.

`planner plan` prints exactly what `plan` returns, so a script calling the library gets the
CLI's answer. The policy lives here: on a cluster whose nodes are not interchangeable (measured
pair links, per-GPU slowdowns or mixed GPU types) the best searched plan is re-planned — placement
and stage split (`planner.search.placement.place_plans`) — and the plans are re-ranked.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import Cluster
from planner.config import Training
from planner.cost.time import UnitTimer
from planner.model import ModelSpec
from planner.profile.calibration import Calibration
from planner.search.placement import heterogeneity_record, place_plans
from planner.search.search import RankedPlan, SearchStats, search
from planner.search.space import FixedOptions

__all__ = ["PLACEMENT_EVALUATIONS", "Planned", "needs_placement", "plan"]

PLACEMENT_EVALUATIONS = 300  # annealing budget beyond exact placement (cost-model calls, ~ seconds)


@dataclass(frozen=True)
class Planned:
    """The ranked plans as they are printed (best first), the search's stats, and the placement record."""

    plans: tuple[RankedPlan, ...]
    stats: SearchStats
    heterogeneity: dict[str, object] | None  # `heterogeneity_record`; None on interchangeable nodes

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
) -> Planned:
    """The top-k plans for `model` on `cluster`, the best one placed where placement matters; only
    configurations `fixed.framework` runs, each estimated as that framework runs it.

    `unslowed` is the cluster before --slowdown (the record then says what ignoring it costs).
    Raises InfeasibleError when nothing fits, PlannerError on bad options.
    """
    found = search(model, cluster, training, fixed, top_k, time_limit_s, timer=timer, calibration=calibration)
    if not needs_placement(cluster):
        return Planned(found.plans, found.stats, None)
    placed = place_plans(model, cluster, training, found.plans[:1], max_evaluations=placement_evaluations,
                         timer=timer, calibration=calibration, framework=fixed.framework if fixed else None)
    record = heterogeneity_record(model, cluster, training, placed, unslowed=unslowed, fixed=fixed,
                                  time_limit_s=time_limit_s, timer=timer, calibration=calibration)
    return Planned((placed[0][0], *found.plans[1:]), found.stats, record)
