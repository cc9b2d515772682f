"""Measured links: LINKS.json, its import from nccl-tests logs, and a torch.distributed probe.

LINKS.json (schema_version 1) holds, for N nodes, two N×N matrices in SI units:
``bandwidth_bytes_per_s`` and ``latency_s``. The diagonal is the bandwidth inside a node (the bus
bandwidth of a collective over that node's GPUs, or a GPU-to-GPU p2p when no collective was
measured); an off-diagonal entry is the per-GPU point-to-point bandwidth between two nodes (one
GPU on each side, as `planner.cluster` defines inter-node links). Pairs not measured are ``null``.
Extra fields: ``collectives`` (every measurement behind the matrices, with its α-β fit) and
``source`` (what produced the file).

Producers: `planner.profile.links_nccl` (nccl-tests logs) and `planner.profile.links_probe`
(torch.distributed under torchrun). Every measurement becomes a `CollectiveResult`: message sizes
and times. Its time model is ``t(S) = α + S·f/β`` where ``f`` is the nccl-tests bus factor of the
collective over n ranks (all_reduce 2(n−1)/n; all_gather, reduce_scatter, alltoall (n−1)/n;
sendrecv, broadcast, reduce 1), so β is a bus bandwidth and α a per-operation latency (see
`fit_latency_bandwidth`).

`slow_link_warnings` flags measured links far below the nominal link they replace
(`SLOW_LINK_FRACTION`); plan and estimate print them and carry them into their output.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.cluster import Cluster, Link
from planner.errors import PlannerError
from planner.resources import parse_json, write_atomic

__all__ = [
    "COLLECTIVES",
    "SCHEMA_VERSION",
    "SLOW_LINK_FRACTION",
    "AlphaBeta",
    "CollectiveResult",
    "LinksTable",
    "apply_links",
    "bus_factor",
    "fit_latency_bandwidth",
    "link_node_indices",
    "links_from_results",
    "load_links",
    "normalize_collective",
    "slow_link_warnings",
    "write_links",
]

SCHEMA_VERSION = 1
_GB = 1e9

# ---- collectives and the α-β fit ---------------------------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv", "broadcast", "reduce")
"""nccl-tests tests this module reads (names without `_perf`)."""

# Which measurement fills a node's diagonal when several do: a ring collective over the node's
# GPUs is what TP/DP groups inside the node see; a p2p pair is only the fallback.
_DIAGONAL_PRIORITY = {
    "all_reduce": 0, "reduce_scatter": 1, "all_gather": 1, "alltoall": 2, "broadcast": 3, "reduce": 3,
    "sendrecv": 4,
}


def normalize_collective(name: str) -> str:
    """`all_reduce_perf`, `allreduce`, `all-reduce` → `all_reduce`; unknown names are a PlannerError."""
    key = re.sub(r"[-_\s]", "", name.strip().lower())
    key = key.removesuffix("perf")
    for known in COLLECTIVES:
        if known.replace("_", "") == key:
            return known
    raise PlannerError(f"unknown collective {name!r}: use one of {', '.join(COLLECTIVES)}")


def bus_factor(collective: str, nranks: int | None) -> float:
    """busbw / algbw of an nccl-tests test over `nranks` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if collective in ("sendrecv", "broadcast", "reduce"):
        return 1.0
    if nranks is None or nranks < 2:
        raise PlannerError(f"{collective} over {nranks} rank(s) moves no data between GPUs")
    if collective == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    return (nranks - 1) / nranks


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted link: `t(bus_bytes) = latency_s + bus_bytes / bandwidth_bytes_per_s`."""

    latency_s: float | None
    bandwidth_bytes_per_s: float


def fit_latency_bandwidth(bus_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBeta:
    """Fit t(B) = α + B/β to measurements (B = bus bytes) so that both ends of the sweep count.

    β: least squares of t against B over the large messages (B ≥ B_max/64, at least the two
    largest sizes), where bandwidth dominates and protocol switches at small sizes do not bend
    the slope. α: median of t − B/β over the smallest quarter of sizes (at least two), where
    latency dominates; the median ignores single noisy points. With a single size α is unknown
    (None) and β = B/t. A non-positive slope (noise on a flat curve) falls back to the median bus
    bandwidth of the largest sizes; α is floored at zero.
    """
    sizes = np.asarray(bus_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if sizes.size == 0 or sizes.size != times.size:
        raise ValueError("fit needs equally many sizes and times, at least one")
    distinct = np.unique(sizes)
    if distinct.size == 1:
        return AlphaBeta(None, float(np.median(sizes / times)))
    threshold = min(distinct.max() / 64.0, distinct[-2])
    large = sizes >= threshold
    slope, _intercept = np.polyfit(sizes[large], times[large], 1)
    if slope > 0:
        bandwidth = 1.0 / slope
    else:
        top = sizes >= distinct[-min(3, distinct.size)]
        bandwidth = float(np.median(sizes[top] / times[top]))
    small_limit = distinct[max(2, distinct.size // 4) - 1]
    small = sizes <= small_limit
    latency = float(np.median(times[small] - sizes[small] / bandwidth))
    return AlphaBeta(max(latency, 0.0), float(bandwidth))


@dataclass(frozen=True)
class CollectiveResult:
    """One measured sweep: a collective over `nranks` ranks on `hosts`, a time per message size.

    `hosts` names each rank's node in rank order (empty when the log did not say); `sizes_bytes`
    is nccl-tests' `size` column (the full buffer), `times_s` the per-operation time.
    """

    name: str
    nranks: int | None
    hosts: tuple[str, ...]
    sizes_bytes: tuple[int, ...]
    times_s: tuple[float, ...]
    origin: str

    def __post_init__(self) -> None:
        if self.name not in COLLECTIVES:
            raise PlannerError(f"{self.origin}: unknown collective {self.name!r}")
        if not self.sizes_bytes or len(self.sizes_bytes) != len(self.times_s):
            raise PlannerError(f"{self.origin}: {self.name} has no (size, time) measurements")
        if any(t <= 0 or not math.isfinite(t) for t in self.times_s):
            raise PlannerError(f"{self.origin}: {self.name} has a non-positive or non-finite time")

    @property
    def bus_factor(self) -> float:
        return bus_factor(self.name, self.nranks)

    @property
    def unique_hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.hosts))

    @property
    def bus_bytes(self) -> np.ndarray:
        return np.asarray(self.sizes_bytes, dtype=float) * self.bus_factor

    @property
    def busbw_plateau_bytes_per_s(self) -> float:
        """Median bus bandwidth of the three largest sizes (what nccl-tests users quote)."""
        sizes = np.asarray(self.sizes_bytes)
        top = sizes >= np.unique(sizes)[-min(3, np.unique(sizes).size)]
        return float(np.median(self.bus_bytes[top] / np.asarray(self.times_s)[top]))

    def fit(self) -> AlphaBeta:
        return fit_latency_bandwidth(self.bus_bytes, self.times_s)

    def to_dict(self, used_for: str | None = None) -> dict[str, Any]:
        fit = self.fit()
        return {
            "name": self.name,
            "nranks": self.nranks,
            "hosts": list(self.unique_hosts) or None,
            "ranks_per_host": [self.hosts.count(h) for h in self.unique_hosts] or None,
            "busbw_bytes_per_s": self.busbw_plateau_bytes_per_s,
            "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
            "latency_s": fit.latency_s,
            "bus_factor": self.bus_factor,
            "sizes_bytes": list(self.sizes_bytes),
            "times_s": list(self.times_s),
            "origin": self.origin,
            "used_for": used_for,
        }


# ---- LINKS.json ----------------------------------------------------------------------------------

Matrix = tuple[tuple[float | None, ...], ...]


@dataclass(frozen=True)
class LinksTable:
    """The contents of LINKS.json (see the module docstring); entries are SI or None (not measured)."""

    nodes: tuple[str, ...]
    bandwidth_bytes_per_s: Matrix
    latency_s: Matrix
    collectives: tuple[Mapping[str, Any], ...] = ()
    source: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate_table(self.nodes, {"bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                                     "latency_s": self.latency_s}, "LINKS table")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "nodes": list(self.nodes),
            "bandwidth_bytes_per_s": [list(row) for row in self.bandwidth_bytes_per_s],
            "latency_s": [list(row) for row in self.latency_s],
            "collectives": [dict(c) for c in self.collectives],
            "source": dict(self.source),
        }

    @classmethod
    def from_dict(cls, data: Any, origin: str) -> LinksTable:
        """Validate a parsed LINKS.json document; every violation is one PlannerError line."""
        if not isinstance(data, dict):
            raise PlannerError(f"{origin}: LINKS.json must be a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise PlannerError(f"{origin}: schema_version must be {SCHEMA_VERSION}, got {version!r}")
        nodes = data.get("nodes")
        if not isinstance(nodes, list):
            raise PlannerError(f"{origin}: 'nodes' must be a list of node names")
        matrices = {key: data.get(key) for key in ("bandwidth_bytes_per_s", "latency_s")}
        _validate_table(nodes, matrices, origin)
        collectives = data.get("collectives", [])
        if not isinstance(collectives, list) or not all(isinstance(c, dict) for c in collectives):
            raise PlannerError(f"{origin}: 'collectives' must be a list of objects")
        source = data.get("source", {})
        if not isinstance(source, dict):
            raise PlannerError(f"{origin}: 'source' must be an object")
        return cls(
            nodes=tuple(nodes),
            bandwidth_bytes_per_s=_as_matrix(matrices["bandwidth_bytes_per_s"]),
            latency_s=_as_matrix(matrices["latency_s"]),
            collectives=tuple(collectives),
            source=source,
        )


def _validate_table(nodes: Sequence[Any], matrices: Mapping[str, Any], origin: str) -> None:
    if not nodes:
        raise PlannerError(f"{origin}: 'nodes' is empty")
    for name in nodes:
        if not isinstance(name, str) or not name:
            raise PlannerError(f"{origin}: node names must be non-empty strings, got {name!r}")
    if len(set(nodes)) != len(nodes):
        duplicate = next(n for n in nodes if list(nodes).count(n) > 1)
        raise PlannerError(f"{origin}: node {duplicate!r} is listed twice")
    count = len(nodes)
    for key, matrix in matrices.items():
        if not isinstance(matrix, (list, tuple)) or len(matrix) != count:
            raise PlannerError(f"{origin}: '{key}' must be a {count}×{count} matrix (one row per node)")
        for i, row in enumerate(matrix):
            if not isinstance(row, (list, tuple)) or len(row) != count:
                raise PlannerError(f"{origin}: '{key}' row {i} must have {count} entries")
            for j, value in enumerate(row):
                if value is None:
                    continue
                if (isinstance(value, bool) or not isinstance(value, (int, float))
                        or not math.isfinite(value) or value <= 0):
                    raise PlannerError(
                        f"{origin}: {key}[{i}][{j}] must be a positive number or null, got {value!r}"
                    )


def _as_matrix(rows: Sequence[Sequence[Any]]) -> Matrix:
    return tuple(tuple(None if v is None else float(v) for v in row) for row in rows)


def write_links(path: str | os.PathLike[str], links: LinksTable) -> None:
    """Write LINKS.json atomically (temporary file in the same directory, then rename)."""
    write_atomic(Path(path), json.dumps(links.to_dict(), indent=2, allow_nan=False) + "\n")


def load_links(path: str | os.PathLike[str]) -> LinksTable:
    """Read and validate LINKS.json; a missing, unreadable or malformed file is a PlannerError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerError(f"links file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"cannot read links file {path}: {exc}") from None
    try:
        data = parse_json(text, str(path))
    except json.JSONDecodeError as exc:
        raise PlannerError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    return LinksTable.from_dict(data, str(path))


# ---- applying LINKS.json to a cluster ------------------------------------------------------------

def link_node_indices(cluster: Cluster, links: LinksTable) -> tuple[tuple[int, ...], bool]:
    """The cluster node index of each LINKS node, and whether they were matched by position.

    Names are matched exactly. Only when the cluster's nodes carry the default names
    node0..node{N−1} (a shorthand or catalog cluster whose nodes nobody named) are unknown LINKS
    names mapped by position, LINKS node i → cluster node i; the caller should say so. A cluster
    with its own names never maps by position: an unknown LINKS node is an error, since silently
    putting a measured slow pair on the wrong nodes would mislead placement.
    """
    known = {node.name for node in cluster.nodes}
    unknown = [name for name in links.nodes if name not in known]
    if not unknown:
        return tuple(cluster.node_index(name) for name in links.nodes), False
    default_names = all(node.name == f"node{i}" for i, node in enumerate(cluster.nodes))
    if not default_names:
        shown = ", ".join(node.name for node in cluster.nodes[:4])
        shown += ", ..." if cluster.num_nodes > 4 else ""
        raise PlannerError(
            f"links node {unknown[0]!r} is not a node of cluster {cluster.name} ({shown}); "
            "name the cluster's nodes like the LINKS file"
        )
    if len(links.nodes) > cluster.num_nodes:
        raise PlannerError(
            f"links file measures {len(links.nodes)} nodes but cluster {cluster.name} has {cluster.num_nodes}"
        )
    return tuple(range(len(links.nodes))), True


def _measured_pairs(links: LinksTable) -> Iterator[tuple[int, int, float | None, float | None]]:
    """(i, j ≥ i, bandwidth, latency) of every LINKS pair with a measurement, None where not measured.

    A pair measured in both directions takes the lower bandwidth and the higher latency.
    """
    count = len(links.nodes)
    for i in range(count):
        for j in range(i, count):
            bandwidths = [v for v in (links.bandwidth_bytes_per_s[i][j], links.bandwidth_bytes_per_s[j][i])
                          if v is not None]
            latencies = [v for v in (links.latency_s[i][j], links.latency_s[j][i]) if v is not None]
            if bandwidths or latencies:
                yield i, j, min(bandwidths, default=None), max(latencies, default=None)


def apply_links(cluster: Cluster, links: LinksTable) -> Cluster:
    """`cluster` with every measured LINKS entry as a pair link (see `link_node_indices`).

    A pair with only one of bandwidth and latency measured keeps the cluster's value for the other.
    """
    indices, _by_position = link_node_indices(cluster, links)
    overrides: dict[tuple[int, int], Link] = {}
    for i, j, bandwidth, latency in _measured_pairs(links):
        a, b = indices[i], indices[j]
        default = cluster.link(a, b)
        overrides[(a, b)] = Link(
            default.bandwidth_bytes_per_s if bandwidth is None else bandwidth,
            default.latency_s if latency is None else latency,
            "intra" if a == b else "inter",
        )
    return cluster.with_pair_links(overrides)


SLOW_LINK_FRACTION = 0.1
"""A measured link below this fraction of the nominal link of its kind is flagged. NCCL reaches
70–90 % of an NVLink island's or a NIC's line rate, so a tenth means the probe took another path
(gloo over TCP, a CPU run, PCIe instead of NVLink) or the link is broken, and every plan placed on
that number inherits the error."""


def _nominal(cluster: Cluster, a: int, b: int) -> tuple[float, str]:
    """The catalog bandwidth (bytes/s) of the link between two cluster nodes, and what it is."""
    if a == b:
        node = cluster.nodes[a]
        return node.intra_bandwidth_bytes_per_s, f"{node.gpu.name} {node.gpu.intra_node_link}"
    slower = min(cluster.nodes[a], cluster.nodes[b], key=lambda node: node.nic_bandwidth_bytes_per_s)
    return slower.nic_bandwidth_bytes_per_s, f"{slower.gpu.name} NIC line rate"


def slow_link_warnings(cluster: Cluster, links: LinksTable, origin: str) -> tuple[str, ...]:
    """One line per measured bandwidth of `links` below SLOW_LINK_FRACTION of the nominal link of
    `cluster` (before the links are applied) it replaces."""
    indices, _by_position = link_node_indices(cluster, links)
    warnings = []
    for i, j, bandwidth, _latency in _measured_pairs(links):
        nominal, what = _nominal(cluster, indices[i], indices[j])
        if bandwidth is not None and bandwidth < SLOW_LINK_FRACTION * nominal:
            where = f"inside node {links.nodes[i]}" if i == j else f"between {links.nodes[i]} and {links.nodes[j]}"
            warnings.append(f"{origin}: link {where} measured {bandwidth / _GB:.3g} GB/s, "
                            f"{100 * bandwidth / nominal:.2g} % of the nominal {what} ({nominal / _GB:g} GB/s), "
                            f"below {100 * SLOW_LINK_FRACTION:g} %: re-measure it (e.g. nccl-tests) or plans "
                            "built on it are wrong")
    return tuple(warnings)


# ---- measurements → table ------------------------------------------------------------------------

_ASSUMED_NODE = "node0"


def links_from_results(results: Iterable[CollectiveResult], source: Mapping[str, Any],
                       nodes: Sequence[str] | None = None) -> LinksTable:
    """Build the LINKS table from measurements.

    A result on one host fills that node's diagonal (a collective beats a p2p sendrecv; among
    equals the higher bandwidth wins); a sendrecv between exactly two hosts fills that pair. Other
    multi-host results are kept in `collectives` only (their bandwidth mixes NVLink and network
    hops). A result whose log named no hosts is taken to be one node called ``node0``.
    `nodes` fixes the node order (default: order of first appearance).
    """
    results = list(results)
    order = list(nodes) if nodes is not None else []
    best: dict[tuple[int, int], tuple[tuple[float, float], int]] = {}
    fits = [r.fit() for r in results]
    for index, (result, fit) in enumerate(zip(results, fits, strict=True)):
        hosts = result.unique_hosts or (_ASSUMED_NODE,)
        for host in hosts:
            if host not in order:
                if nodes is not None:
                    raise PlannerError(f"{result.origin}: host {host!r} is not among the probed nodes")
                order.append(host)
        if len(hosts) == 1:
            key = (order.index(hosts[0]),) * 2
            rank = (-_DIAGONAL_PRIORITY[result.name], fit.bandwidth_bytes_per_s)
        elif len(hosts) == 2 and result.name == "sendrecv":
            a, b = sorted(order.index(h) for h in hosts)
            key, rank = (a, b), (0.0, fit.bandwidth_bytes_per_s)
        else:
            continue
        if key not in best or rank > best[key][0]:
            best[key] = (rank, index)
    count = len(order)
    if count == 0:
        raise PlannerError("no measurements to build a links table from")
    bandwidth: list[list[float | None]] = [[None] * count for _ in range(count)]
    latency: list[list[float | None]] = [[None] * count for _ in range(count)]
    used: dict[int, str] = {}
    for (a, b), (_rank, index) in best.items():
        fit = fits[index]
        for i, j in ((a, b), (b, a)):
            bandwidth[i][j] = fit.bandwidth_bytes_per_s
            latency[i][j] = fit.latency_s if fit.latency_s else None
        used[index] = f"diagonal {order[a]}" if a == b else f"pair {order[a]}-{order[b]}"
    return LinksTable(
        nodes=tuple(order),
        bandwidth_bytes_per_s=_as_matrix(bandwidth),
        latency_s=_as_matrix(latency),
        collectives=tuple(r.to_dict(used.get(i)) for i, r in enumerate(results)),
        source=dict(source),
    )
