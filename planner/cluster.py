"""The cluster: nodes of GPUs, the links between them, and the bandwidth a collective gets.

A `Cluster` is a list of nodes (each with its GPU type, NVLink/XGMI island and one NIC per GPU)
plus optional per-node-pair link overrides (from a cluster file or a measured LINKS.json). Its
`graph` is the same topology as a networkx graph: GPU vertices, one switch vertex per node
(the NVLink island) and a fabric vertex; override pairs are direct switch–switch edges.

Bandwidth convention: every bandwidth is bytes per second per direction *per GPU*. Inside a node
that is the GPU's NVLink share; between nodes it is what one GPU's NIC carries to a peer GPU in
the other node (LINKS.json measures exactly this with p2p probes).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import PlannerError
from planner.gpu import GPUSpec, gpu_from_dict, lookup_gpu
from planner.limits import MAX_GPUS, MAX_SECONDS, bandwidth_problem, finite_number, name_problem
from planner.resources import load_structured_file, profiles_dir

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "Cluster",
    "GpuId",
    "Link",
    "Node",
    "catalog_cluster_names",
    "load_cluster",
    "parse_shorthand",
]

_GB = 1e9
# α of one NCCL ring step. Defaults until calibration overrides them (profiles/calibration.yaml):
# NVLink hop a few µs, InfiniBand/RoCE hop ~10 µs (nccl-tests small-message times, REFERENCE.md §4).
DEFAULT_INTRA_NODE_LATENCY_S = 5e-6
DEFAULT_INTER_NODE_LATENCY_S = 10e-6

GpuId = tuple[int, int]
"""A GPU as (node index, GPU index inside the node)."""


@dataclass(frozen=True)
class Link:
    """A path's bandwidth (bytes/s per direction per GPU) and latency (seconds per message)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str = "inter"  # "intra" (NVLink/XGMI/PCIe island) or "inter" (NIC fabric)

    def check(self, where: str) -> None:
        """A link a cluster is given (file, plan file, measured table): finite positive bandwidth, a latency in
        [0, MAX_SECONDS], a known kind (one line naming `where` otherwise). Links the cluster derives are not
        checked: a GPU's path to itself is infinitely fast."""
        _check_bandwidths(where, {"bandwidth_bytes_per_s": self.bandwidth_bytes_per_s})
        _check_latency(f"{where}: latency_s", self.latency_s)
        if self.kind not in ("intra", "inter"):
            raise PlannerError(f"{where}: kind must be 'intra' or 'inter', got {self.kind!r}")


def _check_bandwidths(where: str, bandwidths: dict[str, float]) -> None:
    """Each bandwidth a number of bytes/s in [MIN_BANDWIDTH, MAX_PER_GPU_QUANTITY) (one line naming it otherwise)."""
    for name, value in bandwidths.items():
        if problem := bandwidth_problem(name, value):
            raise PlannerError(f"{where}: {problem}")


def _check_latency(name: str, value: float) -> None:
    """A latency in [0, MAX_SECONDS] seconds (one line naming it otherwise)."""
    if not finite_number(value) or not 0 <= value <= MAX_SECONDS:
        raise PlannerError(f"{name} must be a number of seconds in [0, {MAX_SECONDS:g}], got {value!r}")


@dataclass(frozen=True)
class Node:
    """One NVLink domain: `num_gpus` GPUs of one type on one intra-node fabric, one NIC per GPU.

    Usually one server; a rack-scale domain (GB200 NVL72: 72 GPUs) spans hosts of `gpus_per_host`
    GPUs (4), which only launchers see: bandwidth and group placement follow the domain.
    """

    name: str
    gpu: GPUSpec
    num_gpus: int
    intra_bandwidth_bytes_per_s: float
    nic_bandwidth_bytes_per_s: float
    gpus_per_host: int | None = None  # None: the whole node is one host

    def __post_init__(self) -> None:
        if why := name_problem(self.name, host=True):
            raise PlannerError(f"node name {why}")
        gpus = self.num_gpus
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
            raise PlannerError(f"node {self.name}: num_gpus must be an integer in [1, {MAX_GPUS:,}], got {gpus!r}")
        _check_bandwidths(f"node {self.name}", {"intra_bandwidth_bytes_per_s": self.intra_bandwidth_bytes_per_s,
                                                "nic_bandwidth_bytes_per_s": self.nic_bandwidth_bytes_per_s})
        if self.gpus_per_host is None:
            object.__setattr__(self, "gpus_per_host", self.num_gpus)
        elif not 1 <= self.gpus_per_host <= self.num_gpus or self.num_gpus % self.gpus_per_host:
            raise PlannerError(f"node {self.name}: gpus_per_host must divide its {self.num_gpus} GPUs, "
                               f"got {self.gpus_per_host}")

    @property
    def num_hosts(self) -> int:
        """Hosts (servers, compute trays) the NVLink domain spans; a launcher starts one process group per host."""
        return self.num_gpus // (self.gpus_per_host or self.num_gpus)


@dataclass(frozen=True)
class Cluster:
    """A set of nodes and the links between them (see the module docstring for units)."""

    name: str
    nodes: tuple[Node, ...]
    pair_links: dict[tuple[int, int], Link] = field(default_factory=dict, compare=False, repr=False)
    intra_latency_s: float = DEFAULT_INTRA_NODE_LATENCY_S
    inter_latency_s: float = DEFAULT_INTER_NODE_LATENCY_S
    # Per-GPU exceptions to a node's GPU type (known stragglers, planner.slowdown).
    gpu_overrides: dict[GpuId, GPUSpec] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if why := name_problem(self.name):
            raise PlannerError(f"cluster name {why}")
        if not self.nodes:
            raise PlannerError(f"cluster {self.name}: needs at least one node")
        _check_latency(f"cluster {self.name}: intra_latency_s", self.intra_latency_s)
        _check_latency(f"cluster {self.name}: inter_latency_s", self.inter_latency_s)
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise PlannerError(f"cluster {self.name}: node names must be unique")

    # ---- shape ----------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_gpus(self) -> int:
        return sum(node.num_gpus for node in self.nodes)

    @property
    def gpus_per_node(self) -> int:
        """GPUs in the smallest node (the size a TP group must fit in)."""
        return min(node.num_gpus for node in self.nodes)

    @property
    def is_homogeneous(self) -> bool:
        first = self.nodes[0]
        return all(n.gpu == first.gpu and n.num_gpus == first.num_gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[GPUSpec, ...]:
        seen: dict[str, GPUSpec] = {}
        for node in self.nodes:
            seen.setdefault(node.gpu.name, node.gpu)
        return tuple(seen.values())

    @property
    def gpu(self) -> GPUSpec:
        """The GPU type of a single-type cluster (mixed clusters name their groups instead)."""
        types = self.gpu_types
        if len(types) != 1:
            raise PlannerError(f"cluster {self.name} mixes GPU types: {', '.join(t.name for t in types)}")
        return types[0]

    @property
    def gpu_label(self) -> str:
        return "+".join(t.name for t in self.gpu_types)

    def gpu_ids(self) -> list[GpuId]:
        """Every GPU in rank order: node by node, GPU index fastest."""
        return list(self.gpu_order)

    @cached_property
    def gpu_order(self) -> tuple[GpuId, ...]:
        """`gpu_ids` once per cluster, as a tuple (the search places and compares thousands of layouts against it)."""
        return tuple((n, g) for n, node in enumerate(self.nodes) for g in range(node.num_gpus))

    def gpu_spec(self, gpu: GpuId) -> GPUSpec:
        """The GPU type at (node, GPU index): the node's type unless a per-GPU override exists."""
        return self.gpu_overrides.get(gpu, self.nodes[gpu[0]].gpu)

    def node_index(self, name: str) -> int:
        for index, node in enumerate(self.nodes):
            if node.name == name:
                return index
        raise PlannerError(f"cluster {self.name} has no node named {name!r}")

    # ---- links ----------------------------------------------------------------------------
    def link(self, node_a: int, node_b: int) -> Link:
        """The per-GPU path between two nodes (the NVLink island when they are the same node)."""
        key = (min(node_a, node_b), max(node_a, node_b))
        if key in self.pair_links:
            return self.pair_links[key]
        a, b = self.nodes[node_a], self.nodes[node_b]
        if node_a == node_b:
            return Link(a.intra_bandwidth_bytes_per_s, self.intra_latency_s, "intra")
        bandwidth = min(a.nic_bandwidth_bytes_per_s, b.nic_bandwidth_bytes_per_s)
        return Link(bandwidth, self.inter_latency_s, "inter")

    def ring_link(self, gpus: Sequence[GpuId]) -> Link:
        """Effective bus bandwidth and per-step latency of a ring collective over `gpus`.

        The ring visits nodes in the order their GPUs first appear. Inside a node it runs on the
        NVLink island; each node-to-node hop can use one NIC per group GPU on the node (NCCL runs
        that many rings in parallel), so the hop gives `pair bandwidth × GPUs per node`, capped by
        the island. The slowest hop bounds the ring.
        """
        if len(gpus) <= 1:
            return Link(float("inf"), 0.0, "intra")
        order: list[int] = []
        per_node: dict[int, int] = {}
        for node, _gpu in gpus:
            if node not in per_node:
                order.append(node)
                per_node[node] = 0
            per_node[node] += 1
        if len(order) == 1:
            return self.link(order[0], order[0])
        width = min(per_node.values())
        bandwidth = min(
            (self.link(n, n).bandwidth_bytes_per_s for n in order if per_node[n] > 1), default=float("inf")
        )
        latency = 0.0
        for position, node in enumerate(order):
            hop = self.link(node, order[(position + 1) % len(order)])
            bandwidth = min(bandwidth, hop.bandwidth_bytes_per_s * width)
            latency = max(latency, hop.latency_s)
        return Link(bandwidth, latency, "inter")

    # ---- derived clusters -----------------------------------------------------------------
    def with_pair_links(self, links: dict[tuple[int, int], Link]) -> Cluster:
        for (a, b), link in links.items():
            link.check(f"cluster {self.name}: link between {self.nodes[a].name} and {self.nodes[b].name}")
        merged = dict(self.pair_links)
        merged.update({(min(a, b), max(a, b)): link for (a, b), link in links.items()})
        return replace(self, pair_links=merged)

    def with_gpu_overrides(self, overrides: dict[GpuId, GPUSpec]) -> Cluster:
        return replace(self, gpu_overrides={**self.gpu_overrides, **overrides})

    def with_nodes(self, nodes: Iterable[Node]) -> Cluster:
        return replace(self, nodes=tuple(nodes))

    def with_memory_share(self, share: float) -> Cluster:
        """The same cluster with `share` of every GPU's memory: a planning budget that leaves the rest free."""
        def budget(gpu: GPUSpec) -> GPUSpec:
            return replace(gpu, memory_bytes=int(gpu.memory_bytes * share))

        return replace(self, nodes=tuple(replace(node, gpu=budget(node.gpu)) for node in self.nodes),
                       gpu_overrides={gpu: budget(spec) for gpu, spec in self.gpu_overrides.items()})

    # ---- graph view -----------------------------------------------------------------------
    def node_graph(self, nodes: Sequence[int] | None = None) -> nx.Graph:
        """The nodes (all, or `nodes`) as a complete networkx graph whose edges carry each pair's
        per-GPU link (measured pair links included) and `seconds_per_gb` = 1e9 / bandwidth, the
        weight placement's ring and path orders minimise."""
        import networkx as nx  # imported here: a third of a second that only placement on uneven links needs

        chosen = range(self.num_nodes) if nodes is None else nodes
        graph = nx.Graph(name=self.name)
        graph.add_nodes_from((n, {"name": self.nodes[n].name}) for n in chosen)
        for a, b in itertools.combinations(chosen, 2):
            link = self.link(a, b)
            graph.add_edge(a, b, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s,
                           seconds_per_gb=1e9 / link.bandwidth_bytes_per_s)
        return graph


# ---- construction -----------------------------------------------------------------------------

# NODESxGPUSxGPU (GPUS may be written NVLk), or HOSTSxGPUSxGPU:nvlN (hosts of GPUS in NVLink domains of N GPUs).
_SHORTHAND = re.compile(r"^(\d+)x(nvl)?(\d+)x([^:@\s]+)(?:@([\d.]+)W)?(?::nvl(\d+))?$",
                        re.IGNORECASE | re.ASCII)
_SHORTHAND_FORMS = ("NODESxGPUSxGPU (e.g. 16x8xH100-80GB, 2xNVL72xGB200) or HOSTSxGPUSxGPU:nvlN "
                    "(e.g. 36x4xGB200:nvl72), the GPU optionally @WATTSW under a power limit (16x8xH100-80GB@500W)")


def _host_gpus(gpu: GPUSpec, gpus_per_node: int, origin: str) -> int:
    """GPUs per host in a node of `gpus_per_node` GPUs of this type: the type's usual host (GB200: a tray of 4)
    when the node spans several, else the node; a node that is not a whole number of hosts is refused."""
    host = gpu.gpus_per_host or gpus_per_node
    if gpus_per_node <= host:
        return gpus_per_node
    if gpus_per_node % host:
        raise PlannerError(f"{origin}: {gpu.name} hosts hold {host} GPUs, so a node (NVLink domain) of "
                           f"{gpus_per_node} GPUs must be a multiple of {host}")
    return host


def uniform_cluster(name: str, gpu: GPUSpec, num_nodes: int, gpus_per_node: int,
                    intra_bandwidth_bytes_per_s: float | None = None,
                    nic_bandwidth_bytes_per_s: float | None = None,
                    gpus_per_host: int | None = None) -> Cluster:
    """`num_nodes` identical nodes of the usual build for this GPU unless bandwidths or host size are given."""
    if num_nodes < 1 or gpus_per_node < 1:
        raise PlannerError(f"cluster {name}: node count and GPUs per node must be positive")
    host = gpus_per_host or _host_gpus(gpu, gpus_per_node, f"cluster {name}")
    nodes = tuple(
        Node(
            name=f"node{i}",
            gpu=gpu,
            num_gpus=gpus_per_node,
            intra_bandwidth_bytes_per_s=intra_bandwidth_bytes_per_s or gpu.intra_node_bandwidth_bytes_per_s,
            nic_bandwidth_bytes_per_s=nic_bandwidth_bytes_per_s or gpu.nic_bandwidth_bytes_per_s,
            gpus_per_host=host,
        )
        for i in range(num_nodes)
    )
    return Cluster(name=name, nodes=nodes)


def parse_shorthand(text: str) -> Cluster:
    """`NODESxGPUSxGPU`, e.g. `16x8xH100-80GB`: usual nodes (NVLink domains) of that GPU, a NIC per GPU; a
    rack-scale type splits each node into its usual hosts (`2xNVL72xGB200`: 2 domains of 18 trays of 4).
    `HOSTSxGPUSxGPU:nvlN`, e.g. `36x4xGB200:nvl72`: hosts of GPUS GPUs grouped into NVLink domains of N. `GPU@WATTSW`
    (`16x8xH100-80GB@500W`): the GPUs run under that board power limit (`GPUSpec.power_limited`)."""
    match = _SHORTHAND.match(text.strip())
    if not match:
        raise PlannerError(f"cluster shorthand {text!r} is not {_SHORTHAND_FORMS}")
    count, per_count, gpu_name = int(match[1]), int(match[3]), match[4]
    if count < 1 or per_count < 1:
        raise PlannerError(f"cluster {text!r}: node count and GPUs per node must be at least 1")
    _check_size(count * per_count, f"cluster {text!r}")
    gpu = lookup_gpu(gpu_name)
    if match[5] is not None:
        try:
            watts = float(match[5])
        except ValueError:
            raise PlannerError(f"cluster {text!r}: power limit {match[5]!r} W is not a number") from None
        gpu = gpu.power_limited(watts)
    if match[6] is None:
        return uniform_cluster(f"{count}x{per_count}x{gpu.name}", gpu, count, per_count)
    domain, total = int(match[6]), count * per_count
    if match[2]:
        raise PlannerError(f"cluster {text!r}: give the NVLink domain once, as NVLk or as :nvlN, not both")
    if domain < 1 or domain % per_count or total % domain:
        raise PlannerError(f"cluster {text!r}: an NVLink domain of {domain} GPUs must be a whole number of "
                           f"{per_count}-GPU hosts and divide the {total} GPUs")
    return uniform_cluster(f"{count}x{per_count}x{gpu.name}:nvl{domain}", gpu, total // domain, domain,
                           gpus_per_host=per_count)


def _number(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float | None:
    value = data.get(key)
    if value is None:  # absent or null: the default
        value = default
    if value is None:
        return None
    if not finite_number(value) or value <= 0:
        raise PlannerError(f"{origin}: '{key}' must be a positive number (finite), got {value!r}")
    return float(value)


_GROUP_KEYS = frozenset({"gpu", "gpu_profile", "power_limit_w", "nodes", "gpus_per_node", "gpus_per_host",
                         "intra_node_gbps", "inter_node_gbps", "names"})
_CLUSTER_KEYS = frozenset({"name", "node_groups", "intra_node_latency_us", "inter_node_latency_us", "links"})


def _check_keys(mapping: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """Refuse keys a cluster file does not read: a typo (gpus_per_nod) would otherwise be ignored in silence."""
    unknown = sorted(str(key) for key in mapping if key not in allowed)
    if unknown:
        raise PlannerError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")


def cluster_from_dict(data: dict[str, Any], origin: str) -> Cluster:
    """A cluster document: `node_groups` (or one group's keys at top level) plus optional `links`.

    Group keys: gpu (a catalog type) or gpu_profile (a file written by `planner calibrate`), power_limit_w (the
    board power limit the GPUs run under, `GPUSpec.power_limited`), nodes, gpus_per_node (GPUs per NVLink domain),
    gpus_per_host (GPUs per server or tray when a domain spans several: 4 in a GB200 NVL72), intra_node_gbps,
    inter_node_gbps (per GPU, GB/s), names (optional list of node names). Top level: name, intra_node_latency_us,
    inter_node_latency_us, links: [{nodes: [a, b], gbps, latency_us}] with node names or indices.
    """
    if not isinstance(data, dict):
        raise PlannerError(f"{origin}: a cluster file must be a mapping")
    groups = data.get("node_groups", [data])
    if not isinstance(groups, list) or not groups:
        raise PlannerError(f"{origin}: 'node_groups' must be a non-empty list")
    _check_keys(data, _CLUSTER_KEYS | (frozenset() if "node_groups" in data else _GROUP_KEYS), origin)
    for position, group in enumerate(groups):
        if not isinstance(group, dict):
            raise PlannerError(f"{origin}: node group {position} must be a mapping")
        if "node_groups" in data:
            _check_keys(group, _GROUP_KEYS, f"{origin}: node group {position}")
    nodes: list[Node] = []
    total = 0
    for position, group in enumerate(groups):
        where = f"{origin}: node group {position}"
        gpu = _group_gpu(group, origin, where)
        if group.get("power_limit_w") is not None:
            try:
                gpu = gpu.power_limited(group["power_limit_w"])
            except PlannerError as exc:
                raise PlannerError(f"{where}: {exc}") from None
        count = group.get("nodes", 1)
        per_node = group.get("gpus_per_node", gpu.gpus_per_node)
        for key, value in (("nodes", count), ("gpus_per_node", per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"{where}: '{key}' must be a positive integer, got {value!r}")
        per_host = group.get("gpus_per_host", None)
        if per_host is None:
            per_host = _host_gpus(gpu, per_node, where)
        elif isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1 or per_node % per_host:
            raise PlannerError(f"{where}: 'gpus_per_host' must be a positive integer dividing gpus_per_node "
                               f"({per_node}), got {per_host!r}")
        total += count * per_node
        _check_size(total, origin)
        intra = _number(group, "intra_node_gbps", where, gpu.intra_node_bandwidth_bytes_per_s / _GB)
        nic = _number(group, "inter_node_gbps", where, gpu.nic_bandwidth_bytes_per_s / _GB)
        names = group.get("names") or [f"node{len(nodes) + i}" for i in range(count)]
        if not isinstance(names, list) or len(names) != count or not all(isinstance(n, (str, int)) for n in names):
            raise PlannerError(f"{where}: 'names' must be a list of {count} node names, got {names!r:.80}")
        try:
            nodes.extend(Node(str(n), gpu, per_node, intra * _GB, nic * _GB, per_host) for n in names)
        except PlannerError as exc:
            raise PlannerError(f"{where}: {exc}") from None
    cluster = Cluster(
        name=str(data.get("name", Path(origin).stem)),
        nodes=tuple(nodes),
        intra_latency_s=_number(data, "intra_node_latency_us", origin, DEFAULT_INTRA_NODE_LATENCY_S * 1e6) / 1e6,
        inter_latency_s=_number(data, "inter_node_latency_us", origin, DEFAULT_INTER_NODE_LATENCY_S * 1e6) / 1e6,
    )
    overrides: dict[tuple[int, int], Link] = {}
    links = [] if data.get("links") is None else data["links"]  # `links:` with nothing after it: none
    if not isinstance(links, list):
        raise PlannerError(f"{origin}: 'links' must be a list of {{nodes: [a, b], gbps, latency_us}}")
    for position, entry in enumerate(links):
        where = f"{origin}: links[{position}]"
        pair = entry.get("nodes") if isinstance(entry, dict) else None
        if not isinstance(pair, list) or len(pair) != 2:
            raise PlannerError(f"{where}: needs 'nodes: [a, b]'")
        a, b = (_resolve_node(cluster, item, where) for item in pair)
        bandwidth = _number(entry, "gbps", where)
        if bandwidth is None:
            raise PlannerError(f"{where}: needs 'gbps'")
        latency = _number(entry, "latency_us", where, cluster.inter_latency_s * 1e6)
        if (min(a, b), max(a, b)) in overrides:
            raise PlannerError(f"{where}: a second link between {cluster.nodes[a].name} and {cluster.nodes[b].name}")
        overrides[(min(a, b), max(a, b))] = Link(bandwidth * _GB, latency / 1e6, "intra" if a == b else "inter")
    return cluster.with_pair_links(overrides) if overrides else cluster


def _check_size(num_gpus: int, origin: str) -> None:
    """Refuse a cluster above the stated scale limit before any node of it is built."""
    if num_gpus > MAX_GPUS:
        raise PlannerError(f"{origin}: {num_gpus:,} GPUs exceeds planner's limit of {MAX_GPUS:,} GPUs per cluster")


def _group_gpu(group: Any, origin: str, where: str) -> GPUSpec:
    """A group's GPU: a catalog `gpu` name, or a `gpu_profile` file (one gpus.yaml-style entry) whose
    relative path is taken from the cluster file's directory."""
    if isinstance(group, dict) and "gpu_profile" in group:
        if "gpu" in group:
            raise PlannerError(f"{where}: give a 'gpu' type or a 'gpu_profile' file, not both")
        path = Path(str(group["gpu_profile"]))
        if not path.is_absolute() and Path(origin).is_file():
            path = Path(origin).parent / path
        entries = load_structured_file(path)
        entries = entries.get("gpus") if isinstance(entries, dict) else None
        if not isinstance(entries, dict) or len(entries) != 1:
            raise PlannerError(f"{where}: gpu_profile {path} must hold one entry under 'gpus'")
        (name, data), = entries.items()
        return gpu_from_dict(str(name), data, str(path))
    if not isinstance(group, dict) or "gpu" not in group:
        raise PlannerError(f"{where}: needs a 'gpu' type or a 'gpu_profile' file")
    return lookup_gpu(str(group["gpu"]))


def _resolve_node(cluster: Cluster, item: Any, where: str) -> int:
    if isinstance(item, int) and not isinstance(item, bool):
        if not 0 <= item < cluster.num_nodes:
            raise PlannerError(f"{where}: node index {item} is outside 0..{cluster.num_nodes - 1}")
        return item
    return cluster.node_index(str(item))


@cache
def _catalog() -> dict[str, dict[str, Any]]:
    return load_structured_file(profiles_dir() / "clusters.yaml")["clusters"]


def catalog_cluster_names() -> list[str]:
    return list(_catalog())


def load_cluster(spec: str) -> Cluster:
    """A catalog preset name, a YAML/JSON cluster file, or the shorthand (`parse_shorthand`)."""
    catalog = _catalog()
    if spec in catalog:
        return cluster_from_dict({"name": spec, **catalog[spec]}, f"catalog cluster {spec!r}")
    path = Path(spec)
    if spec.strip() and (path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists()):
        return cluster_from_dict(load_structured_file(path), str(path))
    if _SHORTHAND.match(spec.strip()):
        return parse_shorthand(spec)
    raise PlannerError(f"unknown cluster {spec!r}: use a preset ({', '.join(catalog)}), a YAML/JSON file, "
                       f"or {_SHORTHAND_FORMS}")
