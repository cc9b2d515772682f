"""How a pass's GPU time and its host launch time combine (`overlapped_host_time`, `host_overlap_softness`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.profile.analytic import overlapped_host_time
from planner.profile.calibration import calibration_from_constants, default_calibration

_TIMES = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
_SOFTNESS = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def test_the_ends_of_the_scale_are_the_longer_one_and_the_sum() -> None:
    assert overlapped_host_time(3e-3, 1e-3, 0.0) == 3e-3
    assert overlapped_host_time(3e-3, 1e-3, 1.0) == pytest.approx(4e-3, rel=1e-12)


def test_the_shipped_softness_charges_equal_times_the_cube_root_of_two() -> None:
    """p = 3: a pass whose host and GPU times are equal takes 2^(1/3) = 1.26 of either; once one is twice the other
    it is within 4 % of the longer."""
    softness = default_calibration().host_overlap_softness
    assert softness == pytest.approx(1 / 3, abs=1e-3)
    assert overlapped_host_time(1e-3, 1e-3, softness) == pytest.approx(2 ** softness * 1e-3, rel=1e-12)
    assert 1.0 < overlapped_host_time(2e-3, 1e-3, softness) / 2e-3 < 1.041


def test_tiny_times_do_not_underflow_to_nothing() -> None:
    """p-norms of microsecond times raised to large powers underflow unless scaled by the longer time first."""
    assert overlapped_host_time(1e-9, 1e-9, 0.01) == pytest.approx(1e-9 * 2 ** 0.01, rel=1e-9)
    assert overlapped_host_time(0.0, 0.0, 0.5) == 0.0


@given(_TIMES, _TIMES, _SOFTNESS, _SOFTNESS)
def test_between_the_longer_one_and_the_sum_and_monotone_in_softness(gpu: float, host: float, low: float,
                                                                      high: float) -> None:
    low, high = sorted((low, high))
    softer, harder = overlapped_host_time(gpu, host, high), overlapped_host_time(gpu, host, low)
    assert max(gpu, host) <= harder * (1 + 1e-12)
    assert harder <= softer * (1 + 1e-12)
    assert softer <= (gpu + host) * (1 + 1e-12)
    assert overlapped_host_time(gpu, host, low) == overlapped_host_time(host, gpu, low)
    assert math.isfinite(softer)


@pytest.mark.parametrize("value", [1.5, -0.1])
def test_a_softness_outside_zero_to_one_is_refused(value: float) -> None:
    constants = {field: 0.5 for field in ("memory_bound_efficiency", "flash_attention_efficiency",
                                          "collective_efficiency_intra", "collective_efficiency_inter",
                                          "p2p_efficiency_intra", "p2p_efficiency_inter")}
    constants.update(gemm_tile=128, kernel_launch_s=4e-6, iteration_overhead_s=0.0, cuda_context_bytes=0.0,
                     nccl_communicator_bytes=0.0, allocator_fragmentation=0.0, host_overlap_softness=value)
    with pytest.raises(PlannerError, match="host_overlap_softness"):
        calibration_from_constants(constants, "cal.yaml")
