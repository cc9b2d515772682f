"""Which GPU runs each rank (`Placement`), and what that means for the cost model: the GPU type of
each pipeline rank and the links its tensor-, pipeline- and data-parallel groups use.

Ranks follow Megatron-LM's default order tp-cp-ep-dp-pp (TP fastest, PP slowest):
rank = tp_rank + tp·(dp_rank + dp·pp_rank). The default placement puts rank r on the r-th GPU in
cluster order (node by node), which is what `torchrun` does with hosts listed in node order.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import Cluster, GpuId, Link
from planner.config import ParallelConfig
from planner.errors import PlannerError
from planner.gpu import GPUSpec

__all__ = ["GroupLinks", "Placement", "default_placement", "rank_coordinates", "rank_of"]


def rank_of(config: ParallelConfig, dp: int, pp: int, tp: int) -> int:
    return tp + config.tp * (dp + config.dp * pp)


def rank_coordinates(config: ParallelConfig, rank: int) -> tuple[int, int, int]:
    """(dp, pp, tp) coordinates of a global rank under the tp-dp-pp order."""
    tp = rank % config.tp
    dp = (rank // config.tp) % config.dp
    pp = rank // (config.tp * config.dp)
    return dp, pp, tp


@dataclass(frozen=True)
class Placement:
    """`gpus[rank]` is the (node index, GPU index) that runs global rank `rank`."""

    gpus: tuple[GpuId, ...]

    def gpu_of(self, config: ParallelConfig, dp: int, pp: int, tp: int) -> GpuId:
        return self.gpus[rank_of(config, dp, pp, tp)]


def default_placement(cluster: Cluster, config: ParallelConfig) -> Placement:
    """Rank r on the r-th GPU of the cluster (node-major); the job may use fewer GPUs than exist."""
    available = cluster.gpu_ids()
    if config.num_gpus > len(available):
        raise PlannerError(
            f"configuration needs {config.num_gpus} GPUs (dp·tp·pp·cp) but cluster {cluster.name} has "
            f"{len(available)}"
        )
    return Placement(tuple(available[: config.num_gpus]))


@dataclass(frozen=True)
class GroupLinks:
    """What the cost model needs from a placement, per pipeline rank.

    `gpu[r]`: the slowest GPU type among rank r's GPUs (it bounds the rank's speed);
    `capacity_bytes[r]`: the smallest memory among them. `tp[r]` / `dp[r]`: the worst ring over that
    rank's TP / DP groups. `pp[r]`: the worst link between rank r and rank r+1 (the last entry
    links the last rank back to the first, used only by interleaved schedules).
    """

    gpu: tuple[GPUSpec, ...]
    capacity_bytes: tuple[int, ...]
    tp: tuple[Link, ...]
    dp: tuple[Link, ...]
    pp: tuple[Link, ...]

    @classmethod
    def from_placement(cls, cluster: Cluster, config: ParallelConfig, placement: Placement) -> GroupLinks:
        if len(placement.gpus) != config.num_gpus:
            raise PlannerError(
                f"placement lists {len(placement.gpus)} GPUs for a configuration of {config.num_gpus}"
            )
        gpus, capacity, tp_links, dp_links, pp_links = [], [], [], [], []
        ring = _ring_links(cluster)
        size = config.dp * config.tp  # ranks of one pipeline rank are contiguous: tp fastest, then dp
        blocks = [placement.gpus[pp * size:(pp + 1) * size] for pp in range(config.pp)]
        for pp, members in enumerate(blocks):
            if cluster.gpu_overrides:
                types = {cluster.gpu_spec(member) for member in members}
            else:
                types = {cluster.nodes[node].gpu for node in {node for node, _ in members}}
            gpus.append(min(types, key=lambda g: (max(dict(g.peak_flops_per_s).values()), g.name)))
            capacity.append(min(g.memory_bytes for g in types))
            tp_links.append(_worst(ring(members[d * config.tp:(d + 1) * config.tp]) for d in range(config.dp)))
            dp_links.append(_worst(ring(members[t::config.tp]) for t in range(config.tp)))
            nxt = blocks[(pp + 1) % config.pp]
            node_pairs = dict.fromkeys((a[0], b[0]) for a, b in zip(members, nxt, strict=True))
            pp_links.append(_worst(cluster.link(a, b) for a, b in node_pairs))
        return cls(tuple(gpus), tuple(capacity), tuple(tp_links), tuple(dp_links), tuple(pp_links))


def _ring_links(cluster: Cluster):
    """`cluster.ring_link`, memoised where that is exact: with all nodes alike and no per-pair links,
    a ring depends only on how many nodes it spans and how many of its GPUs each holds."""
    first = cluster.nodes[0]
    alike = not cluster.pair_links and all(
        (n.gpu, n.num_gpus, n.intra_bandwidth_bytes_per_s, n.nic_bandwidth_bytes_per_s)
        == (first.gpu, first.num_gpus, first.intra_bandwidth_bytes_per_s, first.nic_bandwidth_bytes_per_s)
        for n in cluster.nodes)
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


def _worst(links) -> Link:
    """The slowest of several links (lowest bandwidth; latency breaks ties)."""
    return min(links, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))
