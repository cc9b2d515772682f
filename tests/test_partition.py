"""The ILP stage partition against the exact DP and brute force (DESIGN.md "Search": cross-check)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import Schedule
from planner.cost.schedule import simulated_pipeline_time
from planner.search.partition import (
    PartitionProblem,
    _stage_budgets,
    balanced_objective_s,
    dp_partition,
    fits,
    ilp_partition,
    objective_s,
    stage_times,
    within_budget,
)


@st.composite
def problems(draw, interleaved: bool = False) -> PartitionProblem:
    pp = draw(st.integers(2 if interleaved else 1, 3))
    vpp = 2 if interleaved else 1
    n = draw(st.integers(pp * vpp, 8))
    times = st.floats(0.1, 5.0, allow_nan=False)
    unit_time = tuple(tuple(draw(times) for _ in range(n)) for _ in range(pp))
    unit_memory = tuple(tuple(draw(st.floats(1e9, 5e9)) for _ in range(n)) for _ in range(pp))
    budgets = tuple(draw(st.floats(2e9, 5e9 * n / pp)) for _ in range(pp))
    boundary = tuple(draw(st.floats(0.0, 0.5)) for _ in range(pp))
    schedule = draw(st.sampled_from([Schedule.INTERLEAVED, Schedule.INTERLEAVED_ZB, Schedule.ZB_V] if interleaved
                                    else [Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.ZB_H1, Schedule.ZB_H2]))
    return PartitionProblem(unit_time, boundary, unit_memory, budgets, vpp, draw(st.integers(1, 16)), schedule)


def brute_force(problem: PartitionProblem) -> float | None:
    n, stages = problem.num_units, problem.num_stages
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True)]
        if fits(problem, counts):
            value = objective_s(problem, counts)
            best = value if best is None else min(best, value)
    return best


@settings(max_examples=60, deadline=None)
@given(problems())
def test_ilp_optimum_equals_dp_optimum_and_brute_force(problem: PartitionProblem) -> None:
    exact = brute_force(problem)
    dp = dp_partition(problem)
    ilp = ilp_partition(problem)
    assert (exact is None) == (dp is None) == (ilp is None)
    if exact is not None:
        assert abs(dp.objective_s - exact) <= 1e-9 * exact
        assert abs(ilp.objective_s - exact) <= 1e-4 * exact  # the solver's relative gap
        assert fits(problem, ilp.partition.unit_counts) and fits(problem, dp.partition.unit_counts)
        assert ilp.partition.num_units == problem.num_units and ilp.partition.num_stages == problem.num_stages


@settings(max_examples=25, deadline=None)
@given(problems(interleaved=True))
def test_interleaved_ilp_matches_brute_force(problem: PartitionProblem) -> None:
    exact = brute_force(problem)
    ilp = ilp_partition(problem)
    assert (exact is None) == (ilp is None)
    if exact is not None:
        assert abs(ilp.objective_s - exact) <= 1e-4 * exact


def _splits(problem: PartitionProblem):
    n, stages = problem.num_units, problem.num_stages
    for cuts in itertools.combinations(range(1, n), stages - 1):
        yield [b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True)]


def _within_stage_budgets(problem: PartitionProblem, counts: list[int]) -> bool:
    ends = list(itertools.accumulate(counts, initial=0))
    return all(within_budget(sum(problem.unit_memory_bytes[rank][start:end]), budget)
               for rank, start, end, budget in zip(problem.stage_ranks, ends[:-1], ends[1:], _stage_budgets(problem),
                                                   strict=True))


@settings(max_examples=40, deadline=None)
@given(problems(interleaved=True))
def test_interleaved_dp_is_the_stage_balanced_optimum(problem: PartitionProblem) -> None:
    """With chunks the DP minimises the closed form with each rank paced by its slowest stage, exactly, over the
    splits within the stages' memory shares; what it returns fits the problem's own budgets."""
    values = [balanced_objective_s(problem, counts) for counts in _splits(problem)
              if _within_stage_budgets(problem, counts)]
    dp = dp_partition(problem)
    assert (dp is None) == (not values)
    if dp is not None:
        assert fits(problem, dp.partition.unit_counts)
        assert balanced_objective_s(problem, dp.partition.unit_counts) == pytest.approx(min(values), rel=1e-9)
        assert dp.objective_s == pytest.approx(objective_s(problem, dp.partition.unit_counts))


def test_dp_gives_chunks_alike_where_the_closed_form_cannot_tell_them_apart() -> None:
    """Two ranks, two chunks each, ten alike blocks and a heavy one: the closed form sees only the rank loads,
    so a split with one-block chunks beside heavy ones is as good to it as a balanced one; paced by each rank's
    slowest chunk, the DP picks chunks within one block of each other, which the simulated order runs faster."""
    times = (0.1, *(1.0,) * 5, 3.0, *(1.0,) * 5, 0.1)
    problem = PartitionProblem((times, times), (0.0, 0.0), ((0.0,) * 13,) * 2, (1.0, 1.0), 2, 8,
                               Schedule.INTERLEAVED)
    lopsided = [2, 1, 5, 5]  # rank 0: 2 + 5 blocks' time, rank 1: 1 + 5 + heavy: the closed form's optimum loads
    dp = dp_partition(problem)
    assert dp is not None
    assert objective_s(problem, lopsided) <= dp.objective_s * (1 + 1e-9)
    assert balanced_objective_s(problem, dp.partition.unit_counts) < balanced_objective_s(problem, lopsided)
    stages = stage_times(problem, dp.partition.unit_counts)
    assert max(stages) - min(stages) <= 3.0

    def simulated(counts: list[int]) -> float:
        times = stage_times(problem, counts)
        return simulated_pipeline_time([t / 3 for t in times], [2 * t / 3 for t in times], 2, 8,
                                       Schedule.INTERLEAVED).total_s

    assert simulated(list(dp.partition.unit_counts)) < simulated(lopsided)


def test_upper_bound_from_dp_keeps_the_optimum() -> None:
    problem = PartitionProblem(((1.0, 3.0, 1.0, 1.0, 2.0, 1.0),) * 2, (0.1, 0.1), ((1.0,) * 6,) * 2, (10.0, 10.0),
                               1, 4, Schedule.ONE_F_ONE_B)
    dp = dp_partition(problem)
    assert ilp_partition(problem, upper_bound=dp).objective_s == dp.objective_s == brute_force(problem)


def test_memory_too_small_has_no_partition() -> None:
    problem = PartitionProblem(((1.0,) * 4,) * 2, (0.0, 0.0), ((3.0,) * 4,) * 2, (5.0, 5.0), 1, 2,
                               Schedule.ONE_F_ONE_B)
    assert dp_partition(problem) is None and ilp_partition(problem) is None
