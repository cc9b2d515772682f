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
from typing import NamedTuple

from planner.config import Schedule
from planner.errors import PlannerError

__all__ = ["PassEvent", "PipelineTime", "Timeline", "pipeline_time", "rank_order", "rank_times", "simulate",
           "simulated_pipeline_time"]


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


# ---- event simulator ------------------------------------------------------------------------
# The closed form above is what the ILP optimises. The simulator below replays the framework's
# actual per-rank order of forward and backward passes (Megatron-LM's warm-up / steady 1F1B /
# cool-down) with per-stage times and p2p transfers, so it sees what the closed form cannot:
# forward/backward imbalance between stages, p2p latency on the critical path, and the exact
# interleaved order.

FORWARD, BACKWARD = "F", "B"


class PassEvent(NamedTuple):
    """One forward or backward pass of one micro-batch on one virtual stage (a NamedTuple: the
    simulator creates tens of thousands per call)."""

    kind: str  # FORWARD or BACKWARD
    stage: int  # virtual stage k (chunk · pp + rank)
    pp_rank: int
    chunk: int
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """Simulated pipeline iteration: its length and every pass with start and end times."""

    iteration_s: float
    events: tuple[PassEvent, ...]

    def rank_events(self, pp_rank: int) -> list[PassEvent]:
        """The passes of one pipeline rank in execution order."""
        return sorted((e for e in self.events if e.pp_rank == pp_rank), key=lambda e: e.start_s)

    def busy_s(self, pp_rank: int) -> float:
        return sum(e.end_s - e.start_s for e in self.events if e.pp_rank == pp_rank)


def _interleaved_table(num_microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch in forward order: Megatron-LM runs
    groups of `group` (= pp) micro-batches through chunk 0, then chunk 1, … before the next group;
    the last group takes whatever micro-batches remain."""
    table = []
    for first in range(0, num_microbatches, group):
        members = range(first, min(first + group, num_microbatches))
        table += [(mb, chunk) for chunk in range(vpp) for mb in members]
    return table


def rank_order(pp_rank: int, pp: int, vpp: int, num_microbatches: int,
               schedule: Schedule) -> list[tuple[str, int, int]]:
    """The (kind, chunk, micro-batch) passes a rank runs, in the framework's order."""
    m = num_microbatches
    if schedule is Schedule.GPIPE:
        return [(FORWARD, 0, i) for i in range(m)] + [(BACKWARD, 0, i) for i in range(m)]
    if schedule is Schedule.ONE_F_ONE_B:
        table = [(i, 0) for i in range(m)]
        warmup = min(pp - pp_rank - 1, m)
    else:
        table = _interleaved_table(m, vpp, pp)
        # Megatron-LM: (p − r − 1)·2 + (v − 1)·p warm-up forwards; all of them when m == p
        warmup = len(table) if m == pp else min((pp - pp_rank - 1) * 2 + (vpp - 1) * pp, len(table))
    forwards = [(FORWARD, chunk, mb) for mb, chunk in table]
    backwards = [(BACKWARD, vpp - 1 - chunk, mb) for mb, chunk in table]
    order = forwards[:warmup]
    for i in range(len(table) - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[len(table) - warmup:]


def simulate(
    forward_s: Sequence[float], backward_s: Sequence[float], p2p_s: Sequence[float], pp: int,
    num_microbatches: int, schedule: Schedule, record: bool = True,
) -> Timeline:
    """Event simulation of one iteration's pipeline part.

    `forward_s[k]` / `backward_s[k]`: time of one micro-batch's pass on virtual stage k (rank
    k mod pp, chunk k div pp); `p2p_s[k]`: one-way transfer time across the boundary k → k+1
    (the backward gradient takes the same time the other way). A pass starts when its rank is
    free and its input has arrived; ranks follow `rank_order` strictly (no reordering), and
    transfers overlap compute (asynchronous send/recv). `record=False` skips the per-pass events
    (the timeline then carries the iteration time only), which is what `estimate` needs.
    """
    stages = len(forward_s)
    if len(backward_s) != stages or len(p2p_s) < stages - 1 or stages % pp:
        raise PlannerError(
            f"simulate: need one forward, backward and boundary time per virtual stage (a multiple of pp={pp}); "
            f"got {stages}, {len(backward_s)}, {len(p2p_s)}"
        )
    vpp = stages // pp
    if schedule is Schedule.INTERLEAVED and num_microbatches % pp:
        raise PlannerError(
            f"simulate: the interleaved schedule needs micro-batches ({num_microbatches}) divisible by pp ({pp}); "
            "Megatron-LM's order deadlocks otherwise"
        )
    orders = [rank_order(r, pp, vpp, num_microbatches, schedule) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    rank_free = [0.0] * pp
    cursor = [0] * pp
    events: list[PassEvent] = []
    waiting: dict[tuple[str, int, int], int] = {}  # a pass not run yet → the rank blocked on it
    runnable = list(range(pp))
    while runnable:
        r = runnable.pop()
        order = orders[r]
        while cursor[r] < len(order):
            kind, chunk, mb = order[cursor[r]]
            k = chunk * pp + r
            ready, missing = _input_ready(done, kind, k, mb, stages, p2p_s)
            if missing is not None:
                waiting[missing] = r
                break
            start = max(rank_free[r], ready)
            end = start + (forward_s[k] if kind == FORWARD else backward_s[k])
            key = (kind, k, mb)
            done[key] = end
            rank_free[r] = end
            if record:
                events.append(PassEvent(kind, k, r, chunk, mb, start, end))
            cursor[r] += 1
            woken = waiting.pop(key, None)
            if woken is not None:
                runnable.append(woken)
    if any(cursor[r] < len(orders[r]) for r in range(pp)):  # cannot happen for rank_order's orders
        raise PlannerError(f"simulate: {schedule.value} order deadlocked with pp={pp}, m={num_microbatches}")
    return Timeline(max(rank_free), tuple(events))


def _input_ready(done: dict[tuple[str, int, int], float], kind: str, k: int, mb: int, stages: int,
                 p2p_s: Sequence[float]) -> tuple[float, tuple[str, int, int] | None]:
    """When the input of a pass is available, or the pass it still waits for."""
    if kind == FORWARD:
        if k == 0:
            return 0.0, None
        upstream = done.get((FORWARD, k - 1, mb))
        return (0.0, (FORWARD, k - 1, mb)) if upstream is None else (upstream + p2p_s[k - 1], None)
    own_forward = done.get((FORWARD, k, mb))
    if own_forward is None:
        return 0.0, (FORWARD, k, mb)
    if k == stages - 1:
        return own_forward, None
    downstream = done.get((BACKWARD, k + 1, mb))
    if downstream is None:
        return 0.0, (BACKWARD, k + 1, mb)
    return max(own_forward, downstream + p2p_s[k]), None


def simulated_pipeline_time(forward_s: Sequence[float], backward_s: Sequence[float], pp: int,
                            num_microbatches: int, schedule: Schedule) -> PipelineTime:
    """`pipeline_time` from the event simulator: pass times include the stage's blocking p2p sends,
    so no separate transfer delay is added; the bottleneck is the busiest rank."""
    timeline = simulate(forward_s, backward_s, [0.0] * len(forward_s), pp, num_microbatches, schedule,
                        record=False)
    busy = [num_microbatches * t for t in rank_times([f + b for f, b in zip(forward_s, backward_s, strict=True)], pp)]
    slowest = max(range(pp), key=lambda r: (busy[r], -r))
    return PipelineTime(timeline.iteration_s, slowest, busy[slowest])
