"""The ILP stage partition against the exact DP and brute force (DESIGN.md "Search": cross-check)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import Schedule
from planner.search.partition import PartitionProblem, dp_partition, fits, ilp_partition, objective_s


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


def test_upper_bound_from_dp_keeps_the_optimum() -> None:
    problem = PartitionProblem(((1.0, 3.0, 1.0, 1.0, 2.0, 1.0),) * 2, (0.1, 0.1), ((1.0,) * 6,) * 2, (10.0, 10.0),
                               1, 4, Schedule.ONE_F_ONE_B)
    dp = dp_partition(problem)
    assert ilp_partition(problem, upper_bound=dp).objective_s == dp.objective_s == brute_force(problem)


def test_memory_too_small_has_no_partition() -> None:
    problem = PartitionProblem(((1.0,) * 4,) * 2, (0.0, 0.0), ((3.0,) * 4,) * 2, (5.0, 5.0), 1, 2,
                               Schedule.ONE_F_ONE_B)
    assert dp_partition(problem) is None and ilp_partition(problem) is None
