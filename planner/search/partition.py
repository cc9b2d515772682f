"""Stage partition: units (embedding, blocks, head) → contiguous, ordered (virtual) stages.

The objective is the schedule's pipeline time (cost/schedule.py), which is linear in the stage
times: a·T + b·Σ τ_s with T ≥ every rank's per-micro-batch work. Each pipeline rank has its own
unit times (its GPU type and TP link) and its own memory budget (its capacity, in-flight
micro-batches, sharding), so mixed clusters need no other model.

`ilp_partition` solves it with PuLP (HiGHS in-process when importable, else CBC), bounded by
`dp_partition` — an exact dynamic programme for one chunk per rank — as DESIGN.md "Search"
describes: the DP optimum is an upper bound, units are fixed outside the stage window that bound
allows, and the perfectly balanced stage time is a lower bound on T. With chunks per rank the DP
minimises the closed form with every rank paced by its slowest chunk instead (`balanced_objective_s`),
whose stage-balanced splits the search takes: the closed form alone cannot tell them from splits
with one-block chunks beside heavy ones, which the simulated order runs far slower.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import pulp

from planner.config import Partition, Schedule
from planner.cost.schedule import (
    JointTypes,
    RankTerms,
    costlier_sets,
    least_linear,
    pipeline_time,
    schedule_of,
    stage_ranks,
)
from planner.cost.time import stage_boundary_s

__all__ = [
    "PartitionProblem",
    "PartitionResult",
    "balanced_objective_s",
    "bound_partition",
    "dp_partition",
    "fits",
    "ilp_partition",
    "objective_s",
    "solver_name",
    "stage_times",
]

# "Optimal" means within 0.01 % of the optimum: interleaved splits have many equivalent optima.
GAP_REL = 1e-4
MEMORY_TOLERANCE = 1e-9  # relative slack on memory budgets for float rounding (1 byte per GB)


@dataclass(frozen=True)
class PartitionProblem:
    """Everything the partitioner needs; equal problems have equal answers (the search caches on it).

    `unit_time_s[r][u]`: time of unit u per micro-batch on pipeline rank r (compute, recompute, TP);
    `boundary_s[r]`: p2p time after a stage on rank r (none after the last stage);
    `unit_memory_bytes[r][u]`: bytes unit u adds to rank r; `memory_budget_bytes[r]`: what rank r
    may hold; stages are virtual: stage k runs on rank `stage_ranks[k]` (the schedule's layout).
    """

    unit_time_s: tuple[tuple[float, ...], ...]
    boundary_s: tuple[float, ...]
    unit_memory_bytes: tuple[tuple[float, ...], ...]
    memory_budget_bytes: tuple[float, ...]
    vpp: int
    num_microbatches: int
    schedule: Schedule

    @property
    def pp(self) -> int:
        return len(self.unit_time_s)

    @property
    def num_units(self) -> int:
        return len(self.unit_time_s[0])

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def stage_ranks(self) -> tuple[int, ...]:
        """The pipeline rank of each virtual stage (cost/schedule.py `stage_ranks`)."""
        return stage_ranks(self.schedule, self.pp, self.num_stages)

    def boundaries(self) -> list[float]:
        """The p2p time each stage pays per micro-batch (cost/time.py `stage_boundary_s`)."""
        return stage_boundary_s(self.boundary_s, self.num_stages, self.schedule)


@dataclass(frozen=True)
class PartitionResult:
    """A partition, its pipeline time, and how it was found."""

    partition: Partition
    objective_s: float
    optimal: bool  # False when the solver hit its time limit and returned the best found
    method: str  # "ilp", "dp", "bound" (met the rank-load lower bound), "uniform" or "single stage"


def linear_form(problem: PartitionProblem) -> tuple[float, float]:
    """(a, b) with pipeline time = a·max_r R_r + b·Σ_r R_r — the schedule's closed form."""
    return schedule_of(problem.schedule).linear_form(problem.num_microbatches, problem.vpp)


def stage_times(problem: PartitionProblem, counts: Sequence[int]) -> list[float]:
    """Per-micro-batch time of each stage: its units on its rank plus its boundaries (both ends)."""
    times, start = [], 0
    for count, boundary, rank in zip(counts, problem.boundaries(), problem.stage_ranks, strict=True):
        times.append(sum(problem.unit_time_s[rank][start:start + count]) + boundary)
        start += count
    return times


def objective_s(problem: PartitionProblem, counts: Sequence[int]) -> float:
    """Pipeline time of a partition, by cost/schedule.py itself."""
    return pipeline_time(stage_times(problem, counts), problem.pp, problem.num_microbatches,
                         problem.schedule).total_s


def fits(problem: PartitionProblem, counts: Sequence[int]) -> bool:
    used, start = [0.0] * problem.pp, 0
    for count, rank in zip(counts, problem.stage_ranks, strict=True):
        used[rank] += sum(problem.unit_memory_bytes[rank][start:start + count])
        start += count
    return all(within_budget(u, b) for u, b in zip(used, problem.memory_budget_bytes, strict=True))


def within_budget(used: float | np.ndarray, budget: float) -> bool | np.ndarray:
    """`used` ≤ `budget` up to float rounding (sums and prefix differences of the same bytes may differ
    in the last bits; the DP, the relaxation and the ILP's check must agree)."""
    return used <= budget + MEMORY_TOLERANCE * abs(budget)


# ---- rank-load relaxation: a lower bound that usually closes the problem -------------------------
# The objective depends on the stages only through the rank loads R_r; relaxed to "how many blocks
# does each rank hold" (cost/schedule.py `least_linear`), its optimum is a valid lower bound,
# attained when the blocks on each rank are alike — then proven without a solver.


def _rank_terms(problem: PartitionProblem) -> RankTerms:
    """Per rank: fixed time (first/last unit, boundaries), cheapest block time, least and most blocks; the blocks
    grouped into types by their times on every rank (`costlier_sets`). The forward terms are not used here."""
    n, pp, v = problem.num_units, problem.pp, problem.vpp
    fixed, block, lower, rooms = [], [], [], []
    ranks, boundaries = problem.stage_ranks, problem.boundaries()
    for r in range(pp):
        first, last = ranks[0] == r, ranks[-1] == r
        times, memory = problem.unit_time_s[r], problem.unit_memory_bytes[r]
        fixed.append(times[0] * first + times[n - 1] * last
                     + sum(b for b, rank in zip(boundaries, ranks, strict=True) if rank == r))
        block.append(min(times[1:n - 1], default=0.0))
        lower.append(max(v - first - last, 0))
        rooms.append(problem.memory_budget_bytes[r] - memory[0] * first - memory[n - 1] * last)
    types: dict[tuple[float, ...], list[int]] = {}
    for u, times in enumerate(_block_times(problem), start=1):
        types.setdefault(times, []).append(u)

    def most(r: int, units: Sequence[int]) -> float:
        """Most blocks rank r's memory holds, each at the least bytes of `units` on it."""
        least = min((problem.unit_memory_bytes[r][u] for u in units), default=0.0)
        return -1.0 if rooms[r] < 0 else math.inf if least <= 0 else math.floor(rooms[r] / least + 1e-9)

    zeros = (0.0,) * pp
    # counted together, blocks are alike in times and bytes on every rank (dense and MoE blocks may tie in time)
    kinds: dict[tuple[tuple[float, ...], tuple[float, ...]], int] = {}
    for u, times in enumerate(_block_times(problem), start=1):
        key = (times, tuple(memory[u] for memory in problem.unit_memory_bytes))
        kinds[key] = kinds.get(key, 0) + 1
    joint = JointTypes(tuple(times for times, _ in kinds), tuple(memory for _, memory in kinds), tuple(kinds.values()),
                       tuple(room + MEMORY_TOLERANCE * abs(budget)
                             for room, budget in zip(rooms, problem.memory_budget_bytes, strict=True))
                       ) if len(kinds) > 1 else None
    return RankTerms(tuple(fixed), tuple(block), tuple(lower), zeros, zeros, zeros,
                     tuple(most(r, range(1, n - 1)) for r in range(pp)),
                     costlier_sets(list(types), [len(units) for units in types.values()],
                                   [[most(r, units) for r in range(pp)] for units in types.values()]), joint=joint)


def _block_times(problem: PartitionProblem) -> list[tuple[float, ...]]:
    """Each block's times on every rank: blocks alike in them are one type to the bounds and the ILP."""
    return [tuple(times[u] for times in problem.unit_time_s) for u in range(1, problem.num_units - 1)]


def _stage_counts(problem: PartitionProblem, rank_blocks: Sequence[int]) -> list[int]:
    """A contiguous partition with the given blocks per rank, spread evenly over each rank's stages
    (the first and last unit count as one unit of their stage)."""
    pp, stages = problem.pp, problem.num_stages
    counts = [int(k == 0) + int(k == stages - 1) for k in range(stages)]
    ranks = problem.stage_ranks
    for r in range(pp):
        own = [k for k in range(stages) if ranks[k] == r]
        left = rank_blocks[r]
        for k in own:  # every stage needs a unit
            if counts[k] == 0:
                counts[k], left = 1, left - 1
        for _ in range(left):
            k = min(own, key=lambda s: (counts[s], s))
            counts[k] += 1
    return counts


def bound_partition(problem: PartitionProblem) -> tuple[float, PartitionResult | None]:
    """(lower bound on the pipeline time, a fitting partition from the relaxation or None).

    The bound is the rank-load relaxation's optimum (math.inf when nothing fits); the partition is
    the even split or one realising the relaxation's counts contiguously, flagged optimal (method
    "bound") when its objective meets the bound to within GAP_REL — then no solver needs to run.
    """
    if problem.num_stages == 1:
        whole = [problem.num_units]
        result = PartitionResult(Partition((problem.num_units,)), objective_s(problem, whole), True, "single stage")
        return result.objective_s, result if fits(problem, whole) else None
    a, b = linear_form(problem)
    terms = _rank_terms(problem)
    bound, rank_blocks = least_linear(terms.fixed_s, terms, problem.num_units - 2, a, b)
    if rank_blocks is None:
        return math.inf, None
    found: PartitionResult | None = None
    # Megatron-LM's even split first: where it meets the bound too, it needs no custom layout.
    even = ([list(Partition.uniform(problem.num_units - 2, problem.num_stages).unit_counts)]
            if problem.num_units - 2 >= problem.num_stages else [])
    for counts in (*even, _stage_counts(problem, rank_blocks)):
        if not fits(problem, counts):
            continue
        loads = rank_loads(problem, counts)
        proven = a * max(loads) + b * sum(loads) <= bound * (1 + GAP_REL)
        if proven or found is None:
            found = PartitionResult(Partition(tuple(counts)), objective_s(problem, counts), proven,
                                    "bound" if proven else "rank counts")
        if proven:
            break
    return bound, found


def rank_loads(problem: PartitionProblem, counts: Sequence[int]) -> list[float]:
    """Per-rank work per micro-batch of a partition: the sum of its stages' times."""
    loads = [0.0] * problem.pp
    for time_s, rank in zip(stage_times(problem, counts), problem.stage_ranks, strict=True):
        loads[rank] += time_s
    return loads


# ---- stage-balanced dynamic programme (the closed form's optimum for one chunk per rank) ----------

def _stage_tables(problem: PartitionProblem) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per stage, every segment [i, j)'s stage time and whether it may be that stage (i < j, within the stage's
    memory share, `_stage_budgets`): what `_min_sum` reads, the same for every cap."""
    n = problem.num_units
    upper = np.triu(np.ones((n + 1, n + 1), dtype=bool), 1)  # segment [i, j) with i < j
    boundaries, budgets = problem.boundaries(), _stage_budgets(problem)
    prefixes = {}
    tables = []
    for k, rank in enumerate(problem.stage_ranks):
        if rank not in prefixes:
            prefixes[rank] = (np.concatenate(([0.0], np.cumsum(problem.unit_time_s[rank]))),
                              np.concatenate(([0.0], np.cumsum(problem.unit_memory_bytes[rank]))))
        prefix_t, prefix_m = prefixes[rank]
        cost = prefix_t[None, :] - prefix_t[:, None] + boundaries[k]
        tables.append((cost, upper & within_budget(prefix_m[None, :] - prefix_m[:, None], budgets[k])))
    return tables


def _min_sum(tables: list[tuple[np.ndarray, np.ndarray]], cap_s: float) -> tuple[float, list[int]] | None:
    """Least Σ stage times with every stage ≤ cap_s and within its share of memory (`_stage_tables`); None if
    impossible."""
    n = len(tables[0][0]) - 1
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choices = []
    columns = np.arange(n + 1)
    for cost, allowed in tables:
        total = np.where(allowed & (cost <= cap_s), best[:, None] + cost, np.inf)
        choices.append(np.argmin(total, axis=0))
        best = total[choices[-1], columns]
    if not np.isfinite(best[n]):
        return None
    counts, end = [], n
    for choice in reversed(choices):
        start = int(choice[end])
        counts.append(end - start)
        end = start
    return float(best[n]), counts[::-1]


def _stage_budgets(problem: PartitionProblem) -> list[float]:
    """Each stage's memory budget in the DP, together at most its rank's so every split the DP returns fits: for
    one chunk per rank the rank's budget; with chunks its end unit (the embedding in the first stage, the head in
    the last) plus a whole number of the rank's largest blocks — the c blocks its rank holds beside its end units
    dealt out evenly, c mod vpp of its stages one more, those without an end unit first (even byte shares would
    round every stage down: a rank with room for 16 blocks over 5 chunks would hold 15)."""
    n, stages, ranks = problem.num_units, problem.num_stages, problem.stage_ranks
    if problem.vpp == 1:
        return [problem.memory_budget_bytes[rank] for rank in ranks]
    ends = [0.0] * stages
    ends[0] += problem.unit_memory_bytes[ranks[0]][0]
    ends[-1] += problem.unit_memory_bytes[ranks[-1]][n - 1]
    budgets = [0.0] * stages
    for rank in range(problem.pp):
        own = sorted((k for k in range(stages) if ranks[k] == rank), key=lambda k: (k in (0, stages - 1), k))
        room = problem.memory_budget_bytes[rank] - sum(ends[k] for k in own)
        largest = max(problem.unit_memory_bytes[rank][1:n - 1], default=0.0)
        blocks = math.floor(room / largest) if largest > 0 and room >= 0 else 0
        for dealt, k in enumerate(own):
            share = (blocks // problem.vpp + (dealt < blocks % problem.vpp)) * largest if blocks else room / problem.vpp
            budgets[k] = ends[k] + share
    return budgets


def dp_partition(problem: PartitionProblem) -> PartitionResult | None:
    """Exact optimum of a·vpp·max_k τ_k + b·Σ τ_k over contiguous splits with every stage within its memory share
    (`_stage_budgets`): min over the largest stage time T of a·vpp·T + min Σ. For one chunk per rank (1F1B,
    GPipe) that is the closed form itself; with vpp chunks per rank vpp·max τ ≥ max_r R_r, so it is the closed
    form with each rank paced by its slowest chunk — the stage-balanced splits the simulated interleaved order
    runs near its closed form (a split with one-block chunks beside heavy ones meets the closed form's optimum
    and simulates 50 % slower).

    The optimal T is some segment's stage time, so it is enough to try those values in increasing order: binary
    search finds the smallest feasible one, and the scan stops once a·vpp·T plus the least possible Σ cannot
    beat the best found. None: no split fits the memory shares.
    """
    a, b = _balanced_form(problem)
    candidates, tables = _segment_times(problem), _stage_tables(problem)
    lo, hi = 0, len(candidates) - 1
    if _min_sum(tables, candidates[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _min_sum(tables, candidates[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    least_sum = _min_sum(tables, math.inf)[0]  # type: ignore[index]
    best: tuple[float, list[int]] | None = None
    for cap in candidates[lo:]:
        if best is not None and a * cap + b * least_sum >= best[0]:
            break
        found = _min_sum(tables, cap)
        if found is not None:
            value = balanced_objective_s(problem, found[1])
            if best is None or value < best[0] - 1e-15:
                best = (value, found[1])
    assert best is not None
    return PartitionResult(Partition(tuple(best[1])), objective_s(problem, best[1]), True, "dp")


def balanced_objective_s(problem: PartitionProblem, counts: Sequence[int]) -> float:
    """`dp_partition`'s objective: a·vpp·max_k τ_k + b·Σ τ_k, the closed form with every rank at vpp times its
    slowest stage (the closed form itself for one chunk per rank)."""
    a, b = _balanced_form(problem)
    times = stage_times(problem, counts)
    return a * max(times) + b * sum(times)


def _balanced_form(problem: PartitionProblem) -> tuple[float, float]:
    """(a·vpp, b): the coefficients of the largest stage time and of their sum in `balanced_objective_s`."""
    a, b = linear_form(problem)
    return a * problem.vpp, b


def _segment_times(problem: PartitionProblem) -> np.ndarray:
    """Sorted distinct stage times any segment on any stage can have."""
    values = []
    n = problem.num_units
    rows, cols = np.triu_indices(n + 1, 1)
    for rank, boundary in zip(problem.stage_ranks, problem.boundaries(), strict=True):
        prefix = np.concatenate(([0.0], np.cumsum(problem.unit_time_s[rank])))
        values.append(prefix[cols] - prefix[rows] + boundary)
    return np.unique(np.concatenate(values))


# ---- ILP ----------------------------------------------------------------------------------------

@cache
def _highs_available() -> bool:
    """Whether highspy imports; also swallows the banner HiGHS prints once per process on stdout,
    which would otherwise corrupt `planner plan --json` (msg=False only silences later output)."""
    if not pulp.HiGHS(msg=False).available():
        return False
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return True


def solver_name() -> str:
    """The solver `ilp_partition` uses here: HiGHS in-process when highspy imports, else CBC."""
    return "HiGHS (highspy, in-process)" if _highs_available() else "CBC (PuLP bundled)"


def _solver(time_limit_s: float) -> pulp.LpSolver:
    """HiGHS without presolve: HiGHS 1.16's MIP presolve ran past the time limit for minutes on some stage
    partitions (a DeepSeek-V3 pp 4 × vpp 5 one: > 120 s against a 10 s limit; 2.4 s, optimal, without it), and
    the partitions here are small enough that the search is faster without it (DeepSeek-V3 on 2,048 H800:
    86 s against 117 s, same plan)."""
    if _highs_available():
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=1, gapRel=GAP_REL, presolve="off")
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s)


def _stage_windows(problem: PartitionProblem, cap_s: float) -> list[tuple[int, int]]:
    """[earliest, latest] stage each unit can sit in, given every stage ≤ cap_s.

    Uses each unit's fastest rank, so the windows are valid for any rank assignment: stages before
    unit u's need at least ⌈cover(0..u)⌉ − 1 of them, stages after it ⌈cover(u..n−1)⌉ − 1.
    """
    n, stages = problem.num_units, problem.num_stages
    fastest = [min(problem.unit_time_s[r][u] for r in range(problem.pp)) for u in range(n)]

    def covers(order: Sequence[int]) -> list[int]:
        out, used, load = [], 0, math.inf
        for u in order:
            if load + fastest[u] > cap_s * (1 + 1e-12):
                used, load = used + 1, 0.0
            load += fastest[u]
            out.append(used)
        return out

    forward = covers(range(n))
    backward = covers(range(n - 1, -1, -1))[::-1]
    windows = []
    for u in range(n):
        earliest = max(forward[u] - 1, stages - n + u, 0)
        latest = min(stages - backward[u], u, stages - 1)
        windows.append((earliest, max(earliest, latest)))
    return windows


def ilp_partition(problem: PartitionProblem, time_limit_s: float = 10.0,
                  upper_bound: PartitionResult | None = None,
                  lower_bound_s: float | None = None, ceiling_s: float | None = None) -> PartitionResult | None:
    """Optimal partition by ILP; None if no partition fits in memory (or, with `ceiling_s`, none can matter).

    Variables y[u,s] = 1 when unit u sits in stage ≤ s (monotone in u and s, so stages are
    contiguous and ordered). `upper_bound` (a feasible partition, e.g. the DP's) bounds T and the
    stage windows; `lower_bound_s` (e.g. `bound_partition`'s) bounds the objective from below so
    the solver can close its gap; `ceiling_s` is a pipeline time no split that matters exceeds: through the
    schedule's bound form (a·max R + b·Σ R, a lower bound on the simulated time) it caps the bottleneck T and the
    windows, so the ILP looks only at splits whose simulated time can stay under it; with a time limit the best
    partition found so far is returned, flagged.
    """
    n, stages, pp = problem.num_units, problem.num_stages, problem.pp
    if stages == 1:
        if not fits(problem, [n]):
            return None
        return PartitionResult(Partition((n,)), objective_s(problem, [n]), True, "single stage")
    if any(budget < 0 for budget in problem.memory_budget_bytes):
        return None
    a, b = linear_form(problem)
    least_sum = sum(min(problem.unit_time_s[r][u] for r in range(pp)) for u in range(n))
    least_sum += sum(problem.boundaries())
    cap = math.inf
    if upper_bound is not None:
        cap = (upper_bound.objective_s - b * least_sum) / a * (1 + 1e-9) if a > 0 else math.inf
    if ceiling_s is not None:  # least_sum ≤ Σ R for every split, so the cap lets through every split under it
        bound_a, bound_b = schedule_of(problem.schedule).bound_form(problem.num_microbatches)
        cap = min(cap, (ceiling_s - bound_b * least_sum) / bound_a * (1 + 1e-9))
    windows = _stage_windows(problem, cap)
    # Scale so coefficients are near 1: times by the balanced stage time, memory by each budget.
    unit = least_sum / stages if least_sum > 0 else 1.0

    model = pulp.LpProblem("stage_partition", pulp.LpMinimize)
    y: dict[tuple[int, int], pulp.LpVariable] = {}
    for u, (lo, hi) in enumerate(windows):
        for s in range(lo, hi):
            y[u, s] = model.add_variable(f"y_{u}_{s}", cat=pulp.LpBinary)

    def in_prefix(u: int, s: int) -> dict[pulp.LpVariable, float] | float:
        """y[u,s] as {var: 1} or a constant."""
        lo, hi = windows[u]
        if s < lo:
            return 0.0
        return 1.0 if s >= hi else {y[u, s]: 1.0}

    def add(expr: dict[pulp.LpVariable, float], const: list[float], term, coef: float) -> None:
        if isinstance(term, dict):
            for var, value in term.items():
                expr[var] = expr.get(var, 0.0) + coef * value
        else:
            const[0] += coef * term

    # Window edges are monotone in u, so fixed neighbours never contradict: only free pairs need rows.
    for (u, s), var in y.items():
        if (u, s + 1) in y:
            model += var <= y[u, s + 1]
        if (u + 1, s) in y:
            model += y[u + 1, s] <= var
    largest = max(min(problem.unit_time_s[r][u] for r in range(pp)) for u in range(n))
    bottleneck = model.add_variable("T", lowBound=max(least_sum / pp, largest) / unit,
                                    upBound=None if math.isinf(cap) else cap / unit)
    budgets = [budget if budget > 0 else 1.0 for budget in problem.memory_budget_bytes]
    boundaries = problem.boundaries()
    rank_time: list[tuple[dict, list[float]]] = [({}, [0.0]) for _ in range(pp)]
    rank_memory: list[tuple[dict, list[float]]] = [({}, [0.0]) for _ in range(pp)]
    total: tuple[dict, list[float]] = ({}, [0.0])
    rank_units: list[tuple[dict, list[float]]] = [({}, [0.0]) for _ in range(pp)]
    block_times = _block_times(problem)
    kinds = list(dict.fromkeys(block_times))
    kind_of = [-1, *(kinds.index(times) for times in block_times), -1] if len(kinds) > 1 else [-1] * n
    rank_kind_units: list[list[tuple[dict, list[float]]]] = [[({}, [0.0]) for _ in kinds] for _ in range(pp)]
    for s in range(stages):
        r = problem.stage_ranks[s]
        count: tuple[dict, list[float]] = ({}, [0.0])
        for u in range(n):
            # z[u,s] = y[u,s] − y[u,s−1]: unit u sits exactly in stage s
            for term, sign in ((in_prefix(u, s), 1.0), (in_prefix(u, s - 1), -1.0)):
                add(*count, term, sign)
                add(*rank_units[r], term, sign)
                if kind_of[u] >= 0:
                    add(*rank_kind_units[r][kind_of[u]], term, sign)
                add(*rank_time[r], term, sign * problem.unit_time_s[r][u] / unit)
                add(*rank_memory[r], term, sign * problem.unit_memory_bytes[r][u] / budgets[r])
        rank_time[r][1][0] += boundaries[s] / unit
        model += pulp.LpAffineExpression(count[0], constant=count[1][0]) >= 1
    for r in range(pp):
        expr = pulp.LpAffineExpression(rank_time[r][0], constant=rank_time[r][1][0])
        model += expr <= bottleneck
        for var, value in rank_time[r][0].items():
            total[0][var] = total[0].get(var, 0.0) + value
        total[1][0] += rank_time[r][1][0]
        model += pulp.LpAffineExpression(rank_memory[r][0], constant=rank_memory[r][1][0]) <= 1
        # An explicit integer count of the rank's units: branching on it proves rounding bounds
        # (e.g. 32 equal blocks on 8 ranks) that the binaries' LP relaxation cannot see.
        units_on_rank = model.add_variable(f"units_{r}", lowBound=0, upBound=n, cat=pulp.LpInteger)
        model += pulp.LpAffineExpression(rank_units[r][0], constant=rank_units[r][1][0]) == units_on_rank
        # with mixed block types, one per type: the rounding of the costlier blocks sets the bottleneck
        for k, (terms, const) in enumerate(rank_kind_units[r]):
            if terms:
                kind_on_rank = model.add_variable(f"kind_{k}_{r}", lowBound=0, upBound=n, cat=pulp.LpInteger)
                model += pulp.LpAffineExpression(terms, constant=const[0]) == kind_on_rank
    objective = a * bottleneck + b * pulp.LpAffineExpression(total[0], constant=total[1][0])
    model += objective
    if lower_bound_s is not None and math.isfinite(lower_bound_s):
        model += objective >= lower_bound_s / unit * (1 - GAP_REL)
    model.solve(_solver(time_limit_s))
    if model.status != pulp.LpStatusOptimal or model.sol_status not in (
            pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        timed_out = model.status == pulp.LpStatusNotSolved
        if timed_out and upper_bound is not None:
            return PartitionResult(upper_bound.partition, upper_bound.objective_s, False, upper_bound.method)
        return None
    stage_of = []
    for u, (lo, hi) in enumerate(windows):
        below = sum(1 for s in range(lo, hi) if (y[u, s].varValue or 0.0) < 0.5)
        stage_of.append(lo + below)
    counts = [stage_of.count(s) for s in range(stages)]
    if not fits(problem, counts):  # within the solver's tolerance but over budget: keep the bound
        return upper_bound
    found = PartitionResult(Partition(tuple(counts)), objective_s(problem, counts),
                            model.sol_status == pulp.LpSolutionOptimal, "ilp")
    if upper_bound is not None and upper_bound.objective_s < found.objective_s:
        return PartitionResult(upper_bound.partition, upper_bound.objective_s, found.optimal, upper_bound.method)
    return found
