"""Measure LINKS with torch.distributed from inside a torchrun job (one process per GPU).

PyTorch is an optional extra, imported only when the probe runs. See `run_link_probe`.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from planner.errors import PlannerError
from planner.profile.links import CollectiveResult, LinksTable, links_from_results, write_links

__all__ = [
    "DEFAULT_PROBE_SIZES_BYTES",
    "assign_probe_nodes",
    "parse_sizes",
    "round_robin_rounds",
    "run_link_probe",
]

DEFAULT_PROBE_SIZES_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26)
_SIZE = re.compile(r"^(\d+)\s*([KMG]?)(i?B)?$", re.IGNORECASE | re.ASCII)


def parse_sizes(text: str) -> tuple[int, ...]:
    """`4K,64K,1M` → bytes (K/M/G are powers of 1024, as in nccl-tests' -b/-e); at least 2 sizes."""
    sizes: list[int] = []
    for item in text.split(","):
        match = _SIZE.match(item.strip())
        if not match:
            raise PlannerError(f"size {item.strip()!r} is not a byte count such as 4096, 64K or 16M")
        value = int(match[1]) * 1024 ** " KMG".index((match[2] or " ").upper())
        if value < 4:
            raise PlannerError(f"size {item.strip()!r} is below 4 bytes (one float32)")
        sizes.append(value)
    if len(set(sizes)) < 2:
        raise PlannerError(f"sizes {text!r}: give at least two different sizes to fit latency and bandwidth")
    return tuple(sorted(set(sizes)))


def assign_probe_nodes(hostnames: Sequence[str], simulate_nodes: int | None = None) -> tuple[str, ...]:
    """Each rank's node: its host name, or with `simulate_nodes` K (a testing aid) K pseudo-nodes
    ``node0..node{K−1}`` of contiguous rank blocks, so one machine can exercise the pair rounds."""
    world = len(hostnames)
    if simulate_nodes is None:
        return tuple(hostnames)
    if not 1 <= simulate_nodes <= world:
        raise PlannerError(f"--simulate-nodes {simulate_nodes} must be between 1 and the {world} ranks")
    return tuple(f"node{rank * simulate_nodes // world}" for rank in range(world))


def round_robin_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Circle-method tournament: every pair of `count` nodes once, each node in ≤ 1 pair per round."""
    slots: list[int | None] = list(range(count)) + ([None] if count % 2 else [])
    rounds = []
    for _ in range(len(slots) - 1):
        half = len(slots) // 2
        pairs = [(slots[i], slots[-1 - i]) for i in range(half)]
        played = [(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None]
        if played:
            rounds.append(played)
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def _import_torch() -> Any:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise PlannerError("planner profile links needs PyTorch: pip install 'planner[profile]'") from None
    if not dist.is_available():
        raise PlannerError("this PyTorch build has no torch.distributed; install one that does")
    return torch


@dataclass(frozen=True)
class _Probe:
    """What every timing loop needs: torch, the device, a clock barrier for GPU work."""

    torch: Any
    device: Any
    iters: int
    warmup: int

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def timed(self, step: Callable[[], None]) -> float:
        """Seconds per call of `step`, after warm-up, with the device drained before each clock read."""
        for _ in range(self.warmup):
            step()
        self.sync()
        start = time.perf_counter()
        for _ in range(self.iters):
            step()
        self.sync()
        return (time.perf_counter() - start) / self.iters

    def buffer(self, size_bytes: int) -> Any:
        return self.torch.ones(size_bytes // 4, dtype=self.torch.float32, device=self.device)


def _ping_pong(probe: _Probe, rank: int, peer: int, leader: bool, sizes: Sequence[int]) -> list[float]:
    """One-way time per size between two ranks: half a send-then-receive round trip."""
    dist = probe.torch.distributed
    times = []
    for size in sizes:
        tensor = probe.buffer(size)
        if leader:
            def step(t: Any = tensor) -> None:
                dist.send(t, peer)
                dist.recv(t, peer)
        else:
            def step(t: Any = tensor) -> None:
                dist.recv(t, peer)
                dist.send(t, peer)
        times.append(probe.timed(step) / 2)
    return times


def _all_reduce_times(probe: _Probe, group: Any, sizes: Sequence[int]) -> list[float]:
    dist = probe.torch.distributed
    times = []
    for size in sizes:
        tensor = probe.buffer(size)
        dist.barrier(group=group)
        times.append(probe.timed(lambda t=tensor: dist.all_reduce(t, group=group)))
    return times


def run_link_probe(
    backend: str = "gloo",
    sizes_bytes: Sequence[int] = DEFAULT_PROBE_SIZES_BYTES,
    *,
    iters: int = 10,
    warmup: int = 2,
    simulate_nodes: int | None = None,
    out: str | os.PathLike[str] | None = None,
    log: TextIO | None = None,
) -> LinksTable:
    """Measure LINKS from inside a torchrun job (one process per GPU, env:// rendezvous).

    Ranks are grouped by host name (or into `simulate_nodes` pseudo-nodes, a testing aid). Inside
    each node: all_reduce bus bandwidth over the node's ranks (its own process group) and a p2p
    ping-pong between its local ranks 0 and 1, all nodes at once. Between nodes: a round-robin
    tournament of rounds in which each node is in at most one pair, the first rank of each node
    ping-pongs with its partner's first rank while the others wait at a barrier. Fits α + S/β per
    entry (`links_from_results`); the diagonal prefers the all_reduce. Every rank returns the
    table; rank 0 writes `out` atomically and reports progress on stderr. nccl: CUDA tensors on
    LOCAL_RANK's GPU, synchronized before every clock read; gloo: CPU tensors.
    """
    if backend not in ("gloo", "nccl"):
        raise PlannerError(f"backend {backend!r} is not gloo or nccl")
    if iters < 1 or warmup < 0:
        raise PlannerError(f"iters must be ≥ 1 and warmup ≥ 0, got {iters} and {warmup}")
    sizes = sorted(set(int(s) for s in sizes_bytes))
    if len(sizes) < 2 or sizes[0] < 4:
        raise PlannerError("the probe needs at least two different sizes of at least 4 bytes")
    torch = _import_torch()
    dist = torch.distributed
    owns_group = not dist.is_initialized()
    if owns_group and ("RANK" not in os.environ or "WORLD_SIZE" not in os.environ):
        raise PlannerError("planner profile links must run under torchrun "
                           "(e.g. torchrun --nproc-per-node 8 ...): RANK/WORLD_SIZE are not set")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise PlannerError("backend nccl needs CUDA GPUs; use --backend gloo on CPU")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)  # before init, so NCCL and barrier() know this rank's GPU
    else:
        device = torch.device("cpu")
    if owns_group:
        dist.init_process_group(backend, init_method="env://")
    try:
        return _probe(_Probe(torch, device, iters, warmup), backend, sizes, simulate_nodes, out,
                      log or sys.stderr)
    finally:
        if owns_group:
            dist.destroy_process_group()


def _probe(probe: _Probe, backend: str, sizes: list[int], simulate_nodes: int | None, out: Any,
           log: TextIO) -> LinksTable:
    dist = probe.torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()

    def say(message: str) -> None:
        if rank == 0:
            print(f"links probe: {message}", file=log, flush=True)

    hostnames: list[Any] = [None] * world
    dist.all_gather_object(hostnames, socket.gethostname())
    node_of = assign_probe_nodes([str(h) for h in hostnames], simulate_nodes)
    nodes = list(dict.fromkeys(node_of))
    members = {node: [r for r in range(world) if node_of[r] == node] for node in nodes}
    say(f"{world} ranks on {len(nodes)} node(s){' (simulated)' if simulate_nodes else ''}, "
        f"backend {backend}, sizes {sizes[0]}..{sizes[-1]} B")
    measured: list[tuple[str, tuple[int, ...], list[float]]] = []  # (collective, ranks, times)

    groups = {node: dist.new_group(members[node]) for node in nodes}  # every rank creates every group
    mine = members[node_of[rank]]
    if len(mine) > 1:
        measured.append(("all_reduce", tuple(mine), _all_reduce_times(probe, groups[node_of[rank]], sizes)))
    dist.barrier()
    say("all_reduce inside each node done")
    if len(mine) > 1 and rank in mine[:2]:
        times = _ping_pong(probe, rank, mine[1 - mine.index(rank)], rank == mine[0], sizes)
        if rank == mine[0]:
            measured.append(("sendrecv", tuple(mine[:2]), times))
    dist.barrier()
    say("p2p inside each node done")
    rounds = round_robin_rounds(len(nodes))
    for number, pairs in enumerate(rounds, start=1):
        for a, b in pairs:
            first_a, first_b = members[nodes[a]][0], members[nodes[b]][0]
            if rank in (first_a, first_b):
                peer = first_b if rank == first_a else first_a
                times = _ping_pong(probe, rank, peer, rank == first_a, sizes)
                if rank == first_a:
                    measured.append(("sendrecv", (first_a, first_b), times))
        dist.barrier()
        say(f"round {number}/{len(rounds)}: " + ", ".join(f"{nodes[a]}<->{nodes[b]}" for a, b in pairs))

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, measured)
    table = _probe_table(gathered, node_of, nodes, sizes,
                         {"kind": "torch.distributed", "backend": backend, "world_size": world,
                          "hosts": sorted(set(map(str, hostnames))), "simulated_nodes": simulate_nodes,
                          "iters": probe.iters, "warmup": probe.warmup})
    if rank == 0 and out is not None:
        write_links(out, table)
        say(f"wrote {out}")
    dist.barrier()
    return table


def _probe_table(gathered: Sequence[Sequence[tuple[str, tuple[int, ...], list[float]]]],
                 node_of: Sequence[str], nodes: Sequence[str], sizes: Sequence[int],
                 source: Mapping[str, Any]) -> LinksTable:
    """Merge every rank's timings: a collective takes its slowest rank's time per size."""
    merged: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    for per_rank in gathered:
        for name, ranks, times in per_rank:
            key = (name, tuple(ranks))
            previous = merged.get(key, times)
            merged[key] = [max(a, b) for a, b in zip(previous, times, strict=True)]
    results = [
        CollectiveResult(name, len(ranks), tuple(node_of[r] for r in ranks), tuple(sizes), tuple(times),
                         f"torch.distributed {source['backend']} {name} ranks {list(ranks)}")
        for (name, ranks), times in merged.items()
    ]
    return links_from_results(results, source, nodes=nodes)
