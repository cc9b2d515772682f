"""The search-speed benchmark's reference workload (benchmarks/search_speed.py) must stay the same work: its walls are
reported over the reference's time so that runs of different days compare, which holds only while the reference does
not change. Its result is a fixed number; a change to the workload changes it and must be a deliberate one."""

from __future__ import annotations

import pytest

from benchmarks.search_speed import REFERENCE_ROUNDS, _reference_work

RECORDED_TOTAL = 3917361.8315090532  # _reference_work() at REFERENCE_ROUNDS = 80 (2026-12-07)


def test_the_reference_workload_is_the_recorded_one() -> None:
    assert REFERENCE_ROUNDS == 80
    assert _reference_work() == pytest.approx(RECORDED_TOTAL, rel=1e-12)
