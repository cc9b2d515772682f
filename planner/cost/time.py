"""Per-unit and per-stage time of one configuration: compute, recompute, tensor- and context-parallel
communication per micro-batch; pipeline p2p per stage boundary; data-parallel gradient
reduction with the overlap Megatron-LM achieves, and ZeRO-2/3 / FSDP collectives per unit and
micro-batch with prefetch overlap; the optimizer step.

Everything here is linear in the units a stage holds, which is what lets the ILP partitioner
optimise the same quantities the estimate reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache, cached_property
from typing import Protocol

import numpy as np

from planner.cluster import Link
from planner.config import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES, ParallelConfig, Recompute, Training
from planner.cost.adapters import adapter_block_times, frozen_end_times
from planner.cost.comm import all_gather_time, all_reduce_time, all_to_all_time, p2p_time, reduce_scatter_time
from planner.cost.memory import (
    activation_bytes,
    block_type_activation_bytes,
    op_sac_applies,
    op_sac_kept_matmuls,
    optimizer_held_gradient_bytes,
    parameter_model_states,
    sharded_state_bytes,
)
from planner.cost.schedule import Schedule, schedule_of, stage_ranks
from planner.finetune import (  # what ZeRO / FSDP all-gathers: the 16-bit model copy (FSDP's param_dtype), or FP8
    FP8_PARAM_BYTES,
    PARAM_BYTES,
    ParameterStates,
    full_parameter_states,
    parameter_states,
)
from planner.gpu import GPUSpec
from planner.model import AttentionSpec, BlockSpec, MlpSpec, ModelSpec, UnitKind
from planner.placement import ExpertLink
from planner.profile.analytic import UnitSetting, UnitTimes, unit_setting, weight_gradient_s
from planner.profile.calibration import Calibration

__all__ = [
    "CPU_ADAM_S_PER_PARAM",
    "CP_COMM_BYTES",
    "OPTIMIZER_BYTES_PER_PARAM",
    "PARAM_BYTES",
    "ActivationSource",
    "BlockTypeTimer",
    "CostKey",
    "DataParallelTime",
    "UnitCost",
    "UnitRun",
    "UnitTimer",
    "activation_offload_s",
    "alltoall_fabric_bytes",
    "boundary_tensor_bytes",
    "boundary_times",
    "context_parallel_s",
    "data_parallel_time",
    "data_parallel_time_of_runs",
    "embedding_sync_time",
    "expected_holders",
    "expert_all_to_all_s",
    "expert_parallel_s",
    "flex_dispatch_s",
    "flex_fabric_bytes",
    "optimizer_step_time",
    "p2p_boundary_time",
    "p2p_hiding_s",
    "resharded_costs",
    "selective_recompute_s",
    "stage_boundary_s",
    "tp_gather_element_bytes",
    "unit_costs",
    "unit_runs",
]

# Adam step per local parameter: read fp32 param, grad, momentum, variance (16 B), write param,
# momentum, variance (12 B) and the 16-bit model copy (2 B).
OPTIMIZER_BYTES_PER_PARAM = 30
# 8-bit Adam (bitsandbytes): read fp32 param and grad, 1-byte m and v (10 B), write param, m, v (6 B) and the
# 16-bit copy (2 B); the block statistics (8 B per 2048 values) are noise.
OPTIMIZER_8BIT_BYTES_PER_PARAM = 18
CPU_ADAM_S_PER_PARAM = 0.22 / 1e9
"""Seconds per parameter of DeepSpeed's vectorised CPU-Adam: 0.22 s for 1 billion parameters on the host CPU of a
DGX-2 node (Ren et al. 2021, ZeRO-Offload, Table 3: CPU-Adam vs PyTorch's 1.39 s), run once per iteration on each
rank's share (ZeRO-Offload partitions the update over the data-parallel ranks)."""
# DeepSpeed ZeRO-3 keeps a parameter tensor with fewer elements than this whole on every rank and never gathers it
# (`stage3_param_persistence_threshold`, default 1e5 since v0.3.x: deepspeed/runtime/zero/constants.py).
ZERO3_PERSISTENT_ELEMENTS = 100_000
# DeepSpeed ZeRO-3 keeps a submodule's gathered weights after it runs, rather than releasing them, when the weights
# the trace runs before their next use add up to fewer elements than this (`max_reuse_distance`, default 1e9 since
# ZeRO-3's first release, v0.3.12: deepspeed/runtime/zero/constants.py).
ZERO3_MAX_REUSE_DISTANCE = 1_000_000_000
# All-reduce-equivalents of the b·s·h activation each unit's TP collectives move per micro-batch
# (Narayanan et al. 2021 §3.2: a block does 2 all-reduces forward and 2 backward; with sequence
# parallelism each becomes an all-gather + reduce-scatter of the same volume, Korthikanti §4.2.2).
_TP_ALL_REDUCES = {UnitKind.EMBEDDING: (1, 0), UnitKind.HEAD: (0, 1)}  # blocks: `_tp_linears`
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


@cache
def _has_method(timer_type: type, name: str) -> bool:
    """Whether a timer class offers an optional protocol's method (once per class: a runtime-checkable
    protocol's isinstance walks every member on each call, thousands of times per search)."""
    return callable(getattr(timer_type, name, None))


class BlockTypeTimer(Protocol):
    """A timer that times each block type (the analytic profile); a timer without it (a measured profile) times
    the model's blocks as one kind, which then stands for every block type."""

    def block_times(self, block: BlockSpec, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes: ...


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
    # parameter tensors, and those ZeRO-3 gathers (not persistent), for collectives issued tensor by tensor
    tensors: int = 1
    gathered_tensors: int = 1
    linear_share: float = 0.0  # share of `params` in linear weight matrices (FP8-gatherable)
    # share of the gathered weights DeepSpeed's per-tensor ZeRO-3 gathers a third time under full recompute
    # (`recompute_regathered_share`)
    regathered_share: float = 0.0
    # routed-expert parameters per rank, reduced over the expert data-parallel group (edp ranks), and their
    # state-weighted share inside `params` (`_block_parameters`); the rest of `params` reduces over dp·cp
    expert_params: float = 0.0
    expert_state_params: float = 0.0
    # trained parameters per TP rank whose gradient the backward completes last and whose weights the forward needs
    # first (the input embedding): their data-parallel bucket cannot be hidden (`data_parallel_time_of_runs`)
    edge_bucket_params: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def linear_params(self) -> float:
        """Parameters per TP rank in linear weight matrices: those an FP8 linear quantises."""
        return self.params * self.linear_share

    @property
    def tp_s(self) -> float:
        return self.tp_forward_s + self.tp_backward_s

    @cached_property
    def forward_pass_s(self) -> float:
        """The forward pass as the schedule sees it: compute plus its exposed TP and CP communication."""
        return self.forward_s + self.tp_forward_s + self.cp_forward_s

    @cached_property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_s + self.cp_forward_s + self.cp_backward_s


CostKey = UnitKind | BlockSpec
"""What a unit's cost is keyed by (`Unit.cost_key`): a block's type, an end's kind."""


def unit_costs(
    model: ModelSpec, training: Training, config: ParallelConfig, gpu: GPUSpec, tp_link: Link,
    timer: UnitTimer, calibration: Calibration, cp_link: Link | None = None, ep_link: ExpertLink | None = None,
) -> dict[CostKey, UnitCost]:
    """Cost of each unit type — the embedding, the head and every block type (`ModelSpec.block_types`) — for one
    configuration on one GPU type, keyed by `Unit.cost_key`; when all blocks are alike `UnitKind.BLOCK` names
    their type too. `cp_link` is the ring the context-parallel group uses (needed when cp > 1), `ep_link` what
    the expert-parallel group crosses (needed for MoE blocks; their exposed all-to-all joins their TP
    communication, `UnitCost.ep_s`)."""
    setting = unit_setting(training, config.tp, config.micro_batch, config.sequence_parallel, config.cp, config.ep,
                           config.etp, config.moe_dispatcher)
    all_reduce = all_reduce_time(2 * setting.tokens * model.hidden_size, config.tp, tp_link, calibration)
    costs: dict[CostKey, UnitCost] = {}
    for kind, parameters in ((UnitKind.EMBEDDING, model.embedding_parameters()),
                             (UnitKind.HEAD, model.head_parameters())):
        # a model without token embedding (a ViT) has no vocab-parallel lookup to all-reduce
        forward_ars, backward_ars = _TP_ALL_REDUCES[kind] if parameters or kind is UnitKind.HEAD else (0, 0)
        times = frozen_end_times(kind, timer.times(kind, setting, gpu), training)
        costs[kind] = UnitCost(
            forward_s=times.forward_s, backward_s=times.backward_s, recompute_s=0.0,
            tp_forward_s=forward_ars * all_reduce, tp_backward_s=backward_ars * all_reduce,
            activation_bytes=_activation_bytes(model, kind, None, training, config, setting, timer),
            params=parameters / config.tp, weight_grad_s=weight_gradient_s(kind, times),
            edge_bucket_params=parameters / config.tp * (kind is UnitKind.EMBEDDING and training.finetune == "full"),
            **_tensor_counts(model.embedding_tensor_sizes() if kind is UnitKind.EMBEDDING
                             else model.head_tensor_sizes()))
    typed = _has_method(type(timer), "block_times")  # a BlockTypeTimer
    for block in model.block_types():
        times = timer.block_times(block, setting, gpu) if typed else timer.times(UnitKind.BLOCK, setting, gpu)
        times = adapter_block_times(block, times, training, setting, gpu, timer)
        costs[block] = _block_cost(model, block, times, training, config, setting, tp_link, calibration, cp_link,
                                   ep_link, timer, gpu.sm_count)
    if len(model.block_types()) == 1:
        costs[UnitKind.BLOCK] = costs[next(iter(model.block_types()))]
    return costs


def _block_cost(model: ModelSpec, block: BlockSpec, times: UnitTimes, training: Training, config: ParallelConfig,
                setting: UnitSetting, tp_link: Link, calibration: Calibration, cp_link: Link | None,
                ep_link: ExpertLink | None, timer: UnitTimer, sm_count: int | None = None) -> UnitCost:
    """One block of type `block` (compute `times`) per micro-batch: TP collectives by the sub-layers it has at its
    own width and token count (a block with its own tokens, e.g. a vision encoder's, runs them whole on every CP
    rank), context parallelism's exchange for attention over the training sequence, the expert all-to-all for
    an MoE MLP, recompute, its activations and its parameters per rank."""
    if block.tokens is not None:
        setting = replace(setting, seq_len=block.tokens, cp=1)
    tp_forward = tp_backward = 0.0
    if config.tp > 1:  # a frozen block has no weight-gradient GEMMs to hide the backward collectives behind
        tp_config = config if training.finetune == "full" else replace(config, overlap_tp_backward=False)
        activation = setting.tokens * block.hidden_size
        quantised = tp_gather_element_bytes(training) * activation
        # an MoE layer's sequence-parallel collectives are its token dispatcher's, on the 16-bit hidden states
        mlp_gather = 2 * activation if block.mlp is not None and block.mlp.is_moe else quantised
        tp_forward, tp_backward = _block_tp_s(times, _tp_linears(block), tp_config, 2 * activation,
                                              (quantised, quantised, mlp_gather, mlp_gather), tp_link, calibration)
    cp_forward = cp_backward = 0.0
    if block.attention is not None and setting.cp > 1:
        if cp_link is None:
            raise ValueError("unit_costs: cp > 1 needs the context-parallel group's link")
        cp_forward, cp_backward = context_parallel_s(times, block.attention, training, config, cp_link, calibration)
    recompute, recompute_tp = 0.0, 0.0
    op_policy = op_sac_applies(block, config)
    if config.recompute is Recompute.FULL:
        recompute, recompute_tp = times.forward_s, tp_forward
    elif op_policy:
        recompute = _op_sac_recompute_s(block, times, config.sac_keeps_attention)
    elif config.recompute is Recompute.SELECTIVE:
        recompute = selective_recompute_s(times, config.selective_modules)
        if "mlp" in config.selective_modules and block.mlp is not None and not block.mlp.is_moe:
            recompute_tp = tp_forward / block.sublayers  # the dense MLP's own collectives, re-run with it
    if config.legacy_pipeline_engine and config.pp > 1:  # DeepSpeed's legacy engine: per layer and forward pass
        engine_s = calibration.legacy_pipeline_layer_s
        times = replace(times, forward_s=times.forward_s + engine_s, backward_s=times.backward_s + 2 * engine_s)
        recompute += engine_s * (config.recompute is Recompute.FULL)
    modules = frozenset(RECOMPUTE_MODULES) if config.recompute is Recompute.FULL else config.selective_modules
    if ("core_attn" in modules and not op_policy) or (op_policy and not config.sac_keeps_attention):
        # attention recomputed, with its KV exchange
        cp_backward += cp_forward
    ep_forward = ep_backward = 0.0
    if block.mlp is not None and block.mlp.is_moe:
        ep_forward, ep_backward = expert_parallel_s(block.mlp, block.hidden_size, setting, config, ep_link, tp_link,
                                                    calibration, times, sm_count)
        ep_backward += ep_forward if "moe" in modules else 0.0  # the MoE layer re-run, dispatch and combine too
        tp_forward, tp_backward = tp_forward + ep_forward, tp_backward + ep_backward
    return UnitCost(
        forward_s=times.forward_s,
        backward_s=times.backward_s,
        recompute_s=recompute,
        tp_forward_s=tp_forward,
        tp_backward_s=tp_backward + recompute_tp,
        activation_bytes=_activation_bytes(model, UnitKind.BLOCK, block, training, config, setting, timer),
        **_block_parameters(model, block, training, config),
        cp_forward_s=cp_forward,
        cp_backward_s=cp_backward,
        ep_s=ep_forward + ep_backward,
        weight_grad_s=weight_gradient_s(UnitKind.BLOCK, times),
        **_block_parameter_layout(block, config.tp),
    )


def resharded_costs(model: ModelSpec, training: Training, config: ParallelConfig,
                    costs: dict[CostKey, UnitCost]) -> dict[CostKey, UnitCost]:
    """`unit_costs` of the same setting under `config`'s data-parallel sharding (dp, ZeRO stage, distributed
    optimizer), from a table computed under another: only an MoE block's state-weighted parameters
    (`_block_parameters`) depend on it, so the search computes each setting's times once."""
    out = dict(costs)
    for block in model.block_types():
        if block.mlp is not None and block.mlp.is_moe:
            out[block] = replace(costs[block], **_block_parameters(model, block, training, config))
    if len(model.block_types()) == 1:
        out[UnitKind.BLOCK] = out[next(iter(model.block_types()))]
    return out


def selective_recompute_s(times: UnitTimes, modules: frozenset[str]) -> float:
    """Forward compute Megatron-Core's selective recompute repeats for `modules` (config.RECOMPUTE_MODULES): the
    attention core's, and each other module's as the profile breaks it out (`UnitTimes.module_forward_s`; a
    profile without the breakdown, e.g. a measured one, charges only the attention core). Nested modules (moe_act
    or shared_experts inside moe) run again inside the outer one's recompute, so their times add."""
    parts = dict(times.module_forward_s)
    return sum(times.attention_core_forward_s if name == "core_attn" else parts.get(name, 0.0) for name in modules)


def _op_sac_recompute_s(block: BlockSpec, times: UnitTimes, keeps_attention: bool) -> float:
    """Forward time the per-op policy repeats in the backward: everything but the kept matrix multiplies (their share
    of the block's linear time, by FLOPs) and the attention kernel where the policy keeps its output
    (`ParallelConfig.sac_keeps_attention`)."""
    matmuls = block.separate_matmuls()
    kept = sum(a * b for a, b, _ in op_sac_kept_matmuls(block)) / sum(a * b for a, b, _ in matmuls)
    attention = times.attention_core_forward_s if keeps_attention else 0.0
    return times.forward_s - attention - kept * sum(times.linear_forward_s)


@cache
def _block_parameter_layout(block: BlockSpec, tp: int) -> dict[str, float]:
    """A block type's parameter tensors (`_tensor_counts`), the share of its parameters in linear weights and the
    share DeepSpeed's per-tensor ZeRO-3 gathers again after a full recompute (`recompute_regathered_share`), once per
    type and TP degree (an MoE block has thousands of expert tensors; the search asks per configuration)."""
    return {**_tensor_counts(block.tensor_sizes()),
            "linear_share": block.linear_weight_parameters() / max(block.parameters(), 1),
            "regathered_share": recompute_regathered_share(block.tensor_sizes(), tp)}


def recompute_regathered_share(sizes: Sequence[int], tp: int) -> float:
    """Share of a block's gathered weights (tensors of `sizes` elements in forward order, split `tp` ways) that
    DeepSpeed's per-tensor ZeRO-3 gathers a third time per micro-batch under full recompute. It releases a
    submodule's weights after each use unless the weights the trace runs before their next use add up to fewer
    than ZERO3_MAX_REUSE_DISTANCE elements (stage3.py `_keep_for_later`). The recomputed forward gathers every
    submodule again; the backward then runs them in reverse, so between a submodule's recomputed forward and its
    backward run, twice over, the submodules after it: the last one is kept, the others are gathered a third time
    where those exceed the distance (GPT-3 175B: all but the MLP's output projection, 8 of 12 h²)."""
    regathered = later = gathered = 0.0
    for size in reversed([size / tp for size in sizes]):
        if size >= ZERO3_PERSISTENT_ELEMENTS:
            gathered += size
            regathered += size if 2 * later >= ZERO3_MAX_REUSE_DISTANCE else 0.0
        later += size
    return regathered / gathered if gathered else 0.0


def _tensor_counts(sizes: Sequence[int]) -> dict[str, int]:
    """A unit's parameter tensors, and how many of them ZeRO-3 partitions and gathers: DeepSpeed keeps tensors
    under `stage3_param_persistence_threshold` whole on every rank (`ZERO3_PERSISTENT_ELEMENTS`)."""
    return {"tensors": len(sizes), "gathered_tensors": sum(size >= ZERO3_PERSISTENT_ELEMENTS for size in sizes)}


def _activation_bytes(model: ModelSpec, kind: UnitKind, block: BlockSpec | None, training: Training,
                      config: ParallelConfig, setting: UnitSetting, timer: UnitTimer) -> float:
    """A unit's activation bytes per micro-batch: the timer's measured ones where it has them (a measured
    profile's block stands for every block type, as its times do; its selective recompute is the default
    attention core's, so other recompute modules are costed analytically), else the analytic ones of its type."""
    measured = (timer.activation_bytes(kind, setting, config.recompute)  # an ActivationSource, by recompute mode
                if _has_method(type(timer), "activation_bytes")
                and config.recompute_modules == DEFAULT_RECOMPUTE_MODULES else None)
    if measured is not None:
        return measured
    if block is None:
        return activation_bytes(model, kind, training, config)
    return block_type_activation_bytes(model, block, training, config)


def _tp_linears(block: BlockSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(column-parallel, row-parallel) positions in `UnitTimes.linear_forward_s` of the TP-split sub-layers a block
    has: the mixer (attention's QKV and output projection, or Mamba's in_proj and out_proj) and the MLP (up,
    down). Each is one all-reduce forward and one backward (2 + 2 for attention + MLP, 1 + 1 for one sub-layer);
    a block's further linears run whole on every rank and communicate nothing."""
    mixer, mlp = block.attention is not None or block.mamba is not None, block.mlp is not None
    present = (mixer, mixer, mlp, mlp)
    return (tuple(i for i in _COLUMN_PARALLEL if present[i]), tuple(i for i in _ROW_PARALLEL if present[i]))


@cache
def _block_parameter_counts(block: BlockSpec) -> tuple[int, int, int]:
    """A block type's (parameters, routed-expert parameters, parameters every TP rank holds whole: further linears and
    extra parameters), once per type (the search reshards MoE blocks per configuration, `resharded_costs`)."""
    return (block.parameters(), block.routed_expert_parameters(),
            block.linear_parameters() + (block.extra_parameters or 0))


def _block_parameters(model: ModelSpec, block: BlockSpec, training: Training,
                      config: ParallelConfig) -> dict[str, float]:
    """A block type's UnitCost parameter fields. `params`: parameters held per rank, weighted so the memory model's
    one per-parameter cost (`sharded_state_bytes`, sharding over dp·cp) gives the exact model-state bytes: the
    TP-split part over tp, the further linears and extra parameters whole on every rank (as they run), the routed
    experts over ep·etp with their gradients reduced and optimizer states sharded over edp (Megatron-Core's expert
    data-parallel group), not over dp·cp. `expert_params`: those routed experts per rank, unweighted, and
    `expert_state_params` their weighted share of `params`, so the data-parallel traffic can send each part over
    its own group."""
    total, experts, whole = _block_parameter_counts(block)
    split = (total - experts - whole) / config.tp + whole
    if not experts:
        return {"params": split}
    states = parameter_states(model, training)
    per_param = sharded_state_bytes(config, training.grad_bytes, states)
    expert_states = parameter_model_states(1.0, config.edp, config.optimizer_sharding, training.grad_bytes, states)
    expert_states = replace(expert_states,
                            gradients=expert_states.gradients + optimizer_held_gradient_bytes(config, states))
    local = experts / (config.ep * config.etp)
    weighted = local * expert_states.total / per_param.total
    return {"params": split + weighted, "expert_params": local, "expert_state_params": weighted}


EP_DISPATCH_BYTES = 2
"""Bytes per element the token dispatcher moves: 16-bit hidden states (Megatron-Core's alltoall / flex
dispatchers send BF16 activations; FP8 dispatch is DeepEP-only and not modelled)."""


def _two_fabric_s(intra_bytes: float, inter_bytes: float, link: ExpertLink, calibration: Calibration) -> float:
    """What one rank sends over NVLink (`intra_bytes`) and through its own NIC (`inter_bytes`) at once: the slower
    fabric sets the time, plus one latency per fabric used. Both run at the point-to-point efficiency: NCCL's
    all-to-all and DeepEP's kernels are direct sends between pairs of GPUs, with no ring and no reduction."""
    intra = intra_bytes / (link.intra.bandwidth_bytes_per_s * calibration.p2p_efficiency(link.intra.kind))
    inter = inter_bytes / (link.inter.bandwidth_bytes_per_s * calibration.p2p_efficiency(link.inter.kind))
    latency = (link.intra.latency_s if intra_bytes > 0 else 0.0) + (link.inter.latency_s if inter_bytes > 0 else 0.0)
    return max(intra, inter) + latency


def alltoall_fabric_bytes(local_bytes: float, ep: int, near: int) -> tuple[float, float]:
    """(NVLink, NIC) bytes one rank sends in an all-to-all over `ep` ranks, `near` of them on its node, of
    `local_bytes` spread evenly over the group: the share for its near − 1 node peers, the share for the rest."""
    return local_bytes * (near - 1) / ep, local_bytes * (ep - near) / ep


def expert_all_to_all_s(local_bytes: float, ep: int, link: ExpertLink, calibration: Calibration) -> float:
    """One all-to-all over an EP group of `ep` ranks, each sending `local_bytes` spread evenly over the group
    (`alltoall_fabric_bytes`), over NVLink and the GPU's own NIC at once (`_two_fabric_s`)."""
    if ep <= 1 or local_bytes <= 0:
        return 0.0
    return _two_fabric_s(*alltoall_fabric_bytes(local_bytes, ep, min(link.ranks_per_node, ep)), link, calibration)


def expected_holders(items: float, picks: int, holders: float) -> float:
    """Expected number of `holders`, each owning an equal share of `items`, that `picks` distinct items chosen
    uniformly at random fall on: holders · (1 − C(items − items/holders, picks) / C(items, picks)). A
    force-balanced router picks a token's top-k experts so (Megatron-Core's --moe-router-force-load-balancing
    routes on random scores), and Megatron-Core places experts on EP ranks, and so on nodes, in equal runs."""
    if holders <= 1:
        return 1.0
    share, missed = items / holders, 1.0
    for i in range(picks):
        missed *= max(items - share - i, 0.0) / (items - i)
    return holders * (1.0 - missed)


def token_destination_nodes(mlp: MlpSpec, nodes: float) -> float:
    """Expected distinct nodes a token's top-k experts lie on, the routed experts spread evenly over `nodes` nodes.
    Group-limited routing picks the experts inside router_group_topk of router_groups equal groups (DeepSeek-V3:
    top-4 of 8, so at most 4 nodes, §2.1.2 of its report); each picked group is taken to hold one of the token's
    experts (the group's score is the sum of its best k / topk_group experts). Groups that split evenly among
    the nodes reach the nodes holding the picked groups; a group spanning nodes spreads the top-k over the picked
    groups' nodes. The smaller of that and the unrestricted count."""
    free = expected_holders(mlp.num_experts, mlp.moe_top_k, nodes)
    groups, picked = mlp.router_groups, mlp.router_group_topk
    if not groups or not picked or nodes <= 1:
        return free
    if groups >= nodes:
        return min(free, expected_holders(groups, picked, nodes))
    return min(free, expected_holders(mlp.num_experts * picked / groups, mlp.moe_top_k, picked * nodes / groups))


def flex_fabric_bytes(token_bytes: float, mlp: MlpSpec, ep: int, near: int) -> tuple[float, float]:
    """(NVLink, NIC) bytes one rank sends in a dispatch (or combine, its mirror) of Megatron-Core's flex dispatcher
    over `ep` ranks, `near` per node, holding `token_bytes` of tokens, one copy each. DeepEP's normal kernels and
    HybridEP (the DeepSeek-V3 report §3.2.2; DeepEP's README) send a token through the NIC once per remote node
    holding any of its experts, to the GPU of the same local index there, which forwards it over NVLink to that
    node's GPUs holding its experts (on its own node it goes over NVLink directly); each destination GPU gets one
    copy, not one per expert. NIC: tokens × remote destination nodes (`token_destination_nodes` × (nodes − 1) /
    nodes); NVLink: tokens × destination GPUs (`expected_holders` over the ep ranks) but the one a copy enters
    the node at, a (near − 1)/near share."""
    nodes = ep / near
    gpus = expected_holders(mlp.num_experts, mlp.moe_top_k, ep)
    remote = token_destination_nodes(mlp, nodes) * (nodes - 1) / nodes
    return token_bytes * gpus * (near - 1) / near, token_bytes * remote


def flex_dispatch_s(token_bytes: float, mlp: MlpSpec, ep: int, link: ExpertLink, calibration: Calibration) -> float:
    """One flex dispatch or combine over an EP group of `ep` ranks (`flex_fabric_bytes`), both fabrics at once."""
    if ep <= 1 or token_bytes <= 0:
        return 0.0
    return _two_fabric_s(*flex_fabric_bytes(token_bytes, mlp, ep, min(link.ranks_per_node, ep)), link, calibration)


def expert_parallel_s(mlp: MlpSpec, hidden_size: int, setting: UnitSetting, config: ParallelConfig,
                      link: ExpertLink | None, tp_link: Link, calibration: Calibration,
                      times: UnitTimes, sm_count: int | None = None) -> tuple[float, float]:
    """Exposed expert-parallel communication of one MoE block (MLP `mlp` at width `hidden_size`, compute `times`)
    per micro-batch, (forward, backward). Forward: a dispatch and a combine of the rank's tokens (tokens/tp under
    sequence parallelism, times the busiest rank's load): with the alltoall dispatcher every routed copy
    (top-k per token) crosses the fabric (`expert_all_to_all_s`), with flex one copy per destination node and
    GPU (`flex_dispatch_s`); with etp > 1 the received tokens are all-gathered over the expert-TP group after
    dispatch and reduce-scattered before combine. Backward: the same in reverse.

    With `moe_ep_overlap` (Megatron-Core's --overlap-moe-expert-parallel-comm, the combined 1F1B schedule after
    DeepSeek-V3's DualPipe, report §3.2.1) one micro-batch's forward of a layer runs with another's backward of a
    layer, in three phases (`_ep_overlap_exposed_s`), the flex dispatcher's kernels holding `ep_comm_sm_share` of the
    GPU's `sm_count` SMs while they run; without it the all-to-alls are exposed."""
    if config.ep * config.etp == 1 or link is None:
        return 0.0, 0.0
    token_bytes = setting.tokens / setting.tp * setting.expert_load * hidden_size * EP_DISPATCH_BYTES
    local_bytes = token_bytes * mlp.moe_top_k
    if config.moe_dispatcher == "flex":
        one_way = flex_dispatch_s(token_bytes, mlp, config.ep, link, calibration)
    else:
        one_way = expert_all_to_all_s(local_bytes, config.ep, link, calibration)
    if config.etp > 1:
        one_way += all_gather_time(local_bytes * config.etp, config.etp, tp_link, calibration)
    if config.moe_ep_overlap:
        return _ep_overlap_exposed_s(one_way, times, ep_comm_sm_share(config, sm_count))
    return 2 * one_way, 2 * one_way


# SMs the flex dispatcher's HybridEP / DeepEP kernels run on, taken from the GEMMs and attention while they run:
# Megatron-Bridge's performance recipes set moe_hybridep_num_sms = 32 for every HybridEP run (src/megatron/bridge/
# perf_recipes/_common.py `_benchmark_common`; gpt_oss/common.py, deepseek/common.py), as its measured Qwen3-30B-A3B
# EP-overlap run on 16 H100 does (skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md: HybridEP with 32 SMs;
# Nsight: only 36.55 % of the communication time ran concurrently with GEMMs or attention).
FLEX_DISPATCH_SMS = 32


def ep_comm_sm_share(config: ParallelConfig, sm_count: int | None) -> float:
    """Share of the GPU's SMs the EP all-to-all kernels hold while they overlap compute: the flex dispatcher's
    `FLEX_DISPATCH_SMS` of `sm_count`; 0 for NCCL's all-to-all (its CTA count per all-to-all is not modelled) or
    when the GPU is not given."""
    if config.moe_dispatcher != "flex" or not sm_count:
        return 0.0
    return min(FLEX_DISPATCH_SMS / sm_count, 1.0)


def _overlapped_exposed_s(comm: float, compute: float, sm_share: float) -> float:
    """What `comm` seconds of communication on `sm_share` of the SMs add to `compute` seconds of (full-GPU) compute run
    beside it: the compute runs on the other SMs while the communication lasts, so either it finishes under the
    communication (comm − compute shows) or it is slowed by the SMs the communication held (comm · sm_share)."""
    return max(comm - compute, comm * sm_share, 0.0)


def _ep_overlap_exposed_s(one_way: float, times: UnitTimes, sm_share: float = 0.0) -> tuple[float, float]:
    """(forward, backward) EP all-to-all time a block leaves exposed under Megatron-Core's combined 1F1B overlap
    (TransformerLayerSchedulePlan.run, core 0.16): the communication stream runs combine_bwd | dispatch_fwd,
    dispatch_bwd | combine_fwd while the compute stream runs attn_fwd | mlp_bwd, mlp_fwd | attn_bwd, so each
    phase shows what its all-to-alls (`one_way` each) exceed its compute. Attention is the QKV and output
    projections plus the core, forward (their dgrad and wgrad GEMMs and the core's backward, backward); the MLP
    the rest (`UnitTimes.linear_forward_s`; a measured profile without it spreads the forward over four linears
    like `_block_tp_s`). The middle phase is split evenly between the passes. Each phase's compute runs on the SMs
    the all-to-alls leave it (`_overlapped_exposed_s`). The first forward and last backward of an iteration, which
    have no partner, are not modelled."""
    gemm = times.linear_forward_s or (times.forward_s / 4,) * 4
    attention_forward = times.attention_core_forward_s + gemm[0] + gemm[1]
    core_backward = times.attention_core_backward_s or 2 * times.attention_core_forward_s
    attention_backward = min(core_backward + 2 * (gemm[0] + gemm[1]), times.backward_s)
    mlp = max(times.forward_s - attention_forward, 0.0) + times.backward_s - attention_backward
    middle = _overlapped_exposed_s(2 * one_way, mlp, sm_share) / 2
    return (middle + _overlapped_exposed_s(one_way, attention_backward, sm_share),
            middle + _overlapped_exposed_s(one_way, attention_forward, sm_share))


def context_parallel_s(times: UnitTimes, attention: AttentionSpec, training: Training, config: ParallelConfig,
                       link: Link, calibration: Calibration) -> tuple[float, float]:
    """Exposed context-parallel communication of one block with `attention` per micro-batch, (forward, backward).

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
    kv_width = attention.kv_width * max(attention.num_key_value_heads / config.tp, 1.0) / attention.num_key_value_heads
    kv_bytes = 2 * tokens * kv_width * CP_COMM_BYTES  # K and V
    q_bytes = tokens * attention.query_width / config.tp * CP_COMM_BYTES
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


def tp_gather_element_bytes(training: Training) -> int:
    """Bytes per activation element sequence parallelism's all-gathers move: an FP8 run's one where its framework
    quantises before gathering (`Training.fp8_tp_gather`), else the 16-bit activation's two (scales not counted)."""
    return FP8_PARAM_BYTES if training.dtype == "fp8" and training.fp8_tp_gather else PARAM_BYTES


def _block_tp_s(times: UnitTimes, linears: tuple[tuple[int, ...], tuple[int, ...]], config: ParallelConfig,
                message: float, gather_messages: tuple[float, float, float, float], link: Link,
                calibration: Calibration) -> tuple[float, float]:
    """Exposed TP communication of one block per micro-batch, (forward, backward), over its TP-split sub-layers
    (`linears`: the positions of their column- and row-parallel linears, `_tp_linears`), each collective hidden
    at most behind the GEMM it overlaps (`UnitTimes.linear_forward_s`; a measured profile without it
    spreads the block's forward over its linear layers). `message`: the 16-bit activation's bytes, what the
    all-reduces and reduce-scatters move; `gather_messages`: what sequence parallelism's all-gather around each
    linear (in `UnitTimes.linear_forward_s` order) moves, FP8's half where the framework gathers quantised inputs
    and output gradients (`tp_gather_element_bytes`).

    Without SP: a synchronous all-reduce per sub-layer forward; backward, each column-parallel linear's input-gradient
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
    tp, (columns, rows) = config.tp, linears
    if not columns:
        return 0.0, 0.0
    gemm = times.linear_forward_s or (times.forward_s / (2 * len(columns)),) * 4
    hidden = calibration.tp_backward_overlap if config.overlap_tp_backward else 0.0
    if not config.sequence_parallel:
        all_reduce = all_reduce_time(message, tp, link, calibration)
        backward = sum(max((1 - hidden) * all_reduce, all_reduce - gemm[i]) for i in columns)
        return len(columns) * all_reduce, backward
    gather = [all_gather_time(size, tp, link, calibration) for size in gather_messages]
    scatter = reduce_scatter_time(message, tp, link, calibration)
    forward = sum(gather[i] + scatter for i in columns)
    regather = gather if _regathers_column_inputs(config) else [0.0] * len(gather)
    backward = sum(gather[i] for i in rows) + sum(max((1 - hidden) * comm, comm - gemm[i])
                                                  for i in columns for comm in (regather[i], scatter))
    if config.tp_comm_overlap:
        forward = sum(_pipelined_exposed_s(gather[i], gemm[i], tp, gather=True) for i in columns)
        forward += sum(_pipelined_exposed_s(scatter, gemm[i], tp, gather=False) for i in rows)
    if config.tp_comm_overlap and config.overlap_tp_backward:
        backward = sum(_pipelined_exposed_s(gather[i], gemm[i], tp, gather=True) for i in rows)
        backward += sum(max(0.0, regather[i] - gemm[i]) + max(0.0, scatter - gemm[i]) for i in columns)
    return forward, backward


def _regathers_column_inputs(config: ParallelConfig) -> bool:
    """Whether a column-parallel linear's sequence-parallel input is all-gathered again in backward for its weight
    gradient: always where it keeps only its shard (Megatron-LM); where it keeps the gathered input (DTensor's
    ColwiseParallel, `sp_saves_gathered_input`) only under torchtitan's per-op SAC, whose save list leaves the
    all-gather out, so backward re-runs it (a full recompute re-runs it with the forward: `recompute_tp`)."""
    return not config.sp_saves_gathered_input or (config.recompute is Recompute.SELECTIVE
                                                   and config.selective_recompute == "op")


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
                      calibration: Calibration, hidden_s: float = 0.0) -> float:
    """Forward activation plus backward gradient across one stage boundary, per micro-batch.

    With TP > 1 each rank sends 1/tp of the tensor (sequence-parallel shards, Megatron-LM's scatter/gather
    optimisation of Narayanan et al. §4.1, DeepSpeed's partitioned pipeline transfers) and the receiver re-gathers
    it over NVLink; with `p2p_scatter_gather` off every TP rank sends the whole tensor.
    A context-parallel rank sends its seq_len / cp tokens. Under local learning only the activation crosses
    (`PipelineSchedule.boundary_legs`); where the activation and the gradient cross at once
    (`ParallelConfig.p2p_duplex`) the boundary takes one transfer's time. Overlapped
    (`ParallelConfig.p2p_overlapped`) the latency and what of the transfer `hidden_s` of compute does not cover show.
    """
    legs = 1 if config.p2p_duplex else schedule_of(config.schedule).boundary_legs
    transfer = p2p_time(boundary_tensor_bytes(model, training, config), link, calibration)
    if config.p2p_overlapped:  # the transfer runs behind `hidden_s` of compute; its latency does not
        return legs * (link.latency_s + max(0.0, transfer - link.latency_s - hidden_s))
    return legs * transfer


def p2p_hiding_s(costs: Mapping[CostKey, UnitCost]) -> float:
    """Compute an overlapped stage-boundary transfer surely runs behind on a rank with unit costs `costs`: one
    block's forward, the cheapest block type's (a model chunk holds at least one block, and the pass a rank runs
    while its transfer is in flight is at least a chunk's forward)."""
    return min(cost.forward_s for key, cost in costs.items() if key not in (UnitKind.EMBEDDING, UnitKind.HEAD))


def boundary_times(model: ModelSpec, training: Training, config: ParallelConfig, pp_links: Sequence[Link],
                   rank_costs: Sequence[Mapping[CostKey, UnitCost]], calibration: Calibration) -> list[float]:
    """`p2p_boundary_time` of each rank boundary r → r + 1 (mod pp), an overlapped one hidden behind the less of the
    two ranks' `p2p_hiding_s`: the one rule `estimate` and the search both use."""
    pp = len(pp_links)
    hiding = [p2p_hiding_s(costs) for costs in rank_costs] if config.p2p_overlapped else [0.0] * pp
    return [p2p_boundary_time(model, training, config, link, calibration, min(hiding[r], hiding[(r + 1) % pp]))
            for r, link in enumerate(pp_links)]


def boundary_tensor_bytes(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Bytes one rank sends across a stage boundary per micro-batch: the 16-bit activation of its seq_len / cp
    tokens, 1/tp of it with sequence parallelism or Megatron-LM's scatter/gather."""
    size = 2 * training.seq_len / config.cp * config.micro_batch * model.hidden_size
    return size / config.tp if config.p2p_scatter_gather or config.sequence_parallel else size


def stage_boundary_s(boundary_by_rank: Sequence[float], num_stages: int,
                     schedule: Schedule = Schedule.ONE_F_ONE_B) -> list[float]:
    """p2p time each virtual stage pays per micro-batch. Blocking send/recv occupies both ends of a
    boundary, so a stage pays its incoming and its outgoing one; `boundary_by_rank[r]` is the
    boundary between rank r and rank r + 1 (mod pp), crossed by a stage on rank r sending forward
    (loop layout: stage k on rank k mod pp) or by a stage on rank r + 1 sending back (the second leg of
    a V); a boundary between two stages on one rank (the V's turn) costs nothing (`stage_ranks`). The one
    rule the estimate, the partitioner and the search bounds all use."""
    outgoing = [0.0 if link is None else boundary_by_rank[link]
                for link in _boundary_links(schedule, len(boundary_by_rank), num_stages)]
    return [outgoing[k] + (outgoing[k - 1] if k else 0.0) for k in range(num_stages)]


@cache
def _boundary_links(schedule: Schedule, pp: int, num_stages: int) -> tuple[int | None, ...]:
    """Per stage, the rank boundary its outgoing send crosses (`stage_boundary_s`); None for none (the last
    stage, the V's turn)."""
    ranks = stage_ranks(schedule, pp, num_stages)

    def link(k: int) -> int | None:
        here, there = ranks[k], ranks[k + 1]
        if here == there:
            return None
        return here if there == (here + 1) % pp else there

    return (*(link(k) for k in range(num_stages - 1)), None)


def embedding_sync_time(model: ModelSpec, training: Training, config: ParallelConfig, link: Link,
                        calibration: Calibration) -> float:
    """All-reduce of the tied word-embedding gradient between the first and the last pipeline stage,
    once per iteration after the pipeline flush (Megatron-LM and DeepSpeed alike; not overlapped); none
    where one rank holds both (a V layout). A frozen embedding (LoRA, QLoRA) has no gradient to reduce."""
    if (not model.tie_embeddings or config.pp == 1 or config.stage_ranks[0] == config.stage_ranks[-1]
            or training.finetune != "full"):
        return 0.0
    size = model.vocab_size * model.hidden_size / config.tp * training.grad_bytes
    return all_reduce_time(size, 2, link, calibration)


@dataclass(frozen=True)
class DataParallelTime:
    """Gradient/parameter communication of one pipeline rank per iteration, total and exposed."""

    total_s: float
    exposed_s: float


UnitRun = tuple[UnitCost, int]
"""A run of identical consecutive units (the same UnitCost object) and its length."""


def unit_runs(units: Sequence[UnitCost]) -> tuple[UnitRun, ...]:
    """`units` as runs of identical neighbours: alike units have alike collectives, so the DP time model
    costs a rank in O(runs), not O(units) (a uniform model's rank is at most three runs)."""
    runs: list[list] = []
    for unit in units:
        if runs and runs[-1][0] is unit:
            runs[-1][1] += 1
        else:
            runs.append([unit, 1])
    return tuple((unit, count) for unit, count in runs)


def data_parallel_time(
    units: Sequence[UnitCost], training: Training, config: ParallelConfig, link: Link, calibration: Calibration,
    num_microbatches: int, replicate_link: Link | None = None, states: ParameterStates | None = None,
    expert_link: Link | None = None,
) -> DataParallelTime:
    """DP traffic of one pipeline rank holding `units` (in execution order); see `data_parallel_time_of_runs`."""
    return data_parallel_time_of_runs(unit_runs(units), training, config, link, calibration, num_microbatches,
                                      replicate_link, states, expert_link)


def data_parallel_time_of_runs(
    runs: Sequence[UnitRun], training: Training, config: ParallelConfig, link: Link, calibration: Calibration,
    num_microbatches: int, replicate_link: Link | None = None, states: ParameterStates | None = None,
    expert_link: Link | None = None, any_order: bool = False,
) -> DataParallelTime:
    """DP traffic of one pipeline rank holding `runs` of units (in execution order) and how much the schedule
    cannot hide. `any_order`: the exposed part as a lower bound over every order of the same units
    (`_prefetch_exposed_s`), for a rank whose units' order is not known.

    The group is the dp·cp ranks holding the same weights (`ParallelConfig.replicas`) on `link`. Plain DP
    all-reduces gradients once per iteration; the distributed optimizer / ZeRO-1 reduce-scatters
    gradients and all-gathers the updated 16-bit weights (Megatron's overlap_grad_reduce hides the
    reduction behind the last micro-batch's backward, overlap_param_gather the all-gather behind the
    first forward). Megatron-LM, PyTorch DDP and DeepSpeed fill gradient buckets in backward order and reduce each
    once it is complete: the input embedding's gradient completes last and, larger than a bucket (Megatron-LM's
    max(4e7, 1e6·dp) parameters, DDP's 25 MB), ends in the last one, whose reduction starts only when the backward
    has ended; with the weights' all-gather overlapped, that bucket is also the first the next forward waits on.
    Neither is hidden, whatever the compute (`UnitCost.edge_bucket_params`). Without pipelining, ZeRO-2/3
    collectives are per unit and per micro-batch
    (`_sharded_microbatch_s`); ZeRO-2 all-gathers the updated weights once per iteration like ZeRO-1.
    With pipelining, FSDP runs as PyTorch's pipeline stages drive it (`_pipelined_fsdp_s`). Under HSDP the
    R replicas (`replicate_link`) all-reduce their gradient shards once per iteration, behind the last backward.
    Fine-tuning (`states`, planner.finetune) reduces and re-gathers only the trainable parameters; ZeRO-3 still
    gathers the frozen base weights as stored. Routed experts' gradients and weights go over their expert
    data-parallel group instead (`UnitCost.expert_params`: edp ranks on `expert_link`, which may span more nodes
    than the dense group, e.g. one rank per node when EP fills a node), under ZeRO-2/3 in collectives of their own
    per unit (torchtitan's FSDP wraps the experts over the dp_shard_mod_ep mesh, Megatron-FSDP over the expert
    data-parallel group); DeepSpeed's per-tensor ZeRO-3 has no expert parallelism and keeps them with the rest.
    """
    if config.replicas == 1 and config.edp == 1:
        return DataParallelTime(0.0, 0.0)
    states = states or full_parameter_states(training)  # a fine-tune without its states is a bug: ValueError
    group = config.shard_group
    sharding = config.optimizer_sharding
    apart = expert_link is not None and config.zero3_collectives == "per-unit"  # experts over their own group
    params = sum((unit.params - unit.expert_state_params * apart) * count for unit, count in runs)
    trainable = params * states.trainable
    grads = trainable * training.grad_bytes
    experts = sum(unit.expert_params * count for unit, count in runs) * states.trainable if apart else 0.0
    last_backward = sum((unit.backward_s + unit.recompute_s) * count for unit, count in runs)
    # the input embedding's bucket: its reduction starts only once the backward has ended, its gather (sharded
    # optimizer states) is the first the next forward waits on; its weights are never FP8
    edge = sum(unit.edge_bucket_params * count for unit, count in runs)
    replicate_s = all_reduce_time(grads / group, config.hsdp_replicas, replicate_link or link, calibration)
    replicate = DataParallelTime(replicate_s, _exposed(replicate_s, last_backward, True))

    def both_groups(collective: Callable[..., float], dense_bytes: float, expert_bytes: float) -> float:
        """One collective over the dense group and one over the expert data-parallel group (none without experts
        apart: zero bytes cost nothing)."""
        return (collective(dense_bytes, group, link, calibration)
                + collective(expert_bytes, config.edp, expert_link or link, calibration))

    if sharding == 0:
        reduce_s = both_groups(all_reduce_time, grads, experts * training.grad_bytes)
        edge_s = all_reduce_time(edge * training.grad_bytes, group, link, calibration)
        return DataParallelTime(reduce_s, _exposed(reduce_s, last_backward, config.overlap_grad_reduce, edge_s))
    gathered = trainable * PARAM_BYTES - sum(_fp8_saved_bytes(unit, config, apart) * count for unit, count in runs)
    expert_bytes = experts * (FP8_PARAM_BYTES if config.fp8_param_gather else PARAM_BYTES)
    gather_s = both_groups(all_gather_time, gathered, expert_bytes) if sharding < 3 else 0.0
    forward = sum(unit.forward_s * count for unit, count in runs)
    edge_gather_s = all_gather_time(edge * PARAM_BYTES, group, link, calibration) if sharding < 3 else 0.0
    gather_exposed = _exposed(gather_s, forward, config.overlap_param_gather, edge_gather_s)
    if sharding == 1:
        reduce_s = both_groups(reduce_scatter_time, grads, experts * training.grad_bytes)
        edge_s = reduce_scatter_time(edge * training.grad_bytes, group, link, calibration)
        exposed = _exposed(reduce_s, last_backward, config.overlap_grad_reduce, edge_s) + gather_exposed
        return DataParallelTime(reduce_s + gather_s, exposed)
    experts_link = expert_link if apart else None
    if config.pp > 1:
        total, exposed = _pipelined_fsdp_s(runs, training, config, link, calibration, num_microbatches, states,
                                           experts_link, any_order)
    else:
        total, exposed = _sharded_microbatch_s(runs, training, config, link, calibration, states, experts_link,
                                               any_order)
        total, exposed = num_microbatches * total, num_microbatches * exposed
    return DataParallelTime(total + gather_s + replicate.total_s, exposed + gather_exposed + replicate.exposed_s)


@dataclass(frozen=True)
class _PassRun:
    """A run of alike units in one pass: per unit, the collective prefetched before it (leading), the one
    issued after it (trailing) and the compute that can hide its neighbours' collectives."""

    leading_s: float
    trailing_s: float
    compute_s: float
    count: int


def _pipelined_fsdp_s(runs: Sequence[UnitRun], training: Training, config: ParallelConfig, link: Link,
                      calibration: Calibration, num_microbatches: int, states: ParameterStates,
                      expert_link: Link | None = None, any_order: bool = False) -> tuple[float, float]:
    """(total, exposed) seconds per iteration of ZeRO-2/3 under a pipeline schedule, as PyTorch's pipeline
    stages drive FSDP (torch.distributed.pipelining, used by torchtitan): gradient sync and resharding after
    backward are off until the last micro-batch's backward, which reduce-scatters each unit's gradients once
    (behind the remaining backward). ZeRO-3 gathers each unit's weights before the first forward; with
    `reshard_after_forward` (off by default under PP, as torchtitan sets it) it frees them after every
    forward and gathers them again before every backward: m + 1 gathers, else one."""
    collectives = _run_collectives(runs, training, config, link, calibration, states, expert_link)
    backward = [(gather, reduce, unit.backward_s + unit.recompute_s, count)
                for (unit, count), (gather, reduce) in zip(runs[::-1], collectives[::-1], strict=True)]
    first = _prefetch_exposed_s([_PassRun(gather, 0.0, unit.forward_s, count)
                                 for (unit, count), (gather, _) in zip(runs, collectives, strict=True)], any_order)
    last = _prefetch_exposed_s([_PassRun(0.0, reduce, compute, count) for _, reduce, compute, count in backward],
                               any_order)
    regathers = num_microbatches if config.reshard_after_forward else 0
    regather = _prefetch_exposed_s([_PassRun(gather, 0.0, compute, count) for gather, _, compute, count in backward],
                                   any_order)
    gathered = sum(gather * count for (_, count), (gather, _) in zip(runs, collectives, strict=True))
    reduced = sum(reduce * count for (_, count), (_, reduce) in zip(runs, collectives, strict=True))
    return (1 + regathers) * gathered + reduced, first + last + regathers * regather


def _run_collectives(runs: Sequence[UnitRun], training: Training, config: ParallelConfig, link: Link,
                     calibration: Calibration, states: ParameterStates,
                     expert_link: Link | None = None) -> list[tuple[float, float]]:
    """Per run, one unit's ZeRO-3 weight all-gather (0 under ZeRO-2; the weights as stored) and gradient
    reduce-scatter (its trainable parameters') over the shard group: one collective each, or with
    `zero3_collectives` "per-tensor" one per gathered / trainable tensor, each paying the ring's latency. With
    `expert_link` a unit's routed experts (`UnitCost.expert_params`) are gathered and reduced apart, over the
    edp ranks on that ring."""
    group = config.shard_group
    per_tensor = config.zero3_collectives == "per-tensor"
    zero3 = config.optimizer_sharding == 3
    apart = expert_link is not None
    expert_weight_bytes = FP8_PARAM_BYTES if config.fp8_param_gather else states.weight_bytes

    def collectives(unit: UnitCost) -> tuple[float, float]:
        dense = unit.params - unit.expert_state_params * apart
        experts = unit.expert_params * apart
        gather = reduce = 0.0
        if zero3:
            gather = (all_gather_time(dense * states.weight_bytes - _fp8_saved_bytes(unit, config, apart), group,
                                      link, calibration, messages=unit.gathered_tensors if per_tensor else 1)
                      + (_partition_copies_s(unit.gathered_tensors, group, calibration) if per_tensor else 0.0))
        reduce = (reduce_scatter_time(dense * states.trainable * training.grad_bytes, group, link, calibration,
                                      messages=unit.tensors if per_tensor else 1)
                  + (_partition_copies_s(unit.tensors, group, calibration) if per_tensor else 0.0))
        if experts:
            if zero3:
                gather += all_gather_time(experts * expert_weight_bytes, config.edp, expert_link, calibration)
            reduce += reduce_scatter_time(experts * states.trainable * training.grad_bytes, config.edp, expert_link,
                                          calibration)
        return gather, reduce

    return [collectives(unit) for unit, _ in runs]


def _partition_copies_s(collectives: int, ranks: int, calibration: Calibration) -> float:
    """The per-rank copies of `collectives` list-form NCCL collectives over `ranks` GPUs: DeepSpeed's per-tensor
    ZeRO-3 (v0.3–0.5.10, `partition_parameters._allgather_param` / `_reduce_scatter_gradient`) hands
    torch.distributed one tensor per rank, and PyTorch's ProcessGroupNCCL (before `_all_gather_base`) stages a
    list through one flat buffer, copying each rank's partition out of it (all-gather) or into it (reduce-scatter)
    with its own kernel: `ranks` kernels per collective, each at least a kernel's launch cost. Linear in the GPU
    count, which is why those runs lose more time the more GPUs they use. From v0.5.5 the gathers call
    `_all_gather_base` where PyTorch has it (pytorch#56304, 2021-04), which copies nothing (the reduce-scatters
    stay list-form); the PyTorch of a run is rarely stated, so every per-tensor run is charged the copies."""
    return collectives * ranks * calibration.kernel_launch_s


def _fp8_saved_bytes(unit: UnitCost, config: ParallelConfig, experts_apart: bool = False) -> float:
    """Bytes a unit's weight all-gather saves when its linear weights travel in FP8 (`fp8_param_gather`): one of
    their two bytes each; with `experts_apart`, of the parameters other than routed experts (gathered apart)."""
    if not config.fp8_param_gather:
        return 0.0
    return ((unit.params - unit.expert_state_params * experts_apart) * unit.linear_share
            * (PARAM_BYTES - FP8_PARAM_BYTES))


def _sharded_microbatch_s(runs: Sequence[UnitRun], training: Training, config: ParallelConfig, link: Link,
                          calibration: Calibration, states: ParameterStates,
                          expert_link: Link | None = None, any_order: bool = False) -> tuple[float, float]:
    """(total, exposed) seconds of one micro-batch's ZeRO-2/3 collectives, one per FSDP unit and pass.

    The wrapping unit is one model unit (a transformer block; FSDP's auto-wrap policy, DeepSpeed's
    per-module fetch). ZeRO-3 all-gathers a unit's 16-bit weights before its forward and again
    before its backward (FSDP FULL_SHARD / reshard_after_forward, DeepSpeed stage 3; without
    `reshard_after_forward`, SHARD_GRAD_OP, only before its forward); a full
    recompute runs inside that backward with the weights gathered for it, so it adds hiding
    compute, not traffic: 2 all-gathers + 1 reduce-scatter = 3× the parameter bytes per
    micro-batch, 1.5× DP's all-reduce (Rajbhandari et al. 2020 §7.2.2) — except under DeepSpeed's per-tensor
    ZeRO-3, which releases each submodule's weights after the recomputed forward and gathers most of them again
    for the backward (`recompute_regathered_share`). Gradients are
    reduce-scattered per unit after its backward in every micro-batch (DeepSpeed stages 2/3 and
    FSDP without `no_sync`, the default of Composer and torchtitan; `no_sync` would reduce once
    per iteration at the memory of unsharded gradients). Each collective is a ring over the shard
    group's n ranks with its own (n − 1)·α latency, and prefetch hides it only behind the compute of the
    neighbouring unit (`_prefetch_exposed_s`), or, under `fsdp_backward_prefetch` "post", not the backward
    gathers at all; routed experts' collectives go over their own group (`expert_link`).
    """
    collectives = _run_collectives(runs, training, config, link, calibration, states, expert_link)
    regather = config.reshard_after_forward
    per_tensor = config.zero3_collectives == "per-tensor"
    # per-tensor ZeRO-3 gathers the weights a full recompute released again for the backward, by their bytes
    third = per_tensor and config.recompute is Recompute.FULL
    total = sum((gather * (1 + regather + third * unit.regathered_share) + reduce) * count
                for (unit, count), (gather, reduce) in zip(runs, collectives, strict=True))
    if per_tensor:  # each gather waits for the device to drain: nothing hides
        return total, total
    forward = _prefetch_exposed_s([_PassRun(gather, 0.0, unit.forward_s, count)
                                   for (unit, count), (gather, _) in zip(runs, collectives, strict=True)], any_order)
    # BACKWARD_POST issues a unit's backward gather only after the previous unit's gradient computation: it waits
    # in full, whatever the order of the units, and only the reduce-scatters hide
    post = config.fsdp_backward_prefetch == "post"
    waiting = sum(gather * regather * count
                  for (_, count), (gather, _) in zip(runs, collectives, strict=True)) if post else 0.0
    backward = waiting + _prefetch_exposed_s(
        [_PassRun(0.0 if post else gather * regather, reduce, unit.backward_s + unit.recompute_s, count)
         for (unit, count), (gather, reduce) in zip(runs[::-1], collectives[::-1], strict=True)], any_order)
    return total, forward + backward


def _prefetch_exposed_s(runs: Sequence[_PassRun], any_order: bool = False) -> float:
    """Communication a pass over units cannot hide. While unit i computes, the network carries unit
    i+1's prefetched leading collective (its all-gather) and unit i−1's trailing one (its
    reduce-scatter); what exceeds unit i's compute is exposed, as are the first gather and the last reduce.
    Inside a run of alike units every interior unit sees the same neighbours, so a run costs O(1); a run's
    count (≥ 1) may be a numpy array, which evaluates many run lengths at once (the search's DP tables).
    `any_order`: a lower bound over every order of the same units (counts ≥ 0): each unit's exposed part is at least
    its neighbours' collectives less its compute, and over the pass every leading and trailing collective is some
    unit's neighbour or the first gather or the last reduce once, so the pass exposes at least Σ (leading +
    trailing − compute), and never less than nothing."""
    if any_order:
        return _positive(sum((run.leading_s + run.trailing_s - run.compute_s) * run.count for run in runs))
    if not runs:
        return 0.0
    exposed = runs[0].leading_s + runs[-1].trailing_s
    for j, run in enumerate(runs):
        before = runs[j - 1].trailing_s if j else 0.0  # trailing collective of the unit just before the run
        after = runs[j + 1].leading_s if j + 1 < len(runs) else 0.0  # leading one of the unit just after it
        single = run.count == 1  # then its first unit is also its last: it sees `before` and `after`
        first = before + run.leading_s + single * (after - run.leading_s)
        exposed += _positive(first - run.compute_s)
        exposed += (run.count - 2 + single) * _positive(run.leading_s + run.trailing_s - run.compute_s)
        exposed += (1 - single) * _positive(after + run.trailing_s - run.compute_s)  # its last unit
    return exposed


def _positive(seconds: float) -> float:
    """max(0, seconds), elementwise when the DP tables evaluate many run lengths at once."""
    return np.maximum(seconds, 0.0)


def _exposed(comm_s: float, hiding_s: float, overlapped: bool, unhidden_s: float = 0.0) -> float:
    """What of `comm_s` an overlapped collective leaves past the `hiding_s` of compute it runs behind, and at least
    `unhidden_s`, the part that cannot start before that compute ends (all of it when not overlapped)."""
    return np.maximum(_positive(comm_s - hiding_s), unhidden_s) if overlapped else comm_s


def activation_offload_s(offloaded: Sequence[UnitCost], blocks: Sequence[UnitCost],
                         gpu: GPUSpec) -> tuple[float, float]:
    """Forward and backward seconds per micro-batch that CPU offloading adds where its copies outlast the compute
    they overlap. `offloaded`: the costs of the blocks whose activations go to the host (the rank's first N),
    `blocks`: all the rank's blocks. Transformer Engine's offload handler copies one block at a time over the GPU's
    host link, each due when the blocks of its window (len(blocks) // N of them) have run forward, where the compute
    stream waits for it; the backward reloads them window by window the same way (te.pytorch.cpu_offload, v2.8)."""
    if not offloaded:
        return 0.0, 0.0
    window = len(blocks) // len(offloaded)
    forward = window * sum(b.forward_s + b.tp_forward_s + b.cp_forward_s for b in blocks) / len(blocks)
    backward = window * sum(b.backward_s + b.tp_backward_s + b.cp_backward_s for b in blocks) / len(blocks)
    copies = [cost.activation_bytes / gpu.host_link_bytes_per_s for cost in offloaded]
    return (sum(max(copy - forward, 0.0) for copy in copies), sum(max(copy - backward, 0.0) for copy in copies))


def optimizer_step_time(params: float, config: ParallelConfig, gpu: GPUSpec, calibration: Calibration,
                        states: ParameterStates | None = None, grad_bytes: int = 4) -> float:
    """The Adam step over the trainable parameters this GPU updates (sharded over its shard group under ZeRO):
    memory-bound on the GPU (fp32 or 8-bit states), or offloaded (`states.offload`, ZeRO-Offload): the gradients
    (`grad_bytes` each) down and the 16-bit weights up over the GPU's host link, and CPU-Adam on the host, not
    overlapped with the next iteration (DeepSpeed's delayed parameter update is off by default)."""
    local = params / (config.shard_group if config.optimizer_sharding >= 1 else 1)
    if states is not None:
        local = local * states.trainable
        if states.offload:
            return local * (grad_bytes + PARAM_BYTES) / gpu.host_link_bytes_per_s + local * CPU_ADAM_S_PER_PARAM
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * calibration.memory_bound_efficiency
    per_param = OPTIMIZER_8BIT_BYTES_PER_PARAM if states is not None and states.optimizer == "8bit" else (
        OPTIMIZER_BYTES_PER_PARAM)
    return local * per_param / bandwidth
