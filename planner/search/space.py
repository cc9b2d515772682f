"""The configuration space: every valid `ParallelConfig` for a model, cluster and training job.

Rules (Megatron-LM's, see ../shared/REFERENCE.md): all GPUs are used, dp·tp·pp·cp = GPUs;
tp stays inside a node (a power of two dividing the GPUs per node) and divides both the attention
heads and the KV heads (Megatron-LM splits query groups with `divide()`, so tp > KV heads is not
allowed); pp·vpp ≤ layers so every virtual stage gets a block; the global batch divides by
micro-batch × dp; interleaving needs pp ≥ 2, vpp ≥ 2 and micro-batches a multiple of pp. Context
parallelism: the sequence divides by 2·cp (causal load balancing), every cp_comm variant is tried, and
a2a (Ulysses) needs the attention and KV heads of a TP rank to divide by cp. ZeRO-2/3 (FSDP) with
or without pipeline parallelism (DeepSpeed alone refuses it with PP; its export says so); HSDP only
when asked for. ZeRO-1 and the distributed optimizer shard alike, so the search explores the
distributed optimizer and takes ZeRO-1 only when asked for. Sequence parallelism is on whenever
tp > 1 (Megatron-LM's recommended setting) unless the user fixes it. With expert parallelism the flex
dispatcher and EP communication overlap are used wherever the framework runs them, unless fixed: neither
adds time in the cost model (flex sends at most the alltoall dispatcher's network bytes; overlap only hides).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from planner.cluster import Cluster
from planner.config import (
    CP_COMMS,
    DEFAULT_LOCAL_QUEUE_DEPTH,
    DEFAULT_RECOMPUTE_MODULES,
    LOCAL_HEADS,
    MOE_DISPATCHERS,
    PARALLEL_DEFAULTS,
    ParallelConfig,
    Recompute,
    Schedule,
    Training,
    ep_overlap_why_not,
    fp8_param_gather_why_not,
    graphed_recompute_why_not,
    optimizer_sharding_of,
    parse_recompute_modules,
)
from planner.cost.schedule import schedule_of
from planner.errors import PlannerError
from planner.frameworks import framework_named, megatron_overlaps_param_gather
from planner.model import ModelSpec

__all__ = ["MAX_SEARCHED_VPP", "MIN_SEARCHED_CP_TOKENS", "FixedOptions", "complete_config", "degree_triples",
           "enumerate_configs", "require_nonempty"]

# Fewest tokens a context-parallel rank keeps when the search picks cp (a fixed --cp may go lower): the
# published CP runs keep 4K-32K tokens per rank (long_context_cp_throughput.csv: NeMo long-sequence table,
# Megatron-Bridge 405B at 8K with cp=2; Llama 3 405B at 128K with cp=16, 8K per rank); below that the ring's
# per-step latency and kernel launches dominate the attention they hide behind.
MIN_SEARCHED_CP_TOKENS = 4096
# Larger vpp only adds p2p traffic for a bubble already ≤ 1/8 of the 1F1B one; users may fix more.
MAX_SEARCHED_VPP = 8


@dataclass(frozen=True)
class FixedOptions:
    """Options the user fixed on the command line; None leaves that dimension to the search."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    vpp: int | None = None
    recompute: Recompute | None = None
    recompute_modules: tuple[str, ...] | None = None  # Megatron-LM's --recompute-modules (implies selective)
    schedule: Schedule | None = None
    zero_stage: int | None = None
    distributed_optimizer: bool | None = None
    sequence_parallel: bool | None = None
    tp_comm_overlap: bool | None = None
    cp: int | None = None
    cp_comm: str | None = None
    hsdp_replicas: int | None = None
    ep: int | None = None
    etp: int | None = None
    moe_dispatcher: str | None = None
    moe_ep_overlap: bool | None = None
    zero3_collectives: str | None = None  # estimate only: the search keeps the default
    fsdp_backward_prefetch: str | None = None  # estimate only: the search keeps the default ("pre")
    recompute_num_layers: int | None = None  # estimate only: blocks per model chunk a full recompute re-runs
    cpu_offload_layers: int | None = None  # blocks whose activations go to host memory (pp 1, no recompute)
    fp8_param_gather: bool | None = None  # FP8 weight all-gathers wherever weights are sharded
    framework: str | None = None  # planner.frameworks name; None: any (every layout, Megatron-LM's semantics)
    local_queue_depth: int | None = None  # the local schedule's (config.DEFAULT_LOCAL_QUEUE_DEPTH when None)
    local_head: str | None = None  # the local schedule's auxiliary head ("linear" when None)
    tp_degrees: tuple[int, ...] | None = None  # the TP degrees to search (a measured profile's); None: every one

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> FixedOptions:
        """From the CLI's parallel options (`parallel_options` in cli.py)."""
        recompute, schedule = options.get("recompute"), options.get("schedule")
        modules = options.get("recompute_modules")
        return cls(
            tp=options.get("tp"), pp=options.get("pp"), dp=options.get("dp"), micro_batch=options.get("micro_batch"),
            vpp=options.get("vpp"), recompute=Recompute(recompute) if recompute else None,
            recompute_modules=parse_recompute_modules(modules) if modules is not None else None,
            schedule=Schedule(schedule) if schedule else None, zero_stage=options.get("zero_stage"),
            distributed_optimizer=options.get("distributed_optimizer"),
            sequence_parallel=options.get("sequence_parallel"),
            tp_comm_overlap=options.get("tp_comm_overlap"), cp=options.get("cp"), cp_comm=options.get("cp_comm"),
            hsdp_replicas=options.get("hsdp_replicas"), framework=options.get("framework"),
            ep=options.get("ep"), etp=options.get("etp"), moe_dispatcher=options.get("moe_dispatcher"),
            moe_ep_overlap=options.get("moe_ep_overlap"), zero3_collectives=options.get("zero3_collectives"),
            fsdp_backward_prefetch=options.get("fsdp_backward_prefetch"),
            recompute_num_layers=options.get("recompute_num_layers"),
            cpu_offload_layers=options.get("cpu_offload_layers"),
            local_queue_depth=options.get("local_queue_depth"), local_head=options.get("local_head"),
            fp8_param_gather=options.get("fp8_param_gather"),
        )

    @property
    def names_recompute_modules(self) -> bool:
        """Whether the user named recompute modules other than the default (selective recompute of those)."""
        return self.recompute_modules not in (None, DEFAULT_RECOMPUTE_MODULES)

    def recompute_options(self) -> list[tuple[Recompute, tuple[str, ...]]]:
        """The (recompute, recompute_modules) pairs to plan: the fixed ones, selective when modules are named,
        else every mode with the default modules."""
        modules = self.recompute_modules or DEFAULT_RECOMPUTE_MODULES
        if self.recompute is not None:
            return [(self.recompute, modules)]
        return [(Recompute.SELECTIVE, modules)] if self.names_recompute_modules else [
            (recompute, DEFAULT_RECOMPUTE_MODULES) for recompute in Recompute]

    def local_options(self) -> dict[str, Any]:
        """The local schedule's fields of a ParallelConfig (their defaults where left open)."""
        return {"local_queue_depth": self.local_queue_depth or DEFAULT_LOCAL_QUEUE_DEPTH,
                "local_head": self.local_head or "linear"}


def _selective(recompute: Recompute, modules: tuple[str, ...]) -> frozenset[str]:
    """The modules a recompute option re-runs selectively (ParallelConfig.selective_modules)."""
    return frozenset(modules) if recompute is Recompute.SELECTIVE else frozenset()


def _graphed_recomputes(model: ModelSpec, training: Training,
                        fixed: FixedOptions) -> list[tuple[Recompute, tuple[str, ...]]]:
    """The (recompute, recompute_modules) options `fixed` leaves open that the training's per-layer CUDA graphs allow
    (`graphed_recompute_why_not`; all of them without graphs)."""
    return [(recompute, modules) for recompute, modules in fixed.recompute_options()
            if graphed_recompute_why_not(training.cuda_graph_modules, recompute, _selective(recompute, modules),
                                         model.dropout) is None]


def _check_graphed_parts(model: ModelSpec, training: Training, fixed: FixedOptions) -> None:
    """The per-layer CUDA graphs fit the model, the dispatcher, and at least one recompute option left open
    (ParallelConfig.check_cuda_graph_modules; the search skips the options they rule out)."""
    if not training.cuda_graph_modules:
        return
    recompute, modules = (_graphed_recomputes(model, training, fixed) or fixed.recompute_options())[0]
    ParallelConfig(dp=1, tp=1, pp=1, recompute=recompute, recompute_modules=modules,
                   moe_dispatcher=fixed.moe_dispatcher or "alltoall").check_cuda_graph_modules(
        training, model.layer_kind_counts, model.dropout)


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(√n) (a global batch may be 10⁸ sequences)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _listed(values: list[int], most: int = 12) -> str:
    """'1, 2, 4, 8', or the first `most` values and '…' (a sequence length has many divisors)."""
    return ", ".join(map(str, values[:most])) + (", …" if len(values) > most else "")


def _tp_allowed(tp: int, model: ModelSpec, cluster: Cluster) -> str | None:
    """None if tp is valid, else why not."""
    per_node = cluster.gpus_per_node
    if tp & (tp - 1) or tp > per_node or per_node % tp:
        return f"must be a power of two dividing the {per_node} GPUs per node"
    if model.num_attention_heads % tp or model.num_key_value_heads % tp:
        return (f"must divide the attention heads ({model.num_attention_heads}) and KV heads "
                f"({model.num_key_value_heads})")
    return None


def _cp_allowed(cp: int, cp_comm: str | None, tp: int, model: ModelSpec, training: Training) -> str | None:
    """None if cp (with this variant, if given) is valid at this tp, else why not."""
    if cp > 1 and training.seq_len % (2 * cp):  # without CP any length runs (a ViT's 197 tokens)
        allowed = [c for c in _divisors(training.seq_len // 2) if training.seq_len % (2 * c) == 0]
        return (f"must divide the sequence length {training.seq_len} into 2·cp chunks (causal load balancing; "
                f"allowed: {_listed(allowed)})")
    if cp_comm == "a2a" and cp > 1 and (model.num_attention_heads % (tp * cp) or model.num_key_value_heads % (tp * cp)):
        return (f"with --cp-comm a2a, tp·cp must divide the attention heads ({model.num_attention_heads}) and KV "
                f"heads ({model.num_key_value_heads})")
    return None


def _check_fixed(model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions) -> None:
    """Reject fixed values that are wrong on their own, naming the value and what is allowed."""
    gpus = cluster.num_gpus
    for name in ("tp", "pp", "dp", "micro_batch", "vpp", "cp", "hsdp_replicas"):
        value = getattr(fixed, name)
        if value is not None and value < 1:
            flag = "hsdp" if name == "hsdp_replicas" else name.replace("_", "-")
            raise PlannerError(f"--{flag} must be a positive integer, got {value}")
    if fixed.fp8_param_gather and (why := fp8_param_gather_why_not(training)):
        raise PlannerError(f"--fp8-param-gather {why}")
    if fixed.fp8_param_gather and (why := framework_named(fixed.framework or "any").fp8_gather_why_not(
            training.fp8_recipe)):
        raise PlannerError(f"--fp8-param-gather: {why}")
    if fixed.cpu_offload_layers:  # what Megatron-Core allows with CPU offloading, checked as a configuration would be
        (recompute, _), *_ = fixed.recompute_options()
        ParallelConfig(dp=1, tp=1, pp=fixed.pp or 1, recompute=recompute,
                       cpu_offload_layers=fixed.cpu_offload_layers).check_cpu_offload(model.num_layers, training)
    _check_graphed_parts(model, training, fixed)
    if fixed.cp_comm is not None and fixed.cp_comm not in CP_COMMS:
        raise PlannerError(f"--cp-comm must be one of {', '.join(CP_COMMS)}, got {fixed.cp_comm!r}")
    if fixed.cp is not None and (why := _cp_allowed(fixed.cp, fixed.cp_comm, fixed.tp or 1, model, training)):
        raise PlannerError(f"--cp {fixed.cp} is not allowed: cp {why}")
    if fixed.tp is not None and (why := _tp_allowed(fixed.tp, model, cluster)):
        raise PlannerError(f"--tp {fixed.tp} is not allowed: tp {why}")
    for name in ("tp", "pp", "dp", "cp"):
        value = getattr(fixed, name)
        if value is not None and gpus % value:
            raise PlannerError(f"--{name} {value} does not divide the cluster's {gpus} GPUs "
                               f"(allowed: {_listed(_divisors(gpus))})")
    if fixed.pp is not None and fixed.pp > model.num_layers:
        raise PlannerError(f"--pp {fixed.pp} exceeds the model's {model.num_layers} layers")
    if fixed.dp is not None and training.global_batch % fixed.dp:
        raise PlannerError(f"--dp {fixed.dp} does not divide the global batch {training.global_batch}")
    if fixed.micro_batch is not None and training.global_batch % fixed.micro_batch:
        raise PlannerError(
            f"--micro-batch {fixed.micro_batch} does not divide the global batch {training.global_batch}")
    _check_local(fixed)
    _check_recompute_modules(fixed)
    if fixed.schedule is not None:
        framework_named(fixed.framework or "any").check_schedule(fixed.schedule)
        if schedule_of(fixed.schedule).splits_backward and fixed.pp == 1:
            raise PlannerError(f"--schedule {fixed.schedule.value} splits the backward between pipeline stages and "
                               f"needs pp >= 2, got --pp 1")
    if fixed.vpp is not None and fixed.schedule is not None:
        behaviour = schedule_of(fixed.schedule)
        if fixed.vpp not in behaviour.chunk_counts(max(fixed.vpp, 2)):
            some = behaviour.chunk_counts(3)
            allowed = f"{some[0]} or more" if len(some) > 1 else str(some[0])
            chunked = ", ".join(s.value for s in Schedule if schedule_of(s).chunked)
            raise PlannerError(f"--vpp {fixed.vpp} is not allowed with --schedule {fixed.schedule.value} (allowed: "
                               f"{allowed}; chunks per rank need one of {chunked})")
    if fixed.sequence_parallel and fixed.tp == 1:
        raise PlannerError("--sequence-parallel needs tp > 1, got --tp 1")
    if fixed.tp_comm_overlap and (fixed.tp == 1 or fixed.sequence_parallel is False):
        given = "--tp 1" if fixed.tp == 1 else "--no-sequence-parallel"
        raise PlannerError(f"--tp-comm-overlap overlaps the sequence-parallel collectives and needs tp > 1 with "
                           f"sequence parallelism, got {given}")
    if fixed.hsdp_replicas not in (None, 1) and fixed.zero_stage not in (None, 3):
        raise PlannerError(f"--hsdp {fixed.hsdp_replicas} shards within replicas and needs --zero 3, "
                           f"got --zero {fixed.zero_stage}")
    if fixed.hsdp_replicas is not None and gpus % fixed.hsdp_replicas:
        raise PlannerError(f"--hsdp {fixed.hsdp_replicas} does not divide the cluster's {gpus} GPUs")
    if fixed.distributed_optimizer and fixed.zero_stage not in (None, 0, 1):
        raise PlannerError(f"--distributed-optimizer cannot be combined with --zero {fixed.zero_stage}")


def _check_recompute_modules(fixed: FixedOptions) -> None:
    """Named recompute modules are selective recompute's, of a framework that takes a module list."""
    if not fixed.names_recompute_modules:
        return
    named = ",".join(fixed.recompute_modules or ())
    if fixed.recompute not in (None, Recompute.SELECTIVE):
        raise PlannerError(f"--recompute-modules {named} is what selective recompute re-runs and needs --recompute "
                           f"selective, got --recompute {fixed.recompute.value}")
    why = framework_named(fixed.framework or "any").recompute_modules_why_not(fixed.recompute_modules or ())
    if why:
        raise PlannerError(f"--recompute-modules: {why}; plan with --framework megatron")


def _check_local(fixed: FixedOptions) -> None:
    """The local schedule's options: a queue of at least one slot, a known head, only with --schedule local
    (with at least two pipeline stages)."""
    given = [f"--local-{name}" for name in ("queue-depth", "head")
             if getattr(fixed, f"local_{name.replace('-', '_')}") is not None]
    local = fixed.schedule is not None and schedule_of(fixed.schedule).local_losses
    if given and not local:
        raise PlannerError(f"{' and '.join(given)} configure local learning and need --schedule local")
    if fixed.local_queue_depth is not None and fixed.local_queue_depth < 1:
        raise PlannerError(f"--local-queue-depth must be at least 1 (boundary tensors a stage may send ahead), "
                           f"got {fixed.local_queue_depth}")
    if fixed.local_head is not None and fixed.local_head not in LOCAL_HEADS:
        raise PlannerError(f"--local-head must be one of {', '.join(LOCAL_HEADS)}, got {fixed.local_head!r}")
    if local and fixed.pp is not None and fixed.pp < 2:
        raise PlannerError(f"--schedule local trains each pipeline stage on its own loss and needs --pp 2 or more, "
                           f"got --pp {fixed.pp}")


def degree_triples(model: ModelSpec, cluster: Cluster, training: Training,
                   fixed: FixedOptions = FixedOptions()) -> list[tuple[int, int, int, int]]:
    """(dp, tp, pp, cp) with dp·tp·pp·cp = GPUs, valid tp and cp, pp ≤ layers and dp dividing the global batch."""
    _check_fixed(model, cluster, training, fixed)
    gpus = cluster.num_gpus
    out = []
    for tp in _divisors(cluster.gpus_per_node):
        if (_tp_allowed(tp, model, cluster) or fixed.tp not in (None, tp) or gpus % tp
                or (fixed.tp_degrees is not None and tp not in fixed.tp_degrees)):
            continue
        for cp in _divisors(gpus // tp):
            if fixed.cp not in (None, cp) or _cp_allowed(cp, None, tp, model, training):
                continue
            if fixed.cp is None and cp > 1 and training.seq_len / cp < MIN_SEARCHED_CP_TOKENS:
                continue
            for pp in _divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                if (pp > model.num_layers or fixed.pp not in (None, pp) or fixed.dp not in (None, dp)
                        or training.global_batch % dp):
                    continue
                out.append((dp, tp, pp, cp))
    return out


def _cp_comms(cp: int, tp: int, model: ModelSpec, training: Training, fixed: FixedOptions) -> list[str]:
    """The CP variants to try: all that this cp and tp allow, or the fixed one (irrelevant at cp = 1)."""
    if cp == 1:
        return [fixed.cp_comm or "p2p"]
    wanted = [fixed.cp_comm] if fixed.cp_comm else list(CP_COMMS)
    return [comm for comm in wanted if not _cp_allowed(cp, comm, tp, model, training)]


def _schedules(pp: int, m: int, num_layers: int, fixed: FixedOptions) -> list[tuple[Schedule, int]]:
    """(schedule, vpp) pairs allowed for this pipeline depth and micro-batch count: the fixed schedule, or
    those the framework's search tries (`Framework.searches`)."""
    out: list[tuple[Schedule, int]] = []
    framework = framework_named(fixed.framework or "any")
    for schedule in Schedule:
        if fixed.schedule not in (None, schedule) or (fixed.schedule is None and not framework.searches(schedule)):
            continue
        behaviour = schedule_of(schedule, framework.pipeline_order)
        if (behaviour.splits_backward or behaviour.chunked or behaviour.local_losses) and pp < 2:
            continue  # without a pipeline a split backward, chunks or local losses change nothing
        if not behaviour.runnable(pp, m):
            continue
        top = min(num_layers // pp, MAX_SEARCHED_VPP if fixed.vpp is None else fixed.vpp)
        out.extend((schedule, v) for v in behaviour.chunk_counts(top) if fixed.vpp in (None, v))
    return out


def _sharding_options(replicas: int, fixed: FixedOptions) -> list[tuple[int, bool, int]]:
    """(zero_stage, distributed_optimizer, hsdp_replicas) triples; sharding is pointless (identical) when no
    other rank holds the same weights (dp·cp = 1). FSDP (ZeRO-2/3) is explored with pipelines too; HSDP
    only when fixed."""
    hsdp = fixed.hsdp_replicas or 1
    if replicas % hsdp:
        return []
    if fixed.zero_stage is not None or fixed.distributed_optimizer is not None:
        zero_stage = fixed.zero_stage or (3 if hsdp > 1 else 0)
        return [(zero_stage, bool(fixed.distributed_optimizer), hsdp)]
    if hsdp > 1:
        return [(3, False, hsdp)]
    if replicas == 1:
        return [(0, False, 1)]
    return [(0, False, 1), (0, True, 1), (2, False, 1), (3, False, 1)]


def _sequence_parallel(fixed: FixedOptions, tp: int) -> bool:
    """Sequence parallelism: on whenever tp > 1 (Megatron-LM's recommended setting) unless fixed."""
    return tp > 1 if fixed.sequence_parallel is None else fixed.sequence_parallel and tp > 1


def _tp_comm_overlaps(fixed: FixedOptions, sequence_parallel: bool) -> list[bool]:
    """TP communication overlap: on wherever sequence parallelism runs, unless fixed. It only hides
    communication (the cost model never charges it time), so trying it off too would double the
    space for plans it dominates; `--no-tp-comm-overlap` plans without it."""
    if not sequence_parallel:
        return [False]
    return [True] if fixed.tp_comm_overlap is None else [fixed.tp_comm_overlap]


def _ep_overlap(ep: int, recompute: Recompute, pp: int, vpp: int, fixed: FixedOptions) -> bool | None:
    """EP communication overlap for a configuration of these degrees: wherever Megatron-Core can run it
    (`ep_overlap_why_not`), unless fixed (it only hides communication, like `_tp_comm_overlaps`); None drops a
    configuration a fixed --moe-ep-overlap cannot run."""
    allowed = ep_overlap_why_not(ep, recompute, pp, vpp) is None
    if fixed.moe_ep_overlap is None:
        return allowed
    return None if fixed.moe_ep_overlap and not allowed else fixed.moe_ep_overlap


def _check_fixed_experts(model: ModelSpec, cluster: Cluster, fixed: FixedOptions) -> None:
    """Reject a fixed --ep / --etp that no layout can run: on a dense model, an ep not dividing the routed
    experts (an EP group larger than the expert count included), or ep·etp not dividing the GPUs."""
    ep, etp = fixed.ep or 1, fixed.etp or 1
    for name, value in (("ep", fixed.ep), ("etp", fixed.etp)):
        if value is not None and value < 1:
            raise PlannerError(f"--{name} must be a positive integer, got {value}")
    if ep * etp > 1 and not model.is_moe:
        raise PlannerError(f"--ep {ep} / --etp {etp}: {model.name} has no routed experts; use ep = etp = 1")
    experts = f"{model.name}'s {model.num_experts} routed experts (allowed: {_listed(_divisors(model.num_experts))})"
    if ep > model.num_experts:
        raise PlannerError(f"--ep {ep}: an expert-parallel group of {ep} ranks is larger than {experts}")
    if model.num_experts % ep:
        raise PlannerError(f"--ep {ep} must divide {experts}")
    if cluster.num_gpus % (ep * etp):
        gpus = cluster.num_gpus
        allowed = (f"with --ep {ep}, --etp may be {_listed(_divisors(gpus // ep))}" if gpus % ep == 0 else
                   f"--ep may be {_listed(_divisors(math.gcd(gpus, model.num_experts)))}")
        raise PlannerError(f"--ep {ep} × --etp {etp} = {ep * etp} does not divide the cluster's {gpus} GPUs "
                           f"({allowed})")
    if fixed.moe_dispatcher is not None and fixed.moe_dispatcher not in MOE_DISPATCHERS:
        raise PlannerError(f"--moe-dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, "
                           f"got {fixed.moe_dispatcher!r}")
    if fixed.moe_ep_overlap and (not model.is_moe or fixed.ep == 1):
        raise PlannerError(f"--moe-ep-overlap overlaps expert-parallel all-to-alls and needs an MoE model with "
                           f"ep > 1, got {model.name} with --ep {fixed.ep}" if model.is_moe else
                           f"--moe-ep-overlap: {model.name} has no routed experts")
    if fixed.etp is not None and model.expert_ffn_hidden_size % fixed.etp:
        width = model.expert_ffn_hidden_size
        raise PlannerError(f"--etp {fixed.etp} must divide the expert intermediate size {width} "
                           f"(allowed: {_listed(_divisors(width))})")


def _expert_options(model: ModelSpec, tp: int, ranks: int, fixed: FixedOptions) -> list[tuple[int, int]]:
    """(ep, etp) pairs for a stage of `ranks` = tp·cp·dp GPUs (Megatron-Core's parallel folding: the expert
    grid etp·ep·edp is laid over those ranks independently of tp·cp·dp). etp is 1 or tp (torchtitan allows
    only these; Megatron-LM defaults to tp), ep a power of two dividing the routed experts and ranks / etp."""
    if not model.is_moe:
        return [(1, 1)]
    etps = [fixed.etp] if fixed.etp else sorted({1, tp})
    out = []
    for etp in etps:
        if ranks % etp or model.expert_ffn_hidden_size % etp:
            continue
        for ep in _divisors(model.num_experts):
            if (ep & (ep - 1) and fixed.ep != ep) or fixed.ep not in (None, ep) or (ranks // etp) % ep:
                continue
            out.append((ep, etp))
    return out


def complete_config(fixed: FixedOptions, model: ModelSpec, cluster: Cluster, training: Training) -> ParallelConfig:
    """The one configuration `estimate` evaluates from what the user fixed, checked like the search's:
    unspecified degrees default to 1 (vpp 2 for zb-v) with dp taking the remaining GPUs, the defaults of the search
    (1F1B, or interleaved when vpp > 1; sequence parallelism with tp > 1; no recompute, sharding, TP or EP
    communication overlap, Megatron-LM's defaults; the alltoall dispatcher), as `fixed.framework` runs it
    (PlannerError if it cannot)."""
    _check_fixed(model, cluster, training, fixed)
    tp, pp, cp = fixed.tp or 1, fixed.pp or 1, fixed.cp or 1
    dp = fixed.dp
    if dp is None:
        if cluster.num_gpus % (tp * pp * cp):
            raise PlannerError(f"tp × pp × cp = {tp * pp * cp} does not divide the cluster's {cluster.num_gpus} GPUs; "
                               f"give --dp explicitly")
        dp = cluster.num_gpus // (tp * pp * cp)
    chunks = schedule_of(fixed.schedule).chunk_counts(3) if fixed.schedule else range(1, 2)
    vpp = fixed.vpp or (chunks[0] if len(chunks) == 1 else 1)  # zb-v runs two chunks, no more, no fewer
    hsdp = fixed.hsdp_replicas or 1
    _check_fixed_experts(model, cluster, fixed)
    (recompute, modules), *_ = fixed.recompute_options()  # the fixed one, else selective of the named, else none
    if fixed.recompute_num_layers is not None and recompute is not Recompute.FULL:
        raise PlannerError(f"--recompute-num-layers {fixed.recompute_num_layers} picks the blocks a full recompute "
                           f"re-runs; it needs --recompute full, got {recompute.value}")
    etp = fixed.etp or (tp if model.is_moe else 1)  # Megatron-LM: --expert-tensor-parallel-size defaults to tp
    ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, ep=fixed.ep or 1, etp=etp).check_experts(model.num_experts)
    return framework_named(fixed.framework or "any").require(ParallelConfig(
        dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, cp_comm=fixed.cp_comm or "p2p", hsdp_replicas=hsdp,
        ep=fixed.ep or 1, etp=etp, moe_dispatcher=fixed.moe_dispatcher or "alltoall",
        moe_ep_overlap=bool(fixed.moe_ep_overlap), zero3_collectives=fixed.zero3_collectives or "per-unit",
        fsdp_backward_prefetch=fixed.fsdp_backward_prefetch or "pre",
        fp8_param_gather=bool(fixed.fp8_param_gather), micro_batch=fixed.micro_batch or 1,
        sequence_parallel=_sequence_parallel(fixed, tp), recompute=recompute, recompute_modules=modules,
        recompute_num_layers=fixed.recompute_num_layers, tp_comm_overlap=bool(fixed.tp_comm_overlap),
        cpu_offload_layers=fixed.cpu_offload_layers or 0, zero_stage=fixed.zero_stage or (3 if hsdp > 1 else 0),
        distributed_optimizer=bool(fixed.distributed_optimizer),
        schedule=fixed.schedule or (Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B),
        **fixed.local_options(),
    ))


def enumerate_configs(model: ModelSpec, cluster: Cluster, training: Training,
                      fixed: FixedOptions = FixedOptions()) -> Iterator[ParallelConfig]:
    """Every valid configuration `fixed.framework` runs, as it runs it, in a fixed, deterministic order (built from
    checked options without checking each, `ParallelConfig.unchecked`; each equals its checked configuration)."""
    return runnable_by_framework(_layouts(model, cluster, training, fixed), fixed, training, model)


def runnable_by_framework(configs: Iterable[ParallelConfig], fixed: FixedOptions, training: Training | None = None,
                          model: ModelSpec | None = None) -> Iterator[ParallelConfig]:
    """The configurations the framework runs, with its execution semantics. Where the user left them open,
    the framework's own way of sharding only optimizer states stands for the distributed optimizer
    (DeepSpeed: ZeRO-1; torchtitan has none), and TP communication overlap, EP communication overlap and the
    flex dispatcher are off where it has none (TP overlap also where its schedule rules it out: torchtitan's
    async TP needs torch.compile, which its zero-bubble schedules do not run under); with `training`, only the
    sharding its optimizer states need (e.g. CPU offload: Megatron-LM's distributed optimizer, DeepSpeed's
    ZeRO 1-3); with `model`, only what the framework runs of that model (`Framework.for_model`)."""
    framework = framework_named(fixed.framework or "any")
    if model is not None:
        framework = framework.for_model(model)
    sharding_open = fixed.zero_stage is None and fixed.distributed_optimizer is None
    overlap_open = fixed.tp_comm_overlap is None
    fp8_gather_open = fixed.fp8_param_gather is None
    ep_overlap_open = fixed.moe_ep_overlap is None
    dispatcher_open = fixed.moe_dispatcher is None
    for config in configs:
        if dispatcher_open and config.moe_dispatcher not in framework.moe_dispatchers:
            config = replace(config, moe_dispatcher="alltoall")
        if ep_overlap_open and config.moe_ep_overlap and not framework.overlaps_ep(config):
            config = replace(config, moe_ep_overlap=False)
        if sharding_open and (config.zero_stage, config.distributed_optimizer) == (0, True):
            if framework.optimizer_sharding_only is None:
                continue
            if framework.optimizer_sharding_only != (0, True):  # Megatron-LM's own: the configuration as it is
                zero_stage, distributed_optimizer = framework.optimizer_sharding_only
                config = replace(config, zero_stage=zero_stage, distributed_optimizer=distributed_optimizer)
        if overlap_open and config.tp_comm_overlap and not framework.overlaps_tp(config):
            config = replace(config, tp_comm_overlap=False)
        if (fp8_gather_open and config.fp8_param_gather and training is not None
                and not framework.gathers_weights_in_fp8(training.fp8_recipe)):
            config = replace(config, fp8_param_gather=False)
        if framework.why_not(config) is None and (training is None or training.optimizer_states == "fp32"
                                                  or framework.training_why_not(training, config) is None):
            yield framework.runs(config)


def _layouts(model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions) -> Iterator[ParallelConfig]:
    """Every valid configuration in a fixed, deterministic order, whichever framework runs it."""
    recomputes, local = _graphed_recomputes(model, training, fixed), fixed.local_options()
    _check_fixed_experts(model, cluster, fixed)
    offload = fixed.cpu_offload_layers or 0
    # FP8 weights wherever they are sharded, unless the user says otherwise: they gather in half the bytes, and
    # with Transformer Engine they take the place of the 16-bit weights and their FP8 copies (fp8_weight_copy_bytes)
    fp8_weights = (fp8_param_gather_why_not(training) is None if fixed.fp8_param_gather is None
                   else fixed.fp8_param_gather)
    for dp, tp, pp, cp in degree_triples(model, cluster, training, fixed):
        if offload and pp > 1:
            continue  # Megatron-Core offloads activations only without pipelining
        sp = _sequence_parallel(fixed, tp)
        experts = _expert_options(model, tp, tp * cp * dp, fixed)
        comms = _cp_comms(cp, tp, model, training, fixed)
        for micro_batch in _divisors(training.global_batch // dp):
            if fixed.micro_batch not in (None, micro_batch):
                continue
            m = training.global_batch // (dp * micro_batch)
            for schedule, vpp in _schedules(pp, m, model.num_layers, fixed):
                if pp * vpp > model.num_layers:
                    continue
                # the innermost options, the same under every sharding
                inner = [{"cp_comm": comm, "ep": ep, "etp": etp, "recompute": recompute, "recompute_modules": modules,
                          "tp_comm_overlap": overlap, "moe_ep_overlap": ep_overlap, "cpu_offload_layers": offload,
                          "moe_dispatcher": fixed.moe_dispatcher or ("flex" if ep > 1 else "alltoall")}
                         for (recompute, modules), overlap, comm, (ep, etp) in product(
                             recomputes, _tp_comm_overlaps(fixed, sp), comms, experts)
                         if (ep_overlap := _ep_overlap(ep, recompute, pp, vpp, fixed)) is not None
                         and not (offload and recompute is not Recompute.NONE)]
                for zero_stage, dist_opt, hsdp in _sharding_options(dp * cp, fixed):
                    sharding = optimizer_sharding_of(zero_stage, dist_opt)
                    common = {**PARALLEL_DEFAULTS, "dp": dp, "tp": tp, "pp": pp, "micro_batch": micro_batch,
                              "vpp": vpp, "cp": cp, "hsdp_replicas": hsdp, "sequence_parallel": sp,
                              "zero_stage": zero_stage, "distributed_optimizer": dist_opt, "schedule": schedule,
                              "fp8_param_gather": fp8_weights and sharding > 0,
                              # as Megatron-LM runs it, the default target's semantics: nothing to replace there
                              "overlap_param_gather": megatron_overlaps_param_gather(sharding),
                              **local}
                    for options in inner:  # options checked above; the search checks each configuration it uses
                        yield ParallelConfig.unchecked({**common, **options})


def require_nonempty(configs: list[ParallelConfig], model: ModelSpec, cluster: Cluster, training: Training,
                     fixed: FixedOptions) -> list[ParallelConfig]:
    """The space, or a PlannerError naming the fixed options that together leave nothing (and, where the target
    framework ruled out every layout, why it refused the first)."""
    if configs:
        return configs
    given = {k: v for k, v in fixed.__dict__.items() if v is not None}
    text = ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in given.items()) or "none"
    first = next(iter(_layouts(model, cluster, training, fixed)), None) if fixed.framework else None
    why = first and framework_named(fixed.framework).for_model(model).why_not(first)
    raise PlannerError(
        f"no valid configuration of {model.name} on {cluster.num_gpus} GPUs with global batch "
        f"{training.global_batch} (fixed options: {text}){f': {why}' if why else ''}; relax a fixed option or "
        "change the batch"
    )
