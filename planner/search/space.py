"""The configuration space: every valid `ParallelConfig` for a model, cluster and training job.

Rules (Megatron-LM's, see ../shared/REFERENCE.md): all GPUs are used, dp·tp·pp = GPUs (cp = 1);
tp stays inside a node (a power of two dividing the GPUs per node) and divides both the attention
heads and the KV heads (Megatron-LM splits query groups with `divide()`, so tp > KV heads is not
allowed); pp·vpp ≤ layers so every virtual stage gets a block; the global batch divides by
micro-batch × dp; interleaving needs pp ≥ 2, vpp ≥ 2 and micro-batches a multiple of pp. ZeRO-2/3
only without pipeline parallelism; ZeRO-1 and the distributed optimizer shard alike, so the search
explores the distributed optimizer and takes ZeRO-1 only when asked for. Sequence parallelism is
on whenever tp > 1 (Megatron-LM's recommended setting) unless the user fixes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from planner.cluster import Cluster
from planner.config import ParallelConfig, Recompute, Schedule, Training
from planner.errors import PlannerError
from planner.model import ModelSpec

__all__ = ["MAX_SEARCHED_VPP", "FixedOptions", "complete_config", "degree_triples", "enumerate_configs",
           "require_nonempty"]

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
    schedule: Schedule | None = None
    zero_stage: int | None = None
    distributed_optimizer: bool | None = None
    sequence_parallel: bool | None = None
    tp_comm_overlap: bool | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> FixedOptions:
        """From the CLI's parallel options (`parallel_options` in cli.py)."""
        recompute, schedule = options.get("recompute"), options.get("schedule")
        return cls(
            tp=options.get("tp"), pp=options.get("pp"), dp=options.get("dp"), micro_batch=options.get("micro_batch"),
            vpp=options.get("vpp"), recompute=Recompute(recompute) if recompute else None,
            schedule=Schedule(schedule) if schedule else None, zero_stage=options.get("zero_stage"),
            distributed_optimizer=options.get("distributed_optimizer"),
            sequence_parallel=options.get("sequence_parallel"),
            tp_comm_overlap=options.get("tp_comm_overlap"),
        )

    def runnable_by(self, target: str | None) -> FixedOptions:
        """These options with what an export target cannot run pinned off where the user left it open:
        Megatron-DeepSpeed has no TP communication overlap (`planner plan --export deepspeed`)."""
        if target == "deepspeed" and self.tp_comm_overlap is None:
            return replace(self, tp_comm_overlap=False)
        return self


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(√n) (a global batch may be 10⁸ sequences)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _tp_allowed(tp: int, model: ModelSpec, cluster: Cluster) -> str | None:
    """None if tp is valid, else why not."""
    per_node = cluster.gpus_per_node
    if tp & (tp - 1) or tp > per_node or per_node % tp:
        return f"must be a power of two dividing the {per_node} GPUs per node"
    if model.num_attention_heads % tp or model.num_key_value_heads % tp:
        return (f"must divide the attention heads ({model.num_attention_heads}) and KV heads "
                f"({model.num_key_value_heads})")
    return None


def _check_fixed(model: ModelSpec, cluster: Cluster, training: Training, fixed: FixedOptions) -> None:
    """Reject fixed values that are wrong on their own, naming the value and what is allowed."""
    gpus = cluster.num_gpus
    for name in ("tp", "pp", "dp", "micro_batch", "vpp"):
        value = getattr(fixed, name)
        if value is not None and value < 1:
            raise PlannerError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if fixed.tp is not None and (why := _tp_allowed(fixed.tp, model, cluster)):
        raise PlannerError(f"--tp {fixed.tp} is not allowed: tp {why}")
    for name in ("tp", "pp", "dp"):
        value = getattr(fixed, name)
        if value is not None and gpus % value:
            raise PlannerError(f"--{name} {value} does not divide the cluster's {gpus} GPUs")
    if fixed.pp is not None and fixed.pp > model.num_layers:
        raise PlannerError(f"--pp {fixed.pp} exceeds the model's {model.num_layers} layers")
    if fixed.dp is not None and training.global_batch % fixed.dp:
        raise PlannerError(f"--dp {fixed.dp} does not divide the global batch {training.global_batch}")
    if fixed.micro_batch is not None and training.global_batch % fixed.micro_batch:
        raise PlannerError(
            f"--micro-batch {fixed.micro_batch} does not divide the global batch {training.global_batch}")
    if fixed.vpp is not None and fixed.vpp > 1 and fixed.schedule not in (None, Schedule.INTERLEAVED):
        raise PlannerError(f"--vpp {fixed.vpp} needs --schedule interleaved, got {fixed.schedule.value}")
    if fixed.sequence_parallel and fixed.tp == 1:
        raise PlannerError("--sequence-parallel needs tp > 1, got --tp 1")
    if fixed.tp_comm_overlap and (fixed.tp == 1 or fixed.sequence_parallel is False):
        given = "--tp 1" if fixed.tp == 1 else "--no-sequence-parallel"
        raise PlannerError(f"--tp-comm-overlap overlaps the sequence-parallel collectives and needs tp > 1 with "
                           f"sequence parallelism, got {given}")
    if fixed.zero_stage is not None and fixed.zero_stage >= 2 and fixed.pp not in (None, 1):
        raise PlannerError(f"--zero {fixed.zero_stage} is not supported with --pp {fixed.pp}; use --zero 0 or 1")
    if fixed.distributed_optimizer and fixed.zero_stage not in (None, 0, 1):
        raise PlannerError(f"--distributed-optimizer cannot be combined with --zero {fixed.zero_stage}")


def degree_triples(model: ModelSpec, cluster: Cluster, training: Training,
                   fixed: FixedOptions = FixedOptions()) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) with dp·tp·pp = GPUs, valid tp, pp ≤ layers and dp dividing the global batch."""
    _check_fixed(model, cluster, training, fixed)
    gpus = cluster.num_gpus
    triples = []
    for tp in _divisors(cluster.gpus_per_node):
        if _tp_allowed(tp, model, cluster) or fixed.tp not in (None, tp) or gpus % tp:
            continue
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if (pp > model.num_layers or fixed.pp not in (None, pp) or fixed.dp not in (None, dp)
                    or training.global_batch % dp):
                continue
            triples.append((dp, tp, pp))
    return triples


def _schedules(pp: int, m: int, num_layers: int, fixed: FixedOptions) -> list[tuple[Schedule, int]]:
    """(schedule, vpp) pairs allowed for this pipeline depth and micro-batch count."""
    out: list[tuple[Schedule, int]] = []
    for schedule in (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED):
        if fixed.schedule not in (None, schedule):
            continue
        if schedule is not Schedule.INTERLEAVED:
            if fixed.vpp in (None, 1):
                out.append((schedule, 1))
            continue
        if pp < 2 or m % pp:
            continue
        top = min(num_layers // pp, MAX_SEARCHED_VPP if fixed.vpp is None else fixed.vpp)
        out.extend((schedule, v) for v in range(2, top + 1) if fixed.vpp in (None, v))
    return out


def _sharding_options(pp: int, dp: int, fixed: FixedOptions) -> list[tuple[int, bool]]:
    """(zero_stage, distributed_optimizer) pairs; sharding is pointless (identical) at dp = 1."""
    if fixed.zero_stage is not None or fixed.distributed_optimizer is not None:
        zero_stage = fixed.zero_stage or 0
        return [] if zero_stage >= 2 and pp > 1 else [(zero_stage, bool(fixed.distributed_optimizer))]
    if dp == 1:
        return [(0, False)]
    options = [(0, False), (0, True)]
    if pp == 1:
        options += [(2, False), (3, False)]
    return options


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


def complete_config(fixed: FixedOptions, model: ModelSpec, cluster: Cluster, training: Training) -> ParallelConfig:
    """The one configuration `estimate` evaluates from what the user fixed, checked like the search's:
    unspecified degrees default to 1 with dp taking the remaining GPUs, the defaults of the search
    (1F1B, or interleaved when vpp > 1; sequence parallelism with tp > 1; no recompute, sharding or TP
    communication overlap, Megatron-LM's defaults)."""
    _check_fixed(model, cluster, training, fixed)
    tp, pp = fixed.tp or 1, fixed.pp or 1
    dp = fixed.dp
    if dp is None:
        if cluster.num_gpus % (tp * pp):
            raise PlannerError(
                f"tp × pp = {tp * pp} does not divide the cluster's {cluster.num_gpus} GPUs; give --dp explicitly")
        dp = cluster.num_gpus // (tp * pp)
    vpp = fixed.vpp or 1
    return ParallelConfig(
        dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch=fixed.micro_batch or 1,
        sequence_parallel=_sequence_parallel(fixed, tp), recompute=fixed.recompute or Recompute.NONE,
        tp_comm_overlap=bool(fixed.tp_comm_overlap), zero_stage=fixed.zero_stage or 0,
        distributed_optimizer=bool(fixed.distributed_optimizer),
        schedule=fixed.schedule or (Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B),
    )


def enumerate_configs(model: ModelSpec, cluster: Cluster, training: Training,
                      fixed: FixedOptions = FixedOptions()) -> Iterator[ParallelConfig]:
    """Every valid configuration in a fixed, deterministic order."""
    recomputes = [fixed.recompute] if fixed.recompute else list(Recompute)
    for dp, tp, pp in degree_triples(model, cluster, training, fixed):
        sp = _sequence_parallel(fixed, tp)
        for micro_batch in _divisors(training.global_batch // dp):
            if fixed.micro_batch not in (None, micro_batch):
                continue
            m = training.global_batch // (dp * micro_batch)
            for schedule, vpp in _schedules(pp, m, model.num_layers, fixed):
                if pp * vpp > model.num_layers:
                    continue
                for zero_stage, dist_opt in _sharding_options(pp, dp, fixed):
                    for recompute, overlap in product(recomputes, _tp_comm_overlaps(fixed, sp)):
                        yield ParallelConfig(
                            dp=dp, tp=tp, pp=pp, micro_batch=micro_batch, vpp=vpp, sequence_parallel=sp,
                            recompute=recompute, zero_stage=zero_stage, distributed_optimizer=dist_opt,
                            schedule=schedule, tp_comm_overlap=overlap,
                        )


def require_nonempty(configs: list[ParallelConfig], model: ModelSpec, cluster: Cluster, training: Training,
                     fixed: FixedOptions) -> list[ParallelConfig]:
    """The space, or a PlannerError naming the fixed options that together leave nothing."""
    if configs:
        return configs
    given = {k: v for k, v in fixed.__dict__.items() if v is not None}
    text = ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in given.items()) or "none"
    raise PlannerError(
        f"no valid configuration of {model.name} on {cluster.num_gpus} GPUs with global batch "
        f"{training.global_batch} (fixed options: {text}); relax a fixed option or change the batch"
    )
