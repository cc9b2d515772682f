"""Known slow devices (stragglers): `--slowdown NODE[:GPU]=FACTOR` parsed and applied to a cluster.

FACTOR is how many times slower the device runs than its type's nominal speed: 2 means every
kernel takes twice as long (peak FLOP/s and HBM bandwidth both divided by 2); 1 is nominal.
`NODE` names a node of the cluster (or its index); without `:GPU` every GPU of the node is slow.
A slowed GPU keeps its memory; its type is shown as e.g. `A100-80GB@0.5x` (running at half speed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from planner.cluster import Cluster, GpuId
from planner.errors import PlannerError
from planner.gpu import GPUSpec
from planner.limits import decimal_digits

__all__ = ["Slowdown", "apply_slowdowns", "parse_slowdown"]

_FORM = "NODE[:GPU]=FACTOR, e.g. node3=1.5 or node3:5=2 (FACTOR >= 1: times slower than nominal)"


@dataclass(frozen=True)
class Slowdown:
    """`node` (name or index text) runs `factor` times slower; only GPU `gpu_index` when given."""

    node: str
    gpu_index: int | None
    factor: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.factor) or self.factor < 1:
            raise PlannerError(f"slowdown factor for {self.target} must be a number >= 1, got {self.factor:g}")

    @property
    def target(self) -> str:
        return self.node if self.gpu_index is None else f"{self.node}:{self.gpu_index}"


def parse_slowdown(text: str) -> Slowdown:
    """Parse one `NODE[:GPU]=FACTOR` option value."""
    target, sep, factor_text = text.partition("=")
    node, colon, gpu_text = target.strip().partition(":")
    if not sep or not node:
        raise PlannerError(f"--slowdown {text!r} is not {_FORM}")
    try:
        factor = float(factor_text)
    except ValueError:
        raise PlannerError(f"--slowdown {text!r}: FACTOR {factor_text!r} is not a number; use {_FORM}") from None
    gpu_index = None
    if colon:
        if not decimal_digits(gpu_text.strip()):
            raise PlannerError(f"--slowdown {text!r}: GPU {gpu_text!r} is not a GPU index; use {_FORM}")
        gpu_index = int(gpu_text)
    return Slowdown(node.strip(), gpu_index, factor)


def _node_of(cluster: Cluster, name: str) -> int:
    """A node by name, or by index when no node carries that name."""
    if any(node.name == name for node in cluster.nodes):
        return cluster.node_index(name)
    if decimal_digits(name) and int(name) < cluster.num_nodes:
        return int(name)
    shown = ", ".join(node.name for node in cluster.nodes[:4]) + (", ..." if cluster.num_nodes > 4 else "")
    raise PlannerError(f"--slowdown: cluster {cluster.name} has no node {name!r} (nodes: {shown})")


def apply_slowdowns(cluster: Cluster, slowdowns: Iterable[Slowdown]) -> Cluster:
    """`cluster` with each listed GPU replaced by its type scaled down; a GPU named twice is an error."""
    overrides: dict[GpuId, GPUSpec] = {}
    named: dict[GpuId, str] = {}
    for slowdown in slowdowns:
        n = _node_of(cluster, slowdown.node)
        size = cluster.nodes[n].num_gpus
        if slowdown.gpu_index is not None and slowdown.gpu_index >= size:
            raise PlannerError(
                f"--slowdown {slowdown.target}: node {cluster.nodes[n].name} has GPUs 0..{size - 1}"
            )
        indices = range(size) if slowdown.gpu_index is None else (slowdown.gpu_index,)
        for g in indices:
            if (n, g) in named:
                raise PlannerError(f"--slowdown {slowdown.target}: GPU {n}:{g} is already slowed by {named[(n, g)]}")
            named[(n, g)] = slowdown.target
            overrides[(n, g)] = cluster.gpu_spec((n, g)).scaled(1 / slowdown.factor)
    return cluster.with_gpu_overrides(overrides) if overrides else cluster
