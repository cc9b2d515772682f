"""Per-GPU memory: model states (weights, gradients, optimizer states under ZeRO / the distributed
optimizer), activations (Korthikanti et al. 2022, generalised to GQA, SwiGLU and MoE), and the named
runtime terms around them (CUDA context, NCCL buffers, framework buffers, the largest transient,
allocator fragmentation of transient allocations), each with its source.

Activation bytes per transformer layer reproduce Korthikanti Table 2 exactly for a GPT-style block
(MHA, 4h GeLU MLP, dropout, unfused attention); see tests/test_memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.config import ParallelConfig, Recompute, Training
from planner.cost.schedule import schedule_of
from planner.gpu import GPUSpec
from planner.model import ModelSpec, UnitKind
from planner.profile.calibration import Calibration

__all__ = [
    "MemoryBreakdown",
    "ModelStateBytes",
    "RankMemoryModel",
    "activation_bytes",
    "block_activation_bytes",
    "framework_buffer_bytes",
    "in_flight_microbatches",
    "largest_transient_bytes",
    "model_state_bytes",
    "nccl_communicators",
    "rank_memory_model",
    "recompute_working_bytes",
    "sharded_state_bytes",
]

PARAM_BYTES = 2  # 16-bit weights (fp8 training keeps bf16 weights; FP8 copies are transient)
ADAM_STATE_BYTES = 12  # fp32 master weights + momentum + variance (ZeRO's K = 12)


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model state held by one GPU."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    num_params: float, dp: int, sharding: int, grad_bytes: int = 4, optimizer_bytes: int = ADAM_STATE_BYTES,
    param_bytes: int = PARAM_BYTES,
) -> ModelStateBytes:
    """Model states for `num_params` parameters replicated over `dp` ranks.

    `sharding` is the ZeRO stage (the distributed optimizer counts as 1): 1 shards optimizer
    states, 2 also gradients, 3 also weights (Rajbhandari et al. 2020, §5). With fp16 weights,
    fp16 gradients and K = 12 this is ZeRO's Table 1; with fp32 gradients it is Megatron-LM's
    18 bytes/param (6 + 12/d with the distributed optimizer).
    """
    return ModelStateBytes(
        weights=num_params * param_bytes / (dp if sharding >= 3 else 1),
        gradients=num_params * grad_bytes / (dp if sharding >= 2 else 1),
        optimizer=num_params * optimizer_bytes / (dp if sharding >= 1 else 1),
    )


def sharded_state_bytes(config: ParallelConfig, grad_bytes: int) -> ModelStateBytes:
    """Model states per parameter under the configuration's sharding over its shard group. Under a pipeline
    schedule PyTorch's pipeline stages turn FSDP's gradient sync and resharding after backward off until the
    last micro-batch's backward: gradients stay unsharded, and every unit's 16-bit weights stay gathered from
    its first backward on (a forward's reshard is undone by the next backward). Without pipelining and without
    `reshard_after_forward` the gathered weights stay from forward to backward (no gather buffer extra)."""
    states = model_state_bytes(1.0, config.shard_group, config.optimizer_sharding, grad_bytes)
    if config.pp > 1 and config.optimizer_sharding >= 2:
        return ModelStateBytes(PARAM_BYTES, float(grad_bytes), states.optimizer)
    if config.optimizer_sharding == 3 and not config.reshard_after_forward:
        return ModelStateBytes(PARAM_BYTES, states.gradients, states.optimizer)
    return states


def block_activation_bytes(
    model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
    recompute: Recompute, attention: str = "unfused", cp: int = 1,
) -> float:
    """Activation bytes one transformer layer keeps for backward, per micro-batch on one TP rank and one
    of `cp` context-parallel ranks (each keeps its seq_len / cp tokens; unfused scores span all keys).

    Tensor by tensor (2 bytes each, masks 1 byte): layer-norm inputs, QKV input, Q, K, V,
    softmax output + dropout mask + dropout output (unfused attention only; FlashAttention keeps
    the fp32 log-sum-exp instead), attention-projection input, MLP input, MLP activation input and
    output, and two dropout masks. Tensors outside the TP-sharded regions are replicated unless
    sequence parallelism shards them.
    """
    s, b, t, h = seq_len / cp, micro_batch, tp, model.hidden_size
    sbh = s * b * h
    replicated_divisor = t if sequence_parallel else 1
    if recompute is Recompute.FULL:
        return 2 * sbh / replicated_divisor
    heads = max(model.num_attention_heads / t, 1.0)
    kv_heads = max(model.num_key_value_heads / t, 1.0)
    d = model.head_dim
    masks = 2 * sbh if model.dropout else 0  # attention-output and MLP-output dropout masks (1 byte)
    replicated = 4 * sbh + 2 * sbh + 2 * sbh + masks  # two LN inputs, QKV input, MLP input
    sharded = 2 * s * b * d * (heads + 2 * kv_heads)  # Q, K, V
    sharded += 2 * s * b * d * heads  # attention-projection input
    ffn_local = model.ffn_hidden_size * model.moe_top_k / t
    sharded += s * b * ffn_local * (6 if model.activation == "swiglu" else 4)
    if recompute is Recompute.NONE:
        if attention == "unfused":
            score_bytes_per_element = 5 if model.dropout else 2  # softmax out (2) [+ mask (1) + dropout out (2)]
            sharded += score_bytes_per_element * heads * s * seq_len * b
        else:
            sharded += 4 * s * b * heads  # fp32 log-sum-exp
    return replicated / replicated_divisor + sharded


def activation_bytes(
    model: ModelSpec, kind: UnitKind, training: Training, config: ParallelConfig
) -> float:
    """Activation bytes of one unit per micro-batch on one TP and CP rank (Korthikanti §4.3 for the ends)."""
    s, b, t = training.seq_len / config.cp, config.micro_batch, config.tp
    sbh = s * b * model.hidden_size
    divisor = t if config.sequence_parallel else 1
    if kind is UnitKind.BLOCK:
        return block_activation_bytes(
            model, training.seq_len, b, t, config.sequence_parallel, config.recompute, training.attention, config.cp
        )
    if kind is UnitKind.EMBEDDING:
        return (sbh if model.dropout else 0) / divisor  # embedding-output dropout mask
    # head: final-norm input, output-layer input (2 bytes each), fp32 logits for the loss
    return (2 * sbh) / divisor + 2 * sbh / t + 4 * s * b * model.vocab_size / t


def recompute_working_bytes(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Extra activation bytes while one block is recomputed and back-propagated under full recompute:
    that block's activations for one micro-batch exist in full until its backward ends."""
    if config.recompute is not Recompute.FULL:
        return 0.0
    return block_activation_bytes(model, training.seq_len, config.micro_batch, config.tp, config.sequence_parallel,
                                  Recompute.NONE, training.attention, config.cp)


def in_flight_microbatches(config: ParallelConfig, pp_rank: int, num_microbatches: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, per model chunk, as the
    schedule's own order implies (GPipe: m; 1F1B: min(p − r, m), Narayanan et al. 2021;
    interleaved: Megatron-LM's warm-up count plus one over v chunks, Korthikanti's 1 + (p − 1)/(p·v)
    on rank 0)."""
    return schedule_of(config.schedule).in_flight(pp_rank, config.pp, config.vpp, num_microbatches)


# ---- what a GPU holds besides model states and activations ------------------------------------------
STACK_BYTES_PER_SM = 2048 * 1024
"""Local memory the driver reserves for thread stacks: cudaLimitStackSize (1 KiB default, CUDA Runtime API
cudaDeviceSetLimit) for each of the 2048 threads an SM can hold resident (sm_70/80/90, CUDA C++ Programming
Guide, compute capabilities table); the part of the CUDA context that grows with the GPU's SM count."""

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed ZeRO-1/2 flattens gradients into buckets of `reduce_bucket_size` elements before reducing them
(default 5e8, DeepSpeed configuration docs, zero_optimization.reduce_bucket_size). Megatron-LM's buckets
are views into its contiguous gradient buffer (megatron/core/distributed/param_and_grad_buffer.py), already
counted as gradients, so Megatron's DDP and distributed optimizer add none."""

ZERO3_GATHERED_UNITS = 2
"""Units whose full 16-bit weights exist at once under ZeRO-3 / FSDP: the one computing and the one
prefetched (PyTorch FSDP `limit_all_gathers`: "at most two in-flight all-gathers"; FSDP2 prefetches one
unit ahead)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU. `other` is what is neither a model state nor an activation kept for backward,
    term by term in `other_detail` (CUDA context, NCCL buffers, framework buffers, the largest transient,
    allocator fragmentation), so a reader can see where it comes from."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    capacity: float
    other_detail: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict[str, float]:
        return {
            "weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
            "activations": self.activations, "other": self.other, "total": self.total,
            "capacity": self.capacity,
        }


@dataclass(frozen=True)
class RankMemoryModel:
    """One pipeline rank's per-GPU memory as a linear function of what its stages hold:
    total = param_bytes · parameters + activation_factor · (activation bytes per micro-batch) + fixed_bytes.

    The single accounting of `estimate` and of the search. Model states cost `states` per parameter;
    activations are held for `in_flight` micro-batches. `buffers` are transient allocations that go
    through PyTorch's caching allocator (gathered ZeRO-3 units, gradient buckets, the largest transient);
    `allocator_fragmentation` of those and of the activations is reserved but unusable. `runtime` lies
    outside the allocator (CUDA context, NCCL buffers), so torch's max_memory_reserved does not show it
    while nvidia-smi does. Static states get no fragmentation: they are allocated once."""

    states: ModelStateBytes
    in_flight: float
    working_bytes: float
    buffers: tuple[tuple[str, float], ...]
    runtime: tuple[tuple[str, float], ...]
    fragmentation: float

    @property
    def param_bytes(self) -> float:
        return self.states.total

    @property
    def activation_factor(self) -> float:
        return (1 + self.fragmentation) * self.in_flight

    @property
    def fixed_bytes(self) -> float:
        transient = self.working_bytes + sum(value for _, value in self.buffers)
        return (1 + self.fragmentation) * transient + sum(value for _, value in self.runtime)

    def total(self, params: float, activations: float) -> float:
        return self.param_bytes * params + self.activation_factor * activations + self.fixed_bytes

    def breakdown(self, params: float, activations: float, capacity: float) -> MemoryBreakdown:
        """The named parts of `total(params, activations)` on a GPU of `capacity` bytes."""
        held = self.in_flight * activations + self.working_bytes
        detail = dict(self.runtime) | dict(self.buffers)
        detail["allocator_fragmentation"] = self.fragmentation * (held + sum(value for _, value in self.buffers))
        return MemoryBreakdown(self.states.weights * params, self.states.gradients * params,
                               self.states.optimizer * params, held, sum(detail.values()), capacity, detail)


def nccl_communicators(model: ModelSpec, config: ParallelConfig, pp_rank: int) -> int:
    """NCCL communicators that move data on a rank, each with its own buffers (NCCL allocates them per
    communicator, NVIDIA/nccl#864 and #986): TP, the pipeline's send/recv, DP (gradients, and ZeRO-3's
    gathers; HSDP's replicas another), context parallelism's KV exchange, and the tied-embedding group
    joining the first and last pipeline ranks."""
    tied_end = model.tie_embeddings and config.pp > 1 and pp_rank in (0, config.pp - 1)
    return sum((config.tp > 1, config.pp > 1, config.replicas > 1, config.hsdp_replicas > 1, config.cp > 1, tied_end))


def largest_transient_bytes(model: ModelSpec, training: Training, config: ParallelConfig, pp_rank: int) -> float:
    """The largest short-lived tensor beyond the stored activations (the loss and a block's attention
    backward do not overlap): on the rank with the head, the 16-bit logits alive next to their fp32 copy
    (Megatron-LM's vocab-parallel cross-entropy casts the logits to fp32; the fp32 ones are counted as
    activations); in a block, the gradient of the attention scores (unfused) or FlashAttention's fp32
    dQ accumulator."""
    s, b, t = training.seq_len / config.cp, config.micro_batch, config.tp
    heads = max(model.num_attention_heads / t, 1.0)
    per_token = 2 * heads * training.seq_len if training.attention == "unfused" else 4 * heads * model.head_dim
    attention = per_token * s * b
    loss = 2 * s * b * model.vocab_size / t if pp_rank == config.pp - 1 else 0.0
    return max(loss, attention)


def framework_buffer_bytes(model: ModelSpec, training: Training,
                           config: ParallelConfig) -> tuple[tuple[str, float], ...]:
    """Buffers the data-parallel engine allocates besides the model states: ZeRO-3 / FSDP's gathered
    units (`ZERO3_GATHERED_UNITS` of the largest unit's 16-bit weights plus its unsharded gradient
    before the reduce-scatter), DeepSpeed ZeRO-1/2's gradient bucket (at most the rank's gradients)."""
    if config.optimizer_sharding == 3 and config.reshard_after_forward and config.pp == 1:
        unit = max(unit.num_parameters for unit in model.units()) / config.tp
        return (("gathered_units", unit * (ZERO3_GATHERED_UNITS * PARAM_BYTES + training.grad_bytes)),)
    if config.zero_stage in (1, 2) and not config.distributed_optimizer and config.replicas > 1:
        elements = min(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, model.num_parameters / config.tp)
        return (("gradient_bucket", elements * training.grad_bytes),)
    return ()


def rank_memory_model(model: ModelSpec, training: Training, config: ParallelConfig, pp_rank: int,
                      num_microbatches: int, gpu: GPUSpec, calibration: Calibration) -> RankMemoryModel:
    """The memory accounting of pipeline rank `pp_rank` on `gpu` (constants: profiles/calibration.yaml)."""
    runtime = (
        ("cuda_context", calibration.cuda_context_bytes + gpu.sm_count * STACK_BYTES_PER_SM),
        ("nccl", nccl_communicators(model, config, pp_rank) * calibration.nccl_communicator_bytes),
    )
    buffers = (*framework_buffer_bytes(model, training, config),
               ("largest_transient", largest_transient_bytes(model, training, config, pp_rank)))
    return RankMemoryModel(
        states=sharded_state_bytes(config, training.grad_bytes),
        in_flight=in_flight_microbatches(config, pp_rank, num_microbatches),
        working_bytes=recompute_working_bytes(model, training, config),
        buffers=buffers, runtime=runtime, fragmentation=calibration.allocator_fragmentation,
    )
