"""α-β times of NCCL-style ring collectives and point-to-point transfers over a `Link`.

A ring over n ranks takes n − 1 steps per phase: all-reduce has two phases (reduce-scatter +
all-gather), so it moves 2(n − 1)/n of the buffer per rank; all-gather and reduce-scatter move
(n − 1)/n. `size_bytes` is always the full buffer (what nccl-tests calls `size`), and the link
bandwidth is bus bandwidth derated by the calibrated efficiency of its link type.
"""

from __future__ import annotations

from planner.cluster import Link
from planner.profile.calibration import Calibration

__all__ = ["all_gather_time", "all_reduce_time", "all_to_all_time", "p2p_time", "reduce_scatter_time"]


def _ring_time(size_bytes: float, ranks: int, link: Link, calibration: Calibration, phases: int,
               messages: int = 1) -> float:
    """A ring collective's time, or that of `messages` collectives back to back that move `size_bytes` together
    (each pays the ring's latency); 0 for no bytes (elementwise when `size_bytes` is a numpy array)."""
    if ranks <= 1:
        return 0.0
    steps = phases * (ranks - 1)
    bandwidth = link.bandwidth_bytes_per_s * calibration.collective_efficiency(link.kind)
    return (messages * steps * link.latency_s + steps / ranks * size_bytes / bandwidth) * (size_bytes > 0)


def all_reduce_time(size_bytes: float, ranks: int, link: Link, calibration: Calibration) -> float:
    return _ring_time(size_bytes, ranks, link, calibration, phases=2)


def all_gather_time(size_bytes: float, ranks: int, link: Link, calibration: Calibration, messages: int = 1) -> float:
    return _ring_time(size_bytes, ranks, link, calibration, phases=1, messages=messages)


def reduce_scatter_time(size_bytes: float, ranks: int, link: Link, calibration: Calibration,
                        messages: int = 1) -> float:
    return _ring_time(size_bytes, ranks, link, calibration, phases=1, messages=messages)


def all_to_all_time(local_bytes: float, ranks: int, link: Link, calibration: Calibration) -> float:
    """Each rank sends (n − 1)/n of its `local_bytes` to the others, one step per peer (NCCL's all-to-all)."""
    return _ring_time(local_bytes, ranks, link, calibration, phases=1)


def p2p_time(size_bytes: float, link: Link, calibration: Calibration) -> float:
    if size_bytes <= 0:
        return 0.0
    return link.latency_s + size_bytes / (link.bandwidth_bytes_per_s * calibration.p2p_efficiency(link.kind))
