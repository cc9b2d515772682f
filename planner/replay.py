"""A plan file back into the cost model's inputs, so explain, compare and timeline re-estimate it.

`problem_of` is the one place that turns a loaded `Plan` into model, cluster, training,
configuration, stage split and placement; when plan files carry their full cluster (schema v2)
only this function changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import Cluster
from planner.config import ParallelConfig, Partition, Training
from planner.cost.estimate import Estimate, estimate
from planner.export.common import plan_placement, rebuild_cluster
from planner.model import ModelSpec
from planner.placement import Placement
from planner.plan import Plan
from planner.profile.calibration import Calibration, default_calibration

__all__ = ["PlanProblem", "problem_of"]


@dataclass(frozen=True)
class PlanProblem:
    """Everything `estimate` needs to reproduce one plan."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    config: ParallelConfig
    partition: Partition
    placement: Placement
    calibration: Calibration

    def estimate(self) -> Estimate:
        """The plan's estimate under the current cost model with the plan's own calibration (analytic profile)."""
        return estimate(self.model, self.cluster, self.training, self.config, self.partition, self.placement,
                        calibration=self.calibration)


def problem_of(plan: Plan) -> PlanProblem:
    """The plan's problem: its cluster rebuilt, its placement on it, and the calibration it was made with
    (schema v2 files carry it; version 1 files get the shipped one)."""
    cluster = rebuild_cluster(plan)
    return PlanProblem(plan.model, cluster, plan.training, plan.parallel, plan.partition,
                       plan_placement(plan, cluster), plan.calibration or default_calibration())
