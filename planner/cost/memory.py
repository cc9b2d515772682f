"""Per-GPU memory: model states (weights, gradients, optimizer states under ZeRO / the distributed
optimizer) and activations (Korthikanti et al. 2022, generalised to GQA, SwiGLU and MoE).

Activation bytes per transformer layer reproduce Korthikanti Table 2 exactly for a GPT-style block
(MHA, 4h GeLU MLP, dropout, unfused attention); see tests/test_memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.config import ParallelConfig, Recompute, Training
from planner.cost.schedule import schedule_of
from planner.model import ModelSpec, UnitKind

__all__ = [
    "ModelStateBytes",
    "RankMemoryModel",
    "activation_bytes",
    "block_activation_bytes",
    "in_flight_microbatches",
    "model_state_bytes",
    "rank_memory_model",
    "recompute_working_bytes",
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


def block_activation_bytes(
    model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
    recompute: Recompute, attention: str = "unfused",
) -> float:
    """Activation bytes one transformer layer keeps for backward, per micro-batch on one TP rank.

    Tensor by tensor (2 bytes each, masks 1 byte): layer-norm inputs, QKV input, Q, K, V,
    softmax output + dropout mask + dropout output (unfused attention only; FlashAttention keeps
    the fp32 log-sum-exp instead), attention-projection input, MLP input, MLP activation input and
    output, and two dropout masks. Tensors outside the TP-sharded regions are replicated unless
    sequence parallelism shards them.
    """
    s, b, t, h = seq_len, micro_batch, tp, model.hidden_size
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
            sharded += score_bytes_per_element * heads * s * s * b
        else:
            sharded += 4 * s * b * heads  # fp32 log-sum-exp
    return replicated / replicated_divisor + sharded


def activation_bytes(
    model: ModelSpec, kind: UnitKind, training: Training, config: ParallelConfig
) -> float:
    """Activation bytes of one unit per micro-batch on one TP rank (Korthikanti §4.3 for the ends)."""
    s, b, t = training.seq_len, config.micro_batch, config.tp
    sbh = s * b * model.hidden_size
    divisor = t if config.sequence_parallel else 1
    if kind is UnitKind.BLOCK:
        return block_activation_bytes(
            model, s, b, t, config.sequence_parallel, config.recompute, training.attention
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
                                  Recompute.NONE, training.attention)


def in_flight_microbatches(config: ParallelConfig, pp_rank: int, num_microbatches: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, per model chunk, as the
    schedule's own order implies (GPipe: m; 1F1B: min(p − r, m), Narayanan et al. 2021;
    interleaved: Megatron-LM's warm-up count plus one over v chunks, Korthikanti's 1 + (p − 1)/(p·v)
    on rank 0)."""
    return schedule_of(config.schedule).in_flight(pp_rank, config.pp, config.vpp, num_microbatches)


@dataclass(frozen=True)
class RankMemoryModel:
    """One pipeline rank's per-GPU memory as a linear function of what its stages hold:
    total = param_bytes · parameters + activation_factor · (activation bytes per micro-batch) + fixed_bytes.
    It is the accounting of `estimate` (model states and in-flight activations, plus the stated
    runtime overhead and fragmentation), in the form the stage partitioner needs."""

    param_bytes: float
    activation_factor: float
    fixed_bytes: float

    def total(self, params: float, activations: float) -> float:
        return self.param_bytes * params + self.activation_factor * activations + self.fixed_bytes


def rank_memory_model(model: ModelSpec, training: Training, config: ParallelConfig, pp_rank: int,
                      num_microbatches: int, overhead_bytes: float, fragmentation: float) -> RankMemoryModel:
    """The linear memory form of pipeline rank `pp_rank` (overhead and fragmentation from calibration)."""
    scale = 1 + fragmentation
    states = model_state_bytes(1.0, config.dp, config.optimizer_sharding, training.grad_bytes).total
    return RankMemoryModel(
        param_bytes=scale * states,
        activation_factor=scale * in_flight_microbatches(config, pp_rank, num_microbatches),
        fixed_bytes=overhead_bytes + scale * recompute_working_bytes(model, training, config),
    )
