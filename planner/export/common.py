"""What every exporter shares: the result type, the plan's stage split, the host order that
realises the plan's placement under a rank-ordered launcher, and the cost model rebuilt from a plan.

Launchers (torchrun, the DeepSpeed launcher) number ranks node by node in host order, local rank
fastest, and each process uses the local-rank-th visible GPU. So a plan's placement is realised by
listing hosts in the order of the ranks they hold and, where a node's GPUs are used in another
order, by setting CUDA_VISIBLE_DEVICES on that node.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.cluster import Cluster, load_cluster, uniform_cluster
from planner.config import Partition, Schedule
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.frameworks import framework_named
from planner.gpu import GPUSpec, lookup_gpu
from planner.placement import Placement, default_placement
from planner.plan import Plan

__all__ = [
    "TRAIN_PLACEHOLDER_ARGS",
    "ExportResult",
    "HostOrder",
    "estimate_split",
    "export_header",
    "host_files",
    "host_order",
    "hostfile_text",
    "hosts_named",
    "placement_notes",
    "plan_placement",
    "plan_summary",
    "rebuild_cluster",
    "slower_attention_notes",
    "stage_units",
]


_GENERATED_NODE = re.compile(r"node\d+")  # planner's names for the nodes of a cluster given by shape
# Launch scripts' default optimiser/schedule flags (Megatron names), overridable with TRAIN_ARGS.
TRAIN_PLACEHOLDER_ARGS = ("--train-iters 100 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 10 "
                          "--weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --log-interval 1")


@dataclass(frozen=True)
class ExportResult:
    """Files to write (name → text, in a stable order) and notes a user must read before launching."""

    files: dict[str, str]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostOrder:
    """Hosts in node-rank order, processes per host, and each host's GPU order (None: 0..n-1).

    `problem` is set when no host order can realise the plan's placement; the launch then uses
    the launcher's default placement instead, and the output says so.
    """

    hosts: tuple[str, ...]
    nproc_per_node: int
    device_order: tuple[tuple[int, ...] | None, ...]
    problem: str | None = None
    # Hosts per NVLink domain where a domain spans several (a GB200 NVL72 rack: 18 trays, named NODE-hK by
    # planner); 1: each host is its own domain.
    domain_hosts: int = 1


def plan_summary(plan: Plan) -> str:
    """One line naming the model, cluster, degrees and estimated iteration time."""
    estimate_section = plan.document.get("estimate") or {}
    seconds = estimate_section.get("iteration_time_s")
    timing = f", estimated {seconds:.3f} s/iteration" if isinstance(seconds, (int, float)) else ""
    return (f"{plan.model.name} on {plan.cluster.get('name', '?')}: {plan.parallel.describe()}, "
            f"global batch {plan.training.global_batch}, sequence {plan.training.seq_len}{timing}")


def export_header(target: str, plan: Plan, notes: tuple[str, ...], *about: str) -> list[str]:
    """The comment lines every exported file starts with: what was exported, `about` lines, then the notes."""
    return [f"planner export --to {target}: {plan_summary(plan)}", *about, *(f"NOTE: {note}" for note in notes)]


def stage_units(plan: Plan) -> list[tuple[bool, int, int, bool]]:
    """Per virtual stage (pipeline order): (has embedding, first block, end block, has head)."""
    last = plan.partition.num_stages - 1
    return [(k == 0, start, end, k == last) for k, (start, end) in enumerate(plan.partition.block_ranges())]


def host_order(plan: Plan) -> HostOrder:
    """The host order (and per-host GPU order) under which rank r lands where the plan put it. A node whose
    NVLink domain spans several hosts (a GB200 NVL72 rack of 4-GPU trays) gives one host per tray: NODE-hK
    holds the node's GPUs K·g … K·g+g-1 as its local GPUs 0 … g-1."""
    ranks = sorted(plan.document.get("placement", {}).get("ranks", []), key=lambda r: r.get("rank", 0))
    world = plan.parallel.num_gpus
    if len(ranks) != world or [r.get("rank") for r in ranks] != list(range(world)):
        raise PlannerError(f"plan file: placement.ranks must list ranks 0..{world - 1} once each")
    tray_size = {node.name: node.gpus_per_host for node in plan.machines.nodes
                 if node.num_hosts > 1} if plan.machines else {}
    hosts: list[str] = []
    host_of_rank: list[str] = []
    per_host: dict[str, list[int]] = {}
    for entry in ranks:
        node, gpu = str(entry.get("node")), entry.get("gpu_index")
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise PlannerError(f"plan file: placement rank {entry['rank']} has gpu_index {gpu!r}")
        if node in tray_size:
            node, gpu = f"{node}-h{gpu // tray_size[node]}", gpu % tray_size[node]
        host_of_rank.append(node)
        if node not in per_host:
            hosts.append(node)
            per_host[node] = []
        per_host[node].append(gpu)
    counts = {len(gpus) for gpus in per_host.values()}
    nproc = max(counts)
    problem = None
    if len(counts) != 1:
        problem = (f"hosts run different numbers of ranks ({', '.join(f'{h}: {len(per_host[h])}' for h in hosts)}); "
                   "torchrun needs the same number per host")
    else:
        blocks = [host_of_rank[i * nproc] for i in range(len(hosts))]
        contiguous = all(host_of_rank[r] == blocks[r // nproc] for r in range(world))
        if not contiguous or len(set(blocks)) != len(blocks):
            problem = ("ranks on one host are not a contiguous block of global ranks; a launcher numbers "
                       "ranks host by host")
    domain_hosts = max((node.num_hosts for node in plan.machines.nodes), default=1) if plan.machines else 1
    if problem:
        return HostOrder(tuple(hosts), nproc, tuple(None for _ in hosts), problem, domain_hosts)
    order = tuple(None if per_host[h] == list(range(nproc)) else tuple(per_host[h]) for h in hosts)
    return HostOrder(tuple(hosts), nproc, order, domain_hosts=domain_hosts)


def hosts_named(order: HostOrder) -> bool:
    """Whether the plan's cluster names its hosts (a cluster file), not the generated node0, node1, … nor
    planner's NODE-hK for the trays of an NVLink domain."""
    return order.domain_hosts == 1 and any(not _GENERATED_NODE.fullmatch(host) for host in order.hosts)


def hostfile_text(order: HostOrder) -> str:
    """`host slots=N` lines in node-rank order (the DeepSpeed/MPI hostfile format)."""
    lines = ["# hosts in node-rank order: global rank = node_rank * slots + local_rank"]
    if not hosts_named(order):
        lines.append("# the plan's cluster does not name its hosts: replace these names with yours, in this order")
    if order.domain_hosts > 1:
        lines.append("# NODE-hK is host (tray) K of NVLink domain NODE: list each domain's hosts together")
    if order.problem:
        lines.append(f"# WARNING: the plan's placement cannot be realised by host order: {order.problem}")
    for host, devices in zip(order.hosts, order.device_order, strict=True):
        note = f"  # CUDA_VISIBLE_DEVICES={','.join(map(str, devices))}" if devices else ""
        lines.append(f"{host} slots={order.nproc_per_node}{note}")
    return "\n".join(lines) + "\n"


def host_files(order: HostOrder) -> dict[str, str]:
    """`hostfile` when the plan spans several nodes; one node needs none (launchers then run locally)."""
    return {"hostfile": hostfile_text(order)} if len(order.hosts) > 1 else {}


def placement_notes(order: HostOrder) -> tuple[str, ...]:
    """What a user must know when no host order realises the plan's placement."""
    if order.problem is None:
        return ()
    return (f"placement not realisable by host order ({order.problem}); the launcher's default rank placement "
            "is used instead",)


def slower_attention_notes(plan: Plan, runs: str, slower: Callable[[GPUSpec], bool]) -> tuple[str, ...]:
    """A note for a plan costed with the GPUs' native fused attention ("flash") whose framework `runs` another
    kernel, on the plan's GPUs where `slower` says that kernel is slower."""
    gpus = [node.gpu for node in plan.machines.nodes] if plan.machines else []
    names = sorted({gpu.name for gpu in gpus if slower(gpu)})
    if plan.training.attention != "flash" or not names:
        return ()
    return (f"{runs}, not the native fused attention the plan was costed with, which is faster on "
            f"{', '.join(names)}: estimate it with --attention flash2",)


def rebuild_cluster(plan: Plan) -> Cluster:
    """The plan's cluster: the one its file describes in full (schema v2: GPU profiles, links, slowdowns);
    for a version 1 file by name (catalog or NODESxGPUSxGPU), else identical nodes of the plan's GPU."""
    if plan.machines is not None:
        return plan.machines
    name = str(plan.cluster.get("name", ""))
    try:
        cluster = load_cluster(name)
    except (PlannerError, OSError):
        cluster = None
    if cluster is not None and cluster.num_gpus >= plan.parallel.num_gpus:
        return cluster
    try:
        num_nodes, per_node = int(plan.cluster["num_nodes"]), int(plan.cluster["gpus_per_node"])
        gpu = lookup_gpu(str(plan.cluster["gpu"]))
    except (KeyError, TypeError, ValueError):
        raise PlannerError(
            f"plan file: cannot rebuild cluster {name!r} (needs num_nodes, gpus_per_node, gpu)"
        ) from None
    return uniform_cluster(name or "plan-cluster", gpu, num_nodes, per_node)


def plan_placement(plan: Plan, cluster: Cluster) -> Placement:
    """The plan's rank → GPU map on the rebuilt cluster; the default one when node names differ."""
    try:
        ranks = sorted(plan.document["placement"]["ranks"], key=lambda r: r["rank"])
        return Placement(tuple((cluster.node_index(str(r["node"])), int(r["gpu_index"])) for r in ranks))
    except (KeyError, TypeError, PlannerError):
        return default_placement(cluster, plan.parallel)


def estimate_split(plan: Plan, blocks_per_stage: tuple[int, ...] | None = None,
                   without_interleaving: bool = False, framework: str | None = None) -> float:
    """Iteration time (s) per the cost model (the plan's calibration) of the plan with another block split
    per stage.

    `blocks_per_stage` None keeps the plan's own split; `without_interleaving` runs plain 1F1B
    with one stage per pipeline rank (for frameworks that have no interleaved schedule); `framework`
    runs it with that framework's execution semantics instead of the plan's.
    """
    cluster = rebuild_cluster(plan)
    config = plan.parallel if framework is None else framework_named(framework).runs(plan.parallel)
    if without_interleaving and config.vpp != 1:
        config = replace(config, vpp=1, schedule=Schedule.ONE_F_ONE_B, overlap_p2p_comm=None)
    partition = (plan.partition if blocks_per_stage is None
                 else Partition.from_blocks(list(blocks_per_stage), plan.model.num_layers))
    placement = plan_placement(plan, cluster)
    return estimate(plan.model, cluster, plan.training, config, partition, placement,
                    calibration=plan.calibration).iteration_time_s
