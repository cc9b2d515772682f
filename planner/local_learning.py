"""What a plan under the `local` schedule (local learning, PPLL) tells its user besides its estimate: that it
changes the training algorithm, and how it compares with 1F1B, the traditional pipeline, on the same plan (same
degrees, micro-batches, stage split and placement; 1F1B without the auxiliary heads and with end-to-end backward).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.cluster import Cluster
from planner.config import ParallelConfig, Partition, Schedule, Training
from planner.cost.estimate import Estimate, estimate
from planner.cost.schedule import schedule_of
from planner.cost.time import UnitTimer
from planner.model import ModelSpec
from planner.placement import Placement
from planner.profile.calibration import Calibration

__all__ = ["LOCAL_LEARNING_NOTE", "LocalComparison", "compare_with_1f1b", "local_learning_section"]

LOCAL_LEARNING_NOTE = (
    "the local schedule changes the training algorithm: every pipeline stage trains on its own auxiliary loss "
    "(local learning, PPLL) and no gradient crosses a stage boundary, so there is no end-to-end backpropagation "
    "and convergence and final accuracy differ from the same model trained with backpropagation; no framework "
    "runs it (planner export --to pytorch-local writes a runnable PyTorch reference)")


@dataclass(frozen=True)
class LocalComparison:
    """The local schedule's iteration time and peak memory against 1F1B's on the same plan."""

    local_time_s: float
    one_f_one_b_time_s: float
    local_peak_memory_bytes: float
    one_f_one_b_peak_memory_bytes: float
    one_f_one_b_fits: bool

    @property
    def speedup(self) -> float:
        """1F1B's iteration time over the local schedule's (above 1: local learning is faster)."""
        return self.one_f_one_b_time_s / self.local_time_s

    def as_dict(self) -> dict[str, float | bool]:
        return {"iteration_time_s": self.local_time_s, "one_f_one_b_iteration_time_s": self.one_f_one_b_time_s,
                "speedup_over_1f1b": self.speedup, "peak_memory_bytes": round(self.local_peak_memory_bytes),
                "one_f_one_b_peak_memory_bytes": round(self.one_f_one_b_peak_memory_bytes),
                "one_f_one_b_fits": self.one_f_one_b_fits}


def compare_with_1f1b(model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig,
                      result: Estimate, placement: Placement, timer: UnitTimer | None = None,
                      calibration: Calibration | None = None) -> LocalComparison:
    """`result` (a local-schedule estimate) against 1F1B's estimate of the same configuration, split and placement."""
    partition = Partition(tuple(stage.units[1] - stage.units[0] for stage in result.stages))
    baseline = estimate(model, cluster, training, replace(config, schedule=Schedule.ONE_F_ONE_B), partition,
                        placement, timer=timer, calibration=calibration)
    return LocalComparison(result.iteration_time_s, baseline.iteration_time_s, result.peak_memory_bytes,
                           baseline.peak_memory_bytes, baseline.fits)


def local_learning_section(model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig,
                           result: Estimate, placement: Placement, timer: UnitTimer | None = None,
                           calibration: Calibration | None = None) -> dict[str, object]:
    """The plan document's additions for a local-schedule plan ({} for any other): `notes` saying it changes the
    algorithm and `local_learning` with its queue, head and the comparison with 1F1B."""
    if not schedule_of(config.schedule).local_losses:
        return {}
    comparison = compare_with_1f1b(model, cluster, training, config, result, placement, timer, calibration)
    return {"notes": [LOCAL_LEARNING_NOTE],
            "local_learning": {"changes_training_algorithm": True, "queue_depth": config.local_queue_depth,
                               "aux_head": config.local_head, **comparison.as_dict()}}
