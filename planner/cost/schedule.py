"""Pipeline schedules: iteration time of GPipe, 1F1B and interleaved 1F1B with non-uniform stages.

With per-micro-batch stage times τ_k (forward + backward + its p2p), the critical path of GPipe
and 1F1B is Σ_k τ_k + (m − 1)·max_k τ_k: every micro-batch passes the slowest stage once, and
the first and last micro-batch also cross every other stage (Narayanan et al. 2021 give the
uniform case, bubble (p − 1)/m). For interleaved 1F1B with v chunks per rank, rank r does
R_r = Σ of its chunks per micro-batch and the bubble shrinks v-fold:
m·max_r R_r + (Σ_r R_r − max_r R_r)/v, which is (m + (p − 1)/v)·R for uniform ranks.
Both are linear in the stage times, so the ILP partitioner can use them as its objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.config import Schedule

__all__ = ["PipelineTime", "pipeline_time", "rank_times"]


@dataclass(frozen=True)
class PipelineTime:
    """Total pipeline time per iteration, the bottleneck rank and its steady-state share."""

    total_s: float
    bottleneck_rank: int
    steady_s: float  # m × (bottleneck rank's time per micro-batch)

    @property
    def bubble_s(self) -> float:
        return self.total_s - self.steady_s


def rank_times(stage_times: Sequence[float], pp: int) -> list[float]:
    """Per-micro-batch work of each pipeline rank: virtual stage k runs on rank k mod pp."""
    ranks = [0.0] * pp
    for index, value in enumerate(stage_times):
        ranks[index % pp] += value
    return ranks


def pipeline_time(stage_times: Sequence[float], pp: int, num_microbatches: int, schedule: Schedule) -> PipelineTime:
    """Closed-form iteration time of the pipeline part (no DP/optimizer) for non-uniform stages."""
    ranks = rank_times(stage_times, pp)
    vpp = len(stage_times) // pp
    slowest = max(range(pp), key=lambda r: (ranks[r], -r))
    steady = num_microbatches * ranks[slowest]
    fill_drain = (sum(ranks) - ranks[slowest]) / (vpp if schedule is Schedule.INTERLEAVED else 1)
    return PipelineTime(steady + fill_drain, slowest, steady)
