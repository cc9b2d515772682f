"""Per-GPU memory: model states (weights, gradients, optimizer states under ZeRO / the distributed
optimizer), activations (Korthikanti et al. 2022, generalised to GQA, SwiGLU and MoE), and the named
runtime terms around them (CUDA context, NCCL buffers, framework buffers, the largest transient,
allocator fragmentation of transient allocations), each with its source.

Activation bytes per transformer layer reproduce Korthikanti Table 2 exactly for a GPT-style block
(MHA, 4h GeLU MLP, dropout, unfused attention); see tests/test_memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache, cached_property

from planner.config import ParallelConfig, Recompute, Training, recomputes_pre_mlp_norm
from planner.cost.schedule import schedule_of
from planner.finetune import (
    ADAM_STATE_BYTES,
    FP8_PARAM_BYTES,
    PARAM_BYTES,
    ParameterStates,
    adapter_linears,
    parameter_states,
)
from planner.gpu import GPUSpec
from planner.model import BlockSpec, ModelSpec, UnitKind
from planner.profile.calibration import Calibration

__all__ = [
    "BF16_REDUCE_COPY_BYTES",
    "LOSS_BYTES_PER_LOGIT",
    "LossBytes",
    "MemoryBreakdown",
    "ModelStateBytes",
    "RankMemoryModel",
    "SavedTensor",
    "activation_bytes",
    "attention_tensors",
    "block_activation_bytes",
    "block_type_activation_bytes",
    "fp8_weight_copy_bytes",
    "framework_buffer_bytes",
    "in_flight_microbatches",
    "largest_transient_bytes",
    "logit_elements",
    "megatron_saved_tensors",
    "mlp_tensors",
    "model_state_bytes",
    "nccl_communicators",
    "normed_input_tensors",
    "offloaded_activation_bytes",
    "op_sac_applies",
    "op_sac_kept_matmuls",
    "optimizer_held_gradient_bytes",
    "parameter_model_states",
    "rank_memory_model",
    "recompute_module_bytes",
    "recompute_working_bytes",
    "sharded_state_bytes",
    "step_segment_bytes",
]


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model state held by one GPU; `frozen_weights` is the part of `weights` that is frozen base weights
    (fine-tuning), the rest are trainable weights."""

    weights: float
    gradients: float
    optimizer: float
    frozen_weights: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    num_params: float, dp: int, sharding: int, grad_bytes: int = 4, optimizer_bytes: float = ADAM_STATE_BYTES,
    param_bytes: int = PARAM_BYTES, trainable: float = 1.0, frozen_bytes: float = 0.0,
) -> ModelStateBytes:
    """Model states for `num_params` parameters replicated over `dp` ranks.

    `sharding` is the ZeRO stage (the distributed optimizer counts as 1): 1 shards optimizer
    states, 2 also gradients, 3 also weights (Rajbhandari et al. 2020, §5). With fp16 weights,
    fp16 gradients and K = 12 this is ZeRO's Table 1; with fp32 gradients it is Megatron-LM's
    18 bytes/param (6 + 12/d with the distributed optimizer). Fine-tuning (planner.finetune): only a
    `trainable` fraction of the parameters has a 16-bit weight, a gradient and optimizer states; the frozen base
    adds `frozen_bytes` per parameter of weights (sharded with the weights under ZeRO-3).
    """
    return ModelStateBytes(
        weights=num_params * (frozen_bytes + trainable * param_bytes) / (dp if sharding >= 3 else 1),
        gradients=num_params * trainable * grad_bytes / (dp if sharding >= 2 else 1),
        optimizer=num_params * trainable * optimizer_bytes / (dp if sharding >= 1 else 1),
        frozen_weights=num_params * frozen_bytes / (dp if sharding >= 3 else 1),
    )


_FULL_ADAM = ParameterStates(1.0, 0.0, ADAM_STATE_BYTES)  # full training, Adam on the GPU: the default accounting


def parameter_model_states(num_params: float, dp: int, sharding: int, grad_bytes: int,
                           states: ParameterStates | None = None) -> ModelStateBytes:
    """`model_state_bytes` of `num_params` parameters under a fine-tuning accounting (None: full training)."""
    s = states or _FULL_ADAM
    return model_state_bytes(num_params, dp, sharding, grad_bytes, s.optimizer_bytes, trainable=s.trainable,
                             frozen_bytes=s.frozen_bytes)


def sharded_state_bytes(config: ParallelConfig, grad_bytes: int,
                        states: ParameterStates | None = None) -> ModelStateBytes:
    """Model states per parameter under the configuration's sharding over its shard group. Under a pipeline
    schedule PyTorch's pipeline stages turn FSDP's gradient sync and resharding after backward off until the
    last micro-batch's backward: gradients stay unsharded, and every unit's 16-bit weights stay gathered from
    its first backward on (a forward's reshard is undone by the next backward). Without pipelining and without
    `reshard_after_forward` the gathered weights stay from forward to backward (no gather buffer extra). Gradients
    include what the optimizer wrapper keeps besides (`optimizer_held_gradient_bytes`)."""
    return _sharded_state_bytes(config.shard_group, config.optimizer_sharding, config.pp > 1,
                                bool(config.reshard_after_forward), grad_bytes, states,
                                optimizer_held_gradient_bytes(config, states))


@cache
def _sharded_state_bytes(shard_group: int, sharding: int, pipelined: bool, reshard_after_forward: bool,
                         grad_bytes: int, states: ParameterStates | None, held_gradients: float) -> ModelStateBytes:
    """`sharded_state_bytes` of the few configuration fields it reads (the search asks per configuration);
    `held_gradients`: unsharded gradient bytes per parameter the optimizer wrapper keeps besides."""
    whole = parameter_model_states(1.0, 1, 0, grad_bytes, states)
    sharded = parameter_model_states(1.0, shard_group, sharding, grad_bytes, states)
    if pipelined and sharding >= 2:
        kept = ModelStateBytes(whole.weights, whole.gradients, sharded.optimizer, whole.frozen_weights)
    elif sharding == 3 and not reshard_after_forward:
        kept = ModelStateBytes(whole.weights, sharded.gradients, sharded.optimizer, whole.frozen_weights)
    else:
        kept = sharded
    return replace(kept, gradients=kept.gradients + held_gradients)


BF16_OPTIMIZER_LP_GRAD_BYTES = 2
"""Bytes per trainable parameter of the 16-bit gradients DeepSpeed's BF16_Optimizer keeps besides its fp32
accumulation buffer (deepspeed/runtime/bf16_optimizer.py, olruwase/bf16-updates 819abe2a7 of 2022-02-24 through
v0.6.2's #1801): autograd writes each bf16 `.grad`, `update_hp_grads(clear_lp_grads=False)` adds it into the full,
unsharded fp32 buffer and leaves it, and `clear_lp_grads` frees it only when the next backward starts (pipe/engine.py
`_exec_backward_pass`), so a full set is alive while the next micro-batches' activations are."""


def optimizer_held_gradient_bytes(config: ParallelConfig, states: ParameterStates | None = None) -> float:
    """Unsharded gradient bytes per parameter an optimizer wrapper keeps besides the accumulated gradients
    (`Training.grad_bytes`): `BF16_OPTIMIZER_LP_GRAD_BYTES` per trainable parameter under DeepSpeed's BF16_Optimizer,
    none elsewhere."""
    trainable = (states or _FULL_ADAM).trainable
    return BF16_OPTIMIZER_LP_GRAD_BYTES * trainable if config.deepspeed_optimizer == "bf16" else 0.0


def block_activation_bytes(
    model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
    recompute: Recompute, attention: str = "unfused", cp: int = 1,
) -> float:
    """Activation bytes the mean block keeps for backward, per micro-batch on one TP rank and one of `cp`
    context-parallel ranks: `block_type_activation_bytes` averaged over the model's blocks (the one rule),
    for callers that state a shape rather than a configuration (sequence parallelism means nothing at tp = 1)."""
    training = Training(seq_len=seq_len, attention=attention)
    config = ParallelConfig(dp=1, tp=tp, pp=1, cp=cp, micro_batch=micro_batch,
                            sequence_parallel=sequence_parallel and tp > 1, recompute=recompute)
    return sum(count * block_type_activation_bytes(model, block, training, config)
               for block, count in model.block_types().items()) / model.num_layers


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
        # the embedding-output dropout mask (1 byte) and the embedding norm's 16-bit input (2 bytes)
        return ((sbh if model.dropout else 0) + (2 * sbh if model.embedding_norm else 0)) / divisor
    # head: final-norm input, output-layer input (2 bytes each; a column-parallel linear's, `column_input_shards`),
    # what the loss keeps of the logits, over the tokens it reads
    read = model.head_tokens(s) * b * model.hidden_size
    return (2 * read) / divisor + 2 * read / config.column_input_shards() + LOSS_BYTES_PER_LOGIT[
        training.cross_entropy].kept * logit_elements(model, training, config)


@dataclass(frozen=True)
class LossBytes:
    """Bytes per logit (one token's score for one vocabulary entry on this rank) the loss keeps for its backward,
    and the most it holds besides at one time (forward or backward)."""

    kept: int
    transient: int


LOSS_BYTES_PER_LOGIT = {
    "fused": LossBytes(kept=4, transient=2),
    "eager": LossBytes(kept=4, transient=8),
    "compiled": LossBytes(kept=2, transient=2),
}
"""What the loss holds per logit, by `Training.cross_entropy`. "fused": Megatron-LM's vocab-parallel cross-entropy
(megatron/core/tensor_parallel/cross_entropy.py) casts the logits to fp32, turns that copy into the softmax in place
(`torch.exp(out=)`, `div_`) and saves it (4 bytes); its backward writes the gradient into the saved softmax; the
16-bit logits (2) are alive next to the fp32 copy. "eager": PyTorch's `F.cross_entropy(logits.float())`
(torchtitan's loss_fn, train.py @9dec370) is log_softmax then nll_loss: log_softmax saves its fp32 output (4;
tools/autograd/derivatives.yaml, `_log_softmax_backward_data(grad, result, ...)`), and the backward holds besides
nll_loss's dense fp32 gradient and log_softmax's fp32 gradient at once (8; the forward's 16-bit logits and fp32 copy,
6, are less). torchtitan measured what this costs: chunking that loss 8 ways cut Llama-3-8B's peak by 7.3 GiB
(pytorch/torchtitan e23bb707d, #996). "compiled": torch.compile fuses the cast, log-softmax and NLL into reductions
over the 16-bit logits, which it saves (2; the per-token log-sum-exp is negligible), and its backward writes the
16-bit gradient (2) in one kernel."""


def logit_elements(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Logits per micro-batch on one TP and CP rank: the tokens the head reads times its vocabulary shard."""
    return model.head_tokens(training.seq_len / config.cp) * config.micro_batch * model.vocab_size / config.tp


def op_sac_applies(block: BlockSpec, config: ParallelConfig) -> bool:
    """Whether `block` is recomputed by torchtitan's per-op policy (`selective_recompute` "op"): blocks of the
    Llama family (`BlockSpec.separate_matmuls`); other blocks keep the attention policy's accounting."""
    return (config.recompute is Recompute.SELECTIVE and config.selective_recompute == "op"
            and block.separate_matmuls() is not None)


def op_sac_kept_matmuls(block: BlockSpec) -> tuple[tuple[int, int, bool], ...]:
    """The matrix multiplies whose outputs torchtitan's per-op policy keeps: the 1st, 3rd, … of the block."""
    return block.separate_matmuls()[::2]


FP8_SAVED_INPUT_BYTES = 1
"""Bytes per element of a linear layer's input that Transformer Engine keeps for the weight-gradient GEMM when the
layer runs in FP8: the quantized copy it made for the forward GEMM (te.pytorch Linear, LayerNormLinear and
GroupedLinear save the FP8 input, for MXFP8 its column-wise copy, not the BF16 tensor; Micikevicius et al. 2022,
"FP8 formats for deep learning", §4, store activations for backward in FP8); torchao's Float8Linear keeps the BF16
input instead and casts it again in backward (Training.fp8_saved_input "bf16"). Scaling factors (MXFP8: one byte
per 32 elements; per-tensor: one float) are not counted. Tensors that a BF16 operation also needs keep their
16-bit copy besides: a norm's input, the attention output the fused attention backward reads, the MoE router's
input, the gated activation's input."""


def block_type_activation_bytes(model: ModelSpec, block: BlockSpec, training: Training,
                                config: ParallelConfig) -> float:
    """Activation bytes one block of type `block` keeps for backward, per micro-batch on one TP and CP rank (each
    CP rank keeps its seq_len / cp tokens; unfused scores span all keys), tensor by tensor (2 bytes each, masks 1
    byte; Korthikanti Table 2 for a GPT block), sub-layer by sub-layer at the block's own shapes (a block with its own
    token count, e.g. a vision encoder's, holds its tokens whole on every CP rank). Tensors outside the TP-sharded
    regions are replicated unless sequence parallelism shards them. Per sub-layer: the norm
    input and the sub-layer input (2 bytes each, replicated unless SP) and a dropout mask. Attention: Q, K
    (heads × query/key head width) and V, the projection's input, MLA's query and KV latents (kept whole on
    every rank, as their down projections are), and the scores (unfused; a window is masked, not skipped) or
    the fp32 log-sum-exp. MLP: the activation's inputs and output over the top-k routed copies and the
    shared experts. Mamba-2: the conv input and output (x, B, C), the gate z, dt and its fp32 cumulative decay,
    the scan output and the out_proj input. Further linears keep their inputs; an MTP block also keeps what
    the head keeps (`activation_bytes` of the head). In FP8 training the linear layers' saved inputs take
    `FP8_SAVED_INPUT_BYTES`: the normed input of a sub-layer whose first linear is FP8 (not an MoE sub-layer's,
    which the BF16 router keeps), the routed copies, the second MLP matrix's input; the attention output keeps
    its 16-bit copy for the fused attention backward (unless that is recomputed) and adds the projection's FP8 one.
    Under selective recompute the tensors Megatron-Core's `recompute_modules` discard are not kept
    (`megatron_saved_tensors`); under torchtitan's per-op policy the block keeps its input, the kept matrix
    multiplies' outputs and, where it keeps it (`ParallelConfig.sac_keeps_attention`), the attention output and LSE."""
    seq_len, cp = (block.tokens, 1) if block.tokens is not None else (training.seq_len, config.cp)
    s, b, t, h = seq_len / cp, config.micro_batch, config.tp, block.hidden_size
    sbh, divisor = s * b * h, (t if config.sequence_parallel else 1)
    head = activation_bytes(model, UnitKind.HEAD, training, config) if block.output_head else 0.0
    if config.recompute is Recompute.FULL:
        return 2 * sbh / divisor + head
    if op_sac_applies(block, config):  # the block's input, the kept matmul outputs, the attention output and LSE
        a = block.attention
        kept = sum(2 * s * b * (width if row_parallel else width / t)
                   for _, width, row_parallel in op_sac_kept_matmuls(block))
        attention = s * b * (2 * a.value_width + 4 * a.num_attention_heads) / t if config.sac_keeps_attention else 0.0
        return 2 * sbh / divisor + kept + attention + head
    saved = _saved_input_bytes(training, t)
    replicated = block.sublayers * (2 * sbh + (sbh if block.dropout else 0))  # each norm's input, dropout masks
    replicated += sum(saved * s * b * k for k, _, _ in block.linears)
    sharded = 0.0
    if block.attention is not None:  # the projection's input and MLA's latents
        a = block.attention
        sharded += saved * s * b * max(a.num_attention_heads / t, 1.0) * a.value_head_dim
        if a.is_mla:
            sharded += 2 * s * b * ((a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim)
    if block.mamba is not None:
        mamba = block.mamba
        sharded += s * b * (2 * 2 * mamba.conv_channels + 3 * 2 * mamba.inner_size + 8 * mamba.num_heads) / t
    if training.finetune != "full":  # each adapter a token runs through keeps x·A (r wide, 16-bit) for B's wgrad
        sharded += 2 * s * b * training.lora_rank * sum(
            copies for _, _, copies in adapter_linears(block, training.lora_targets, active=True)) / t
    modules = config.selective_modules
    kept = sum(tensor.bytes for tensor in megatron_saved_tensors(block, training, config)
               if not tensor.freed_by & modules)
    return replicated / divisor + sharded + kept + head


def _saved_input_bytes(training: Training, tp: int) -> int:
    """Bytes per element of an input a linear layer keeps for its weight gradient at TP degree `tp`
    (`FP8_SAVED_INPUT_BYTES` where it keeps the FP8 copy, `Training.keeps_fp8_inputs`)."""
    return FP8_SAVED_INPUT_BYTES if training.keeps_fp8_inputs(tp) else 2


@dataclass(frozen=True)
class SavedTensor:
    """Bytes one block keeps of a tensor for backward per micro-batch on one rank, and the Megatron-Core recompute
    modules (config.RECOMPUTE_MODULES) any one of which discards it and recomputes it in the backward."""

    bytes: float
    freed_by: frozenset[str] = frozenset()


def _tensor(num_bytes: float, *freed_by: str) -> SavedTensor:
    return SavedTensor(num_bytes, frozenset(freed_by))


def megatron_saved_tensors(block: BlockSpec, training: Training, config: ParallelConfig) -> tuple[SavedTensor, ...]:
    """The tensors of `block_type_activation_bytes` that some Megatron-Core recompute module can discard (a module
    not listed by any keeps nothing apart), at the block's per-rank shapes."""
    seq_len, cp = (block.tokens, 1) if block.tokens is not None else (training.seq_len, config.cp)
    s, b, t = seq_len / cp, config.micro_batch, config.tp
    tokens, sbh = s * b, s * b * block.hidden_size / (t if config.sequence_parallel else 1)
    linear_input = s * b * block.hidden_size / config.column_input_shards()
    return (*normed_input_tensors(block, training, sbh, linear_input, t, config.moe_dispatcher),
            *attention_tensors(block, training, tokens, t, seq_len),
            *mlp_tensors(block, training, tokens, t, config.ep))


def normed_input_tensors(block: BlockSpec, training: Training, sbh: float, linear_input: float,
                         tp: int, dispatcher: str) -> tuple[SavedTensor, ...]:
    """Each sub-layer's norm output as it is kept (`sbh`: one hidden-wide 16-bit-less tensor's elements on this
    rank; `linear_input`: the same tensor as a column-parallel linear keeps it, `ParallelConfig.column_input_shards`).
    Attention and a dense MLP fuse their norm into the first linear (Transformer Engine's
    LayerNormLinear keeps its normed output for the wgrad; DTensor's colwise linears keep the gathered one); MLA's
    input norm and an MoE layer's pre-MLP norm are modules of their
    own (gpt_layer_specs.py: `backend.layer_norm()`), whose output the down projections, or the router and the
    dispatcher, read in 16 bits (and the shared experts keep their FP8 copy in FP8 training). The `layernorm`
    module discards the outputs of the norms of their own (transformer_layer.py: CheckpointWithoutOutput around
    input_layernorm / pre_mlp_layernorm, skipped for fused ones); `mlp` discards the dense MLP's, since its
    checkpoint keeps only the MLP's input, the residual stream; `moe` keeps its input, the norm's output. Under a
    moe_router CUDA graph the pre-MLP norm's output stays unless `recomputes_pre_mlp_norm` (`dispatcher`: the
    token dispatcher)."""
    saved = _saved_input_bytes(training, tp)
    tensors = []
    if block.attention is not None or block.mamba is not None:
        separate = block.attention is not None and block.attention.is_mla
        tensors.append(_tensor(saved * (sbh if separate else linear_input), *(("layernorm",) if separate else ())))
    if block.mlp is not None and block.mlp.is_moe:
        pre_mlp_norm = recomputes_pre_mlp_norm(training.cuda_graph_modules, dispatcher)
        tensors.append(_tensor(2 * sbh, *(("layernorm",) if pre_mlp_norm else ())))
        if training.dtype == "fp8" and block.mlp.shared_expert_ffn_hidden_size:
            tensors.append(_tensor(saved * sbh, "layernorm", "moe", "shared_experts"))
    elif block.mlp is not None:
        tensors.append(_tensor(saved * linear_input, "mlp"))
    return tuple(tensors)


def attention_tensors(block: BlockSpec, training: Training, tokens: float, tp: int,
                      seq_len: float) -> tuple[SavedTensor, ...]:
    """The attention core's inputs Q, K, V (heads × query/key and value width; MLA's are its up projections'
    outputs after RoPE, which `mla_up_proj` discards: multi_latent_attention.py's qkv_up_checkpoint) and what the
    core keeps of its own, which `core_attn` discards (Korthikanti's selective recompute): the unfused scores,
    softmax and dropout mask, or FlashAttention's fp32 log-sum-exp, and in FP8 the 16-bit output the fused
    backward reads besides the projection's FP8 copy of it."""
    a = block.attention
    if a is None:
        return ()
    heads, kv_heads = max(a.num_attention_heads / tp, 1.0), max(a.num_key_value_heads / tp, 1.0)
    qkv = 2 * tokens * (heads * a.qk_head_dim + kv_heads * (a.qk_head_dim + a.value_head_dim))
    if training.attention == "unfused":
        core = (5 if block.dropout else 2) * heads * tokens * seq_len
    else:
        core = 4 * tokens * heads + (2 * tokens * heads * a.value_head_dim if training.dtype == "fp8" else 0.0)
    return _tensor(qkv, *(("mla_up_proj",) if a.is_mla else ())), _tensor(core, "core_attn")


def mlp_tensors(block: BlockSpec, training: Training, tokens: float, tp: int, ep: int) -> tuple[SavedTensor, ...]:
    """What the MLP keeps on this rank: the first matrix's output (the activation's input; gated: both halves) and
    the activation's output (the second matrix's input). Dense: `mlp` discards both (transformer_layer.py
    checkpoints the whole MLP). MoE, over the top-k routed copies of each token: `moe` discards the whole layer's
    internals (moe_layer.py checkpoints router, dispatch, experts and combine, keeping the layer's input): the
    routed copies the dispatcher hands the experts, both expert tensors, the shared experts'; `moe_act` only the
    routed experts' activation output (experts.py: CheckpointWithoutOutput around the activation, whose input, the
    first matrix's output, stays) and, with a clamp (GPT-OSS), the clamped copy of that input the fused activation
    keeps (fused_bias_geglu.py's weighted_bias_quick_geglu_impl saves the concatenated clamps, beside the first
    matrix's output the clamps keep); `shared_experts` the shared experts' two (shared_experts.py checkpoints them).
    The routed tensors are the busiest of the `ep` expert-parallel ranks': a dropless dispatcher hands it
    `Training.expert_rank_load` times the mean routed tokens (the load its expert GEMMs are timed at), and that rank
    runs out of memory first."""
    mlp = block.mlp
    if mlp is None:
        return ()
    saved = _saved_input_bytes(training, tp)
    first = 4 if mlp.gated else 2
    if not mlp.is_moe:
        return (_tensor(tokens * mlp.ffn_hidden_size / tp * (first + saved), "mlp"),)
    routed_tokens = tokens * mlp.moe_top_k * training.expert_rank_load(ep)
    routed = routed_tokens * mlp.ffn_hidden_size / tp
    shared = tokens * (mlp.shared_expert_ffn_hidden_size or 0) / tp
    clamped = first * routed if mlp.activation_clamp is not None else 0.0
    return (_tensor(saved * routed_tokens * block.hidden_size / tp, "moe"),
            _tensor(first * routed, "moe"), _tensor(saved * routed + clamped, "moe", "moe_act"),
            _tensor((first + saved) * shared, "moe", "shared_experts"))


def recompute_module_bytes(block: BlockSpec, training: Training, config: ParallelConfig, module: str) -> float:
    """Activation bytes per micro-batch one block of type `block` no longer keeps when Megatron-Core recomputes
    `module` (one of config.RECOMPUTE_MODULES): what `--recompute-modules <module>` saves on its own."""
    return sum(tensor.bytes for tensor in megatron_saved_tensors(block, training, config) if module in tensor.freed_by)


def recompute_working_bytes(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Extra activation bytes while one block is recomputed and back-propagated, the largest block type's: under
    full recompute that block's activations for one micro-batch exist in full until its backward ends; under
    torchtitan's per-op policy, what it recomputes (the whole block's less what it kept); under Megatron-Core's
    modules, what they discard other than the attention core's (recomputed inside the attention's own backward)."""
    full = config.recompute is Recompute.FULL
    if config.recompute is Recompute.SELECTIVE and config.selective_recompute != "op":
        rerun = config.selective_modules - {"core_attn"}
        return max((sum(tensor.bytes for tensor in megatron_saved_tensors(block, training, config)
                        if tensor.freed_by & rerun) for block in model.block_types()), default=0.0)
    if not full and config.recompute is not Recompute.SELECTIVE:
        return 0.0
    whole = replace(config, recompute=Recompute.NONE)
    return max(block_type_activation_bytes(model, block, training, whole)
               - (0.0 if full else block_type_activation_bytes(model, block, training, config))
               for block in model.block_types())


def offloaded_activation_bytes(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Activation bytes per micro-batch in host memory at the peak under CPU offloading
    (`ParallelConfig.cpu_offload_layers` N, pp 1), as `RankMemoryModel` counts the peak: every kept block with the
    head's activations and the loss's transient. Megatron-Core hands Transformer Engine's offload handler the first
    N blocks (transformer_block.py; te.pytorch.cpu_offload AsyncDoubleBufferGroupOffloadHandler, v2.8), which copies
    each to the host while the blocks of its window run and frees it at the window's end; the last window ends with
    the last block, so the GPU holds at most one of them while the later blocks run forward, and none when the loss
    runs. The peak is the larger of the two moments, one offloaded block resident without the loss's tensors or all
    N on the host with them: N blocks less what the resident one holds beyond the loss's (nothing where the loss
    holds more, as a large vocabulary's logits do). They come back one at a time in the backward, as the later
    blocks' activations go."""
    if not config.cpu_offload_layers:
        return 0.0
    first = [block_type_activation_bytes(model, block, training, config)
             for block in model.blocks[:config.cpu_offload_layers]]
    loss = (activation_bytes(model, UnitKind.HEAD, training, config)
            + largest_transient_bytes(model, training, config, config.stage_ranks[-1]))
    return sum(first) - max(max(first) - loss, 0.0)


def in_flight_microbatches(config: ParallelConfig, pp_rank: int, num_microbatches: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, per model chunk, as the
    schedule's own order implies (GPipe: m; 1F1B: min(p − r, m), Narayanan et al. 2021;
    interleaved: Megatron-LM's warm-up count plus one over v chunks, Korthikanti's 1 + (p − 1)/(p·v)
    on rank 0)."""
    return config.pipeline_schedule.in_flight(pp_rank, config.pp, config.vpp, num_microbatches)


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

ZERO3_PREFETCH_BUCKET_ELEMENTS = 50_000_000
"""Parameters DeepSpeed's per-tensor ZeRO-3 (v0.3–0.5.10) gathers ahead of the submodule computing
(`stage3_prefetch_bucket_size`, default 5e7 in deepspeed/runtime/zero/constants.py of those versions)."""

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
    frozen_weights: float = 0.0  # the frozen base weights inside `weights` (fine-tuning); the rest train
    outside_allocator: float = 0.0  # the part of `other` PyTorch's caching allocator does not hand out
    step_segments: float = 0.0  # segments the optimizer step maps after the peak (`step_segment_bytes`), not in total
    offloaded: float = 0.0  # activations in host memory at the peak (`offloaded_activation_bytes`), not held here
    step_phase: float = 0.0  # live while the optimizer step runs (`RankMemoryModel.step_phase`); 0: never above total
    fp8_weight_copies: float = 0.0  # inside `weights`: the FP8 linears' weight copies (`fp8_weight_copy_bytes`)

    @property
    def total(self) -> float:
        """Bytes live at the backward's peak: the model states, the activations held and the other buffers."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def required(self) -> float:
        """Bytes that must fit at once: the backward's peak or, where more, the optimizer step's live set."""
        return max(self.total, self.step_phase)

    @property
    def device_peak(self) -> float:
        """What nvidia-smi shows at the high-water mark: the total and the segments the optimizer step mapped on top."""
        return self.total + self.step_segments

    @property
    def reserved(self) -> float:
        """What the caching allocator holds at its high-water mark, `torch.cuda.max_memory_reserved()`'s figure
        (torchtitan logs it as "memory: X GiB"): the device's less the CUDA context and NCCL buffers."""
        return self.device_peak - self.outside_allocator

    @property
    def fits(self) -> bool:
        return self.required <= self.capacity

    def as_dict(self) -> dict[str, float]:
        """The plan file's `memory_bytes`; `optimizer_step` only where the step's live set exceeds the total,
        `fp8_weight_copies` (inside `weights`) only where there are any."""
        inside_weights = {name: value for name, value in (("frozen_weights", self.frozen_weights),
                                                          ("fp8_weight_copies", self.fp8_weight_copies)) if value}
        step = {"optimizer_step": self.step_phase} if self.step_phase > self.total else {}
        return {
            "weights": self.weights, **inside_weights, "gradients": self.gradients, "optimizer": self.optimizer,
            "activations": self.activations, "other": self.other, "total": self.total, **step,
            "capacity": self.capacity,
        }


@dataclass(frozen=True)
class RankMemoryModel:
    """One pipeline rank's per-GPU memory as a linear function of what its stages hold:
    total = param_bytes · parameters + fp8_copy_bytes · (parameters in FP8 linears)
            + activation_factor · (activation bytes per micro-batch) + fixed_bytes.

    The single accounting of `estimate` and of the search. Model states cost `states` per parameter;
    activations are held for `in_flight` micro-batches, the head's on the rank that holds it for `head_in_flight`
    (`PipelineSchedule.head_in_flight`; None: `in_flight`). `buffers` are transient allocations that go
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
    step_segments: float = 0.0  # per parameter (`step_segment_bytes`): the reserved high-water's, not the total's
    head_in_flight: float | None = None
    offloaded_bytes: float = 0.0  # activations in host memory at the peak (`offloaded_activation_bytes`)
    fp8_copy_bytes: float = 0.0  # per parameter of an FP8 linear (`fp8_weight_copy_bytes`)

    @property
    def param_bytes(self) -> float:
        return self.states.total

    def state_bytes(self, params: float, linear_params: float = 0.0) -> float:
        """Bytes of the model states of `params` parameters, `linear_params` of them in FP8 linears' weights
        (`UnitCost.linear_params`), with those weights' FP8 copies."""
        return self.param_bytes * params + self.fp8_copy_bytes * linear_params

    @property
    def activation_factor(self) -> float:
        return (1 + self.fragmentation) * self.in_flight

    @property
    def head_micro_batches(self) -> float:
        """Micro-batches whose head activations the rank holds (`head_in_flight`, else `in_flight`)."""
        return self.in_flight if self.head_in_flight is None else self.head_in_flight

    @property
    def head_activation_factor(self) -> float:
        """Bytes held per byte of the head's activations per micro-batch."""
        return (1 + self.fragmentation) * self.head_micro_batches

    @cached_property
    def fixed_bytes(self) -> float:
        transient = self.working_bytes - self.offloaded_bytes + sum(value for _, value in self.buffers)
        return (1 + self.fragmentation) * transient + sum(value for _, value in self.runtime)

    def total(self, params: float, activations: float, in_flight: float | None = None,
              head_activations: float = 0.0, linear_params: float = 0.0) -> float:
        """Bytes for `params` parameters (`linear_params` of them in FP8 linears), `activations` activation bytes
        per micro-batch and the head's `head_activations`; `in_flight`: another rank's in-flight micro-batches (ranks
        of one kind differ only there)."""
        factor = self.activation_factor if in_flight is None else (1 + self.fragmentation) * in_flight
        return (self.state_bytes(params, linear_params) + factor * activations
                + self.head_activation_factor * head_activations + self.fixed_bytes)

    def step_phase(self, params: float, linear_params: float = 0.0) -> float:
        """Bytes live while the optimizer step runs on `params` parameters: the model states, the copies the step
        makes (`step_segment_bytes`) and what lies outside the allocator. The activations, gathered units, gradient
        buckets and the largest transient are freed by then (DeepSpeed releases its reduce bucket in the epilogue
        after the flush), so this exceeds the backward's peak only where those copies outweigh them, as under
        DeepSpeed's BF16_Optimizer, whose bf16 gradients stay beside its fp32 ones while the reduction copies the
        latter to bf16. Under ZeRO-1 the 16-bit gradients are freed before the step's flat copies are made, so the sum
        overstates that phase by at most those copies (6 bytes per parameter over the shard group)."""
        return (self.state_bytes(params, linear_params) + self.step_segments * params
                + sum(value for _, value in self.runtime))

    def breakdown(self, params: float, activations: float, capacity: float,
                  head_activations: float = 0.0, linear_params: float = 0.0) -> MemoryBreakdown:
        """The named parts of `total(params, activations, head_activations=…, linear_params=…)` on a GPU of
        `capacity` bytes; the FP8 linears' weight copies count with the weights."""
        held = (self.in_flight * activations + self.head_micro_batches * head_activations + self.working_bytes
                - self.offloaded_bytes)
        detail = dict(self.runtime) | dict(self.buffers)
        detail["allocator_fragmentation"] = self.fragmentation * (held + sum(value for _, value in self.buffers))
        copies = self.fp8_copy_bytes * linear_params
        return MemoryBreakdown(self.states.weights * params + copies, self.states.gradients * params,
                               self.states.optimizer * params, held, sum(detail.values()), capacity, detail,
                               self.states.frozen_weights * params, sum(value for _, value in self.runtime),
                               self.step_segments * params, self.offloaded_bytes,
                               self.step_phase(params, linear_params), copies)


def nccl_communicators(model: ModelSpec, config: ParallelConfig, pp_rank: int) -> int:
    """NCCL communicators that move data on a rank, each with its own buffers (NCCL allocates them per
    communicator, NVIDIA/nccl#864 and #986): TP, the pipeline's send/recv, DP (gradients, and ZeRO-3's
    gathers; HSDP's replicas another), context parallelism's KV exchange, and the tied-embedding group
    joining the ranks of the first and the last stage (none where one rank holds both)."""
    tied_end = False
    if model.tie_embeddings and config.pp > 1:
        first, last = config.stage_ranks[0], config.stage_ranks[-1]
        tied_end = first != last and pp_rank in (first, last)
    return sum((config.tp > 1, config.pp > 1, config.replicas > 1, config.hsdp_replicas > 1, config.cp > 1, tied_end))


def largest_transient_bytes(model: ModelSpec, training: Training, config: ParallelConfig, pp_rank: int) -> float:
    """The largest short-lived tensors beyond the stored activations (the loss and a block's attention
    backward do not overlap): on the rank with the head, what the loss holds besides what it keeps
    (`LOSS_BYTES_PER_LOGIT`: for Megatron-LM's fused kernel the 16-bit logits next to their fp32 copy; for eager
    PyTorch's the two fp32 gradients of its backward); in a block, the gradient of the attention scores (unfused)
    or FlashAttention's fp32 dQ accumulator. Under local learning every rank has a loss (its auxiliary head's)."""
    s, b, t = training.seq_len / config.cp, config.micro_batch, config.tp
    heads = max(model.num_attention_heads / t, 1.0)
    per_token = 2 * heads * training.seq_len if training.attention == "unfused" else 4 * heads * model.head_dim
    attention = per_token * s * b
    has_loss = pp_rank == config.stage_ranks[-1] or schedule_of(config.schedule).local_losses
    loss = (LOSS_BYTES_PER_LOGIT[training.cross_entropy].transient * logit_elements(model, training, config)
            if has_loss else 0.0)
    return max(loss, attention)


@cache
def _parameter_counts(model: ModelSpec) -> tuple[int, int]:
    """(all parameters, the largest unit's), once per model: the search asks for every configuration."""
    return model.num_parameters, max(unit.num_parameters for unit in model.units())


def step_segment_bytes(training: Training, config: ParallelConfig, states: ParameterStates | None = None) -> float:
    """Bytes per parameter the optimizer step allocates in caching-allocator segments of its own, after the backward's
    peak. DeepSpeed's ZeRO-1/2 optimizer (deepspeed/runtime/zero/stage_1_and_2.py, v0.6.0): under ZeRO-1 the
    reduction after the flush first copies the rank's partition of the gradients into one contiguous buffer
    (`copy_grads_in_partition`, `grads_in_partition`: `grad_bytes` per trainable parameter over the shard group;
    contiguous_gradients is on by default; under ZeRO-2 that buffer is the sharded gradients, already counted), which
    `averaged_gradients` keeps through the step; `step` flattens it again (`self.flatten(self.averaged_gradients[i])`,
    `grad_bytes` more) and copies that to fp32 (`.to(fp32)`, 4 more unless already fp32) for the update. Each is one
    block larger than any tensor the backward freed (true of the BLOOM runs: 0.5-0.7 G-parameter partitions against a
    0.45 G-parameter largest tensor), so PyTorch 1.x's caching allocator, without expandable segments, maps new
    segments while the pipeline's stay cached: the reserved high-water (max_memory_reserved, nvidia-smi) counts them
    on top of the backward's peak. They need not fit beside the activations (the step runs after those are freed, and
    a failed cudaMalloc empties the cache and retries), only beside the model states (`RankMemoryModel.step_phase`).
    Its per-tensor temporaries (the fp32 overflow check, the fp64 norm of each gradient) are one tensor at a time and
    not counted. DeepSpeed's BF16_Optimizer reduces after the flush too (`BF16_REDUCE_COPY_BYTES`)."""
    trainable = (states or _FULL_ADAM).trainable
    if config.deepspeed_optimizer == "bf16":
        return BF16_REDUCE_COPY_BYTES * trainable
    if not _deepspeed_zero_optimizer(config):
        return 0.0
    partition_copy = training.grad_bytes if config.zero_stage == 1 else 0
    fp32_copy = 0 if training.grad_bytes == 4 else 4
    return trainable * (partition_copy + training.grad_bytes + fp32_copy) / config.shard_group


def _deepspeed_zero_optimizer(config: ParallelConfig) -> bool:
    """Whether DeepSpeed's ZeRO-1/2 optimizer (stage_1_and_2.py) shards the configuration's optimizer states, rather
    than Megatron-LM's distributed optimizer or DeepSpeed's BF16_Optimizer."""
    return config.zero_stage in (1, 2) and not config.distributed_optimizer and config.deepspeed_optimizer == "zero"


BF16_REDUCE_COPY_BYTES = 2
"""Bytes per trainable parameter of the bf16 copy DeepSpeed's pipeline engine makes to all-reduce the BF16_Optimizer's
fp32 gradients (pipe/engine.py `_bf16_reduce_grads` -> engine.py `buffered_allreduce_fallback`, `allreduce_bucket`:
`tensor.to(self.communication_data_type)`, bf16 when the config names none and ZeRO stage is 0, as
tr11-176B-ml.slurm's ds_config does; v0.6.2 and the bigscience branch before it). Each parameter group's flat fp32
gradient is one tensor larger than the 5e8-element bucket, so the bucket is the whole group and the copy one flat
block: a segment of its own (`step_segment_bytes`)."""


def framework_buffer_bytes(model: ModelSpec, training: Training, config: ParallelConfig,
                           states: ParameterStates | None = None) -> tuple[tuple[str, float], ...]:
    """Buffers the data-parallel engine allocates besides the model states: ZeRO-3 / FSDP's gathered
    units (`ZERO3_GATHERED_UNITS` of the largest unit's weights plus its unsharded gradient
    before the reduce-scatter), DeepSpeed ZeRO-1/2's gradient bucket (at most the rank's gradients; not under
    the BF16_Optimizer, whose reduction after the flush copies its flat fp32 gradients to bf16 instead:
    `BF16_REDUCE_COPY_BYTES`);
    when fine-tuning, of the weights as stored and the trainable parameters' gradients (`states`, else
    `parameter_states(model, training)`)."""
    states = states or parameter_states(model, training)
    if config.optimizer_sharding == 3 and config.zero3_collectives == "per-tensor":
        return _per_tensor_gather_buffers(model, training, config, states)
    if config.optimizer_sharding == 3 and config.reshard_after_forward and config.pp == 1:
        unit = _parameter_counts(model)[1] / config.tp
        per_param = ZERO3_GATHERED_UNITS * states.weight_bytes + states.trainable * training.grad_bytes
        return (("gathered_units", unit * per_param),)
    if _deepspeed_zero_optimizer(config) and config.replicas > 1:
        elements = min(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, _parameter_counts(model)[0] * states.trainable / config.tp)
        return (("gradient_bucket", elements * training.grad_bytes),)
    return ()


def _per_tensor_gather_buffers(model: ModelSpec, training: Training, config: ParallelConfig,
                               states: ParameterStates) -> tuple[tuple[str, float], ...]:
    """DeepSpeed's per-tensor ZeRO-3 (`zero3_collectives` "per-tensor", v0.3–0.5.10) holds whole only the
    submodule computing (at most the largest tensor) and the prefetch bucket, and unsharded gradients up to its
    reduce bucket (`reduce_bucket_size`, 5e8 elements, or one larger tensor: stage3.py's ipg bucket) — not
    whole blocks as FSDP's per-unit gathers do."""
    largest = _largest_tensor(model) / config.tp
    weights = (largest + ZERO3_PREFETCH_BUCKET_ELEMENTS) * states.weight_bytes
    gradients = max(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, largest) * states.trainable * training.grad_bytes
    return (("gathered_units", weights + gradients),)


@cache
def _largest_tensor(model: ModelSpec) -> int:
    """Elements of the model's largest parameter tensor (embedding, head or any block type's)."""
    sizes = (*model.embedding_tensor_sizes(), *model.head_tensor_sizes(),
             *(size for block in model.block_types() for size in block.tensor_sizes()))
    return max(sizes)


MXFP8_SCALE_BYTES = 1 / 32
"""Bytes per element of an MXFP8 tensor's scales: one E8M0 byte per block of 32 elements (OCP Microscaling
Formats v1.0, "MX" block size 32), kept for each of its row-wise and column-wise copies."""


def fp8_weight_copy_bytes(training: Training, config: ParallelConfig, gpu: GPUSpec) -> float:
    """Bytes per parameter of an FP8 linear's weight held beyond the 16-bit weight the model states count. Where its
    FP8 linears keep their quantised weights through the iteration (`Training.caches_fp8_weights`: Transformer
    Engine under Megatron-LM), each keeps a row-wise copy for the forward GEMM and, for the input-gradient GEMM that
    reads the weight transposed, a column-wise one: a transposed FP8 copy where FP8 GEMMs take only the TN layout
    (`GPUSpec.fp8_gemm_tn_only`: Hopper), MXFP8's column-wise scaled copy under that recipe, none else (Blackwell's
    per-tensor FP8 reads the row-wise data either way); 1 byte an element plus MXFP8's scales. With
    `fp8_param_gather` (Megatron-LM's --fp8-param-gather, which stores the weights in FP8) these copies are the
    weights, in place of the 16-bit ones: the difference may be negative. None under ZeRO-3, whose gathered units'
    copies live only as long as the gather."""
    if not training.caches_fp8_weights or config.optimizer_sharding == 3:
        return 0.0
    mxfp8 = training.fp8_recipe == "mxfp8"
    copies = 1 + (mxfp8 or gpu.fp8_gemm_tn_only)
    held = copies * (FP8_PARAM_BYTES + (MXFP8_SCALE_BYTES if mxfp8 else 0.0))
    return held - (PARAM_BYTES if config.fp8_param_gather else 0.0)


def rank_memory_model(model: ModelSpec, training: Training, config: ParallelConfig, pp_rank: int,
                      num_microbatches: int, gpu: GPUSpec, calibration: Calibration,
                      states: ParameterStates | None = None) -> RankMemoryModel:
    """The memory accounting of pipeline rank `pp_rank` on `gpu` (constants: profiles/calibration.yaml);
    `states`: `parameter_states(model, training)`, when the caller has it."""
    runtime = (
        ("cuda_context", calibration.cuda_context_bytes + gpu.sm_count * STACK_BYTES_PER_SM),
        ("nccl", nccl_communicators(model, config, pp_rank) * calibration.nccl_communicator_bytes),
    )
    states = states or parameter_states(model, training)
    buffers = (*framework_buffer_bytes(model, training, config, states),
               ("largest_transient", largest_transient_bytes(model, training, config, pp_rank)))
    head = pp_rank == config.stage_ranks[-1]
    return RankMemoryModel(
        states=sharded_state_bytes(config, training.grad_bytes, states),
        in_flight=in_flight_microbatches(config, pp_rank, num_microbatches),
        head_in_flight=(config.pipeline_schedule.head_in_flight(config.pp, config.vpp, num_microbatches)
                        if head else None),
        working_bytes=recompute_working_bytes(model, training, config),
        buffers=buffers, runtime=runtime, fragmentation=calibration.allocator_fragmentation,
        step_segments=step_segment_bytes(training, config, states),
        offloaded_bytes=offloaded_activation_bytes(model, training, config),
        fp8_copy_bytes=fp8_weight_copy_bytes(training, config, gpu),
    )
