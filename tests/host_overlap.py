"""A calibration whose host launches and GPU work overlap fully, for tests that count a pass's launches."""

from __future__ import annotations

from planner.profile.calibration import Calibration, default_calibration


def full_overlap() -> Calibration:
    """The shipped calibration with `host_overlap_softness` 0: a pass takes the longer of its GPU and host times,
    so a host-bound pass is exactly its launches (the partial overlap itself: tests/test_host_overlap.py)."""
    return default_calibration().updated(host_overlap_softness=0.0)
