"""Which GPU runs each rank (`Placement`), and what that means for the cost model: the GPU type of
each pipeline rank and the links its tensor-, pipeline- and data-parallel groups use.

Ranks follow Megatron-LM's default order tp-cp-ep-dp-pp (TP fastest, PP slowest):
rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)), so a CP group is cp ranks at stride tp and the
dp·cp ranks holding the same weights are those of a pipeline rank at the same tp_rank. The default
placement puts rank r on the r-th GPU in cluster order (node by node), which is what `torchrun` does
with hosts listed in node order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.cluster import Cluster, GpuId, Link
from planner.config import ParallelConfig
from planner.errors import PlannerError
from planner.gpu import GPUSpec

__all__ = ["ExpertLink", "GroupLinks", "Placement", "default_placement", "rank_coordinates", "rank_of"]


def rank_of(config: ParallelConfig, dp: int, pp: int, tp: int, cp: int = 0) -> int:
    return tp + config.tp * (cp + config.cp * (dp + config.dp * pp))


def rank_coordinates(config: ParallelConfig, rank: int) -> tuple[int, int, int, int]:
    """(dp, pp, tp, cp) coordinates of a global rank under the tp-cp-dp-pp order."""
    tp = rank % config.tp
    cp = (rank // config.tp) % config.cp
    dp = (rank // (config.tp * config.cp)) % config.dp
    pp = rank // (config.tp * config.cp * config.dp)
    return dp, pp, tp, cp


@dataclass(frozen=True)
class Placement:
    """`gpus[rank]` is the (node index, GPU index) that runs global rank `rank`."""

    gpus: tuple[GpuId, ...]

    def gpu_of(self, config: ParallelConfig, dp: int, pp: int, tp: int) -> GpuId:
        return self.gpus[rank_of(config, dp, pp, tp)]


def default_placement(cluster: Cluster, config: ParallelConfig) -> Placement:
    """Rank r on the r-th GPU of the cluster (node-major); the job may use fewer GPUs than exist."""
    available = cluster.gpu_order
    if config.num_gpus > len(available):
        raise PlannerError(
            f"configuration needs {config.num_gpus} GPUs (dp·tp·pp·cp) but cluster {cluster.name} has "
            f"{len(available)}"
        )
    return Placement(available[: config.num_gpus])


@dataclass(frozen=True)
class ExpertLink:
    """What an expert-parallel all-to-all crosses: `ranks_per_node` of the EP group's members share a node
    and talk over `intra`; the others sit on other nodes, reached through each GPU's own NIC (`inter`)."""

    intra: Link
    inter: Link
    ranks_per_node: int


def expert_link(cluster: Cluster, config: ParallelConfig, members: tuple[GpuId, ...],
                alike: bool | None = None) -> ExpertLink:
    """The worst EP group of one pipeline rank's GPUs (in rank order). Expert ranks fold over the stage's
    tp·cp·dp ranks in the order etp-ep-edp (Megatron-Core's expert rank generator), so EP group (e, d)
    is the ranks e + etp·(j + ep·d), j < ep: ep ranks at stride etp. `alike`: `_nodes_alike(cluster)`, when known."""
    ep, etp = config.ep, config.etp
    groups = [members[e + etp * ep * d:etp * ep * (d + 1):etp] for d in range(config.edp) for e in range(etp)]
    alike = _nodes_alike(cluster) if alike is None else alike
    shapes: dict[tuple[int, int], ExpertLink] = {}  # with alike nodes a group's link depends on its shape alone
    worst = None
    for group in groups if ep > 1 else ():
        nodes: dict[int, int] = {}
        for node, _gpu in group:
            nodes[node] = nodes.get(node, 0) + 1
        shape = (len(nodes), min(nodes.values()))
        if not alike or shape not in shapes:
            first = next(iter(nodes))
            inter = _worst_between(cluster, list(nodes)) if len(nodes) > 1 else cluster.link(first, first)
            shapes[shape] = ExpertLink(_worst(cluster.link(n, n) for n in nodes), inter, shape[1])
        link = shapes[shape]
        if worst is None or (link.ranks_per_node, link.inter.bandwidth_bytes_per_s) < (
                worst.ranks_per_node, worst.inter.bandwidth_bytes_per_s):
            worst = link
    if worst is None:
        node = members[0][0]
        return ExpertLink(cluster.link(node, node), cluster.link(node, node), 1)
    return worst


@dataclass(frozen=True)
class GroupLinks:
    """What the cost model needs from a placement, per pipeline rank.

    `gpu[r]`: the slowest GPU type among rank r's GPUs (it bounds the rank's speed);
    `capacity_bytes[r]`: the smallest memory among them. `tp[r]` / `cp[r]`: the worst ring over that
    rank's TP / CP groups; `dp[r]`: over its groups sharing gradients (dp·cp ranks, or one HSDP shard
    group), `replicate[r]` over its HSDP replica groups. `pp[r]`: the worst link between rank r and rank
    r+1 (the last entry links the last rank back to the first, used only by interleaved schedules).
    """

    gpu: tuple[GPUSpec, ...]
    capacity_bytes: tuple[int, ...]
    tp: tuple[Link, ...]
    dp: tuple[Link, ...]
    pp: tuple[Link, ...]
    cp: tuple[Link, ...] = ()
    replicate: tuple[Link, ...] = ()
    ep: tuple[ExpertLink, ...] = ()  # per pipeline rank, its worst expert-parallel group (`expert_link`)
    edp: tuple[Link, ...] = ()  # per pipeline rank, the worst ring over its expert data-parallel groups

    @classmethod
    def from_placement(cls, cluster: Cluster, config: ParallelConfig, placement: Placement) -> GroupLinks:
        return cls.without_experts(cluster, config, placement).with_experts(cluster, config, placement)

    @classmethod
    def without_experts(cls, cluster: Cluster, config: ParallelConfig, placement: Placement) -> GroupLinks:
        """Every field but the expert groups' (`ep`, `edp`: `with_experts`), which alone depend on ep and etp."""
        if len(placement.gpus) != config.num_gpus:
            raise PlannerError(
                f"placement lists {len(placement.gpus)} GPUs for a configuration of {config.num_gpus}"
            )
        gpus, capacity, tp_links, dp_links, pp_links, cp_links, replicate_links = [], [], [], [], [], [], []
        alike = _nodes_alike(cluster)
        worst_ring = _strided_rings(cluster, placement, alike)
        tp, cp, replicas, shard = config.tp, config.cp, config.replicas, config.shard_group
        size = replicas * tp  # ranks of one pipeline rank are contiguous: tp fastest, then cp, then dp
        blocks = [placement.gpus[pp * size:(pp + 1) * size] for pp in range(config.pp)]
        homogeneous = cluster.is_homogeneous
        for pp, members in enumerate(blocks):
            if cluster.gpu_overrides:
                types = {cluster.gpu_spec(member) for member in members}
            elif homogeneous:
                types = {cluster.nodes[0].gpu}
            else:
                types = {cluster.nodes[node].gpu for node in {node for node, _ in members}}
            gpus.append(min(types, key=lambda g: (max(dict(g.peak_flops_per_s).values()), g.name)))
            capacity.append(min(g.memory_bytes for g in types))
            base = pp * size
            tp_links.append(worst_ring((base + e * tp for e in range(replicas)), tp, 1))
            cp_links.append(worst_ring((base + d * cp * tp + t for d in range(config.dp) for t in range(tp)), cp, tp)
                            if cp > 1 else tp_links[-1])
            dp_links.append(worst_ring((base + k * shard * tp + t for k in range(config.hsdp_replicas)
                                        for t in range(tp)), shard, tp))
            replicate_links.append(worst_ring((base + j * tp + t for j in range(shard) for t in range(tp)),
                                              config.hsdp_replicas, shard * tp)
                                   if config.hsdp_replicas > 1 else dp_links[-1])
            nxt = blocks[(pp + 1) % config.pp]
            node_pairs = dict.fromkeys((a[0], b[0]) for a, b in zip(members, nxt, strict=True))
            if alike:  # a pair's link is the one within a node or the one between nodes: the first pair of each
                first: dict[bool, tuple[int, int]] = {}
                for a, b in node_pairs:
                    first.setdefault(a == b, (a, b))
                node_pairs = dict.fromkeys(first.values())
            pp_links.append(_worst(cluster.link(a, b) for a, b in node_pairs))
        return cls(tuple(gpus), tuple(capacity), tuple(tp_links), tuple(dp_links), tuple(pp_links), tuple(cp_links),
                   tuple(replicate_links))

    def with_experts(self, cluster: Cluster, config: ParallelConfig, placement: Placement) -> GroupLinks:
        """These links with the expert groups' of `config` (`ep`: each pipeline rank's worst EP group, `edp`: the
        worst ring over its expert data-parallel groups)."""
        alike = _nodes_alike(cluster)
        worst_ring = _strided_rings(cluster, placement, alike)
        size = config.replicas * config.tp
        # expert ranks fold etp-ep-edp over the stage's ranks (`expert_link`): an EDP group is edp ranks at
        # stride etp·ep
        stride = config.etp * config.ep
        edp = tuple(worst_ring((pp * size + j for j in range(stride)), config.edp, stride) for pp in range(config.pp))
        position, ep = _position(cluster, placement, alike), {}  # ranks of alike positions share their EP groups' link
        for pp in range(config.pp):
            key = position(pp * size)
            if key not in ep:
                ep[key] = expert_link(cluster, config, placement.gpus[pp * size:(pp + 1) * size], alike)
        return replace(self, ep=tuple(ep[position(pp * size)] for pp in range(config.pp)), edp=edp)


def _strided_rings(cluster: Cluster, placement: Placement, alike: bool):
    """worst(starts, count, step): the slowest ring over the groups of `count` ranks at stride `step` from each
    start rank. When ranks sit on the cluster's GPUs in order and nodes are alike (`alike`: `_nodes_alike`), a
    group's shape depends only on where in its node it starts, so at most one ring per GPU position in a node,
    count and stride is evaluated."""
    ring = _ring_links(cluster, alike)
    position = _position(cluster, placement, alike)
    shapes: dict[tuple[int, int, int], Link] = {}  # per (position in node, or start rank, count, step)

    def worst(starts, count: int, step: int) -> Link:
        links: dict[int, Link] = {}
        for start in starts:
            key = position(start)
            if key not in links:
                shape = (key, count, step)
                if shape not in shapes:
                    shapes[shape] = ring(placement.gpus[start:start + count * step:step])
                links[key] = shapes[shape]
        return _worst(links.values())

    return worst


def _position(cluster: Cluster, placement: Placement, alike: bool) -> Callable[[int], int]:
    """What the groups starting at a rank look like, as a key: when ranks sit on the cluster's GPUs in order and nodes
    are alike (`alike`: `_nodes_alike`), a group of consecutive or strided ranks has the shape of any other starting
    at the same GPU position in its node, so the position; else the rank itself."""
    per_node = cluster.nodes[0].num_gpus
    if alike and placement.gpus == cluster.gpu_order[:len(placement.gpus)]:
        return lambda start: start % per_node
    return lambda start: start


def _ring_links(cluster: Cluster, alike: bool):
    """`cluster.ring_link`, memoised where that is exact: with all nodes alike (`alike`) and no per-pair links,
    a ring depends only on how many nodes it spans and how many of its GPUs each holds."""
    if not alike:
        return cluster.ring_link
    memo: dict[tuple[bool, int, int, bool], Link] = {}

    def ring(group: tuple[GpuId, ...]) -> Link:
        counts: dict[int, int] = {}
        for node, _gpu in group:
            counts[node] = counts.get(node, 0) + 1
        shape = (len(group) > 1, len(counts), min(counts.values()), max(counts.values()) > 1)
        if shape not in memo:
            memo[shape] = cluster.ring_link(group)
        return memo[shape]

    return ring


def _nodes_alike(cluster: Cluster) -> bool:
    """Whether every node has the same GPUs and bandwidths and no pair of nodes its own link: then a group's links
    depend only on how its GPUs spread over nodes."""
    first = cluster.nodes[0]
    return not cluster.pair_links and all(
        (n.gpu, n.num_gpus, n.intra_bandwidth_bytes_per_s, n.nic_bandwidth_bytes_per_s)
        == (first.gpu, first.num_gpus, first.intra_bandwidth_bytes_per_s, first.nic_bandwidth_bytes_per_s)
        for n in cluster.nodes)


def _worst_between(cluster: Cluster, nodes: list[int]) -> Link:
    """The slowest link between two of `nodes` (at least two): O(k) without pair overrides, where a pair's
    link is the slower NIC's, so the slowest NIC's node with any other gives it."""
    if cluster.pair_links:
        return _worst(cluster.link(a, b) for a, b in itertools.combinations(nodes, 2))
    slowest = min(nodes, key=lambda node: cluster.nodes[node].nic_bandwidth_bytes_per_s)
    return cluster.link(slowest, next(node for node in nodes if node != slowest))


def _worst(links) -> Link:
    """The slowest of several links (lowest bandwidth; latency breaks ties)."""
    return min(links, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))
