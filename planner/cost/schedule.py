"""Pipeline schedules as objects: each one's rules, order of passes, in-flight memory, closed form,
ILP objective and lower bound live together here, so a new schedule is one class in this file.

With per-micro-batch stage times τ_k (forward + backward + its p2p), the critical path of GPipe
and 1F1B is Σ_k τ_k + (m − 1)·max_k τ_k: every micro-batch passes the slowest stage once, and
the first and last micro-batch also cross every other stage (Narayanan et al. 2021 give the
uniform case, bubble (p − 1)/m). For interleaved 1F1B with v chunks per rank, rank r does
R_r = Σ of its chunks per micro-batch and the bubble shrinks v-fold:
m·max_r R_r + (Σ_r R_r − max_r R_r)/v, which is (m + (p − 1)/v)·R for uniform ranks.
Both are linear in the stage times (the ILP partitioner's objective). `estimate` replays the
framework's own order with the event simulator, whose cost does not grow with m: past a short
prefix the schedule is periodic, so the rest is extrapolated (and checked) in whole periods.
Zero-bubble schedules (Qi et al., ICLR 2024: ZB-H1, ZB-H2, PyTorch's interleaved zero bubble) split
each backward into B (input gradient) and W (weight gradient) passes; the simulator runs W as a pass
of its own kind, and their closed forms keep the share of 1F1B's fill they leave at F = B = W. The paper's
automatic ZB-1p / ZB-2p order depends on the pass times themselves, so a schedule gives the simulator every
rank's order from those times (`PipelineSchedule.orders`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from planner.errors import PlannerError

__all__ = [
    "JOINT_STATES",
    "PIPELINE_ORDERS",
    "SCHEDULES",
    "JointTypes",
    "PassEvent",
    "PassTimes",
    "PipelineSchedule",
    "PipelineTime",
    "PyTorchInterleaved",
    "RankTerms",
    "Schedule",
    "ScheduleRef",
    "Timeline",
    "costlier_sets",
    "joint_fits",
    "least_joint_bottleneck",
    "least_linear",
    "pipeline_time",
    "rank_order",
    "rank_times",
    "relaxed_rank_counts",
    "schedule_of",
    "simulate",
    "simulated_pipeline_time",
    "stage_ranks",
]


class Schedule(str, Enum):
    """Pipeline schedule names (the `--schedule` values); `schedule_of` gives the behaviour."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zb-h1"
    ZB_H2 = "zb-h2"
    ZB_1P = "zb-1p"
    ZB_2P = "zb-2p"
    INTERLEAVED_ZB = "interleaved-zb"
    ZB_V = "zb-v"
    DUALPIPE_V = "dualpipe-v"
    LOCAL = "local"


@dataclass(frozen=True)
class PipelineTime:
    """Total pipeline time per iteration, the bottleneck rank and its steady-state share."""

    total_s: float
    bottleneck_rank: int
    steady_s: float  # m × (bottleneck rank's time per micro-batch)

    @property
    def bubble_s(self) -> float:
        """Time beyond the bottleneck rank's steady work; never below zero (a zero-bubble schedule's total and
        steady share agree up to float rounding)."""
        return max(self.total_s - self.steady_s, 0.0)


@dataclass(frozen=True)
class RankTerms:
    """What a lower bound over stage splits needs to know of each pipeline rank, when the split
    changes only how many (alike) blocks each rank holds: rank r's load per micro-batch is
    fixed_s[r] + n_r·block_s[r], its forward work forward_fixed_s[r] + n_r·forward_block_s[r] — with mixed
    block types forward_block_s is the largest block's (bounds that subtract forward work) and
    least_forward_block_s the least (bounds that add it)."""

    fixed_s: tuple[float, ...]  # its end units (embedding/head) and stage boundaries
    block_s: tuple[float, ...]
    lower: tuple[int, ...]  # fewest blocks the rank can hold (every stage needs a unit)
    forward_fixed_s: tuple[float, ...]
    forward_block_s: tuple[float, ...]
    least_stage_s: tuple[float, ...]  # the least work a stage on the rank can have (its first unit, boundary)
    upper: tuple[float, ...] | None = None  # most blocks the rank's memory holds (None: no limit known)
    # mixed block types: per nested set of the costlier types, (each rank's least time of a block in it, its
    # blocks, the most of them each rank's memory holds)
    costlier: tuple[tuple[tuple[float, ...], int, tuple[float, ...]], ...] = ()
    # the least block forward pass per rank, where a bound adds forward work (None: blocks alike, forward_block_s)
    least_forward_block_s: tuple[float, ...] | None = None
    # mixed block types: every type's time and bytes on every rank at once (`least_joint_bottleneck`)
    joint: JointTypes | None = None

    @property
    def pp(self) -> int:
        return len(self.fixed_s)

    def most_blocks(self) -> tuple[float, ...]:
        return (math.inf,) * self.pp if self.upper is None else self.upper

    def views(self, blocks: int) -> tuple[tuple[tuple[float, ...], tuple[int, ...], tuple[float, ...], int, int], ...]:
        """The block-count relaxations a bound takes the largest of, as (per-rank block time, fewest and most
        blocks per rank, blocks counted, blocks left out): every block at its rank's cheapest type's time; then,
        per set of the costlier types (`costlier`), only that set's blocks, each at the set's least time and
        bytes on its rank — the others may sit anywhere (at least the cheapest time each), so a bound over the
        set stays a bound. With dense and MoE blocks the first alone sees every block as a dense one; the
        second sees where the MoE ones must go."""
        none = (0,) * self.pp
        return ((self.block_s, self.lower, self.most_blocks(), blocks, 0),
                *((times, none, most, count, blocks - count) for times, count, most in self.costlier))


@dataclass(frozen=True)
class JointTypes:
    """Mixed block types seen together: `type_times[t][r]` and `type_bytes[t][r]`, a block of type t's time and
    bytes on rank r, `type_counts[t]` its blocks, `rooms[r]` the bytes rank r holds beside its end units (with
    the partitioner's float tolerance). The per-type views (`RankTerms.costlier`) cap each type's blocks by its
    own bytes alone; a rank short of room for one more large block may still hold a small one, and only the
    blocks of every type at once show whether all of them fit (DeepSeek-V3's 3 dense and 58 MoE blocks)."""

    type_times: tuple[tuple[float, ...], ...]
    type_bytes: tuple[tuple[float, ...], ...]
    type_counts: tuple[int, ...]
    rooms: tuple[float, ...]


# Most count vectors of the minor types `least_joint_bottleneck` tracks (else no bound): its DP takes one array
# operation per vector per rank over an array of them, so its cost grows with their square. DeepSeek-V3's 3 dense
# blocks need 4 and Gemma 3's 10 global-attention ones 11; LLaVA's 24 vision blocks beside a stem and a projector
# (100) cost more search time than they save and are left to the per-type views (measured 2026-12-02).
JOINT_STATES = 64


def least_joint_bottleneck(fixed_s: Sequence[float], lower: Sequence[int], joint: JointTypes,
                           at_least: float = -math.inf) -> float:
    """Least bottleneck T — every rank r at most T of work, fixed_s[r] plus its blocks' times — at which integer
    block counts per type and rank exist that hold every block of every type within each rank's room and give
    each rank its fewest blocks (`lower`): math.inf when none exists at any T; -math.inf when T ≤ `at_least` (a
    bound the caller has: one check settles most layouts) or when the minor types' count vectors exceed
    JOINT_STATES (no bound). A relaxation of every stage split (which blocks a rank holds, not where), so a valid
    lower bound on the bottleneck of any split that fits; the least T is found by bisection over the loads a rank
    can have (feasibility only grows with T)."""
    programme = _JointCounts(fixed_s, lower, joint)
    if not programme.bounded or (at_least > -math.inf and programme.feasible(at_least)):
        return -math.inf
    if not programme.feasible(math.inf):
        return math.inf
    loads = [load for load in programme.loads() if load > at_least]
    lo, hi = 0, len(loads) - 1  # the largest load is feasible (every rank at its most)
    while lo < hi:
        mid = (lo + hi) // 2
        if programme.feasible(loads[mid]):
            hi = mid
        else:
            lo = mid + 1
    return loads[lo]


def joint_fits(lower: Sequence[int], joint: JointTypes) -> bool:
    """Whether integer block counts per type and rank hold every block of every type within each rank's room
    (`least_joint_bottleneck` without a time limit); True when the count vectors exceed JOINT_STATES. At once
    where every block at its rank's largest type's bytes fits: any counts within those caps then hold any mix."""
    blocks = sum(joint.type_counts)
    largest = map(max, zip(*joint.type_bytes, strict=True))
    caps = [blocks if most <= 0 else math.floor(room / most + 1e-9) if room >= 0 else -1
            for room, most in zip(joint.rooms, largest, strict=True)]
    if all(cap >= low for cap, low in zip(caps, lower, strict=True)) and sum(min(c, blocks) for c in caps) >= blocks:
        return True
    programme = _JointCounts((0.0,) * len(lower), lower, joint)
    return not programme.bounded or programme.feasible(math.inf)


class _JointCounts:
    """The dynamic programme behind `least_joint_bottleneck`: the type with the most blocks is the major one;
    over the ranks it tracks how many blocks of each minor type are placed and, per such vector, the most major
    blocks the ranks so far hold."""

    def __init__(self, fixed_s: Sequence[float], lower: Sequence[int], joint: JointTypes) -> None:
        counts = joint.type_counts
        self.fixed_s, self.lower, self.joint = fixed_s, lower, joint
        self.major = max(range(len(counts)), key=lambda t: (counts[t], -t))
        self.minors = [t for t in range(len(counts)) if t != self.major]
        self.bounded = math.prod(counts[t] + 1 for t in self.minors) <= JOINT_STATES
        # per rank, the minor count vectors its room holds: (vector, its blocks, its time, the most major blocks
        # the room left holds)
        self.options: list[list[tuple[tuple[int, ...], int, float, float]]] = []
        if not self.bounded:
            return
        major_bytes = joint.type_bytes[self.major]
        for r in range(len(fixed_s)):
            fitting = []
            for vector in itertools.product(*(range(counts[t] + 1) for t in self.minors)):
                used = sum(n * joint.type_bytes[t][r] for n, t in zip(vector, self.minors, strict=True))
                if used <= joint.rooms[r]:
                    room = (math.inf if major_bytes[r] <= 0
                            else math.floor((joint.rooms[r] - used) / major_bytes[r] + 1e-9))
                    fitting.append((vector, sum(vector), sum(n * joint.type_times[t][r]
                                                             for n, t in zip(vector, self.minors, strict=True)),
                                    min(room, counts[self.major])))
            self.options.append(fitting)

    def most_major(self, r: int, used_s: float, room: float, bottleneck: float) -> float:
        """Most major blocks rank r adds beside `used_s` of minor ones, `room` by memory, under `bottleneck`."""
        time_ = self.joint.type_times[self.major][r]
        slack = bottleneck - self.fixed_s[r] - used_s
        if time_ <= 0 or slack == math.inf:
            return room if slack >= 0 else -1.0
        return min(room, math.floor(slack / time_ + 1e-9))

    def feasible(self, bottleneck: float) -> bool:
        """Whether counts exist with every rank's load at most `bottleneck`: per rank, a max-plus step over the
        array of minor count vectors placed (one array operation per vector the rank may take)."""
        counts = self.joint.type_counts
        shape = tuple(counts[t] + 1 for t in self.minors)
        best = np.full(shape, -np.inf)
        best[(0,) * len(shape)] = 0.0
        for r, options in enumerate(self.options):
            step = np.full(shape, -np.inf)
            for vector, size, used_s, room in options:
                most = self.most_major(r, used_s, room, bottleneck)
                if most < 0 or most + size < self.lower[r]:
                    continue
                into = tuple(slice(n, c) for n, c in zip(vector, shape, strict=True))
                source = tuple(slice(0, c - n) for n, c in zip(vector, shape, strict=True))
                np.maximum(step[into], best[source] + most, out=step[into])
            best = step
        return bool(best[tuple(c - 1 for c in shape)] >= counts[self.major])

    def loads(self) -> list[float]:
        """Every load a rank can have within its room, sorted: the least bottleneck is one of them."""
        time_ = self.joint.type_times[self.major]
        return sorted({self.fixed_s[r] + used_s + k * time_[r]
                       for r, options in enumerate(self.options) for _, _, used_s, room in options
                       for k in range(int(room) + 1)})


def costlier_sets(type_times: Sequence[Sequence[float]], type_counts: Sequence[int],
                  type_most: Sequence[Sequence[float]]) -> tuple[tuple[tuple[float, ...], int, tuple[float, ...]], ...]:
    """`RankTerms.costlier` from each block type's time on each rank (`type_times[t][r]`), its blocks and the
    most of them each rank's memory holds (`type_most[t][r]`): the types by their time summed over the ranks,
    costliest first; for each leading set short of all of them, its least time on each rank, its blocks and the
    most of its blocks each rank holds (those of its smallest type's bytes). Empty for one type."""
    order = sorted(range(len(type_counts)), key=lambda t: (-sum(type_times[t]), t))
    ranks = range(len(type_times[0])) if type_times else range(0)
    return tuple((tuple(min(type_times[t][r] for t in order[:j]) for r in ranks),
                  sum(type_counts[t] for t in order[:j]),
                  tuple(max(type_most[t][r] for t in order[:j]) for r in ranks)) for j in range(1, len(order)))


FORWARD, BACKWARD, WEIGHT = "F", "B", "W"  # W: the weight-gradient half of a split backward


@dataclass(frozen=True)
class PassTimes:
    """One micro-batch's pass times per virtual stage as the simulator runs them: forward, B (the backward less
    its W), W, and the one-way transfer across each boundary k → k + 1 (`simulate`)."""

    forward_s: tuple[float, ...]
    input_grad_s: tuple[float, ...]
    weight_s: tuple[float, ...]
    p2p_s: tuple[float, ...]


class PipelineSchedule:
    """One pipeline schedule. Subclasses state its rules, the order each rank runs its passes in,
    the micro-batches it keeps in flight, its closed form and a lower bound valid for that order."""

    kind: Schedule
    chunked = False  # more than one model chunk per rank (vpp > 1)
    splits_backward = False  # backward run as B (input gradient) and a later W (weight gradient) pass
    tiles_iterations = False  # no synchronisation before the optimizer step: iterations overlap rank by rank
    extrapolated = True  # the simulator may extrapolate long runs from short prefixes (`_periodic_iteration_s`)
    # local learning (PPLL): each stage trains on its own auxiliary loss, no gradient crosses a stage boundary, only
    # forward activations travel (through a bounded queue); a different training algorithm, never searched unasked
    local_losses = False
    boundary_legs = 2  # transfers across a stage boundary per micro-batch: the activation, the gradient back
    runs_elsewhere = ""  # software outside the export targets that runs it, named when an export refuses it

    @property
    def forward_p2p_share(self) -> float:
        """The share of a stage's p2p time its forward pass carries (the backward the rest): each pass carries its
        own transfers, the activation's and the gradient's, so half each, or all where only activations cross."""
        return 1 / self.boundary_legs

    def periodic(self, pp: int, num_microbatches: int) -> bool:
        """Whether the orders for m₀ + i·pp micro-batches (m₀ ≡ m mod pp) are one order repeated, so that
        `_periodic_iteration_s` may extrapolate m's from theirs (`extrapolated` schedules only)."""
        return self.extrapolated

    def queue_depth(self, config_queue_depth: int) -> int:
        """The simulator's `queue_depth` for a configuration's queue (0: no queue bounds a send)."""
        return config_queue_depth if self.local_losses else 0

    def stage_rank(self, stage: int, pp: int) -> int:
        """The pipeline rank that runs virtual stage `stage`: k mod pp (the "loop" layout)."""
        return stage % pp

    def rank_stage(self, pp_rank: int, chunk: int, pp: int) -> int:
        """The virtual stage of a rank's `chunk`-th model chunk (inverse of `stage_rank`)."""
        return chunk * pp + pp_rank

    def check(self, pp: int, vpp: int) -> None:
        """Raise when (pp, vpp) is not allowed for this schedule."""
        if vpp != 1:
            raise PlannerError(f"parallel config: vpp={vpp} needs --schedule interleaved")

    def runnable(self, pp: int, num_microbatches: int) -> bool:
        """Whether the framework's order exists for this pipeline depth and micro-batch count (`runnable_rule`)."""
        return True

    runnable_rule = ""  # what `runnable` asks of the micro-batch count, in words, where it asks anything

    def chunk_counts(self, most: int) -> range:
        """The model chunks per rank (vpp) it runs, up to `most` where it runs any number."""
        return range(2, most + 1) if self.chunked else range(1, 2)

    def forward_table(self, pp: int, vpp: int, num_microbatches: int) -> list[tuple[int, int]]:
        """(micro-batch, chunk) of each forward pass of a rank, in order."""
        return [(mb, 0) for mb in range(num_microbatches)]

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        """Forward passes a rank runs before its first backward."""
        raise NotImplementedError

    def order(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
        """The (kind, chunk, micro-batch) passes a rank runs: warm-up forwards, then one forward and
        one backward alternately, then the remaining backwards (Megatron-LM's order)."""
        table = self.forward_table(pp, vpp, num_microbatches)
        warmup = self.warmup(pp_rank, pp, vpp, num_microbatches)
        forwards = [(FORWARD, chunk, mb) for mb, chunk in table]
        backwards = [(BACKWARD, vpp - 1 - chunk, mb) for mb, chunk in table]
        order = forwards[:warmup]
        for i in range(len(table) - warmup):
            order += [forwards[warmup + i], backwards[i]]
        return order + backwards[len(table) - warmup:]

    def orders(self, pp: int, vpp: int, num_microbatches: int, times: PassTimes) -> list[list[tuple[str, int, int]]]:
        """Every rank's `order`, as the simulator replays them; a time-aware schedule builds them from `times`."""
        return [self.order(r, pp, vpp, num_microbatches) for r in range(pp)]

    def in_flight(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> float:
        """Micro-batches whose activations a rank holds at its peak, per model chunk: its warm-up
        forwards plus the one whose backward comes next, out of all it runs."""
        passes = num_microbatches * vpp
        return min(self.warmup(pp_rank, pp, vpp, num_microbatches) + 1, passes) / vpp

    def head_in_flight(self, pp: int, vpp: int, num_microbatches: int) -> float:
        """Micro-batches whose head activations (the output layer's input, what the loss keeps of the logits) the
        last virtual stage holds at its peak: its forwards whose backward has not run yet, in its rank's order,
        where a backward is the head's whole gradient. The last stage backs each micro-batch through at once in
        1F1B and in Megatron-LM's interleaved order (1), where the rank's chunks hold `in_flight` on average."""
        return _head_peak(self, pp, vpp, num_microbatches)

    def linear_form(self, num_microbatches: int, vpp: int) -> tuple[float, float]:
        """(a, b) with the closed form = a·max_r R_r + b·Σ_r R_r (the ILP's objective)."""
        return num_microbatches - 1, 1.0

    def closed_form(self, rank_loads: Sequence[float], num_microbatches: int, vpp: int) -> PipelineTime:
        """The closed-form iteration time of the pipeline part for per-rank loads R_r."""
        slowest = max(range(len(rank_loads)), key=lambda r: (rank_loads[r], -r))
        a, b = self.linear_form(num_microbatches, vpp)
        total = a * rank_loads[slowest] + b * sum(rank_loads)
        return PipelineTime(total, slowest, num_microbatches * rank_loads[slowest])


    def bound_form(self, num_microbatches: int) -> tuple[float, float]:
        """(a, b) with a·max R + b·Σ R a lower bound on the simulated time (the cheap search bound)."""
        return num_microbatches, 0.0

    def lower_bound(self, terms: RankTerms, num_microbatches: int, blocks: int) -> float:
        """A lower bound on the simulated pipeline time over every split of `blocks` alike blocks."""
        a, b = self.bound_form(num_microbatches)
        return least_linear(terms.fixed_s, terms, blocks, a, b)[0]


class GPipe(PipelineSchedule):
    """All forwards, then all backwards: every micro-batch's activations stay until its backward."""

    kind = Schedule.GPIPE

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        return num_microbatches

    def bound_form(self, num_microbatches: int) -> tuple[float, float]:
        return num_microbatches - 1, 1.0  # the closed form, which the simulator reproduces exactly


class OneFOneB(PipelineSchedule):
    """1F1B (PipeDream-flush): rank r warms up with p − r − 1 forwards (Narayanan et al. 2021)."""

    kind = Schedule.ONE_F_ONE_B

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        return min(pp - pp_rank - 1, num_microbatches)

    def lower_bound(self, terms: RankTerms, num_microbatches: int, blocks: int) -> float:
        """Rank r's first backward waits for micro-batch 0's forward through every rank and its
        backward through the later ones; until then r runs at most w_r + 1 forwards; after its last
        backward, the earlier ranks' backward follows. So T ≥ (m − 1)·R_r + Σ R − w_r·F_r for every
        rank (the closed form for the last rank, where w = 0; F_r: the rank's forward work),
        minimised over blocks per rank with Σ R at its least."""
        return max(self._view_bound(terms, num_microbatches, view) for view in terms.views(blocks))

    def _view_bound(self, terms: RankTerms, m: int,
                    view: tuple[tuple[float, ...], tuple[int, ...], tuple[float, ...], int, int]) -> float:
        """`lower_bound` over one of `RankTerms.views`: the blocks left out sit anywhere at the cheapest time, so
        each rank's term takes as many of them as it holds where they lower it, and none elsewhere."""
        block_s, lower, upper, counted, left_out = view
        pp, cheapest = terms.pp, min(terms.block_s)
        least_sum = sum(terms.fixed_s) + counted * min(block_s) + left_out * cheapest
        if m == 1:
            return least_sum
        shifted, per_block = [], []
        for r in range(pp):
            warmup = self.warmup(r, pp, 1, m)
            forward = warmup * terms.forward_block_s[r] / (m - 1)
            slope, other = block_s[r] - forward, terms.block_s[r] - forward
            # a non-positive slope: the term is least with as many blocks as the rank can hold
            most = terms.most_blocks()[r]
            shifted.append(terms.fixed_s[r] - warmup * terms.forward_fixed_s[r] / (m - 1)
                           + min(counted, upper[r]) * min(slope, 0.0) + min(left_out, most) * min(other, 0.0))
            per_block.append(max(slope, 0.0))
        relaxed = relaxed_rank_counts(shifted, per_block, lower, upper, counted, 1.0, 0.0)
        return math.inf if relaxed is None else (m - 1) * relaxed[0] + least_sum


def _check_chunked(kind: Schedule, pp: int, vpp: int) -> None:
    """A schedule over model chunks needs at least two ranks and two chunks per rank."""
    if pp < 2 or vpp < 2:
        raise PlannerError(
            f"parallel config: the {kind.value} schedule needs pp >= 2 and vpp >= 2, got pp={pp} vpp={vpp}")


def _grouped_forward_table(group: int, vpp: int, num_microbatches: int) -> list[tuple[int, int]]:
    """Groups of `group` micro-batches (Megatron-LM: pp; PyTorch: a round's) run through chunk 0, then chunk 1, …
    before the next group; the last group takes whatever micro-batches remain."""
    table = []
    for first in range(0, num_microbatches, group):
        members = range(first, min(first + group, num_microbatches))
        table += [(mb, chunk) for chunk in range(vpp) for mb in members]
    return table


class Interleaved(PipelineSchedule):
    """Interleaved 1F1B (Narayanan et al. 2021): v model chunks per rank, bubble v-fold smaller."""

    kind = Schedule.INTERLEAVED
    chunked = True

    def check(self, pp: int, vpp: int) -> None:
        _check_chunked(self.kind, pp, vpp)

    runnable_rule = "micro-batches divisible by pp (Megatron-LM's order deadlocks otherwise)"

    def runnable(self, pp: int, num_microbatches: int) -> bool:
        return num_microbatches % pp == 0

    def forward_table(self, pp: int, vpp: int, num_microbatches: int) -> list[tuple[int, int]]:
        return _grouped_forward_table(pp, vpp, num_microbatches)

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        """(p − r − 1)·2 + (v − 1)·p, or every forward when m = p (Megatron-LM)."""
        passes = num_microbatches * vpp
        return passes if num_microbatches == pp else min((pp - pp_rank - 1) * 2 + (vpp - 1) * pp, passes)

    def linear_form(self, num_microbatches: int, vpp: int) -> tuple[float, float]:
        return num_microbatches - 1 / vpp, 1 / vpp

    def lower_bound(self, terms: RankTerms, num_microbatches: int, blocks: int) -> float:
        """Rank r starts only after micro-batch 0's forward crossed the chunk-0 stages of ranks
        0..r−1, and its last pass is followed by those stages' backward: m·R_r + Σ_{r'<r} least
        stage_{r'} bounds the time (folded into each rank's fixed load as /m)."""
        m = num_microbatches
        prefix = np.concatenate(([0.0], np.cumsum(terms.least_stage_s)[:-1]))
        fixed = tuple(f + p / m for f, p in zip(terms.fixed_s, prefix, strict=True))
        return least_linear(fixed, terms, blocks, m, 0.0)[0]


def _rounds(pp: int, num_microbatches: int) -> int:
    """The rounds PyTorch's interleaved schedule splits the micro-batches into: max(1, m // p)."""
    return max(1, num_microbatches // pp)


class PyTorchInterleaved(Interleaved):
    """Interleaved 1F1B as torch.distributed.pipelining runs it (`ScheduleInterleaved1F1B`, torchtitan's
    "Interleaved1F1B"): max(1, m // p) rounds of m / rounds micro-batches each go through chunk 0, then chunk 1, …
    (Megatron-LM's groups of p when p divides m), and rank r warms up with (v − 1)·(m / rounds) + 2(p − 1 − r)
    forwards: no all-forwards case when m = p, and any m the rounds divide runs (fewer than p, or not a
    multiple of it). `ParallelConfig.pipeline_order` "pytorch" selects it."""

    runnable_rule = "micro-batches divisible by its rounds, max(1, m // pp) (PyTorch's order)"

    def runnable(self, pp: int, num_microbatches: int) -> bool:
        return num_microbatches % _rounds(pp, num_microbatches) == 0

    def forward_table(self, pp: int, vpp: int, num_microbatches: int) -> list[tuple[int, int]]:
        return _grouped_forward_table(num_microbatches // _rounds(pp, num_microbatches), vpp, num_microbatches)

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        per_round = num_microbatches // _rounds(pp, num_microbatches)
        return min((vpp - 1) * per_round + 2 * (pp - 1 - pp_rank), num_microbatches * vpp)

    def periodic(self, pp: int, num_microbatches: int) -> bool:
        """Rounds of p micro-batches (Megatron-LM's groups) when p divides m; other m round differently."""
        return num_microbatches % pp == 0


class ZeroBubble(PipelineSchedule):
    """Zero-bubble pipelines (Qi et al., ICLR 2024): a backward is split into B, the input gradient the
    previous stage waits for, and W, the weight gradient nothing waits for, so W passes held back fill
    the bubbles. The order is torch.distributed.pipelining's (`_get_1f1b_rank_ops` with zero bubble):
    warm-up forwards, then F and B alternately, each B followed by the oldest W once the rank holds
    `deferred` of them back, then the remaining B (same rule), then the W still held. A micro-batch's
    activations stay until its W (the weight gradient needs each layer's input), so the memory is the
    order's own peak. Closed form: 1F1B's with its fill scaled by `fill`, the share of 1F1B's bubble
    (p − 1)(F + B + W) the schedule leaves at F = B = W (the paper's Table 1)."""

    splits_backward = True
    fill: float

    def check(self, pp: int, vpp: int) -> None:
        if pp < 2:
            raise PlannerError(f"parallel config: the {self.kind.value} schedule splits the backward between "
                               f"pipeline stages and needs pp >= 2, got pp={pp}")
        super().check(pp, vpp)

    def deferred(self, pp_rank: int, pp: int) -> int:
        """W passes a rank holds back before it runs its oldest one."""
        return pp_rank  # the later a rank, the longer it would idle at the end waiting for gradients

    def order(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
        table = self.forward_table(pp, vpp, num_microbatches)
        warmup = self.warmup(pp_rank, pp, vpp, num_microbatches)
        held = self.deferred(pp_rank, pp)
        forwards = [(FORWARD, chunk, mb) for mb, chunk in table]
        backwards = [(vpp - 1 - chunk, mb) for mb, chunk in table]
        order = forwards[:warmup]
        for i, (chunk, mb) in enumerate(backwards):
            if warmup + i < len(forwards):
                order.append(forwards[warmup + i])
            order.append((BACKWARD, chunk, mb))
            if i >= held:
                order.append((WEIGHT, *backwards[i - held]))
        return order + [(WEIGHT, *pass_) for pass_ in backwards[max(len(backwards) - held, 0):]]

    def head_in_flight(self, pp: int, vpp: int, num_microbatches: int) -> float:
        """The last stage's rank's own count (`in_flight`): the output layer's input stays until its W."""
        return self.in_flight(self.stage_rank(pp * vpp - 1, pp), pp, vpp, num_microbatches)

    def in_flight(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> float:
        """The most micro-batches between their forward and their W at any point of the rank's order. The
        peak comes within the first (v + 1)·p + 1 passes (warm-up, then at most p held-back W), and an
        order's start does not depend on m beyond that, so 3p micro-batches show it at any m."""
        live = peak = 0
        for kind, _, _ in self.order(pp_rank, pp, vpp, min(num_microbatches, 3 * pp)):
            live += {FORWARD: 1, WEIGHT: -1}.get(kind, 0)
            peak = max(peak, live)
        return peak / vpp

    def linear_form(self, num_microbatches: int, vpp: int) -> tuple[float, float]:
        return num_microbatches - self.fill / vpp, self.fill / vpp

    def lower_bound(self, terms: RankTerms, num_microbatches: int, blocks: int) -> float:
        """Rank r runs m·R_r of work, and (one chunk per rank) starts only after micro-batch 0's forward
        crossed ranks 0..r−1, each at least its fixed forward plus its fewest blocks' forward: the
        busiest rank's work plus the smallest fill, folded into each rank's fixed load as /m."""
        m, fixed = num_microbatches, terms.fixed_s
        if not self.chunked and not self.tiles_iterations:  # a tiled iteration starts at each rank's first pass
            blocks_forward = terms.least_forward_block_s or terms.forward_block_s  # added work: the least block's
            least_forward = [f + n * b for f, n, b in zip(terms.forward_fixed_s, terms.lower, blocks_forward,
                                                          strict=True)]
            prefix = np.concatenate(([0.0], np.cumsum(least_forward)[:-1]))
            fixed = tuple(f + p / m for f, p in zip(fixed, prefix, strict=True))
        return least_linear(fixed, terms, blocks, m, 0.0)[0]


class ZeroBubbleH1(ZeroBubble):
    """ZB-H1: 1F1B's warm-up, each rank r holding r W passes back to fill its end; at most p micro-batches
    in flight on any rank, 1F1B's peak (on rank 0); bubble (p − 1)(F + B − W), a third of 1F1B's."""

    kind = Schedule.ZB_H1
    fill = 1 / 3

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        return min(pp - pp_rank - 1, num_microbatches)


class ZeroBubbleH2(ZeroBubble):
    """ZB-H2: up to 2p − 1 micro-batches in flight on every rank (rank 0's 2p − 1 warm-up forwards fill the
    start bubble; held-back W passes fill the end), bubble (p − 1)(F + B − 2W), none at F = B = W, for
    about twice 1F1B's peak activations. The order is the paper's greedy rule at F = B = W (`_greedy_order`).
    Its zero bubble needs the paper's optimizer post-validation (no all-reduce of the gradient norm
    before the step), so iterations tile as a parallelogram: each rank's span from its first pass to its
    last is the iteration (`tiles_iterations`)."""

    kind = Schedule.ZB_H2
    fill = 0.0
    tiles_iterations = True

    def order(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
        return list(_greedy_order(pp, num_microbatches, 2 * pp - 1)[pp_rank])


@functools.lru_cache(maxsize=64)
def _greedy_order(pp: int, num_microbatches: int, limit: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Each rank's passes under Qi et al.'s greedy rule with unit pass times: whenever a rank is free it
    runs its next B if its gradient has arrived, else its next F if that has arrived and fewer than
    `limit` micro-batches are in flight (forward done, W not), else its oldest pending W."""
    m = num_microbatches
    forward_end = [[math.inf] * m for _ in range(pp)]
    backward_end = [[math.inf] * m for _ in range(pp)]
    done = {kind: [0] * pp for kind in (FORWARD, BACKWARD, WEIGHT)}
    orders: list[list[tuple[str, int, int]]] = [[] for _ in range(pp)]
    t = 0
    while any(w < m for w in done[WEIGHT]):
        for r in range(pp):
            f, b, w = done[FORWARD][r], done[BACKWARD][r], done[WEIGHT][r]
            if b < m and forward_end[r][b] <= t and (r == pp - 1 or backward_end[r + 1][b] <= t):
                kind, mb = BACKWARD, b
                backward_end[r][b] = t + 1
            elif f < m and f - w < limit and (r == 0 or forward_end[r - 1][f] <= t):
                kind, mb = FORWARD, f
                forward_end[r][f] = t + 1
            elif w < b:
                kind, mb = WEIGHT, w
            else:
                continue
            done[kind][r] += 1
            orders[r].append((kind, 0, mb))
        t += 1
    return tuple(map(tuple, orders))


class AdaptiveZeroBubble(ZeroBubble):
    """ZB-1p / ZB-2p, Qi et al.'s automatic schedule (§3): each rank's order of F, B and W passes is built from
    the stages' own pass and transfer times under a memory limit of `limit_factor`·p micro-batches in flight
    (forward done, W not) on every rank — 1F1B's peak for ZB-1p, twice it for ZB-2p — by the paper's greedy
    heuristic (`_time_aware_orders`), trying its variants and the handcrafted schedule at the same memory
    (`handcrafted`, within the limit) and keeping the order the simulator finds fastest, so it is never slower than
    ZB-H1 / ZB-H2 on the same times; the paper refines its heuristic's order with an ILP, here a bounded local
    search refines the kept one (`_refined`: W passes held to a critical rank's end run in its idle gaps). Two
    schedule names rather than a memory-limit option: the paper's two settings are what its Table 4 measured, and a
    name carries the limit through the plan file, the search and the exports with no new configuration field. The
    memory is the limit (the order's own peak depends on the times, which the memory model does not see); the
    closed form, bound and synchronisation are the handcrafted schedule's."""

    limit_factor: int
    handcrafted: Schedule
    runs_elsewhere = "sail-sg/zero-bubble-pipeline-parallelism, the authors' Megatron-LM fork,"
    # the order is rebuilt for each micro-batch count (the greedy heuristic and a budgeted refinement), so it is not
    # one fixed order whose prefixes predict the rest (found by the property test: zb-1p, pp 4, m 85, 531.85 s
    # simulated against 532.55 s extrapolated): every micro-batch is simulated, as for ZB-V; a schedule run by name
    extrapolated = False

    def limit(self, pp: int) -> int:
        """Micro-batches in flight a rank may hold."""
        return self.limit_factor * pp

    def order(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
        """The order at F = B = W with no transfer time (the times-free view of the schedule)."""
        return self.orders(pp, vpp, num_microbatches, PassTimes((1.0,) * pp, (1.0,) * pp, (1.0,) * pp,
                                                                (0.0,) * pp))[pp_rank]

    def orders(self, pp: int, vpp: int, num_microbatches: int, times: PassTimes) -> list[list[tuple[str, int, int]]]:
        candidates = [orders for flags in itertools.product((True, False), repeat=3)
                      if (orders := _time_aware_orders(times, num_microbatches, self.limit(pp), *flags)) is not None]
        candidates.append(schedule_of(self.handcrafted).orders(pp, vpp, num_microbatches, times))
        best = min(candidates, key=lambda orders: _replay(self, orders, times, num_microbatches).iteration_s)
        return _refined(self, best, times, num_microbatches)

    def in_flight(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> float:
        return float(min(self.limit(pp), num_microbatches))


class ZeroBubble1P(AdaptiveZeroBubble):
    """ZB-1p: p micro-batches in flight, ZB-H1's synchronised optimizer step and closed form."""

    kind = Schedule.ZB_1P
    limit_factor = 1
    handcrafted = Schedule.ZB_H1
    fill = ZeroBubbleH1.fill


class ZeroBubble2P(AdaptiveZeroBubble):
    """ZB-2p: 2p micro-batches in flight, ZB-H2's tiled iterations (optimizer post-validation) and closed form."""

    kind = Schedule.ZB_2P
    limit_factor = 2
    handcrafted = Schedule.ZB_H2
    fill = ZeroBubbleH2.fill
    tiles_iterations = True


# the refinement of an automatic zero-bubble order (`_refined`): at most this many candidate replays, stopping after
# this many in a row gain nothing (the benchmark's gains each came at a critical rank's first fillable gap)
_REFINE_TRIES = 48
_REFINE_PATIENCE = 8


def _refined(behaviour: PipelineSchedule, orders: list[list[tuple[str, int, int]]], times: PassTimes,
             num_microbatches: int) -> list[list[tuple[str, int, int]]]:
    """`orders` improved by a bounded local search in place of Qi et al.'s ILP refinement: an idle gap of a rank whose
    span is the iteration runs a W pass the rank held to its end (`_gap_fillings`), kept when the replayed iteration
    is no longer and it or the ranks' summed spans shorter (`_shorter`: ties between critical ranks), one gap at a
    time, until none gains or the budget is spent. Never slower than `orders`, and within their memory limit."""
    timeline = _replay(behaviour, orders, times, num_microbatches, record=True)
    tries, failed, improved = _REFINE_TRIES, 0, True
    while improved:
        improved = False
        for candidate in _gap_fillings(orders, timeline):
            if not tries or failed == _REFINE_PATIENCE:
                return orders
            tries -= 1
            if _shorter(_replay(behaviour, candidate, times, num_microbatches), timeline):
                orders, failed, improved = candidate, 0, True
                timeline = _replay(behaviour, orders, times, num_microbatches, record=True)
                break
            failed += 1
    return orders


def _shorter(new: Timeline, old: Timeline) -> bool:
    """Whether `new` has no longer an iteration than `old`, and a shorter one or a shorter sum of rank spans."""
    return (new.iteration_s, sum(new.rank_spans_s)) < (old.iteration_s, sum(old.rank_spans_s)) \
        and new.iteration_s <= old.iteration_s


def _gap_fillings(orders: list[list[tuple[str, int, int]]],
                  timeline: Timeline) -> Iterator[list[list[tuple[str, int, int]]]]:
    """Every rank's orders with one idle gap of a critical rank (span within 1e-12 of the iteration) filled by the W
    pass the rank holds to its end (`_tail_weight_fits`), so that its tail shortens, in order of the gaps."""
    critical = [r for r, span in enumerate(timeline.rank_spans_s) if span >= timeline.iteration_s * (1 - 1e-12)]
    for r in critical:
        passes = [e for e in timeline.events if e.pp_rank == r]  # the replay records a rank's passes in order
        for i in range(1, len(passes) - 1):
            if passes[i].start_s > passes[i - 1].end_s and _tail_weight_fits(orders[r], i):
                yield [*orders[:r], _tail_weight_at(orders[r], i), *orders[r + 1:]]


def _tail_weight_fits(order: list[tuple[str, int, int]], i: int) -> bool:
    """Whether the rank's last pass is a W that may run at position `i` instead, the W passes from there on each one
    slot later: each W still after its own B (a B without its W before every position from `i` on). Running a W
    sooner only frees memory, so the limit holds."""
    if order[-1][0] != WEIGHT:
        return False
    pending = sum({BACKWARD: 1, WEIGHT: -1}.get(kind, 0) for kind, _, _ in order[:i])
    for kind, _, _ in order[i:-1]:
        if pending < 1:
            return False
        pending += {BACKWARD: 1, WEIGHT: -1}.get(kind, 0)
    return pending >= 1


def _tail_weight_at(order: list[tuple[str, int, int]], i: int) -> list[tuple[str, int, int]]:
    """`order` with a W slot moved from its end to position `i`, the W passes keeping their order."""
    labels = iter([pass_ for pass_ in order[i:] if pass_[0] == WEIGHT])
    return [*order[:i], *(next(labels) if pass_[0] == WEIGHT else pass_ for pass_ in (order[-1], *order[i:-1]))]


@dataclass
class _Placement:
    """The state of `_time_aware_orders`: each stage's passes so far, when its last one ends, its idle time since
    its first forward, and the end of every pass placed (the simulator's `ends`, -1 until placed). Mutable: the
    heuristic places one pass at a time."""

    times: PassTimes
    limit: int
    orders: list[list[tuple[str, int, int]]]
    count: dict[str, list[int]]
    free_s: list[float]
    idle_s: list[float]
    ends: dict[str, list[list[float]]]

    @classmethod
    def empty(cls, times: PassTimes, num_microbatches: int, limit: int) -> _Placement:
        pp, kinds = len(times.forward_s), (FORWARD, BACKWARD, WEIGHT)
        return cls(times, limit, [[] for _ in range(pp)], {kind: [0] * pp for kind in kinds}, [0.0] * pp, [0.0] * pp,
                   {kind: [[-1.0] * num_microbatches for _ in range(pp)] for kind in kinds})

    def cost(self, kind: str, j: int) -> float:
        return {FORWARD: self.times.forward_s, BACKWARD: self.times.input_grad_s, WEIGHT: self.times.weight_s}[kind][j]

    def arrival(self, kind: str, j: int) -> float:
        """When the input of stage j's next pass of `kind` is there (the passes it needs are placed)."""
        return _input_ready(self.ends, kind, j, self.count[kind][j], len(self.free_s), self.times.p2p_s)[0]

    def held(self, j: int) -> int:
        """Micro-batches in flight on stage j: forward done, W not."""
        return self.count[FORWARD][j] - self.count[WEIGHT][j]

    def pending_weight(self, j: int) -> bool:
        return self.count[WEIGHT][j] < self.count[BACKWARD][j]

    def put(self, kind: str, j: int) -> None:
        """Stage j's next pass of `kind`, as early as its input and the stage allow."""
        start = max(self.free_s[j], self.arrival(kind, j))
        if self.count[FORWARD][j]:
            self.idle_s[j] += start - self.free_s[j]
        self.free_s[j] = start + self.cost(kind, j)
        mb = self.count[kind][j]
        self.ends[kind][j][mb] = self.free_s[j]
        self.count[kind][j] += 1
        self.orders[j].append((kind, 0, mb))

    def affordable(self, j: int, gap_s: float) -> bool:
        """Whether stage j can idle `gap_s` and stay no idler than the idlest stage so far."""
        return gap_s <= max(self.idle_s) - self.idle_s[j]

    def make_room(self, j: int) -> bool:
        """Run stage j's oldest W passes until one more micro-batch fits the limit; False when none is left."""
        while self.held(j) >= self.limit:
            if not self.pending_weight(j):
                return False
            self.put(WEIGHT, j)
        return True

    def fill_gap(self, j: int, kind: str, overrun: bool) -> None:
        """W passes while stage j waits for its next `kind` pass's input: those that end by then, and one that
        overruns it when the wait is more than the stage can afford idle, or always with `overrun`."""
        arrives = self.arrival(kind, j)
        while self.pending_weight(j) and self.free_s[j] + self.cost(WEIGHT, j) <= arrives:
            self.put(WEIGHT, j)
        gap = arrives - self.free_s[j]
        if self.pending_weight(j) and gap > 0 and (overrun or not self.affordable(j, gap)):
            self.put(WEIGHT, j)


def _time_aware_orders(times: PassTimes, num_microbatches: int, limit: int, idle_warmup: bool, prefer_backward: bool,
                       overrun: bool) -> list[list[tuple[str, int, int]]] | None:
    """Each stage's order under Qi et al.'s heuristic (one chunk per rank; None when the limit cannot hold it).

    Micro-batch 0's forward runs through every stage; stage j then adds warm-up forwards, back from the last
    stage, while they fit the limit and do not delay its first B (`idle_warmup`: each must end by the time the
    gradient arrives, so the stage may idle until then; else each must start before it), each stage fewer than
    the one before. Then, for each further micro-batch, every stage runs one forward (front to back)
    and one B (back to front), W passes filling the wait for each input (`_Placement.fill_gap`) or freeing
    memory; `prefer_backward`: a stage two or more forwards ahead of the next one skips its forward when the
    next gradient would come back first, or when the wait it leaves is one the stage can afford idle. Last, every
    stage's remaining W passes."""
    m, pp = num_microbatches, len(times.forward_s)
    state = _Placement.empty(times, m, limit)
    for j in range(pp):
        state.put(FORWARD, j)
    extra, gradient_s = [0] * pp, state.free_s[-1] + times.input_grad_s[-1]  # when the last stage's B 0 ends
    for j in reversed(range(pp - 1)):
        arrives, end = gradient_s + times.p2p_s[j], state.free_s[j]
        while 1 + extra[j] < m and state.held(j) + extra[j] < limit and (
                end + times.forward_s[j] <= arrives if idle_warmup else end < arrives):
            end += times.forward_s[j]
            extra[j] += 1
        gradient_s = max(end, arrives) + times.input_grad_s[j]
    for j in range(1, pp):  # each stage fewer warm-up forwards than the one before, as many where that runs all
        extra[j] = min(extra[j], extra[j - 1] if 1 + extra[j - 1] == m else max(extra[j - 1] - 1, 0))
    for j in range(pp):
        for _ in range(extra[j]):
            state.put(FORWARD, j)
    for j in reversed(range(pp)):
        state.put(BACKWARD, j)
    for _ in range(1, m):
        wants = [state.count[FORWARD][j] < m and not (prefer_backward and _backward_first(state, j))
                 for j in range(pp)]
        for j in reversed(range(pp - 1)):  # a stage runs a forward only if the next one does
            wants[j] = wants[j] and wants[j + 1]
        for j in (j for j in range(pp) if wants[j]):
            if not state.make_room(j):
                return None
            if j:
                state.fill_gap(j, FORWARD, overrun)
            state.put(FORWARD, j)
        for j in reversed(range(pp)):
            if j < pp - 1:
                state.fill_gap(j, BACKWARD, overrun)
            state.put(BACKWARD, j)
    for j in range(pp):
        while state.pending_weight(j):
            state.put(WEIGHT, j)
    return state.orders


def _backward_first(state: _Placement, j: int) -> bool:
    """Whether stage j, two or more forwards ahead of stage j + 1, should leave its next forward for later: the next
    gradient comes back before the stage is free, or before the forward (with the W passes it needs for memory)
    ends and the wait until it comes is one the stage can afford idle."""
    count, last = state.count[FORWARD], len(state.free_s) - 1
    if j == last or count[j] < count[j + 1] + 2:
        return False
    times = state.times
    returns = state.free_s[j + 1] + times.forward_s[j + 1] + times.input_grad_s[j + 1] + times.p2p_s[j]
    if state.free_s[j] >= returns:
        return True
    freeing = min(max(state.held(j) + 1 - state.limit, 0), state.count[BACKWARD][j] - state.count[WEIGHT][j])
    if state.free_s[j] + times.forward_s[j] + freeing * times.weight_s[j] <= returns:
        return False
    return state.affordable(j, returns - state.free_s[j])


class InterleavedZeroBubble(ZeroBubble):
    """Interleaved zero bubble (torch.distributed.pipelining's ScheduleInterleavedZeroBubble, "ZB1P" over v
    chunks per rank): the interleaved order with warm-up (v − 1)·p + p − r − 1 and ZB-H1's held-back W."""

    kind = Schedule.INTERLEAVED_ZB
    chunked = True
    fill = 1 / 3

    def check(self, pp: int, vpp: int) -> None:
        _check_chunked(self.kind, pp, vpp)

    runnable_rule = "micro-batches divisible by pp (rounds of other sizes are not modelled)"

    def runnable(self, pp: int, num_microbatches: int) -> bool:
        """Micro-batches a multiple of pp, where PyTorch's rounds hold p micro-batches each (it also runs
        m % ⌊m / p⌋ = 0, rounds of more than p, which the planner does not model)."""
        return num_microbatches % pp == 0

    def forward_table(self, pp: int, vpp: int, num_microbatches: int) -> list[tuple[int, int]]:
        return _grouped_forward_table(pp, vpp, num_microbatches)

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        return min((vpp - 1) * pp + pp - pp_rank - 1, num_microbatches * vpp)


class ZeroBubbleV(ZeroBubble):
    """ZB-V (Qi et al. 2024 §6; torch.distributed.pipelining's ScheduleZBVZeroBubble, torchtitan's ZBVZeroBubble):
    two model chunks per rank in a V — rank r holds stages r and 2p − 1 − r, so the first and the last stage
    share rank 0 and the turn at stage p − 1 → p stays on rank p − 1. The order is PyTorch's
    (`_calculate_single_rank_operations`): 2(p − r) − 1 chunk-0 forwards, r pairs of chunk-1 and chunk-0
    forwards, p − r chunk-1 F/B/W triples, then F, B, W of chunk 0 and of chunk 1 alternately, then the
    remaining B with W held back. At most 2p chunk passes in flight on rank 0, p micro-batches of the
    rank's layers: 1F1B's peak, as the paper states for ZB-V."""

    kind = Schedule.ZB_V
    chunked = True
    fill = 1 / 3  # at F = B = W its bubble is one chunk forward per rank, (p − 1)·R/6: 1/(3v) of 1F1B's, v = 2
    # with unlike stages its critical path can change after the simulator's prefixes (found by the property test:
    # pp 3, m 75, 470.42 simulated against 469.03 extrapolated), so every micro-batch is simulated: cost linear
    # in m, for a schedule searched only for torchtitan or by name
    extrapolated = False

    def check(self, pp: int, vpp: int) -> None:
        if pp < 2 or vpp != 2:
            raise PlannerError(f"parallel config: the {self.kind.value} schedule holds exactly two model chunks per "
                               f"rank in a V and needs pp >= 2 and vpp = 2, got pp={pp} vpp={vpp}")

    def chunk_counts(self, most: int) -> range:
        return range(2, 3)

    def stage_rank(self, stage: int, pp: int) -> int:
        return stage if stage < pp else 2 * pp - 1 - stage

    def rank_stage(self, pp_rank: int, chunk: int, pp: int) -> int:
        return pp_rank if chunk == 0 else 2 * pp - 1 - pp_rank

    def order(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
        return list(_zbv_order(pp_rank, pp, num_microbatches))


@functools.lru_cache(maxsize=256)
def _zbv_order(r: int, pp: int, num_microbatches: int) -> tuple[tuple[str, int, int], ...]:
    """PyTorch's ZB-V order for rank r, built for max(2p − 1, m) micro-batches and cut to the m that exist."""
    n = max(2 * pp - 1, num_microbatches)
    order: list[tuple[str, int, int]] = []
    count = {(kind, chunk): 0 for kind in (FORWARD, BACKWARD, WEIGHT) for chunk in (0, 1)}

    def phase(times: int, *passes: tuple[str, int]) -> None:
        """`times` rounds of `passes`, each the (kind, chunk) of the next micro-batch of that kind and chunk."""
        for _ in range(times):
            for kind, chunk in passes:
                order.append((kind, chunk, count[kind, chunk]))
                count[kind, chunk] += 1

    phase(2 * (pp - r) - 1, (FORWARD, 0))  # warm-up
    phase(r, (FORWARD, 1), (FORWARD, 0))
    phase(pp - r, (FORWARD, 1), (BACKWARD, 1), (WEIGHT, 1))
    while count[FORWARD, 1] < count[FORWARD, 0] or count[FORWARD, 0] < n:  # steady state
        phase(int(count[FORWARD, 0] < n), (FORWARD, 0))
        phase(1, (BACKWARD, 0), (WEIGHT, 0), (FORWARD, 1), (BACKWARD, 1), (WEIGHT, 1))
    phase(r, (BACKWARD, 0), (BACKWARD, 1))  # cool-down: W held back, then run oldest first
    phase(pp - r, (BACKWARD, 0), (WEIGHT, 0))
    phase(count[BACKWARD, 1] - count[WEIGHT, 1], (WEIGHT, 1))
    phase(count[BACKWARD, 0] - count[WEIGHT, 0], (WEIGHT, 0))
    return tuple(p for p in order if p[2] < num_microbatches)


class DualPipeV(ZeroBubbleV):
    """DualPipeV (DeepSeek-V3's DualPipe folded into a V; torch.distributed.pipelining's ScheduleDualPipeV,
    torchtitan's DualPipeV): ZB-V's layout, PyTorch's order (`_dualpipev_order`) — forwards of both chunks
    first, then pairs of one chunk's forward with the other chunk's whole backward (B and W back to back),
    splitting the backward only near the end. The pairs are what lets torchtitan overlap one micro-batch's EP
    all-to-alls with the other's compute (`pipeline_parallel_expert_parallel_overlap`); the passes of a pair
    run one after the other here, the overlap is in each block's exposed all-to-all time (cost/time.py). It needs
    at least as many micro-batches as stages (2p). Peak in flight: 2p + 1 chunk passes, p + 1/2 micro-batches
    of the rank's layers (DeepSeek-V3 report: PP + 1 activations)."""

    kind = Schedule.DUALPIPE_V  # ZB-V's closed form too: at F = B = W the same (p − 1)·F bubble (tests)
    # simulated whole like ZB-V (its critical path changes late too: pp 4, at m = 56)

    runnable_rule = "at least 2·pp micro-batches"

    def runnable(self, pp: int, num_microbatches: int) -> bool:
        return num_microbatches >= 2 * pp

    def order(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> list[tuple[str, int, int]]:
        return list(_dualpipev_order(pp_rank, pp, num_microbatches))


@functools.lru_cache(maxsize=256)
def _dualpipev_order(r: int, pp: int, num_microbatches: int) -> tuple[tuple[str, int, int], ...]:
    """PyTorch's DualPipeV order for rank r (`ScheduleDualPipeV._calculate_single_rank_operations`, steps 1-8):
    a whole backward is B then its W; a split one holds its W back until a later step runs the oldest."""
    order: list[tuple[str, int, int]] = []
    count = {(kind, chunk): 0 for kind in (FORWARD, BACKWARD) for chunk in (0, 1)}
    held: list[tuple[int, int]] = []

    def forward(chunk: int) -> None:
        order.append((FORWARD, chunk, count[FORWARD, chunk]))
        count[FORWARD, chunk] += 1

    def backward(chunk: int, split: bool) -> None:
        mb = count[BACKWARD, chunk]
        count[BACKWARD, chunk] += 1
        order.append((BACKWARD, chunk, mb))
        if split:
            held.append((chunk, mb))
        else:
            order.append((WEIGHT, chunk, mb))

    def weight() -> None:
        if held:
            order.append((WEIGHT, *held.pop(0)))

    for _ in range(2 * (pp - r - 1)):  # 1: F0
        forward(0)
    for _ in range(r + 1):  # 2: F0 F1
        forward(0)
        forward(1)
    for _ in range(pp - r - 1):  # 3: B1 (split) W F1
        backward(1, True)
        weight()
        forward(1)
    for _ in range(num_microbatches - 2 * pp + r + 1):  # 4: (F0 with B1) (F1 with B0)
        forward(0)
        backward(1, False)
        forward(1)
        backward(0, False)
    for _ in range(pp - r - 1):  # 5: B1, (F1 with B0)
        backward(1, False)
        forward(1)
        backward(0, False)
    split = False
    for i in range(r + 1):  # 6: B1 B0, split from the middle on
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        backward(1, split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        backward(0, split)
    for _ in range(pp - r - 1):  # 7: W B0
        weight()
        backward(0, split)
    for _ in range(r + 1):  # 8: W
        weight()
    return tuple(order)


class LocalLearning(PipelineSchedule):
    """Pipeline parallelism with local learning (PPLL, Guo et al. 2024, arXiv:2411.12780): every stage carries an
    auxiliary head and trains on its own loss, so its backward needs only its own forward. A rank runs F then B of
    each micro-batch in turn and sends the forward output downstream through a queue of `queue_depth` slots (a full
    queue blocks the send). Time: the first micro-batch's forward through the earlier ranks (fill), then the
    slowest rank's F + B per micro-batch (`fill_form`). Memory: one micro-batch's activations (the backward follows
    its forward at once) plus the queue (cost/local.py). It changes the training algorithm (no end-to-end backward)."""

    kind = Schedule.LOCAL
    local_losses = True
    boundary_legs = 1
    # ILP objective: 1F1B's (m − 1)·max R + Σ R, which bounds `fill_form` from above (Σ_{r<e} F_r + R_e ≤ Σ R)

    def check(self, pp: int, vpp: int) -> None:
        if pp < 2:
            raise PlannerError(f"parallel config: the {self.kind.value} schedule trains pipeline stages on their own "
                               f"losses and needs pp >= 2, got pp={pp}")
        super().check(pp, vpp)

    def warmup(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> int:
        return 0  # F then B of each micro-batch: the backward waits for nothing downstream

    def head_in_flight(self, pp: int, vpp: int, num_microbatches: int) -> float:
        """Every stage trains a head of its own: the last one's is held like the rest of its rank (`in_flight`)."""
        return self.in_flight(pp - 1, pp, vpp, num_microbatches)

    def in_flight(self, pp_rank: int, pp: int, vpp: int, num_microbatches: int) -> float:
        return 1.0  # the queued boundary tensors are counted apart (`local_queue_bytes`)

    def fill_form(self, forward_s: Sequence[float], backward_s: Sequence[float], num_microbatches: int) -> PipelineTime:
        """The iteration's pipeline part from each rank's F and B per micro-batch (the send inside F): the longest
        path that runs micro-batch 0's forward through ranks 0..e−1, then m micro-batches on the slowest rank up to
        e, ending with rank e's last B, T = max_e Σ_{r<e} F_r + R_e + (m − 1)·max_{r≤e} R_r with R = F + B. A queue of
        depth ≥ 1 never lengthens it: its back-pressure cycle (a forward and a send per slot) is shorter than the
        slowest rank's R (tests/test_local_learning.py checks it against the simulator)."""
        loads = [f + b for f, b in zip(forward_s, backward_s, strict=True)]
        ends, fill, slowest = [], 0.0, 0.0
        for forward, load in zip(forward_s, loads, strict=True):
            slowest = max(slowest, load)
            ends.append(fill + load + (num_microbatches - 1) * slowest)
            fill += forward
        bottleneck = max(range(len(loads)), key=lambda r: (loads[r], -r))
        return PipelineTime(max(ends), bottleneck, num_microbatches * loads[bottleneck])


def least_linear(fixed_s: Sequence[float], terms: RankTerms, blocks: int, a: float,
                 b: float) -> tuple[float, list[int] | None]:
    """(A lower bound on a·max R + b·Σ R over every split, a, b ≥ 0: the largest over `RankTerms.views` of the
    least over block counts per rank, each view's left-out blocks at the cheapest time in Σ; the first view's
    counts, which realise it when blocks are alike), or (math.inf, None) when no count vector exists."""
    best, counts, cheapest = -math.inf, None, min(terms.block_s)
    for block_s, lower, upper, counted, left_out in terms.views(blocks):
        relaxed = relaxed_rank_counts(fixed_s, block_s, lower, upper, counted, a, b)
        if relaxed is None:
            return math.inf, None
        loads = [f + n * t for f, n, t in zip(fixed_s, relaxed[1], block_s, strict=True)]
        best = max(best, a * max(loads) + b * (sum(loads) + left_out * cheapest))
        if counts is None:
            counts = relaxed[1]
    joint = terms.joint
    if joint is not None:
        # every type at once: the bottleneck of their joint counts, beside the least sum (each block at its
        # type's cheapest rank): max R ≥ T* and Σ R ≥ that sum hold for every split that fits; only a T* above
        # what the views give can raise the bound
        least_sum = sum(fixed_s) + sum(count * min(times) for times, count in zip(joint.type_times, joint.type_counts,
                                                                                   strict=True))
        bottleneck = least_joint_bottleneck(fixed_s, terms.lower, joint,
                                            (best - b * least_sum) / a if a > 0 else -math.inf)
        if bottleneck == math.inf:
            return math.inf, None
        if bottleneck > -math.inf:
            best = max(best, a * bottleneck + b * least_sum)
    return best, counts


SCHEDULES: dict[Schedule, PipelineSchedule] = {s.kind: s for s in (
    OneFOneB(), GPipe(), Interleaved(), ZeroBubbleH1(), ZeroBubbleH2(), ZeroBubble1P(), ZeroBubble2P(),
    InterleavedZeroBubble(), ZeroBubbleV(), DualPipeV(), LocalLearning())}


ScheduleRef = Schedule | PipelineSchedule  # a schedule's name, or its behaviour in one framework's order

PIPELINE_ORDERS = ("megatron", "pytorch")
"""Whose implementation of a schedule's order a framework runs (`ParallelConfig.pipeline_order`): Megatron-LM's
(also DeepSpeed's 1F1B) or torch.distributed.pipelining's (torchtitan). They differ for the interleaved schedule
(`PyTorchInterleaved`); every other schedule has one order."""

_PYTORCH_ORDERS: dict[Schedule, PipelineSchedule] = {Schedule.INTERLEAVED: PyTorchInterleaved()}


def schedule_of(kind: Schedule | str | PipelineSchedule, order: str = "megatron") -> PipelineSchedule:
    """The behaviour of a schedule name in `order`'s implementation (PIPELINE_ORDERS); a behaviour is itself."""
    if isinstance(kind, PipelineSchedule):
        return kind
    kind = kind if isinstance(kind, Schedule) else Schedule(kind)
    return _PYTORCH_ORDERS.get(kind, SCHEDULES[kind]) if order == "pytorch" else SCHEDULES[kind]


@functools.cache
def _head_peak(behaviour: PipelineSchedule, pp: int, vpp: int, num_microbatches: int) -> float:
    """`PipelineSchedule.head_in_flight` from the order of the rank holding the last virtual stage."""
    schedule, last = behaviour, pp * vpp - 1
    rank = schedule.stage_rank(last, pp)
    chunk = next(c for c in range(vpp) if schedule.rank_stage(rank, c, pp) == last)
    live = peak = 0
    for pass_kind, pass_chunk, _ in schedule.order(rank, pp, vpp, num_microbatches):
        if pass_chunk == chunk:
            live += {FORWARD: 1, BACKWARD: -1}.get(pass_kind, 0)
            peak = max(peak, live)
    return float(peak)


@functools.cache
def stage_ranks(schedule: ScheduleRef, pp: int, num_stages: int) -> tuple[int, ...]:
    """The pipeline rank of each virtual stage under `schedule` (`PipelineSchedule.stage_rank`): the one rule
    the estimate, the partitioner, the search bounds, the simulator and the exports use."""
    behaviour = schedule_of(schedule)
    return tuple(behaviour.stage_rank(k, pp) for k in range(num_stages))


def rank_times(stage_times: Sequence[float], pp: int, schedule: ScheduleRef = Schedule.ONE_F_ONE_B) -> list[float]:
    """Per-micro-batch work of each pipeline rank: the sum of its virtual stages' (`stage_ranks`)."""
    ranks = [0.0] * pp
    for value, rank in zip(stage_times, stage_ranks(schedule, pp, len(stage_times)), strict=True):
        ranks[rank] += value
    return ranks


def pipeline_time(stage_times: Sequence[float], pp: int, num_microbatches: int, schedule: ScheduleRef) -> PipelineTime:
    """Closed-form iteration time of the pipeline part (no DP/optimizer) for non-uniform stages."""
    return schedule_of(schedule).closed_form(rank_times(stage_times, pp, schedule), num_microbatches,
                                             len(stage_times) // pp)


def rank_order(pp_rank: int, pp: int, vpp: int, num_microbatches: int,
               schedule: ScheduleRef) -> list[tuple[str, int, int]]:
    """The (kind, chunk, micro-batch) passes a rank runs, in the framework's order."""
    return schedule_of(schedule).order(pp_rank, pp, vpp, num_microbatches)


# ---- rank-load relaxation ---------------------------------------------------------------------
# The closed form and the bounds depend on a split only through the rank loads R_r. Relaxed to
# "how many blocks does each rank hold" (rank r: c_r + n_r·t_r), the least value over count vectors
# is a valid lower bound for every contiguous split, and attained when blocks are alike.


def relaxed_rank_counts(fixed_s: Sequence[float], block_s: Sequence[float], lower: Sequence[int],
                        upper: Sequence[float], blocks: int, a: float, b: float) -> tuple[float, list[int]] | None:
    """Least a·max_r(c_r + n_r·t_r) + b·Σ_r(c_r + n_r·t_r) over integer n with Σ n = blocks and
    lower_r ≤ n_r ≤ upper_r; None when no count vector exists.

    For a bottleneck T, the least Σ fills the cheapest ranks first up to min(upper, ⌊(T − c)/t⌋).
    The optimal T is one of the c_r + n·t_r: the least feasible one is found by selection, then the
    larger ones are tried, a chunk at a time in one array computation, until a·T + b·(least Σ over all
    T) cannot beat the best found (at once when b = 0).
    """
    fixed, time_ = np.asarray(fixed_s, dtype=float), np.asarray(block_s, dtype=float)
    lo, pp = np.asarray(lower, dtype=np.int64), len(fixed_s)
    hi = np.minimum(np.asarray(upper, dtype=float), blocks).astype(np.int64)
    if np.any(lo > hi) or lo.sum() > blocks or hi.sum() < blocks:
        return None
    cheapest = np.lexsort((np.arange(pp), time_))  # by block time, then rank
    spare = blocks - lo.sum()
    positive = time_ > 0

    def caps_at(bottlenecks: np.ndarray) -> np.ndarray:
        """Most blocks per rank (columns) under each bottleneck (rows)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            room = np.where(positive, np.floor((bottlenecks[:, None] - fixed) / np.where(positive, time_, 1) + 1e-9),
                            np.where(fixed <= bottlenecks[:, None] * (1 + 1e-12), blocks, -1))
        return np.minimum(hi, room).astype(np.int64)

    def fill(caps: np.ndarray) -> np.ndarray:
        """Counts per rank (rows: feasible caps): the blocks beyond the least go to the cheapest ranks first."""
        room = (caps - lo)[:, cheapest]
        before = np.cumsum(room, axis=1) - room
        counts = np.broadcast_to(lo, caps.shape).copy()
        counts[:, cheapest] += np.clip(spare - before, 0, room)
        return counts

    least_sum = float(fixed.sum() + fill(hi[None, :])[0] @ time_)
    # Above every rank's least load, Σ caps(T) = Σ lower + #{(r, n): lower_r < n ≤ upper_r, c_r + n·t_r ≤ T}:
    # the least feasible bottleneck is the larger of that least load and the (blocks − Σ lower)-th such value.
    rank = np.repeat(np.arange(pp), hi - lo)
    steps = np.arange(len(rank)) - np.repeat(np.cumsum(hi - lo) - (hi - lo), hi - lo) + 1
    increments = fixed[rank] + (lo[rank] + steps) * time_[rank]
    least = float(np.max(fixed + lo * time_))
    if spare > 0:
        least = max(least, float(np.partition(increments, spare - 1)[spare - 1]))
    # with b = 0 the least feasible bottleneck is optimal; else larger ones may lower the sum
    values = np.unique(np.concatenate(([least], increments[increments > least]))) if b else np.array([least])
    low, chunk = 0, 1
    best: tuple[float, list[int]] | None = None
    while low < len(values) and (best is None or a * values[low] + b * least_sum < best[0]):
        counts = fill(caps_at(values[low:low + chunk]))  # every bottleneck from the least feasible one is feasible
        loads = fixed + counts * time_
        totals = a * loads.max(axis=1) + b * loads.sum(axis=1)
        at = int(np.argmin(totals))
        if best is None or totals[at] < best[0] - 1e-15:
            best = (float(totals[at]), counts[at].tolist())
        low, chunk = low + chunk, chunk * 8
    return best


# ---- event simulator ------------------------------------------------------------------------
# The closed form is what the ILP optimises. The simulator replays the framework's actual per-rank
# order of forward and backward passes with per-stage times and p2p transfers, so it sees what the
# closed form cannot: forward/backward imbalance between stages, p2p latency on the critical path,
# and the exact interleaved order.


class PassEvent(NamedTuple):
    """One forward or backward pass of one micro-batch on one virtual stage (a NamedTuple: the
    simulator creates tens of thousands per call)."""

    kind: str  # FORWARD, BACKWARD or WEIGHT
    stage: int  # virtual stage k (the schedule's `rank_stage` of rank and chunk)
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
    # each rank's share of the iteration, whose largest is `iteration_s`: its last pass's end, from its first pass's
    # start where iterations tile
    rank_spans_s: tuple[float, ...] = ()

    def rank_events(self, pp_rank: int) -> list[PassEvent]:
        """The passes of one pipeline rank in execution order."""
        return sorted((e for e in self.events if e.pp_rank == pp_rank), key=lambda e: e.start_s)


def simulate(
    forward_s: Sequence[float], backward_s: Sequence[float], p2p_s: Sequence[float], pp: int,
    num_microbatches: int, schedule: ScheduleRef, record: bool = True, weight_s: Sequence[float] | None = None,
    queue_depth: int = 0,
) -> Timeline:
    """Event simulation of one iteration's pipeline part, every pass of every micro-batch.

    `forward_s[k]` / `backward_s[k]`: time of one micro-batch's pass on virtual stage k (on the
    rank `stage_ranks` gives, chunk k div pp); `p2p_s[k]`: one-way transfer time across the boundary k → k+1
    (the backward gradient takes the same time the other way). A pass starts when its rank is
    free and its input has arrived; ranks follow the schedule's order strictly (no reordering), and
    transfers overlap compute (asynchronous send/recv). `record=False` skips the per-pass events.
    `weight_s[k]`: the weight-gradient part of `backward_s[k]`, run as its own W pass by schedules that
    split the backward (none: nothing to split, W passes take no time). `queue_depth`: under local learning, the
    boundary tensors a stage may have sent that the next stage has not taken (its forward not started); a forward
    that would overfill the queue ends only when a slot frees (0: unbounded).
    """
    stages = len(forward_s)
    if len(backward_s) != stages or len(p2p_s) < stages - 1 or stages % pp:
        raise PlannerError(
            f"simulate: need one forward, backward and boundary time per virtual stage (a multiple of pp={pp}); "
            f"got {stages}, {len(backward_s)}, {len(p2p_s)}"
        )
    vpp = stages // pp
    behaviour = schedule_of(schedule)
    if not behaviour.runnable(pp, num_microbatches):
        raise PlannerError(
            f"simulate: the {behaviour.kind.value} schedule with pp={pp} needs {behaviour.runnable_rule}, got "
            f"{num_microbatches}"
        )
    weight = [0.0] * stages if weight_s is None or not behaviour.splits_backward else weight_s
    times = PassTimes(tuple(forward_s), tuple(b - w for b, w in zip(backward_s, weight, strict=True)),
                      tuple(weight), tuple(p2p_s))
    orders = behaviour.orders(pp, vpp, num_microbatches, times)
    return _replay(behaviour, orders, times, num_microbatches, record, queue_depth)


def _replay(behaviour: PipelineSchedule, orders: Sequence[Sequence[tuple[str, int, int]]], times: PassTimes,
            num_microbatches: int, record: bool = False, queue_depth: int = 0) -> Timeline:
    """Run each rank's `orders` strictly in order under `behaviour`'s layout and rules (`simulate`)."""
    pp, stages, p2p_s = len(orders), len(times.forward_s), times.p2p_s
    vpp = stages // pp
    stage_of = [[behaviour.rank_stage(r, chunk, pp) for chunk in range(vpp)] for r in range(pp)]
    durations = {FORWARD: times.forward_s, BACKWARD: times.input_grad_s, WEIGHT: times.weight_s}
    # end time of each pass, -1 until it has run: ends[kind][k][mb]
    ends = {kind: [[-1.0] * num_microbatches for _ in range(stages)] for kind in durations}
    forward_starts = [[-1.0] * num_microbatches for _ in range(stages)]
    local = behaviour.local_losses
    rank_free = [0.0] * pp
    rank_start = [math.inf] * pp
    cursor = [0] * pp
    events: list[PassEvent] = []
    waiting: dict[tuple[str, int, int], list[int]] = {}  # a pass not run yet → the ranks blocked on it
    runnable = list(range(pp))
    while runnable:
        r = runnable.pop()
        order = orders[r]
        while cursor[r] < len(order):
            kind, chunk, mb = order[cursor[r]]
            k = stage_of[r][chunk]
            ready, missing = _input_ready(ends, kind, k, mb, stages, p2p_s, local)
            bounded = local and kind == FORWARD and 0 < queue_depth <= mb and k < stages - 1
            if missing is None and bounded and ends[FORWARD][k + 1][mb - queue_depth] < 0:
                missing = (FORWARD, k + 1, mb - queue_depth)  # the slot this send needs is not free yet
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            start = max(rank_free[r], ready)
            if not cursor[r]:  # a rank's passes run in order: its first starts first
                rank_start[r] = start
            end = start + durations[kind][k]
            if kind == FORWARD:
                forward_starts[k][mb] = start
            if bounded:
                end = max(end, forward_starts[k + 1][mb - queue_depth])
            ends[kind][k][mb] = end
            rank_free[r] = end
            if record:
                events.append(PassEvent(kind, k, r, chunk, mb, start, end))
            cursor[r] += 1
            if waiting:
                runnable.extend(waiting.pop((kind, k, mb), ()))
    if any(cursor[r] < len(orders[r]) for r in range(pp)):  # cannot happen for the schedules' orders
        raise PlannerError(f"simulate: {behaviour.kind.value} order deadlocked with pp={pp}, m={num_microbatches}")
    spans = [end - start for start, end in zip(rank_start, rank_free, strict=True)] if behaviour.tiles_iterations \
        else rank_free
    return Timeline(max(spans), tuple(events), tuple(spans))


def _input_ready(ends: dict[str, list[list[float]]], kind: str, k: int, mb: int, stages: int,
                 p2p_s: Sequence[float], local: bool = False) -> tuple[float, tuple[str, int, int] | None]:
    """When the input of a pass is available, or the pass it still waits for (a W: its own B; a B under local
    learning: its own F alone, no gradient comes from downstream)."""
    if kind == WEIGHT:
        own_backward = ends[BACKWARD][k][mb]
        return (0.0, (BACKWARD, k, mb)) if own_backward < 0 else (own_backward, None)
    if kind == FORWARD:
        if k == 0:
            return 0.0, None
        upstream = ends[FORWARD][k - 1][mb]
        return (0.0, (FORWARD, k - 1, mb)) if upstream < 0 else (upstream + p2p_s[k - 1], None)
    own_forward = ends[FORWARD][k][mb]
    if own_forward < 0:
        return 0.0, (FORWARD, k, mb)
    if k == stages - 1 or local:
        return own_forward, None
    downstream = ends[BACKWARD][k + 1][mb]
    if downstream < 0:
        return 0.0, (BACKWARD, k + 1, mb)
    return max(own_forward, downstream + p2p_s[k]), None


@lru_cache(maxsize=4096)
def _periodic_iteration_s(forward_s: tuple[float, ...], backward_s: tuple[float, ...], pp: int,
                          num_microbatches: int, schedule: ScheduleRef,
                          weight_s: tuple[float, ...] | None = None, queue_depth: int = 0) -> float:
    """The simulated iteration time at a cost that does not grow with m. Cached: configurations that
    differ only in what the pipeline does not see (ZeRO stage, optimizer sharding) share one simulation.
    `weight_s`: the weight-gradient part of each backward, `queue_depth`: local learning's queue (`simulate`).

    The order is fixed, so the simulation is a longest path in a max-plus system: past a transient
    every further group of pp micro-batches adds the same time (its critical cycle, which for interleaved
    orders can exceed the busiest rank's work, and is never below it: every rank runs all its passes one
    after another). Simulations at m₀ + i·pp, i < 4 (m₀ ≡ m mod pp) that grow by one equal step three times,
    at least the busiest rank's work per group, and a fifth at m₀ + 8pp that the step predicts, show the
    transient is over and the rest is extrapolated at that step; otherwise m₀ doubles, and a transient as
    long as m is simulated whole. (A step below the busiest rank's work is a slower cycle still being
    overtaken: ZB-H1 at pp 3 grows by 18.208 s per group until m = 54, then by rank 0's 18.305 s.)
    """
    vpp = len(forward_s) // pp
    zeros = [0.0] * len(forward_s)
    base = pp * vpp
    busiest = pp * max(rank_times([f + b for f, b in zip(forward_s, backward_s, strict=True)], pp, schedule))

    def simulated(m: int) -> float:
        return simulate(forward_s, backward_s, zeros, pp, m, schedule, record=False,
                        weight_s=weight_s, queue_depth=queue_depth).iteration_s

    # the prefix simulations cost about 5·m₀ + 14pp micro-batches: worth it only when m is larger
    extrapolated = schedule_of(schedule).periodic(pp, num_microbatches)
    while extrapolated and 5 * (start := base + num_microbatches % pp) + 14 * pp < num_microbatches:
        times = [simulated(start + i * pp) for i in range(4)]
        steps = [b - a for a, b in itertools.pairwise(times)]
        if (all(abs(step - steps[0]) <= 1e-9 * times[-1] for step in steps)
                and steps[0] >= busiest - 1e-9 * times[-1]
                and abs(simulated(start + 8 * pp) - times[3] - 5 * steps[0]) <= 1e-9 * times[-1]):
            return times[3] + (num_microbatches - start - 3 * pp) / pp * steps[0]
        base *= 2
    return simulated(num_microbatches)


def simulated_pipeline_time(forward_s: Sequence[float], backward_s: Sequence[float], pp: int,
                            num_microbatches: int, schedule: ScheduleRef,
                            weight_s: Sequence[float] | None = None, queue_depth: int = 0) -> PipelineTime:
    """`pipeline_time` from the event simulator: pass times include the stage's blocking p2p sends,
    so no separate transfer delay is added; the bottleneck is the busiest rank. `weight_s`: the
    weight-gradient part of each backward, `queue_depth`: local learning's queue (`simulate`)."""
    total = _periodic_iteration_s(tuple(forward_s), tuple(backward_s), pp, num_microbatches, schedule,
                                  None if weight_s is None else tuple(weight_s), queue_depth)
    busy = [num_microbatches * t
            for t in rank_times([f + b for f, b in zip(forward_s, backward_s, strict=True)], pp, schedule)]
    slowest = max(range(pp), key=lambda r: (busy[r], -r))
    return PipelineTime(total, slowest, busy[slowest])
