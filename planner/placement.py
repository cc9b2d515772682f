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
        for pp in range(config.pp):
            members = [placement.gpu_of(config, d, pp, t) for d in range(config.dp) for t in range(config.tp)]
            types = {cluster.gpu_spec(member) for member in members}
            gpus.append(min(types, key=lambda g: (max(dict(g.peak_flops_per_s).values()), g.name)))
            capacity.append(min(g.memory_bytes for g in types))
            tp_groups = [[placement.gpu_of(config, d, pp, t) for t in range(config.tp)] for d in range(config.dp)]
            dp_groups = [[placement.gpu_of(config, d, pp, t) for d in range(config.dp)] for t in range(config.tp)]
            tp_links.append(_worst(cluster.ring_link(group) for group in tp_groups))
            dp_links.append(_worst(cluster.ring_link(group) for group in dp_groups))
            nxt = (pp + 1) % config.pp
            pairs = [
                (placement.gpu_of(config, d, pp, t), placement.gpu_of(config, d, nxt, t))
                for d in range(config.dp)
                for t in range(config.tp)
            ]
            pp_links.append(_worst(cluster.p2p_link(a, b) for a, b in pairs))
        return cls(tuple(gpus), tuple(capacity), tuple(tp_links), tuple(dp_links), tuple(pp_links))


def _worst(links) -> Link:
    """The slowest of several links (lowest bandwidth; latency breaks ties)."""
    return min(links, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))
