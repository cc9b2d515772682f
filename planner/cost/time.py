"""Per-unit and per-stage time of one configuration: compute, recompute, tensor- and context-parallel
communication per micro-batch; pipeline p2p per stage boundary; data-parallel gradient
reduction with the overlap Megatron-LM achieves, and ZeRO-2/3 / FSDP collectives per unit and
micro-batch with prefetch overlap; the optimizer step.

Everything here is linear in the units a stage holds, which is what lets the ILP partitioner
optimise the same quantities the estimate reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from planner.cluster import Link
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.comm import all_gather_time, all_reduce_time, all_to_all_time, p2p_time, reduce_scatter_time
from planner.cost.memory import activation_bytes, model_state_bytes, sharded_state_bytes
from planner.gpu import GPUSpec
from planner.model import ModelSpec, UnitKind
from planner.placement import ExpertLink
from planner.profile.analytic import UnitSetting, UnitTimes, unit_setting, weight_gradient_s
from planner.profile.calibration import Calibration

__all__ = [
    "CP_COMM_BYTES",
    "OPTIMIZER_BYTES_PER_PARAM",
    "PARAM_BYTES",
    "ActivationSource",
    "DataParallelTime",
    "UnitCost",
    "UnitTimer",
    "context_parallel_s",
    "data_parallel_time",
    "embedding_sync_time",
    "expert_all_to_all_s",
    "expert_parallel_s",
    "optimizer_step_time",
    "p2p_boundary_time",
    "stage_boundary_s",
    "unit_costs",
]

# Adam step per local parameter: read fp32 param, grad, momentum, variance (16 B), write param,
# momentum, variance (12 B) and the 16-bit model copy (2 B).
OPTIMIZER_BYTES_PER_PARAM = 30
# Bytes per parameter of the weights ZeRO / FSDP all-gathers: the 16-bit model copy (fp16/bf16; FSDP's
# mixed-precision param_dtype, DeepSpeed's fp16 partitions).
PARAM_BYTES = 2
# All-reduce-equivalents of the b·s·h activation each unit's TP collectives move per micro-batch
# (Narayanan et al. 2021 §3.2: a block does 2 all-reduces forward and 2 backward; with sequence
# parallelism each becomes an all-gather + reduce-scatter of the same volume, Korthikanti §4.2.2).
_TP_ALL_REDUCES = {UnitKind.EMBEDDING: (1, 0), UnitKind.BLOCK: (2, 2), UnitKind.HEAD: (0, 1)}
# With sequence parallelism a block's backward moves more than the forward and not all of it can hide
# (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication and the sequence-parallel mappings):
# each column-parallel linear (QKV, FC1) keeps only its sharded input and all-gathers it again for the
# weight gradient (async, behind the dgrad GEMM) and reduce-scatters the input gradient (async, behind
# the wgrad GEMM); the backward of each row-parallel linear's reduce-scatter (attention projection, FC2)
# is a synchronous all-gather of the output gradient, which only TP communication overlap can hide.
_COLUMN_PARALLEL = (0, 2)  # QKV and FC1 in UnitTimes.linear_forward_s order
_ROW_PARALLEL = (1, 3)  # attention projection and FC2
CP_COMM_BYTES = 2
"""Bytes per element CP exchanges: 16-bit K, V, Q, O and their gradients (Megatron-LM / Transformer Engine
attention with context parallelism communicates in the activation dtype)."""


class UnitTimer(Protocol):
    """Source of unit compute times: the analytic profile or a measured one."""

    def times(self, kind: UnitKind, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes: ...


@runtime_checkable
class ActivationSource(Protocol):
    """A timer that may also supply measured activation bytes; None means use the analytic ones."""

    def activation_bytes(self, kind: UnitKind, setting: UnitSetting, recompute: Recompute) -> float | None: ...


@dataclass(frozen=True)
class UnitCost:
    """One unit for one micro-batch on one TP rank of a given GPU type."""

    forward_s: float
    backward_s: float  # without recompute
    recompute_s: float  # extra forward work repeated during backward
    tp_forward_s: float
    tp_backward_s: float  # exposed part (see tp_backward_overlap) plus the recomputed forward's collectives
    activation_bytes: float
    params: float  # parameters held per TP rank
    cp_forward_s: float = 0.0  # exposed context-parallel KV / head exchange (`context_parallel_s`)
    cp_backward_s: float = 0.0  # its backward, plus the recomputed forward's
    ep_s: float = 0.0  # expert dispatch/combine all-to-all, part of tp_forward_s + tp_backward_s
    weight_grad_s: float = 0.0  # the weight-gradient GEMMs inside backward_s (a zero-bubble W pass)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def tp_s(self) -> float:
        return self.tp_forward_s + self.tp_backward_s

    @property
    def forward_pass_s(self) -> float:
        """The forward pass as the schedule sees it: compute plus its exposed TP and CP communication."""
        return self.forward_s + self.tp_forward_s + self.cp_forward_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_s + self.cp_forward_s + self.cp_backward_s


def unit_costs(
    model: ModelSpec, training: Training, config: ParallelConfig, gpu: GPUSpec, tp_link: Link,
    timer: UnitTimer, calibration: Calibration, cp_link: Link | None = None, ep_link: ExpertLink | None = None,
) -> dict[UnitKind, UnitCost]:
    """Cost of each unit kind (all blocks are alike) for one configuration on one GPU type; `cp_link` is the
    ring the context-parallel group uses (needed when cp > 1), `ep_link` what the expert-parallel group crosses
    (needed for MoE models; the block's exposed all-to-all joins its TP communication, `UnitCost.ep_s`)."""
    setting = unit_setting(training, config.tp, config.micro_batch, config.sequence_parallel, config.cp, config.ep,
                           config.etp)
    message = 2 * setting.tokens * model.hidden_size
    all_reduce = all_reduce_time(message, config.tp, tp_link, calibration)
    params = {
        UnitKind.EMBEDDING: model.embedding_parameters(),
        UnitKind.BLOCK: _block_state_parameters(model, training, config) * config.tp,
        UnitKind.HEAD: model.head_parameters(),
    }
    costs = {}
    for kind in UnitKind:
        times = timer.times(kind, setting, gpu)
        forward_ars, backward_ars = _TP_ALL_REDUCES[kind]
        tp_forward, tp_backward = forward_ars * all_reduce, backward_ars * all_reduce
        if kind is UnitKind.BLOCK and config.tp > 1:
            tp_forward, tp_backward = _block_tp_s(times, config, message, tp_link, calibration)
        cp_forward = cp_backward = 0.0
        if kind is UnitKind.BLOCK and config.cp > 1:
            if cp_link is None:
                raise ValueError("unit_costs: cp > 1 needs the context-parallel group's link")
            cp_forward, cp_backward = context_parallel_s(times, model, training, config, cp_link, calibration)
        recompute, recompute_tp = 0.0, 0.0
        if kind is UnitKind.BLOCK and config.recompute is Recompute.FULL:
            recompute, recompute_tp = times.forward_s, tp_forward
        elif kind is UnitKind.BLOCK and config.recompute is Recompute.SELECTIVE:
            recompute = times.attention_core_forward_s
        if config.recompute is not Recompute.NONE:  # both modes recompute attention, with its KV exchange
            cp_backward += cp_forward
        ep_forward = ep_backward = 0.0
        if kind is UnitKind.BLOCK and model.is_moe:
            ep_forward, ep_backward = expert_parallel_s(model, setting, config, ep_link, tp_link, calibration)
            ep_backward += ep_forward if config.recompute is Recompute.FULL else 0.0
            tp_forward, tp_backward = tp_forward + ep_forward, tp_backward + ep_backward
        measured = (timer.activation_bytes(kind, setting, config.recompute)
                    if isinstance(timer, ActivationSource) else None)
        costs[kind] = UnitCost(
            forward_s=times.forward_s,
            backward_s=times.backward_s,
            recompute_s=recompute,
            tp_forward_s=tp_forward,
            tp_backward_s=tp_backward + recompute_tp,
            activation_bytes=activation_bytes(model, kind, training, config) if measured is None else measured,
            params=params[kind] / config.tp,
            cp_forward_s=cp_forward,
            cp_backward_s=cp_backward,
            ep_s=ep_forward + ep_backward,
            weight_grad_s=weight_gradient_s(kind, times),
        )
    return costs


def _block_state_parameters(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Parameters of the mean block held per rank, weighted so the memory model's one per-parameter cost
    (`sharded_state_bytes`, sharding over dp·cp) gives the exact model-state bytes: the non-expert part is
    split over tp, the routed experts over ep·etp with their gradients reduced and optimizer states
    sharded over edp (Megatron-Core's expert data-parallel group), not over dp·cp."""
    block = model.block_parameters()
    experts = model.expert_fraction() * block if model.is_moe else 0.0
    dense = (block - experts) / config.tp
    if not experts:
        return dense
    per_param = sharded_state_bytes(config, training.grad_bytes)
    expert_states = model_state_bytes(1.0, config.edp, config.optimizer_sharding, training.grad_bytes)
    return dense + experts / (config.ep * config.etp) * expert_states.total / per_param.total


EP_DISPATCH_BYTES = 2
"""Bytes per element the token dispatcher moves: 16-bit hidden states (Megatron-Core's alltoall / flex
dispatchers send BF16 activations; FP8 dispatch is DeepEP-only and not modelled)."""


def expert_all_to_all_s(local_bytes: float, ep: int, link: ExpertLink, calibration: Calibration) -> float:
    """One all-to-all over an EP group of `ep` ranks, each sending `local_bytes` spread evenly over the group:
    the share for the ranks_per_node − 1 peers on its node crosses NVLink, the share for the other nodes
    crosses the GPU's own NIC, both at once; the slower fabric sets the time, plus one latency per fabric."""
    if ep <= 1 or local_bytes <= 0:
        return 0.0
    near = min(link.ranks_per_node, ep)
    intra = local_bytes * (near - 1) / ep / (link.intra.bandwidth_bytes_per_s
                                            * calibration.collective_efficiency(link.intra.kind))
    inter = local_bytes * (ep - near) / ep / (link.inter.bandwidth_bytes_per_s
                                             * calibration.collective_efficiency(link.inter.kind))
    latency = (link.intra.latency_s if near > 1 else 0.0) + (link.inter.latency_s if ep > near else 0.0)
    return max(intra, inter) + latency


def expert_parallel_s(model: ModelSpec, setting: UnitSetting, config: ParallelConfig, link: ExpertLink | None,
                      tp_link: Link, calibration: Calibration) -> tuple[float, float]:
    """Exposed expert-parallel communication of one MoE block per micro-batch, (forward, backward), averaged
    over the blocks like its compute (dense first layers have none). Forward: dispatch and combine
    all-to-alls of every routed token copy (tokens/tp per rank under sequence parallelism, top-k copies,
    times the busiest rank's load); with etp > 1 the received tokens are all-gathered over the expert-TP
    group after dispatch and reduce-scattered before combine. Backward: the same in reverse. Exposed, as
    Megatron-Core's default alltoall dispatcher runs them (its 1F1B A2A overlap and DeepEP are not modelled)."""
    if config.ep * config.etp == 1 or link is None:
        return 0.0, 0.0
    routed = setting.tokens / setting.tp * model.moe_top_k * setting.expert_load
    local_bytes = routed * model.hidden_size * EP_DISPATCH_BYTES
    one_way = expert_all_to_all_s(local_bytes, config.ep, link, calibration)
    if config.etp > 1:
        one_way += all_gather_time(local_bytes * config.etp, config.etp, tp_link, calibration)
    share = model.num_moe_layers / model.num_layers
    return 2 * one_way * share, 2 * one_way * share


def context_parallel_s(times: UnitTimes, model: ModelSpec, training: Training, config: ParallelConfig, link: Link,
                       calibration: Calibration) -> tuple[float, float]:
    """Exposed context-parallel communication of one block per micro-batch, (forward, backward).

    Each of the cp ranks holds s/cp tokens (2·cp chunks, causally load-balanced) of this TP rank's heads.
    * p2p (Megatron-LM's ring attention): cp − 1 steps each pass this rank's K and V chunk to the next
      rank while the attention of the chunk received before runs, so a step shows only what its transfer
      exceeds 1/cp of the attention core; the backward passes K, V and their gradients (twice the bytes).
    * all-gather (Llama 3): K and V of the whole sequence are all-gathered before attention and their
      gradients reduce-scattered after it, not overlapped (cheap with GQA's few KV heads).
    * a2a (DeepSpeed Ulysses): all-to-alls turn sequence-sharded Q, K, V into head-sharded ones and the
      output back, four forward and four backward, synchronous.
    """
    cp = config.cp
    tokens = config.micro_batch * training.seq_len / cp
    kv_width = model.kv_width * max(model.num_key_value_heads / config.tp, 1.0) / model.num_key_value_heads
    kv_bytes = 2 * tokens * kv_width * CP_COMM_BYTES  # K and V
    q_bytes = tokens * model.query_width / config.tp * CP_COMM_BYTES
    core_forward = times.attention_core_forward_s
    core_backward = times.attention_core_backward_s or 2 * core_forward  # a measured profile: backward ≈ 2 × forward
    if config.cp_comm == "p2p":
        step_forward, step_backward = p2p_time(kv_bytes, link, calibration), p2p_time(2 * kv_bytes, link, calibration)
        return ((cp - 1) * max(0.0, step_forward - core_forward / cp),
                (cp - 1) * max(0.0, step_backward - core_backward / cp))
    if config.cp_comm == "all-gather":
        return (all_gather_time(cp * kv_bytes, cp, link, calibration),
                reduce_scatter_time(cp * kv_bytes, cp, link, calibration))
    exchange = sum(all_to_all_time(size, cp, link, calibration) for size in (q_bytes, kv_bytes, q_bytes))
    return exchange, exchange


def _block_tp_s(times: UnitTimes, config: ParallelConfig, message: float, link: Link,
                calibration: Calibration) -> tuple[float, float]:
    """Exposed TP communication of one block per micro-batch, (forward, backward), each collective hidden
    at most behind the GEMM it overlaps (`UnitTimes.linear_forward_s`; a measured profile without it
    spreads the block's forward over its four linear layers).

    Without SP: two synchronous all-reduces forward; backward, each column-parallel linear's input-gradient
    all-reduce runs behind its wgrad GEMM (`tp_backward_overlap` of it at most). With SP: forward, an
    all-gather before each column-parallel and a reduce-scatter after each row-parallel linear, synchronous;
    backward, the column-parallel all-gather / reduce-scatter behind dgrad / wgrad, and the row-parallel
    output-gradient all-gathers synchronous. With `tp_comm_overlap` (needs SP) every one of them is
    chunked and pipelined with its GEMM (`_pipelined_exposed_s`), and the column-parallel backward pair
    runs concurrently with dgrad / wgrad in full (Transformer Engine's ring-exchange, pipelined and bulk
    userbuffer overlaps). A framework that does not overlap backward TP collectives (`overlap_tp_backward`
    off, e.g. torchtitan, whose async TP micro-pipelines the forward all-gather→matmul and
    matmul→reduce-scatter; PyTorch reports up to 29 % forward and 8 % end-to-end speed-up, torchtitan's
    Llama-3.1-70B run 829 → 876 tokens/s) keeps its backward collectives exposed."""
    tp = config.tp
    gemm = times.linear_forward_s or (times.forward_s / 4,) * 4
    hidden = calibration.tp_backward_overlap if config.overlap_tp_backward else 0.0
    if not config.sequence_parallel:
        all_reduce = all_reduce_time(message, tp, link, calibration)
        backward = sum(max((1 - hidden) * all_reduce, all_reduce - gemm[i]) for i in _COLUMN_PARALLEL)
        return 2 * all_reduce, backward
    gather = all_gather_time(message, tp, link, calibration)
    scatter = reduce_scatter_time(message, tp, link, calibration)
    forward = 2 * (gather + scatter)
    backward = 2 * gather + sum(max((1 - hidden) * comm, comm - gemm[i])
                                for i in _COLUMN_PARALLEL for comm in (gather, scatter))
    if config.tp_comm_overlap:
        forward = sum(_pipelined_exposed_s(gather, gemm[i], tp, gather=True) for i in _COLUMN_PARALLEL)
        forward += sum(_pipelined_exposed_s(scatter, gemm[i], tp, gather=False) for i in _ROW_PARALLEL)
    if config.tp_comm_overlap and config.overlap_tp_backward:
        backward = sum(_pipelined_exposed_s(gather, gemm[i], tp, gather=True) for i in _ROW_PARALLEL)
        backward += sum(max(0.0, gather - gemm[i]) + max(0.0, scatter - gemm[i]) for i in _COLUMN_PARALLEL)
    return forward, backward


def _pipelined_exposed_s(comm_s: float, gemm_s: float, tp: int, gather: bool) -> float:
    """What a collective chunked over the tp ranks and pipelined with its GEMM leaves exposed. All-gather
    (ring exchange): the GEMM on the local shard runs first, each of the tp − 1 transfers then hides behind
    one GEMM chunk; reduce-scatter: each GEMM chunk's partial sums are sent while the next chunk computes,
    so the last chunk's transfer has nothing to hide behind. A transfer longer than its chunk shows the excess."""
    chunk_gemm = gemm_s / tp
    if gather:
        return (tp - 1) * max(0.0, comm_s / (tp - 1) - chunk_gemm)
    chunk_comm = comm_s / tp
    return chunk_comm + (tp - 1) * max(0.0, chunk_comm - chunk_gemm)


def p2p_boundary_time(model: ModelSpec, training: Training, config: ParallelConfig, link: Link,
                      calibration: Calibration) -> float:
    """Forward activation plus backward gradient across one stage boundary, per micro-batch.

    With TP > 1 Megatron-LM sends 1/tp of the tensor (sequence-parallel shards, or the
    scatter/gather optimisation of Narayanan et al. §4.1) and re-gathers it over NVLink;
    DeepSpeed's pipeline engine (`p2p_scatter_gather=False`) sends the whole tensor from every TP rank.
    A context-parallel rank sends its seq_len / cp tokens.
    """
    size = 2 * training.seq_len / config.cp * config.micro_batch * model.hidden_size
    if config.p2p_scatter_gather or config.sequence_parallel:
        size /= config.tp
    return 2 * p2p_time(size, link, calibration)


def stage_boundary_s(boundary_by_rank: Sequence[float], num_stages: int) -> list[float]:
    """p2p time each virtual stage pays per micro-batch. Blocking send/recv occupies both ends of a
    boundary, so a stage pays its incoming and its outgoing one; `boundary_by_rank[r]` is the
    boundary after a stage on rank r (stage k runs on rank k mod pp). The one rule the estimate,
    the partitioner and the search bounds all use."""
    pp = len(boundary_by_rank)
    return [(boundary_by_rank[k % pp] if k < num_stages - 1 else 0.0)
            + (boundary_by_rank[(k - 1) % pp] if k else 0.0) for k in range(num_stages)]


def embedding_sync_time(model: ModelSpec, training: Training, config: ParallelConfig, link: Link,
                        calibration: Calibration) -> float:
    """All-reduce of the tied word-embedding gradient between the first and the last pipeline stage,
    once per iteration after the pipeline flush (Megatron-LM and DeepSpeed alike; not overlapped)."""
    if not model.tie_embeddings or config.pp == 1:
        return 0.0
    size = model.vocab_size * model.hidden_size / config.tp * training.grad_bytes
    return all_reduce_time(size, 2, link, calibration)


@dataclass(frozen=True)
class DataParallelTime:
    """Gradient/parameter communication of one pipeline rank per iteration, total and exposed."""

    total_s: float
    exposed_s: float


def data_parallel_time(
    units: Sequence[UnitCost], training: Training, config: ParallelConfig, link: Link, calibration: Calibration,
    num_microbatches: int, replicate_link: Link | None = None,
) -> DataParallelTime:
    """DP traffic of one pipeline rank holding `units` (in execution order) and how much the schedule cannot hide.

    The group is the dp·cp ranks holding the same weights (`ParallelConfig.replicas`) on `link`. Plain DP
    all-reduces gradients once per iteration; the distributed optimizer / ZeRO-1 reduce-scatters
    gradients and all-gathers the updated 16-bit weights (Megatron's overlap_grad_reduce hides the
    reduction behind the last micro-batch's backward, overlap_param_gather the all-gather behind the
    first forward). Without pipelining, ZeRO-2/3 collectives are per unit and per micro-batch
    (`_sharded_microbatch_s`); ZeRO-2 all-gathers the updated weights once per iteration like ZeRO-1.
    With pipelining, FSDP runs as PyTorch's pipeline stages drive it (`_pipelined_fsdp_s`). Under HSDP the
    R replicas (`replicate_link`) all-reduce their gradient shards once per iteration, behind the last backward.
    """
    if config.replicas == 1:
        return DataParallelTime(0.0, 0.0)
    group = config.shard_group
    params = sum(unit.params for unit in units)
    grads = params * training.grad_bytes
    sharding = config.optimizer_sharding
    last_backward = sum(unit.backward_s + unit.recompute_s for unit in units)
    replicate_s = all_reduce_time(grads / group, config.hsdp_replicas, replicate_link or link, calibration)
    replicate = DataParallelTime(replicate_s, _exposed(replicate_s, last_backward, True))
    if sharding == 0:
        reduce_s = all_reduce_time(grads, group, link, calibration)
        return DataParallelTime(reduce_s, _exposed(reduce_s, last_backward, config.overlap_grad_reduce))
    gather_s = all_gather_time(params * PARAM_BYTES, group, link, calibration) if sharding < 3 else 0.0
    gather_exposed = _exposed(gather_s, sum(unit.forward_s for unit in units), config.overlap_param_gather)
    if sharding == 1:
        reduce_s = reduce_scatter_time(grads, group, link, calibration)
        exposed = _exposed(reduce_s, last_backward, config.overlap_grad_reduce) + gather_exposed
        return DataParallelTime(reduce_s + gather_s, exposed)
    if config.pp > 1:
        total, exposed = _pipelined_fsdp_s(units, training, config, link, calibration, num_microbatches)
    else:
        total, exposed = _sharded_microbatch_s(units, training, config, link, calibration)
        total, exposed = num_microbatches * total, num_microbatches * exposed
    return DataParallelTime(total + gather_s + replicate.total_s, exposed + gather_exposed + replicate.exposed_s)


def _pipelined_fsdp_s(units: Sequence[UnitCost], training: Training, config: ParallelConfig, link: Link,
                      calibration: Calibration, num_microbatches: int) -> tuple[float, float]:
    """(total, exposed) seconds per iteration of ZeRO-2/3 under a pipeline schedule, as PyTorch's pipeline
    stages drive FSDP (torch.distributed.pipelining, used by torchtitan): gradient sync and resharding after
    backward are off until the last micro-batch's backward, which reduce-scatters each unit's gradients once
    (behind the remaining backward). ZeRO-3 gathers each unit's weights before the first forward; with
    `reshard_after_forward` (off by default under PP, as torchtitan sets it) it frees them after every
    forward and gathers them again before every backward: m + 1 gathers, else one."""
    gathers, reduces = _unit_collectives(units, training, config, link, calibration)
    backward_compute = [unit.backward_s + unit.recompute_s for unit in reversed(units)]
    first = _prefetch_exposed_s(gathers, [0.0] * len(units), [unit.forward_s for unit in units])
    last = _prefetch_exposed_s([0.0] * len(units), reduces[::-1], backward_compute)
    regathers = num_microbatches if config.reshard_after_forward else 0
    regather = _prefetch_exposed_s(gathers[::-1], [0.0] * len(units), backward_compute)
    return ((1 + regathers) * sum(gathers) + sum(reduces), first + last + regathers * regather)


def _unit_collectives(units: Sequence[UnitCost], training: Training, config: ParallelConfig, link: Link,
                      calibration: Calibration) -> tuple[list[float], list[float]]:
    """Per unit, its ZeRO-3 weight all-gather (0 under ZeRO-2) and its gradient reduce-scatter over the shard
    group; alike units (the same UnitCost) are costed once."""
    group, known = config.shard_group, {}
    for unit in units:
        if id(unit) not in known:
            gather = all_gather_time(unit.params * PARAM_BYTES, group, link, calibration)
            known[id(unit)] = (gather if config.optimizer_sharding == 3 else 0.0,
                               reduce_scatter_time(unit.params * training.grad_bytes, group, link, calibration))
    pairs = [known[id(unit)] for unit in units]
    return [gather for gather, _ in pairs], [reduce for _, reduce in pairs]


def _sharded_microbatch_s(units: Sequence[UnitCost], training: Training, config: ParallelConfig, link: Link,
                          calibration: Calibration) -> tuple[float, float]:
    """(total, exposed) seconds of one micro-batch's ZeRO-2/3 collectives, one per FSDP unit and pass.

    The wrapping unit is one model unit (a transformer block; FSDP's auto-wrap policy, DeepSpeed's
    per-module fetch). ZeRO-3 all-gathers a unit's 16-bit weights before its forward and again
    before its backward (FSDP FULL_SHARD / reshard_after_forward, DeepSpeed stage 3; without
    `reshard_after_forward`, SHARD_GRAD_OP, only before its forward); a full
    recompute runs inside that backward with the weights gathered for it, so it adds hiding
    compute, not traffic: 2 all-gathers + 1 reduce-scatter = 3× the parameter bytes per
    micro-batch, 1.5× DP's all-reduce (Rajbhandari et al. 2020 §7.2.2). Gradients are
    reduce-scattered per unit after its backward in every micro-batch (DeepSpeed stages 2/3 and
    FSDP without `no_sync`, the default of Composer and torchtitan; `no_sync` would reduce once
    per iteration at the memory of unsharded gradients). Each collective is a ring over the shard
    group's n ranks with its own (n − 1)·α latency, and prefetch hides it only behind the compute of the
    neighbouring unit (`_prefetch_exposed_s`).
    """
    gathers, reduces = _unit_collectives(units, training, config, link, calibration)
    regathers = gathers if config.reshard_after_forward else [0.0] * len(units)
    forward = _prefetch_exposed_s(gathers, [0.0] * len(units), [unit.forward_s for unit in units])
    backward = _prefetch_exposed_s(regathers[::-1], reduces[::-1],
                                   [unit.backward_s + unit.recompute_s for unit in reversed(units)])
    return sum(gathers) + sum(regathers) + sum(reduces), forward + backward


def _prefetch_exposed_s(leading: Sequence[float], trailing: Sequence[float], compute: Sequence[float]) -> float:
    """Communication a pass over units cannot hide. While unit i computes, the network carries unit
    i+1's prefetched leading collective (its all-gather) and unit i−1's trailing one (its
    reduce-scatter); what exceeds unit i's compute is exposed, as are the first gather and the last reduce."""
    count = len(compute)
    exposed = leading[0] + trailing[-1]
    for i in range(count):
        comm = (leading[i + 1] if i + 1 < count else 0.0) + (trailing[i - 1] if i else 0.0)
        exposed += max(0.0, comm - compute[i])
    return exposed


def _exposed(comm_s: float, hiding_s: float, overlapped: bool) -> float:
    return max(0.0, comm_s - hiding_s) if overlapped else comm_s


def optimizer_step_time(params: float, config: ParallelConfig, gpu: GPUSpec, calibration: Calibration) -> float:
    """Memory-bound Adam step over the parameters this GPU updates (sharded over its shard group under ZeRO)."""
    local = params / (config.shard_group if config.optimizer_sharding >= 1 else 1)
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * calibration.memory_bound_efficiency
    return local * OPTIMIZER_BYTES_PER_PARAM / bandwidth
