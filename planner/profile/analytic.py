"""Analytic per-unit compute profile: FLOPs and bytes of every kernel → time on a GPU.

GEMMs run on a roofline whose compute roof is the GPU's measured matmul efficiency, times the
calibrated fraction of it training GEMMs reach (and, for FP8, FP8's lower fraction of its own peak),
times a wave-quantisation factor (output tiles over whole waves of SMs), so small or oddly shaped
GEMMs are slower per FLOP, and a calibrated penalty applies when a 16-bit operand's leading dimension is
not a whole number of 16-byte vectors (BLOOM's 108-wide heads); element-wise work (norms, activations,
residuals, dropout, softmax) is memory bound at HBM bandwidth. Every kernel pays a fixed GPU-side launch cost,
and a pass takes at least the host (CPU) time eager PyTorch needs to launch its kernels, which is what
small models and thin TP shards run at. Times are per micro-batch on one TP rank.

FLOP conventions (checked in tests against Narayanan et al. 2021 eq. 3 and Korthikanti et al.
2022 eq. 7): a GEMM of m×k by k×n costs 2mnk; backward costs twice the forward GEMMs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache

from planner.config import Training, recomputes_pre_mlp_norm
from planner.errors import PlannerError
from planner.gpu import GPUSpec
from planner.model import AttentionSpec, BlockSpec, MlpSpec, ModelSpec, UnitKind
from planner.profile.calibration import Calibration

__all__ = [
    "AnalyticProfile",
    "UnitSetting",
    "UnitTimes",
    "block_forward_flops",
    "block_type_forward_flops",
    "head_forward_flops",
    "overlapped_host_time",
    "unit_setting",
    "weight_gradient_s",
]

_ATTENTION_BACKWARD_RATIO = 2.5  # FlashAttention-2 backward: 5 matmuls vs 2 forward (Dao 2023)
_FLASH_TILE = 128  # FlashAttention-2/3 query/key block (Dao 2023; Shah et al. 2024): diagonal blocks run whole
# Fixed work of one query tile (load Q, final rescale, write O and the log-sum-exp) in key tiles' worth: fused
# attention's forward rate rises with the key tiles each query tile streams and saturates near 16K tokens. H100,
# head dim 128, non-causal forward (pytorch/benchmark PR #2391, B·S = 16K): FA2 329 → 477 and FA3 430 → 621
# TFLOP/s from 512 to 16,384 tokens, 0.69 of the 16K rate at 4 key tiles: n / (n + 1.8) = 0.69 · 128 / (128 + 1.8).
# The causal forward rates of Shah et al. 2024 (Fig. 5, head dim 256, 2.5 key tiles per query tile at 512 tokens)
# give 1.1 (FA2), 1.7 (cuDNN) and 3.4 (FA3) on the same model
_FLASH_QUERY_TILE_OVERHEAD = 1.8
# Fused attention's rate at head dimension 64 relative to 128: each score tile does half the matmul work per
# softmax element. H100 SXM5 forward at 16K tokens (Shah et al. 2024, FlashAttention-3, Fig. 5): cuDNN 413 vs 595
# and FA3 497 vs 648 TFLOP/s, 0.69 and 0.77 (the native kernels: 0.73); FA2 324 vs 370, 0.88. At 128 and above 1.
_HEAD_DIM_64_SHARE = {"flash": 0.73, "flash2": 0.88}


@dataclass(frozen=True)
class _Fp8Casts:
    """HBM bytes per element that FP8 quantisation adds around a linear layer beyond the BF16 path, by what
    produces the element: an input whose producer (a norm, the MLP activation) can run the cast in its own kernel,
    an input none can (the attention core's output), the output gradient, and the saved input the weight-gradient
    GEMM reads: from the FP8 copy the forward kept (`saved_input`, Transformer Engine) or from the BF16 input
    (`saved_input_bf16`, torchao, which keeps the BF16 tensor and casts it again: read 2 B, write 1 B).
    `bf16_wgrad`: the weight-gradient GEMM runs in BF16 (on the BF16 tensors)."""

    fused_input: float
    unfused_input: float
    output_grad: float
    saved_input: float
    saved_input_bf16: float
    bf16_wgrad: bool = False


# By Training.fp8_recipe. delayed (Transformer Engine DelayedScaling, scale from the amax history): the forward
# casts ride in the norm / activation kernel (LayerNormLinear, fp8 swiglu output) except the attention projection's
# input (read 2 B, write 1 B); the backward casts the BF16 output gradient row-major for dgrad and transposed for
# wgrad in one pass (read 2, write 1 + 1) and transposes the saved FP8 input for wgrad (read 1, write 1): Hopper's
# FP8 tensor cores take only the TN layout.
# tensorwise (current scaling: TE Float8CurrentScaling, torchao tensorwise): the scale needs the whole tensor's
# amax before any element is cast, so no cast runs inside its producer: the producer writes BF16 and reduces the
# amax, a cast kernel reads 2 B and writes 1 B; an input or gradient whose producer cannot reduce the amax (the
# attention core, a GEMM) is read once more for it (+2 B).
# rowwise (torchao: one scale per row of each GEMM operand along its K): the casts are row-local, one pass each
# (read 2, write 1); wgrad's K is the token dimension, so the output gradient and the saved BF16 input are cast
# again along it (2 × 3 B, 3 B), and the backward GEMMs run cuBLAS's tensor-wise kernel with the row and column
# scales applied to the output in a pass of their own (read 2 B, write 2 B per dgrad output element: pytorch/ao
# #1325, torchao 0.7–0.11, avoiding the slow-accumulation CUTLASS kernel, pytorch/pytorch #147971).
# rowwise_with_gw_hp: as rowwise for the forward and dgrad; wgrad runs in BF16 on the BF16 tensors.
# blockwise (TE Float8BlockScaling: 1×128 activation and gradient tiles, 128×128 weight tiles) and mxfp8 (OCP MX,
# 32-element blocks, E8M0 scales): block-local scales let one pass write both the row-wise copy and the
# column-wise copy wgrad reads (read 2, write 1 + 1 plus a scale per block), so nothing is transposed later;
# blockwise's quantiser is a kernel of its own, MXFP8's runs inside the norm on Blackwell (TE's fused
# norm + MXFP8 cast), where both copies replace the BF16 output.
_FP8_CASTS = {
    "delayed": _Fp8Casts(0.0, 3.0, 4.0, 2.0, 3.0),
    "tensorwise": _Fp8Casts(3.0, 5.0, 6.0, 2.0, 3.0),
    "rowwise": _Fp8Casts(3.0, 3.0, 6.0, 3.0 + 4.0, 3.0 + 4.0),
    "rowwise_with_gw_hp": _Fp8Casts(3.0, 3.0, 3.0, 4.0, 4.0, bf16_wgrad=True),
    "blockwise": _Fp8Casts(4.0 + 2 * 4 / 128, 4.0 + 2 * 4 / 128, 4.0 + 2 * 4 / 128, 0.0, 3.0 + 4 / 128),
    "mxfp8": _Fp8Casts(2 / 32, 4.0 + 2 / 32, 4.0 + 2 / 32, 0.0, 3.0 + 1 / 32),
}
_VECTOR_BYTES = 16  # tensor-core GEMM kernels load operands in 16-byte vectors
# Kernels a transformer block's forward launches besides its linear layers' GEMMs, per rank (Megatron-LM's
# fused kernels: one LayerNorm/RMSNorm each, one bias-dropout-add each): the attention half's norm and residual add,
# the MLP half's norm, residual add and activation; the attention core is 1 FlashAttention kernel, or unfused 2
# batched GEMMs + the fused scale-mask-softmax + the output transpose copy (+ dropout); RoPE rotates q and k (2);
# each TP collective is one NCCL kernel.
_ATTENTION_ELEMENTWISE_KERNELS = 2
_MLP_ELEMENTWISE_KERNELS = 3
_UNFUSED_ATTENTION_KERNELS = 4
# Megatron-LM's vocab-parallel cross entropy: logit max, subtract, target-logit gather (mask, index, sum), exp,
# exp-sum, log and loss mean, with two all-reduces under TP
_CROSS_ENTROPY_KERNELS = 8
# The backward launches about twice the forward's kernels: dgrad + wgrad per GEMM, and per element-wise op
# its gradient kernel plus a bias-gradient reduction or gradient accumulation (PyTorch autograd).
_BACKWARD_KERNELS_PER_FORWARD = 2
# Megatron-Core's TEGroupedMLP runs the routed experts as two Transformer Engine GroupedLinear layers (linear_fc1 with
# gate and up fused, linear_fc2); GroupedLinear issues one cuBLASLt GEMM per local expert from a C++ loop over 4
# streams (TE PR #853, "Grouped GEMM via multi-stream cuBLAS"; kept over grouped kernels, TE issue #1386), each a
# kernel the host launches: TE PR #3134 measures that loop at 0.267 ms for 8 small experts (~33 µs each) on SM100,
# where one grouped kernel takes 0.069 ms. With FP8, `split_quantize` quantises each expert's input split with its
# own quantizer (one kernel per expert and layer; the backward's gradient casts are the usual backward doubling).
_GROUPED_LINEARS = 2
# The streams that loop spreads its GEMMs over (Transformer Engine common/util/multi_stream.cpp,
# get_num_compute_streams): at most 4 experts' GEMMs share the SMs at once, so small experts leave SMs idle
_GROUPED_GEMM_STREAMS = 4
# Kernels of the dispatched tokens' path besides the experts' GEMMs and permutations: the activation
_ROUTED_ELEMENTWISE_KERNELS = 1
_ROUTER_KERNELS = 2  # the router's top-k and softmax, besides its GEMM
# Passes over the routed copies of the tokens that reorder them, per forward. Every dispatcher permutes the tokens by
# expert and un-permutes the experts' outputs (2). Megatron-Core's alltoall dispatcher (MoEAlltoAllTokenDispatcher,
# core_v0.15.0 through HEAD) receives each source rank's tokens grouped by that rank, so with more than one local
# expert it sorts them by local expert after the all-to-all ("Permutation 2", `sort_chunks_by_idxs` in
# dispatch_postprocess) and back before the combine ("Unpermutation 2", combine_preprocess): 2 more, each a read and
# a write of every routed copy (fused into one kernel each under moe_permute_fusion). The flex dispatcher's
# DeepEP / HybridEP kernels deliver the tokens per destination, permuted once by expert (2). Without expert
# parallelism there is no all-to-all to sort after (Megatron-Core's default dispatcher there is allgather's, which
# permutes once).
_PERMUTATIONS = 2
_ALLTOALL_CHUNK_SORTS = 2
# Eager PyTorch (Training.elementwise "eager") over fused kernels, per element and forward, from torchtitan's Llama
# code of December 2024 (pytorch/torchtitan 9dec370: models/norms.py RMSNorm, llama/model.py apply_rotary_emb and
# FeedForward). RMSNorm casts to fp32 (read 2 B, write 4 B), squares (4, 4), takes the mean (4), scales (4, 4), casts
# back (4, 2) and multiplies the weight (2, 2): 36 B and 8 kernels (cast, pow, mean, add, rsqrt, mul, cast, mul)
# where a fused kernel moves 4 B in 1. RoPE casts q and k to fp32 (2, 4), multiplies by the complex frequencies
# (4, 4) and casts back (4, 2): 20 B and 3 kernels per tensor against 4 B in 1. SwiGLU's SiLU (2, 2) and gate
# product (2 + 2, 2) run apart: 10 B and 2 kernels against 6 B in 1. The backward doubles them, as it does the
# fused kernels (its autograd graph has a gradient kernel or two per forward op).
_EAGER_NORM_EXTRA = (32, 7)  # (bytes per element, kernels) per RMSNorm
_EAGER_ROPE_EXTRA = (16, 2)  # per rotated tensor (q, k)
_EAGER_GATED_EXTRA = (4, 1)  # per gated-activation channel / per activation
# Expert linears with biases (GPT-OSS): TEGroupedMLP fuses linear_fc1's bias into the activation, but adds linear_fc2's
# (skip_bias_add) in eager PyTorch, weighted by each token's routing probability, one local expert at a time
# (Megatron-Core 0.15-0.19 `TEGroupedMLP._apply_bias`: `torch.cat([t + b * p for t, b, p in zip(split(out), biases,
# split(probs))])`): per local expert a multiply and an add kernel, then one concatenation; per routed copy of a
# token the product is written (h 16-bit values), the add reads the GEMM output and the product and writes the sum,
# and the concatenation copies the sums: 6 reads or writes of h 16-bit values.
_EXPERT_BIAS_KERNELS_PER_EXPERT = 2
_EXPERT_BIAS_ACCESSES = 6
# A clamped gated activation (GPT-OSS: MlpSpec.activation_clamp) in TEGroupedMLP: Megatron-Core's fused
# weighted_bias_quick_geglu_impl (megatron/core/fusions/fused_bias_geglu.py, the same from its first version, 2e29a5e1e3
# of 2025-09, through core_v0.19.0 and d98e8a64dd of 2026-08) clamps outside its fused kernel, in eager PyTorch: per
# routed copy of a token and intermediate channel, the gate half's clamp and the linear half's (read 2 B, write 2 B
# each), then torch.cat joins them for the fused kernel (read 2 × 2 B, write 2 × 2 B): 16 B in 3 kernels. Autograd's
# backward: each clamp's masked gradient (read the gradient and the input, write: 6 B each) and the chunk's gradient,
# a concatenation (8 B): 20 B in 3 kernels. The function then makes its linear offset with torch.tensor(...,
# device=input.device), a blocking host-to-device copy (PyTorch's copy_kernel_cuda: memcpy_and_sync, which calls
# cudaStreamSynchronize): the host waits for the experts' first GEMMs before it launches the rest of the routed path.
# (Megatron-Core 0.18's Transformer Engine op fuser, use_transformer_engine_op_fuser, fuses the clamp instead;
# Megatron-Bridge sets it for GPT-OSS-120B only in HEAD's MXFP8 full-iteration recipes, which planner does not
# tell apart.)
_CLAMP_FORWARD_BYTES = 16  # per routed intermediate channel
_CLAMP_BACKWARD_BYTES = 20
_CLAMP_KERNELS = 3  # forward, and backward
# RoPE under YaRN scaling outside MLA (GPT-OSS; Megatron-Bridge maps any HF rope_scaling of type yarn to
# position_embedding_type "yarn" but for MLA, src/megatron/bridge/models/conversion/model_bridge.py at v0.4.0):
# Megatron-LM (megatron/training/arguments.py, core_v0.15.0) and Megatron-Bridge (src/megatron/bridge/utils/fusions.py
# validate_rope_fusion_compatibility, v0.2.0 through HEAD) turn apply_rope_fusion off for any position embedding but
# "rope", so Megatron-Core rotates q and k in eager PyTorch (rope_utils._apply_rotary_pos_emb_bshd, the same from
# core_v0.15.0 through core_v0.19.0; MLA's YaRN is its rope_type under position_embedding_type "rope" and stays
# fused). Per element of a rotated tensor, beyond the fused kernel's read and write (4 B, 1 kernel): t·cos (4 B),
# the rotated half's negation (2 B) and concatenation (4 B), ·sin (4 B), the sum (6 B) and the final concatenation
# with the empty unrotated part (4 B), plus cos, sin, their mscale and dtype casts over the s × d frequency table
# (6 kernels, bytes negligible): 20 B and 11 kernels more. Autograd's backward: the gradient times sin (4 B), the
# negation (2 B), the chunk's concatenation (4 B), times cos (4 B) and the two branches' sum (6 B): 20 B in 5
# kernels against the fused backward's 4 B in 1, so 16 B and 4 kernels more.
_UNFUSED_ROPE_FORWARD = (20, 11)  # (bytes per rotated element, kernels per rotated tensor) beyond the fused kernel
_UNFUSED_ROPE_BACKWARD = (16, 4)


@dataclass(frozen=True)
class UnitSetting:
    """The per-rank shape a unit runs at."""

    tp: int
    micro_batch: int
    seq_len: int
    sequence_parallel: bool
    dtype: str
    attention: str
    cp: int = 1  # context-parallel ranks: each holds seq_len / cp tokens and attends over the whole sequence
    ep: int = 1  # expert-parallel ranks: each runs num_experts / ep experts
    etp: int = 1  # expert tensor parallelism: each expert's intermediate size split etp ways
    expert_load: float = 1.0  # routed tokens of the busiest expert rank over the mean (Training.moe_expert_load)
    elementwise: str = "fused"  # Training.elementwise: fused kernels or eager PyTorch's
    dispatcher: str = "alltoall"  # ParallelConfig.moe_dispatcher: how an MoE block's routed tokens move
    cuda_graphs: str = "none"  # Training.cuda_graphs: kernels launched one by one, or replayed as one graph
    fp8_recipe: str | None = None  # Training.fp8_recipe: how dtype fp8 scales its GEMM operands
    fp8_saved_input: str = "fp8"  # Training.fp8_saved_input: what an FP8 linear keeps of its input for wgrad
    graphed_modules: tuple[str, ...] = ()  # Training.cuda_graph_modules: layer parts replayed from per-layer graphs

    @property
    def tokens(self) -> float:
        """Tokens of one micro-batch on this rank."""
        return self.micro_batch * self.seq_len / self.cp


@dataclass(frozen=True)
class UnitTimes:
    """Compute time of one unit for one micro-batch on one TP rank (communication excluded).

    `attention_core_forward_s` is the part selective recomputation repeats.
    """

    forward_s: float
    backward_s: float
    attention_core_forward_s: float = 0.0
    # forward GEMM time of each tensor-parallel linear layer, in order: QKV, attention projection, MLP up
    # (FC1), MLP down (FC2); its dgrad and wgrad GEMMs take as long. The compute TP collectives can hide behind.
    linear_forward_s: tuple[float, ...] = ()
    attention_core_backward_s: float = 0.0  # what context parallelism's ring steps hide behind in the backward
    # the weight-gradient GEMMs inside backward_s (a zero-bubble schedule's W pass); None: not profiled
    weight_grad_s: float | None = None
    # forward seconds of what each Megatron-Core recompute module re-runs (config.RECOMPUTE_MODULES but core_attn,
    # which is attention_core_forward_s), as (module, seconds); empty where the profile does not break them out
    module_forward_s: tuple[tuple[str, float], ...] = ()


def weight_gradient_s(kind: UnitKind, times: UnitTimes) -> float:
    """The weight-gradient part of a unit's backward, what a zero-bubble W pass runs: the profile's own
    figure; for a measured profile without one, the embedding's whole backward (it has no input gradient)
    or the forward's part outside the attention core (its linear layers, whose weight-gradient GEMMs take
    as long as their forward GEMMs), at most the backward."""
    if times.weight_grad_s is not None:
        return times.weight_grad_s
    if kind is UnitKind.EMBEDDING:
        return times.backward_s
    return min(max(times.forward_s - times.attention_core_forward_s, 0.0), times.backward_s)


def _flash_tile_utilisation(mean_keys: float) -> float:
    """Share of a fused attention kernel's time spent on score tiles rather than each query tile's fixed work,
    for queries that see `mean_keys` keys on average in one kernel call (causal: about half the keys; ring CP
    runs one call per step over a rank's s/cp keys)."""
    streamed = max(mean_keys / _FLASH_TILE, 1.0)
    return streamed / (streamed + _FLASH_QUERY_TILE_OVERHEAD)


def _head_dim_share(head_dim: int, kernel: str) -> float:
    """Fused attention's rate at `head_dim` relative to head dimension 128 (`_HEAD_DIM_64_SHARE`), linear in
    between; smaller heads run at the 64 rate, larger ones at the 128 rate."""
    low = _HEAD_DIM_64_SHARE[kernel]
    return low + (1 - low) * min(max((head_dim - 64) / 64, 0.0), 1.0)


def overlapped_host_time(gpu_s: float, host_s: float, softness: float) -> float:
    """Time of a pass whose kernels take `gpu_s` on the GPU and `host_s` for the host to launch. Eager PyTorch queues
    kernels asynchronously, so far from the crossover the pass takes the longer of the two; near it the two overlap
    only in part (vTrain's layouts whose two times are about equal measure ~1.3x the longer one, per layer; why is not
    settled: host-heavy stretches the queue has not buffered, ranks waiting for the slowest host at a collective):
    the p-norm of the two with p = 1 / `softness` (0: the longer one, 1: their sum; `Calibration.host_overlap_softness`,
    an empirical form fitted on that sweep)."""
    longer = max(gpu_s, host_s)
    if softness == 0 or longer == 0:
        return longer
    exponent = 1 / softness
    return longer * ((gpu_s / longer) ** exponent + (host_s / longer) ** exponent) ** softness


def _causal_mean_keys(keys: float) -> float:
    """Keys a query tile streams on average under the causal mask: half of them, plus the diagonal tile run
    whole."""
    return 0.5 * keys * (1 + min(_FLASH_TILE / keys, 1.0))


def _local_heads(heads: int, tp: int) -> float:
    """Heads per TP rank; KV heads fewer than TP ranks are replicated, one per rank."""
    return max(heads / tp, 1.0)


def _aligned(elements: float, element_bytes: int) -> bool:
    """Whether a row-major operand's leading dimension spans whole 16-byte vectors (cuBLAS's condition
    for its fastest tensor-core kernels; e.g. an fp16 attention head of 108 does not, 104 or 128 do).
    Fractional widths are per-rank averages of the model, not real shapes, and count as aligned."""
    return not float(elements).is_integer() or int(elements) * element_bytes % _VECTOR_BYTES == 0


def _gemm_dtype_outside_linears(dtype: str, gpu: GPUSpec) -> str:
    """FP8 training runs only the transformer blocks' linear layers in FP8; the attention core, the MoE
    router and the output layer (logits) stay BF16 (Megatron-LM / Transformer Engine, torchao float8's
    default filter, which skips the output projection)."""
    return "bf16" if dtype == "fp8" and gpu.supports("bf16") else dtype


def _fp8_casts(setting: UnitSetting, gpu: GPUSpec) -> _Fp8Casts | None:
    """What FP8 quantisation adds around the linear layers at `setting` (None: not FP8); MXFP8 needs the hardware
    block scaling that came with FP4 tensor cores (NVIDIA Blackwell, AMD CDNA 4)."""
    if setting.dtype != "fp8":
        return None
    recipe = setting.fp8_recipe or "delayed"
    if recipe == "mxfp8" and not gpu.supports("fp4"):
        raise PlannerError(f"fp8 recipe mxfp8 needs MX block-scaled tensor cores (Blackwell: B200, B300, GB200, "
                           f"GB300); {gpu.name} has none: use a recipe without MX scaling (delayed, tensorwise, "
                           f"rowwise, blockwise)")
    return _FP8_CASTS[recipe]


def _mlp_cast_widths(hidden: float, ffn: float, gated: bool, copies: float, tp: int) -> list[tuple[float, float]]:
    """(input, output) width per token of an MLP's two linear layers on one TP rank, what FP8's casts move
    (`_fp8_cast_times`); an MoE MLP's routed tokens count `copies` times (top-k × the busiest rank's load)."""
    up = (2 if gated else 1) * ffn / tp
    return [(hidden * copies, up * copies), (ffn / tp * copies, hidden * copies)]


def _bf16_twin(setting: UnitSetting) -> UnitSetting:
    """`setting` in BF16: what an FP8 recipe that keeps the weight-gradient GEMMs in BF16 runs them at."""
    return replace(setting, dtype="bf16", fp8_recipe=None)


def block_forward_flops(model: ModelSpec, tokens: int, seq_len: int, causal_halving: bool = False) -> float:
    """Forward FLOPs of the mean block over `tokens` tokens of `seq_len`-token sequences (whole model width, no
    TP): `block_type_forward_flops` averaged over the model's blocks, so num_layers times it is the sum."""
    types = model.block_types()
    if len(types) == 1:
        return block_type_forward_flops(model, next(iter(types)), tokens, seq_len, causal_halving)
    return sum(count * block_type_forward_flops(model, block, tokens, seq_len, causal_halving)
               for block, count in types.items()) / model.num_layers


def block_type_forward_flops(model: ModelSpec, block: BlockSpec, tokens: float, seq_len: int,
                             causal_halving: bool = False) -> float:
    """Forward FLOPs of one block of `model` of type `block` over `tokens` tokens of `seq_len`-token sequences (a block
    with its own token count, e.g. a vision encoder's, runs tokens / seq_len samples of its own length): the
    mixer's linears (MHA/GQA or MLA, or Mamba's in/out projections), the dense MLP or the top-k routed
    experts + shared experts + router, the block's further linears, the attention core over the keys each
    query sees (`AttentionSpec.keys_per_query`: a window's or chunk's, not the sequence's), and the Mamba-2
    scan at Megatron-LM's 7 FLOPs per inner channel and state element (its num_floating_point_operations), and
    an MTP block's own output projection."""
    if block.tokens is not None:
        tokens, seq_len = tokens * block.tokens / seq_len, block.tokens
    h = block.hidden_size
    gemm = 2 * tokens * sum(a * b for a, b in block.mixer_linears)
    if block.mlp is not None:
        mlp = block.mlp.matrices * 2 * tokens * h
        if block.mlp.is_moe:
            gemm += mlp * (block.mlp.moe_top_k * block.mlp.ffn_hidden_size
                           + (block.mlp.shared_expert_ffn_hidden_size or 0)) + 2 * tokens * h * block.mlp.num_experts
        else:
            gemm += mlp * block.mlp.ffn_hidden_size
    gemm += 2 * tokens * sum(a * b for a, b, _ in block.linears)
    if block.mamba is not None:
        gemm += 7 * tokens * block.mamba.inner_size * block.mamba.state_size
    if block.output_head:
        gemm += head_forward_flops(model, tokens)
    attention = 0.0
    if block.attention is not None:
        a = block.attention
        width = a.num_attention_heads * (a.qk_head_dim + a.value_head_dim)
        attention = 2 * tokens * a.keys_per_query(seq_len, causal_halving) * width
    return gemm + attention


def head_forward_flops(model: ModelSpec, tokens: int) -> float:
    """Forward FLOPs of the output projection (logits)."""
    return 2 * tokens * model.hidden_size * model.vocab_size


@dataclass(frozen=True)
class AnalyticProfile:
    """Unit times from first principles for one model, with calibrated efficiencies. A unit's times depend only on
    (kind or block type, setting, GPU), so they are kept per instance: the search asks for the same ones under many
    links (DeepSeek-V3 on 2,048 H800: 10,608 block-time requests, 3,040 distinct)."""

    model: ModelSpec
    calibration: Calibration
    _memo: dict[tuple, UnitTimes] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def _memoised(self, key: tuple, compute: Callable[[], UnitTimes]) -> UnitTimes:
        """`compute()`, once per key."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def gemm_time(self, gpu: GPUSpec, dtype: str, m: float, n: float, k: float, count: float = 1,
                  concurrent: float | None = None) -> float:
        """Time of `count` independent m×k·k×n GEMMs on a wave-quantised roofline: one batched kernel whose tiles
        fill the SMs together, or (`concurrent`) separate kernels of which at most that many share the GPU at once
        (streams), each round of them quantised on its own."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        cal = self.calibration
        tile = cal.gemm_tile
        tiles_each = math.ceil(m / tile) * math.ceil(n / tile)
        together = count if concurrent is None else min(count, concurrent)
        waves = math.ceil(tiles_each * together / gpu.sm_count) * count / together
        wave_efficiency = tiles_each * count / (waves * gpu.sm_count)
        efficiency = gpu.matmul_efficiency * gpu.gemm_clock_ratio * cal.gemm_efficiency * wave_efficiency
        if dtype == "fp8":
            efficiency *= cal.fp8_gemm_efficiency_ratio
        element_bytes = 1 if dtype == "fp8" else 2
        if not _aligned(k, element_bytes) or not _aligned(n, element_bytes):
            efficiency *= cal.misaligned_gemm_efficiency
        compute = 2 * m * n * k * count / (gpu.peak_flops(dtype) * efficiency)
        traffic = element_bytes * (m * k + k * n) * count + 2 * m * n * count
        memory = traffic / (gpu.hbm_bandwidth_bytes_per_s * cal.memory_bound_efficiency)
        return max(compute, memory) + cal.kernel_launch_s

    def memory_time(self, gpu: GPUSpec, num_bytes: float) -> float:
        return num_bytes / (gpu.hbm_bandwidth_bytes_per_s * self.calibration.memory_bound_efficiency)

    # ---- units -------------------------------------------------------------------------
    def times(self, kind: UnitKind, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        """Times of a unit kind; a block is the mean block (a model stated layer by layer: `mean_block_times`)."""
        return self._memoised((kind, setting, gpu), lambda: self._kind_times(kind, setting, gpu))

    def _kind_times(self, kind: UnitKind, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        if kind is UnitKind.BLOCK:
            return self._block(setting, gpu) if self.model.layers is None else self.mean_block_times(setting, gpu)
        if kind is UnitKind.EMBEDDING:
            return self._embedding(setting, gpu)
        return self._head(setting, gpu)

    # ---- per block type ----------------------------------------------------------------
    def times_by_type(self, setting: UnitSetting, gpu: GPUSpec) -> dict[BlockSpec, UnitTimes]:
        """`block_times` of each of the model's block types (`ModelSpec.block_types`)."""
        return {block: self.block_times(block, setting, gpu) for block in self.model.block_types()}

    def mean_block_times(self, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        """The blocks' times averaged field by field, weighted by how many blocks have each type."""
        counts, times = self.model.block_types(), self.times_by_type(setting, gpu)
        if len(times) == 1:
            return next(iter(times.values()))
        def mean(values: list[float]) -> float:
            return sum(n * v for n, v in zip(counts.values(), values, strict=True)) / self.model.num_layers
        fields = [[t.forward_s, t.backward_s, t.attention_core_forward_s, t.attention_core_backward_s,
                   weight_gradient_s(UnitKind.BLOCK, t), *t.linear_forward_s] for t in times.values()]
        mixed = [mean(list(column)) for column in zip(*fields, strict=True)]
        return UnitTimes(mixed[0], mixed[1], mixed[2], tuple(mixed[5:]), mixed[3], mixed[4])

    def block_times(self, block: BlockSpec, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        """Compute time of one block of type `block` per micro-batch on one TP rank. A block of attention (any
        kind) and an MLP is costed by the mean-block rules (`_block_of`) applied to the block's own shapes,
        its attention core swapped for its kind's; a block lacking either, or with a Mamba-2 mixer, is
        composed from the same rules sub-layer by sub-layer (`_composed_block`). A block with its own token
        count (a vision encoder) runs micro_batch samples of it, whole on every context-parallel rank.
        `linear_forward_s` is always (mixer input, mixer output, MLP up, MLP down), zero where absent."""
        return self._memoised((block, setting, gpu), lambda: self._block_type_times(block, setting, gpu))

    def _block_type_times(self, block: BlockSpec, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        if block.tokens is not None:
            setting = replace(setting, seq_len=block.tokens, cp=1)
        if block.attention is not None and block.mlp is not None:
            view = AnalyticProfile(_block_view(self.model, block), self.calibration)
            times = view._block_of(setting, gpu, block.mlp.is_moe)
            if block.attention.kind != "full":
                full_forward, full_backward = view._attention_core(setting, gpu)
                forward, backward = self._typed_attention_core(block.attention, (full_forward, full_backward),
                                                               setting)
                times = replace(times, forward_s=times.forward_s - full_forward + forward,
                                backward_s=times.backward_s - full_backward + backward,
                                attention_core_forward_s=forward, attention_core_backward_s=backward)
        elif block.attention is not None or block.mamba is not None or block.mlp is not None:
            times = self._composed_block(block, setting, gpu)
        else:
            times = UnitTimes(0.0, 0.0, 0.0, (0.0, 0.0, 0.0, 0.0), 0.0, 0.0)
        extra_forward = sum(self.gemm_time(gpu, setting.dtype, setting.tokens, n, k) for k, n, _ in block.linears)
        extra_backward = 2 * extra_forward
        extra_weight = extra_forward  # the extra linears' weight-gradient GEMMs (the W pass)
        if block.post_norms:  # a second norm per sub-layer: read + write 2-byte activations
            width = block.hidden_size / setting.tp if setting.sequence_parallel else block.hidden_size
            norms = self.memory_time(gpu, setting.tokens * block.sublayers * 4 * width)
            extra_forward, extra_backward = extra_forward + norms, extra_backward + 2 * norms
        if block.output_head:
            head = self._head(setting, gpu)
            extra_forward, extra_backward = extra_forward + head.forward_s, extra_backward + head.backward_s
            extra_weight += weight_gradient_s(UnitKind.HEAD, head)
        return replace(times, forward_s=times.forward_s + extra_forward, backward_s=times.backward_s + extra_backward,
                       weight_grad_s=weight_gradient_s(UnitKind.BLOCK, times) + extra_weight)

    def _typed_attention_core(self, attention: AttentionSpec, full: tuple[float, float],
                              setting: UnitSetting) -> tuple[float, float]:
        """(forward, backward) of the attention core of `attention`'s kind, from `full`, the full causal core's
        at the same shape. FlashAttention skips the key tiles outside a window or chunk, so a query tile runs
        over the keys it sees plus a partly masked tile at each edge: bidirectional s, sliding (mean keys) +
        tile, chunked c/2 · (1 + tile/c), at the rate of that many streamed key tiles (`_flash_tile_utilisation`);
        unfused kernels compute the whole score matrix and mask it."""
        if attention.kind == "full" or setting.attention == "unfused":
            return full
        s, tile, launch = setting.seq_len, _FLASH_TILE, self.calibration.kernel_launch_s
        causal = _causal_mean_keys(s)
        if attention.kind == "bidirectional":
            keys = float(s)
        elif attention.kind == "sliding":
            keys = min(causal, attention.keys_per_query(s, causal_halving=True) + tile)
        else:
            chunk = min(attention.window, s)
            keys = _causal_mean_keys(chunk)
        cp = setting.cp  # the full core's rate is that of a rank's s/cp keys per ring step
        rate_ratio = _flash_tile_utilisation(causal / cp) / _flash_tile_utilisation(keys / cp)
        forward = (full[0] - launch) * keys / causal * rate_ratio + launch
        return forward, _ATTENTION_BACKWARD_RATIO * forward

    def _composed_block(self, block: BlockSpec, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        """A block of one sub-layer, or with a Mamba-2 mixer: its linears (attention's and the MLP's by
        `_attention_linears` and `_mlp_linears` at the block's shapes, Mamba's by `_mamba`), its attention
        core, and per sub-layer a norm, a residual add (and dropout) at HBM bandwidth, one launch each. An MoE MLP
        is Megatron-Core's MoELayer, the same module a GPT block runs (a hybrid stack's E layer): its router's
        top-k and softmax, its dispatched-token path's bytes and kernels (`_routed_bytes_per_token`,
        `_routed_kernels`) and, in a block of the MoE layer alone, the dispatcher's host sync that splits its
        forward into two host-bound passes (`_synced_forward`) and a host-bound backward, as `_block_of` costs
        them. (A Mamba mixer's scan kernels are not counted, so its blocks' passes are their GPU time.)"""
        view = AnalyticProfile(_block_view(self.model, block), self.calibration)
        linears = [0.0, 0.0, 0.0, 0.0]
        core_forward = core_backward = scan_forward = scan_backward = router = rope_width = gated = 0.0
        t, h = setting.tp, block.hidden_size
        width = h / t if setting.sequence_parallel else h
        per_token = block.sublayers * (4 + 6 + (5 if block.dropout else 0)) * width
        kernels = 2 * block.sublayers
        widths: list[tuple[float, float]] = []  # (input, output) per token of each linear layer, for FP8's casts
        unfused_inputs = 0.0
        if block.attention is not None:
            linears[0], linears[1], qkv_width = view._attention_linears(setting, gpu)
            query_width = block.attention.query_width / t
            widths += [(h, qkv_width), (query_width, h)]
            unfused_inputs += query_width
            core_forward, core_backward = self._typed_attention_core(
                block.attention, view._attention_core(setting, gpu), setting)
            if block.attention.rope:
                rope_width = (block.attention.query_width + block.attention.kv_width) / t
        if block.mamba is not None:
            linears[0], linears[1], scan_forward, scan_backward = self._mamba(block, setting, gpu)
            inner = block.mamba.inner_size / t  # out_proj's input comes from mamba_ssm's gated-norm kernel
            widths += [(h, block.mamba.in_proj_width / t), (inner, h)]
            unfused_inputs += inner
        if block.mlp is not None:
            linears[2], linears[3], router = view._mlp_linears(setting, gpu, block.mlp.is_moe)
            mlp = block.mlp
            routed = mlp.moe_top_k * setting.expert_load * mlp.ffn_hidden_size
            shared = (mlp.shared_expert_ffn_hidden_size or 0) if mlp.is_moe else 0
            ffn = routed + shared if mlp.is_moe else mlp.ffn_hidden_size
            if mlp.is_moe:  # the dispatched-token path as in a GPT block's MoE layer (`_block_of`)
                per_token += view._routed_bytes_per_token(setting) + view._activation_bytes_per_channel() * shared / t
                kernels += _ROUTER_KERNELS + view._routed_kernels(setting)[0] + (1 if shared else 0)
            else:
                per_token += (6 if mlp.gated else 4) * ffn / t
                kernels += 1
            gated = ffn / t if mlp.gated else 0.0
            copies = mlp.moe_top_k * setting.expert_load if mlp.is_moe else 1
            widths += _mlp_cast_widths(h, mlp.ffn_hidden_size, mlp.gated, copies, t)
        per_token += 4 * rope_width + _eager_extra_bytes(setting, block.sublayers, width, rope_width, gated)
        kernels += _eager_extra_kernels(setting, block.sublayers, rope_width > 0, gated > 0)
        if view._unfused_rope(setting):
            per_token += _UNFUSED_ROPE_FORWARD[0] * rope_width
            kernels += 2 * _UNFUSED_ROPE_FORWARD[1]  # q and k
        gemms = sum(linears) + router
        elementwise = self.memory_time(gpu, setting.tokens * per_token) + kernels * self.calibration.kernel_launch_s
        cast_forward, cast_backward = self._fp8_cast_times(setting, gpu, tuple(widths), unfused_inputs)
        wgrad = self._composed_block(block, _bf16_twin(setting), gpu).weight_grad_s \
            if self._bf16_wgrad(setting, gpu) else gemms
        modules = view._module_forward_s(setting, gpu, block.mlp is not None and block.mlp.is_moe,
                                         block.mlp is not None)
        backward_elementwise = view._elementwise_backward(setting, gpu, elementwise, moe=False)
        forward = gemms + core_forward + scan_forward + elementwise + cast_forward
        backward = gemms + wgrad + core_backward + scan_backward + backward_elementwise + cast_backward
        if block.mlp is not None and block.mlp.is_moe and block.attention is None and block.mamba is None:
            launched, launched_backward = view._launches(setting, kernels + view._moe_gemm_kernels(setting),
                                                         moe=True, attention=False)
            forward = view._synced_forward(setting, gpu, forward, launched)
            backward = view._host_bound(setting, backward, launched_backward,
                                        _BACKWARD_KERNELS_PER_FORWARD * view._routed_kernels(setting)[1])
        return UnitTimes(forward, backward, core_forward, tuple(linears), core_backward, wgrad, modules)

    def _mamba(self, block: BlockSpec, setting: UnitSetting, gpu: GPUSpec) -> tuple[float, float, float, float]:
        """(in_proj, out_proj, scan forward, scan backward) of a Mamba-2 mixer on one TP rank. As Megatron-Core's
        MambaMixer splits it: in_proj column-parallel, out_proj row-parallel, heads and groups over TP. The
        chunked SSD scan (Dao & Gu 2024, §6) per chunk of Q tokens, as batched GEMMs: the intra-chunk scores
        C·Bᵀ (Q×Q over the state N, per group), their product with x (Q×Q by Q×P, per head), each chunk's
        state Bᵀ·x (N×Q by Q×P) and the output from the carried state C·h (Q×N by N×P), plus the fp32 chunk
        states written and read once; the causal conv1d (with SiLU) over x, B and C and the gated RMSNorm
        read and write their 2-byte tensors, all at `mamba_scan_efficiency` of the GEMM and HBM rates (mamba_ssm's
        Triton kernels). Backward: twice the GEMMs and the memory traffic."""
        mamba, t, dtype, tokens = block.mamba, setting.tp, setting.dtype, setting.tokens
        h, state, head_dim = block.hidden_size, mamba.state_size, mamba.head_dim
        in_proj = self.gemm_time(gpu, dtype, tokens, mamba.in_proj_width / t, h)
        out_proj = self.gemm_time(gpu, dtype, tokens, h, mamba.inner_size / t)
        heads, groups = mamba.num_heads / t, max(mamba.num_groups / t, 1.0)
        q = min(mamba.chunk_size, setting.seq_len)
        chunks = tokens / q
        scan_dtype = _gemm_dtype_outside_linears(dtype, gpu)
        gemms = (self.gemm_time(gpu, scan_dtype, q, q, state, chunks * groups)
                 + self.gemm_time(gpu, scan_dtype, q, head_dim, q, chunks * heads)
                 + self.gemm_time(gpu, scan_dtype, state, head_dim, q, chunks * heads)
                 + self.gemm_time(gpu, scan_dtype, q, head_dim, state, chunks * heads))
        conv, inner = mamba.conv_channels / t, mamba.inner_size / t
        per_token = 2 * 2 * conv + 2 * 3 * inner + 2 * conv + 4 * heads + 2 * inner  # conv, gated norm, scan I/O
        traffic = chunks * heads * head_dim * state * 4 * 2 + tokens * per_token
        memory = self.memory_time(gpu, traffic)
        scan = (gemms + memory) / self.calibration.mamba_scan_efficiency
        return in_proj, out_proj, scan, 2 * scan

    def _attention_core(self, setting: UnitSetting, gpu: GPUSpec) -> tuple[float, float]:
        m, s, b, cp = self.model, setting.seq_len, setting.micro_batch, setting.cp
        heads = _local_heads(m.num_attention_heads, setting.tp)
        attention_dtype = _gemm_dtype_outside_linears(setting.dtype, gpu)
        if setting.attention != "unfused":
            # causal: masked blocks are skipped, the s/tile diagonal blocks run whole; context parallelism's
            # load balancing (2·cp chunks, rank i holding chunks i and 2cp−1−i) gives each rank 1/cp of the work
            width = heads * (m.qk_head_dim + m.value_head_dim)
            flops = 2 * b * s * _causal_mean_keys(s) * width / cp
            rate = (gpu.peak_flops(attention_dtype) * self.calibration.flash_attention_efficiency
                    * gpu.fused_attention_share * _flash_tile_utilisation(_causal_mean_keys(s / cp))
                    * _head_dim_share(m.qk_head_dim, setting.attention))
            if setting.attention == "flash2":
                rate *= gpu.flash_attention_2_share
            forward = flops / rate + self.calibration.kernel_launch_s
            return forward, _ATTENTION_BACKWARD_RATIO * forward
        batches, queries = b * heads, s / cp
        score_gemms = self.gemm_time(gpu, attention_dtype, queries, s, m.head_dim, batches)
        value_gemms = self.gemm_time(gpu, attention_dtype, queries, m.head_dim, s, batches)
        elements = batches * queries * s
        # fused scale+mask+softmax reads and writes 2-byte scores; dropout reads, writes and keeps a 1-byte mask
        softmax_dropout_bytes = elements * (4 + (5 if m.dropout else 0))
        forward = score_gemms + value_gemms + self.memory_time(gpu, softmax_dropout_bytes)
        return forward, 2 * (score_gemms + value_gemms) + self.memory_time(gpu, 2 * softmax_dropout_bytes)

    def _elementwise_bytes_per_token(self, setting: UnitSetting, moe: bool = False) -> float:
        """HBM bytes per token of a block's memory-bound kernels in the forward pass; an MoE block's
        activation runs over the routed copies of each token (top-k, times the busiest rank's load) and
        the shared experts, and the dispatcher permutes and un-permutes every routed copy (read + write
        of h 16-bit values each way)."""
        m, t = self.model, setting.tp
        width = m.hidden_size / t if setting.sequence_parallel else m.hidden_size
        norms = 2 * 4 * width  # read + write 2-byte activations
        residuals = 2 * 6 * width  # read two, write one
        dropouts = 2 * 5 * width if m.dropout else 0.0
        ffn = (m.shared_expert_ffn_hidden_size or 0) if moe else m.ffn_hidden_size
        activation = self._activation_bytes_per_channel() * ffn / t
        routed = self._routed_bytes_per_token(setting) if moe else 0.0
        rope_width = self._rope_width(setting)
        gated = ffn / t + (self._routed_channels(setting) if moe else 0.0) if m.activation == "swiglu" else 0.0
        eager = _eager_extra_bytes(setting, 2, width, rope_width, gated)
        unfused_rope = _UNFUSED_ROPE_FORWARD[0] * rope_width if self._unfused_rope(setting) else 0.0
        return norms + residuals + dropouts + activation + routed + 4 * rope_width + eager + unfused_rope

    def _activation_bytes_per_channel(self) -> int:
        """HBM bytes per intermediate channel of the MLP activation: SwiGLU reads two 2-byte inputs and writes
        one, other activations read one and write one."""
        return 6 if self.model.activation == "swiglu" else 4

    def _routed_bytes_per_token(self, setting: UnitSetting) -> float:
        """HBM bytes per token of an MoE block's dispatched-token path: its permutes, the routed activation and the
        experts' output bias (`_expert_bias_bytes_per_token`)."""
        return (self._permute_bytes_per_token(setting) + self._routed_activation_bytes_per_token(setting)
                + self._expert_bias_bytes_per_token(setting))

    def _expert_bias_bytes_per_token(self, setting: UnitSetting) -> float:
        """The eager per-expert add of linear_fc2's probability-weighted bias over the routed copies of a token
        (`_EXPERT_BIAS_ACCESSES`); zero without expert biases."""
        if not self.model.moe_bias:
            return 0.0
        return _EXPERT_BIAS_ACCESSES * 2 * self._routed_hidden(setting)

    def _permute_bytes_per_token(self, setting: UnitSetting) -> float:
        """The dispatcher's reorderings of every routed copy (top-k, times the busiest rank's load; `_permutations`):
        each a read + write of h 16-bit values."""
        return self._permutations(setting) * 2 * 2 * self._routed_hidden(setting)

    def _permutations(self, setting: UnitSetting) -> int:
        """Passes that reorder the routed copies in an MoE block's forward (`_PERMUTATIONS`): the permute and the
        un-permute, and under the alltoall dispatcher with more than one local expert its sort of the received tokens
        by local expert and the sort back (`_ALLTOALL_CHUNK_SORTS`), when there is an expert-parallel all-to-all."""
        chunk_sorts = setting.dispatcher == "alltoall" and setting.ep > 1 and self.model.num_experts / setting.ep > 1
        return _PERMUTATIONS + (_ALLTOALL_CHUNK_SORTS if chunk_sorts else 0)

    def _routed_hidden(self, setting: UnitSetting) -> float:
        """Hidden values per token of its routed copies on one rank: top-k copies, times the busiest rank's load, of
        h over TP (what the permutes and the expert-bias add move, 16-bit each)."""
        m = self.model
        return m.moe_top_k * setting.expert_load * m.hidden_size / setting.tp

    def _routed_activation_bytes_per_token(self, setting: UnitSetting) -> float:
        """The routed experts' activation over the routed copies of a token, with its eager input clamp where the
        model clamps (`_CLAMP_FORWARD_BYTES`)."""
        clamp = _CLAMP_FORWARD_BYTES if self.model.activation_clamp is not None else 0
        return (self._activation_bytes_per_channel() + clamp) * self._routed_channels(setting)

    def _elementwise_backward(self, setting: UnitSetting, gpu: GPUSpec, forward_s: float, moe: bool) -> float:
        """Backward time of a block's element-wise work of `forward_s` forward seconds (launches included): twice
        the forward, but for the eager chains whose autograd backward is counted kernel by kernel, the routed
        experts' activation clamp (`_CLAMP_FORWARD_BYTES`, if `moe`) and the unfused YaRN RoPE over q and k
        (`_UNFUSED_ROPE_FORWARD`)."""
        def chain(values_per_token: float, size: float, kernels: float) -> float:
            return (self.memory_time(gpu, setting.tokens * values_per_token * size)
                    + kernels * self.calibration.kernel_launch_s)

        own_forward = own_backward = 0.0
        if moe and self.model.activation_clamp is not None:
            channels = self._routed_channels(setting)
            own_forward += chain(channels, _CLAMP_FORWARD_BYTES, _CLAMP_KERNELS)
            own_backward += chain(channels, _CLAMP_BACKWARD_BYTES, _CLAMP_KERNELS)
        if self._unfused_rope(setting):
            width = self._rope_width(setting)
            own_forward += chain(width, _UNFUSED_ROPE_FORWARD[0], 2 * _UNFUSED_ROPE_FORWARD[1])  # q and k
            own_backward += chain(width, _UNFUSED_ROPE_BACKWARD[0], 2 * _UNFUSED_ROPE_BACKWARD[1])
        return 2 * (forward_s - own_forward) + own_backward

    def _unfused_rope(self, setting: UnitSetting) -> bool:
        """Whether Megatron-Core rotates q and k in eager PyTorch beyond the fused kernels planner assumes: YaRN
        scaling outside MLA (`_UNFUSED_ROPE_FORWARD`); eager element-wise training counts its own RoPE
        (`_EAGER_ROPE_EXTRA`)."""
        m = self.model
        return (setting.elementwise == "fused" and m.position_embedding == "rope" and m.rope_scaling == "yarn"
                and not m.is_mla)

    def _rope_width(self, setting: UnitSetting) -> float:
        """Rotated q and k values per token on one TP rank (zero without RoPE)."""
        m = self.model
        return (m.query_width + m.kv_width) / setting.tp if m.position_embedding == "rope" else 0.0

    def _routed_channels(self, setting: UnitSetting) -> float:
        """Intermediate channels per token of the routed experts on one rank: top-k copies, times the busiest rank's
        load, of the expert width over TP."""
        m = self.model
        return m.moe_top_k * setting.expert_load * m.expert_ffn_hidden_size / setting.tp

    def _block_kernels(self, setting: UnitSetting, moe: bool) -> tuple[float, float]:
        """(memory-bound kernels, all kernels) a block's forward launches on one rank: its attention half's and its
        MLP half's (`_attention_kernels`, `_mlp_kernels`)."""
        attention_memory, attention = self._attention_kernels(setting)
        mlp_memory, mlp, _ = self._mlp_kernels(setting, moe)
        return attention_memory + mlp_memory, attention + mlp

    def _attention_kernels(self, setting: UnitSetting) -> tuple[float, float]:
        """(memory-bound kernels, all kernels) of a block's attention half in the forward on one rank (Megatron-Core's
        TransformerLayer._forward_attention): the input norm, RoPE on q and k, the residual add
        (`_ATTENTION_ELEMENTWISE_KERNELS`), one GEMM per attention weight matrix, the core (FlashAttention one kernel;
        unfused, two batched GEMMs, which `gemm_time` charges as GEMMs, and its softmax and copies) and half the
        block's TP collectives."""
        m = self.model
        rope = m.position_embedding == "rope"
        elementwise = _ATTENTION_ELEMENTWISE_KERNELS + (2 if rope else 0)  # RoPE: q and k
        elementwise += _eager_extra_kernels(setting, 1, rope, False)
        elementwise += 2 * _UNFUSED_ROPE_FORWARD[1] if self._unfused_rope(setting) else 0  # q and k
        gemms, core = len(m.attention_linears()), 1
        if setting.attention == "unfused":
            gemms, core = gemms + 2, 0
            elementwise += _UNFUSED_ATTENTION_KERNELS - 2 + (1 if m.dropout else 0)
        return elementwise, elementwise + gemms + core + self._tp_collectives(setting) / 2

    def _mlp_kernels(self, setting: UnitSetting, moe: bool) -> tuple[float, float, float]:
        """(memory-bound kernels, all kernels, the router's) of a block's MLP half in the forward on one rank: the
        pre-MLP norm, the residual add and the activation (`_MLP_ELEMENTWISE_KERNELS`), half the block's TP
        collectives, and a dense MLP's GEMMs or an MoE layer's router GEMM, top-k and softmax, shared experts' GEMMs
        and routed path (`_routed_kernels`, the activation among its kernels). The router's kernels are what
        Megatron-Core's moe_router CUDA-graph scope captures: the norm, the router and the shared experts."""
        m = self.model
        elementwise = _MLP_ELEMENTWISE_KERNELS + _eager_extra_kernels(setting, 1, False, m.activation == "swiglu")
        collectives = self._tp_collectives(setting) / 2
        if not moe:
            return elementwise, elementwise + m.mlp_matrices + collectives, 0.0
        routed_memory, routed_gemms = self._routed_kernels(setting)
        gemms = self._moe_gemm_kernels(setting)
        router = 1 + _eager_extra_kernels(setting, 1, False, False) + _ROUTER_KERNELS + gemms - routed_gemms
        elementwise += _ROUTER_KERNELS + routed_memory - 1  # the activation: one of the three
        return elementwise, elementwise + gemms + collectives, router

    @staticmethod
    def _tp_collectives(setting: UnitSetting) -> int:
        """NCCL kernels of a block's TP collectives in the forward: with sequence parallelism an all-gather and a
        reduce-scatter around each half, else an all-reduce after each."""
        return (4 if setting.sequence_parallel else 2) if setting.tp > 1 else 0

    def _launches(self, setting: UnitSetting, kernels: float, moe: bool, attention: bool = True) -> tuple[float, float]:
        """(forward, backward) host launches of a block whose forward runs `kernels`: the backward
        `_BACKWARD_KERNELS_PER_FORWARD` per forward kernel, except that the graphed parts (`_graphed_kernels`)
        launch one replay each way."""
        graphed, graphs = self._graphed_kernels(setting, moe, attention)
        return kernels - graphed + graphs, _BACKWARD_KERNELS_PER_FORWARD * (kernels - graphed) + graphs

    def _graphed_kernels(self, setting: UnitSetting, moe: bool, attention: bool = True) -> tuple[float, int]:
        """(kernels inside the per-layer CUDA graphs, graphs) of a block's forward on one rank
        (UnitSetting.graphed_modules): the attention half under attn (if the block has one), a dense MLP half under
        mlp, an MoE layer's router part under moe_router and, under moe_preprocess, the alltoall dispatcher's first
        permutation, which its preprocessing runs before the sync (the flex dispatcher permutes after its dispatch).
        The replay launches each graph from the host once."""
        graphed, kernels, graphs = setting.graphed_modules, 0.0, 0
        if not graphed:
            return kernels, graphs
        if attention and "attn" in graphed:
            kernels, graphs = kernels + self._attention_kernels(setting)[1], graphs + 1
        _, mlp, router = self._mlp_kernels(setting, moe)
        if not moe and "mlp" in graphed:
            kernels, graphs = kernels + mlp, graphs + 1
        if moe and "moe_router" in graphed:
            kernels, graphs = kernels + router, graphs + 1
            if "moe_preprocess" in graphed and setting.dispatcher == "alltoall":
                kernels += 1
        return kernels, graphs

    def _moe_gemm_kernels(self, setting: UnitSetting) -> float:
        """GEMM kernels of an MoE layer's forward on one rank: the router's, the shared experts' and the routed
        experts' (`_routed_kernels`)."""
        m = self.model
        return 1 + (m.mlp_matrices if m.shared_expert_ffn_hidden_size else 0) + self._routed_kernels(setting)[1]

    def _routed_kernels(self, setting: UnitSetting) -> tuple[float, float]:
        """(memory-bound kernels, other kernels) of an MoE block's dispatched-token path in the forward on one rank:
        its permutations (`_permutations`, one kernel each) and activation (with expert biases, the per-expert bias
        add and its concatenation: `_EXPERT_BIAS_KERNELS_PER_EXPERT`), and per local expert one GEMM in each of the
        two grouped linears and, with FP8, one quantisation of its input split (`_GROUPED_LINEARS`)."""
        local = self.model.num_experts / setting.ep
        per_expert = 2 if setting.dtype == "fp8" else 1
        clamp = _CLAMP_KERNELS if self.model.activation_clamp is not None else 0
        memory = (_ROUTED_ELEMENTWISE_KERNELS + clamp + self._permutations(setting)
                  + self._expert_bias_kernels(setting))
        return memory, _GROUPED_LINEARS * local * per_expert

    def _expert_bias_kernels(self, setting: UnitSetting) -> float:
        """Kernels of the eager expert-bias add on one rank: per local expert `_EXPERT_BIAS_KERNELS_PER_EXPERT`, and
        the concatenation; none without expert biases."""
        if not self.model.moe_bias:
            return 0.0
        return _EXPERT_BIAS_KERNELS_PER_EXPERT * self.model.num_experts / setting.ep + 1

    def _synced_forward(self, setting: UnitSetting, gpu: GPUSpec, gpu_s: float, kernels: float) -> float:
        """Forward of an MoE block of `gpu_s` GPU seconds and `kernels` launches, split by the token dispatcher's
        host-device synchronisation: dropless dispatch sizes its buffers and all-to-all splits from the routed
        token counts, which the host reads once per MoE layer's forward (Megatron-Core 0.15-0.17 alltoall
        dispatcher: a D2H copy and event sync at `cuda_sync_point`, before the EP all-to-all; the flex
        dispatcher's DeepEP / HybridEP dispatch returns the received counts to the host; only drop-and-pad
        mode, which planner does not model, avoids it; the backward reuses the counts). The sync drains the
        GPU queue the host had run ahead on, so the part before it (attention, router) and the dispatched-token
        path after it (`_routed_kernels`) are each host-bound on their own. A clamped activation syncs once more
        (`_CLAMP_FORWARD_BYTES`'s blocking copy), splitting the routed path after the experts' first GEMMs and the
        permutations before them (half of `_permutations`)."""
        memory_kernels, routed_kernels = self._routed_kernels(setting)
        up, down = self._routed_expert_linears(setting, gpu)
        launch = self.calibration.kernel_launch_s
        routed_bytes = setting.tokens * self._routed_bytes_per_token(setting)
        routed = up + down + self.memory_time(gpu, routed_bytes) + memory_kernels * launch
        after = memory_kernels + routed_kernels
        before = self._host_bound(setting, gpu_s - routed, kernels - after)
        if self.model.activation_clamp is None:
            return before + self._host_bound(setting, routed, after, routed_kernels)
        permutes = self._permutations(setting) / 2
        permute_s = self.memory_time(gpu, setting.tokens * self._permute_bytes_per_token(setting) / 2)
        first = up + permute_s + permutes * launch
        first_kernels = permutes + routed_kernels / _GROUPED_LINEARS  # the first grouped linear's launches
        looped = routed_kernels / _GROUPED_LINEARS
        return (before + self._host_bound(setting, first, first_kernels, looped)
                + self._host_bound(setting, routed - first, after - first_kernels, routed_kernels - looped))

    def _host_bound(self, setting: UnitSetting, gpu_s: float, kernels: float, looped: float = 0.0) -> float:
        """A pass's time from its GPU time and the host's time to launch its `kernels` (`looped` of them from
        Transformer Engine's GroupedLinear C++ loop, `grouped_gemm_host_s` each, the rest from Python-level modules,
        `host_kernel_s` each), which eager PyTorch overlaps (`overlapped_host_time`); a replayed full-iteration CUDA
        graph launches nothing from the host (Training.cuda_graphs), so its GPU time."""
        if setting.cuda_graphs == "full_iteration":
            return gpu_s
        cal = self.calibration
        host_s = (kernels - looped) * cal.host_kernel_s + looped * cal.grouped_gemm_host_s
        return overlapped_host_time(gpu_s, host_s, cal.host_overlap_softness)

    def _block(self, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        """The mean block: MoE and dense blocks weighted by their counts (all blocks are costed alike)."""
        m = self.model
        if not m.is_moe:
            return self._block_of(setting, gpu, moe=False)
        moe = self._block_of(setting, gpu, moe=True)
        dense_layers = m.num_layers - m.num_moe_layers
        if not dense_layers:
            return moe
        dense, w = self._block_of(setting, gpu, moe=False), dense_layers / m.num_layers
        mix = [(1 - w) * a + w * b for a, b in zip(
            (moe.forward_s, moe.backward_s, moe.attention_core_forward_s, moe.attention_core_backward_s,
             weight_gradient_s(UnitKind.BLOCK, moe), *moe.linear_forward_s),
            (dense.forward_s, dense.backward_s, dense.attention_core_forward_s, dense.attention_core_backward_s,
             weight_gradient_s(UnitKind.BLOCK, dense), *dense.linear_forward_s), strict=True)]
        return UnitTimes(mix[0], mix[1], mix[2], tuple(mix[5:]), mix[3], mix[4])

    def _attention_linears(self, setting: UnitSetting, gpu: GPUSpec) -> tuple[float, float, float]:
        """(QKV-side GEMMs, output projection, QKV output width per rank). MLA's down projections run whole
        on every TP rank (Megatron-Core duplicates them); its up projections and the output are split."""
        m, t, tokens, h = self.model, setting.tp, setting.tokens, self.model.hidden_size
        if not m.is_mla:
            q, kv = m.query_width, m.kv_width
            qkv_width = q / t + 2 * kv * _local_heads(m.num_key_value_heads, t) / m.num_key_value_heads
            return (self.gemm_time(gpu, setting.dtype, tokens, qkv_width, h),
                    self.gemm_time(gpu, setting.dtype, tokens, h, q / t), qkv_width)
        *inputs, (out_in, _) = m.attention_linears()
        downs = sum(self.gemm_time(gpu, setting.dtype, tokens, n, k) for k, n in inputs if k == h)
        projection = self.gemm_time(gpu, setting.dtype, tokens, h, out_in / t)
        return downs + self._mla_up_linears(setting, gpu), projection, sum(n if k == h else n / t for k, n in inputs)

    def _mla_up_linears(self, setting: UnitSetting, gpu: GPUSpec) -> float:
        """MLA's up projections from the query and KV latents, split over TP (zero without MLA)."""
        m, h = self.model, self.model.hidden_size
        if not m.is_mla:
            return 0.0
        return sum(self.gemm_time(gpu, setting.dtype, setting.tokens, n / setting.tp, k)
                   for k, n in m.attention_linears()[:-1] if k != h)

    def _mlp_linears(self, setting: UnitSetting, gpu: GPUSpec, moe: bool) -> tuple[float, float, float]:
        """(up GEMMs, down GEMMs, router) of one block on one rank. Routed experts run as one grouped GEMM
        over the rank's num_experts / ep experts, each with its own rows padded to whole tiles (the wave
        quantisation of `gemm_time`): with tp·cp·dp ranks sharing the tokens evenly, an expert replica gets
        tokens·top-k·ep·etp / (num_experts·tp) rows of this rank's micro-batch, times the busiest rank's
        load. Shared experts are a dense tensor-parallel MLP; the router runs on the rank's tokens/tp."""
        m, t, dtype, tokens, h = self.model, setting.tp, setting.dtype, setting.tokens, self.model.hidden_size
        gated = 2 if m.activation == "swiglu" else 1
        if not moe:
            f = m.ffn_hidden_size
            up = self.gemm_time(gpu, dtype, tokens, gated * f / t, h)
            return up, self.gemm_time(gpu, dtype, tokens, h, f / t), 0.0
        up, down = self._routed_expert_linears(setting, gpu)
        shared_up, shared_down = self._shared_expert_linears(setting, gpu)
        router = self.gemm_time(gpu, _gemm_dtype_outside_linears(dtype, gpu), tokens / t, m.num_experts, h)
        return up + shared_up, down + shared_down, router

    def _routed_expert_linears(self, setting: UnitSetting, gpu: GPUSpec) -> tuple[float, float]:
        """(up GEMMs, down GEMMs) of the rank's routed experts (see `_mlp_linears`): one GEMM kernel per local
        expert (`_GROUPED_LINEARS`), each paying the launch cost."""
        m, dtype, h = self.model, setting.dtype, self.model.hidden_size
        f, etp, local = m.expert_ffn_hidden_size, setting.etp, m.num_experts / setting.ep
        gated = 2 if m.activation == "swiglu" else 1
        rows = setting.tokens / setting.tp * m.moe_top_k * setting.ep * etp / m.num_experts * setting.expert_load
        launches = (local - 1) * self.calibration.kernel_launch_s  # `gemm_time` charges one launch per call
        streams = _GROUPED_GEMM_STREAMS
        return (self.gemm_time(gpu, dtype, rows, gated * f / etp, h, local, streams) + launches,
                self.gemm_time(gpu, dtype, rows, h, f / etp, local, streams) + launches)

    def _shared_expert_linears(self, setting: UnitSetting, gpu: GPUSpec) -> tuple[float, float]:
        """(up GEMM, down GEMM) of an MoE block's shared experts, a dense tensor-parallel MLP (none: zeros)."""
        m, t, tokens = self.model, setting.tp, setting.tokens
        shared = m.shared_expert_ffn_hidden_size
        if not shared:
            return 0.0, 0.0
        gated = 2 if m.activation == "swiglu" else 1
        return (self.gemm_time(gpu, setting.dtype, tokens, gated * shared / t, m.hidden_size),
                self.gemm_time(gpu, setting.dtype, tokens, m.hidden_size, shared / t))

    def _block_of(self, setting: UnitSetting, gpu: GPUSpec, moe: bool) -> UnitTimes:
        m, t = self.model, setting.tp
        tokens = setting.tokens
        h, q, f = m.hidden_size, m.query_width, m.ffn_hidden_size
        qkv, projection, qkv_width = self._attention_linears(setting, gpu)
        up, down, router = self._mlp_linears(setting, gpu, moe)
        linears = [qkv, projection, up, down]
        gemms = sum(linears) + router
        core_forward, core_backward = self._attention_core(setting, gpu)
        elementwise = self.memory_time(gpu, tokens * self._elementwise_bytes_per_token(setting, moe))
        copies = m.moe_top_k * setting.expert_load if moe else 1
        widths = ((h, qkv_width), (q / t, h),
                  *_mlp_cast_widths(h, m.expert_ffn_hidden_size if moe else f, m.activation == "swiglu", copies, t))
        cast_forward, cast_backward = self._fp8_cast_times(setting, gpu, widths, q / t)
        memory_kernels, kernels = self._block_kernels(setting, moe)
        elementwise += memory_kernels * self.calibration.kernel_launch_s
        forward = gemms + core_forward + elementwise + cast_forward
        launched, launched_backward = self._launches(setting, kernels, moe)
        forward = (self._synced_forward(setting, gpu, forward, launched) if moe
                   else self._host_bound(setting, forward, launched))
        wgrad = self._block_of(_bf16_twin(setting), gpu, moe).weight_grad_s if self._bf16_wgrad(setting, gpu) \
            else gemms
        backward_elementwise = self._elementwise_backward(setting, gpu, elementwise, moe)
        looped = self._routed_kernels(setting)[1] if moe else 0.0
        backward = self._host_bound(setting, gemms + wgrad + core_backward + backward_elementwise + cast_backward,
                                    launched_backward, _BACKWARD_KERNELS_PER_FORWARD * looped)
        # W: each linear layer's and the router's weight-gradient GEMM (as long as its forward GEMM at the
        # recipe's precision); the input-gradient GEMMs, the attention core's backward and the element-wise work
        # are B's
        return UnitTimes(forward, backward, core_forward, tuple(linears), core_backward, wgrad,
                         self._module_forward_s(setting, gpu, moe))

    def _fp8_cast_times(self, setting: UnitSetting, gpu: GPUSpec, widths: tuple[tuple[float, float], ...],
                        unfused_input: float) -> tuple[float, float]:
        """(forward, backward) time of the FP8 recipe's quantisation around linear layers of (input, output)
        `widths` per token, `unfused_input` of whose input width no kernel can cast in passing (`_FP8_CASTS`)."""
        casts = _fp8_casts(setting, gpu)
        if casts is None:
            return 0.0, 0.0
        inputs = sum(k_in for k_in, _ in widths)
        forward = casts.fused_input * (inputs - unfused_input) + casts.unfused_input * unfused_input
        saved = casts.saved_input if setting.fp8_saved_input == "fp8" else casts.saved_input_bf16
        backward = sum(casts.output_grad * n + saved * k_in for k_in, n in widths)
        return self.memory_time(gpu, setting.tokens * forward), self.memory_time(gpu, setting.tokens * backward)

    @staticmethod
    def _bf16_wgrad(setting: UnitSetting, gpu: GPUSpec) -> bool:
        """Whether the FP8 recipe runs the weight-gradient GEMMs in BF16."""
        casts = _fp8_casts(setting, gpu)
        return casts is not None and casts.bf16_wgrad

    def _module_forward_s(self, setting: UnitSetting, gpu: GPUSpec, moe: bool,
                          has_mlp: bool = True) -> tuple[tuple[str, float], ...]:
        """`UnitTimes.module_forward_s` of one block of this one-block model (an MoE MLP if `moe`, none unless
        `has_mlp`): layernorm re-runs the norms that are modules of their own (MLA's input norm, an MoE layer's
        pre-MLP norm where a router CUDA graph does not keep it, `recomputes_pre_mlp_norm`); mla_up_proj MLA's up
        projections and RoPE; mlp a dense MLP's GEMMs, activation and the norm fused into its first linear; moe the
        router, the permutes, the routed and shared experts and their activations; moe_act the routed experts'
        activation; shared_experts the shared experts' GEMMs and activation. Each element-wise kernel at HBM
        bandwidth plus one launch. The communication they re-run (moe's dispatch and combine, mlp's TP collectives)
        is the cost model's (cost/time.py)."""
        m, t = self.model, setting.tp
        width = m.hidden_size / t if setting.sequence_parallel else m.hidden_size
        per_element = self._activation_bytes_per_channel()

        def kernel(bytes_per_token: float) -> float:
            return self.memory_time(gpu, setting.tokens * bytes_per_token) + self.calibration.kernel_launch_s

        norm = kernel(4 * width)
        pre_mlp_norm = moe and has_mlp and recomputes_pre_mlp_norm(setting.graphed_modules, setting.dispatcher)
        parts = {"layernorm": norm * (m.is_mla + pre_mlp_norm)}
        if m.is_mla:
            parts["mla_up_proj"] = self._mla_up_linears(setting, gpu) + kernel(4 * (m.query_width + m.kv_width) / t)
        if has_mlp and not moe:
            up, down, _ = self._mlp_linears(setting, gpu, moe=False)
            parts["mlp"] = norm + up + down + kernel(per_element * m.ffn_hidden_size / t)
        elif has_mlp:
            up, down, router = self._mlp_linears(setting, gpu, moe=True)  # routed and shared experts, router
            shared_up, shared_down = self._shared_expert_linears(setting, gpu)
            shared = m.shared_expert_ffn_hidden_size or 0
            parts["moe_act"] = kernel(self._routed_activation_bytes_per_token(setting))
            shared_act = kernel(per_element * shared / t) if shared else 0.0
            parts["shared_experts"] = shared_up + shared_down + shared_act
            permutes = kernel(self._permute_bytes_per_token(setting))
            bias = (self.memory_time(gpu, setting.tokens * self._expert_bias_bytes_per_token(setting))
                    + self._expert_bias_kernels(setting) * self.calibration.kernel_launch_s)
            parts["moe"] = up + down + router + permutes + bias + parts["moe_act"] + shared_act
        return tuple(parts.items())

    def _embedding(self, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        m = self.model
        if not m.token_embedding:  # nothing to look up: a ViT's stem block embeds its patches
            return UnitTimes(0.0, 0.0, weight_grad_s=0.0)
        tokens = setting.tokens
        width = m.hidden_size / setting.tp if setting.sequence_parallel else m.hidden_size
        # the embedding norm reads and writes the output (4 bytes a value) forward, and twice that backward
        norm_bytes = tokens * 4 * width if m.embedding_norm else 0.0
        forward_bytes = (tokens * (2 * m.hidden_size + 2 * width * (2 if m.position_embedding == "learned" else 1))
                         + norm_bytes)
        # backward accumulates row gradients into the (vocab-sharded) fp32 table gradient
        backward_bytes = tokens * m.hidden_size * (2 + 8) + 2 * norm_bytes
        # lookup, position add, norm, dropout; the vocab-parallel lookup's all-reduce under TP
        kernels = (1 + (m.position_embedding == "learned") + m.embedding_norm + m.dropout + (setting.tp > 1))
        launch = kernels * self.calibration.kernel_launch_s
        backward = self._host_bound(setting, self.memory_time(gpu, backward_bytes) + launch, kernels)
        # all weight gradient: the tokens need no gradient
        return UnitTimes(self._host_bound(setting, self.memory_time(gpu, forward_bytes) + launch, kernels), backward,
                         weight_grad_s=backward)

    def _head(self, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        m, t = self.model, setting.tp
        tokens = setting.micro_batch * m.head_tokens(setting.seq_len / setting.cp)
        vocab_local = m.padded_vocab_size(t) / t
        width = m.hidden_size / t if setting.sequence_parallel else m.hidden_size
        logits = self.gemm_time(gpu, _gemm_dtype_outside_linears(setting.dtype, gpu), tokens, vocab_local,
                                m.hidden_size)
        norm = self.memory_time(gpu, tokens * 4 * width)
        # vocab-parallel cross entropy over fp32 logits: max, exp-sum and loss passes, then the gradient
        cross_entropy = self.memory_time(gpu, tokens * vocab_local * 4 * 4)
        cross_entropy += _CROSS_ENTROPY_KERNELS * self.calibration.kernel_launch_s
        kernels = 2 + _CROSS_ENTROPY_KERNELS + (2 if t > 1 else 0)  # the norm and the logits GEMM besides
        backward_kernels = _BACKWARD_KERNELS_PER_FORWARD * kernels
        return UnitTimes(self._host_bound(setting, logits + norm + cross_entropy, kernels),
                         self._host_bound(setting, 2 * logits + 2 * norm + cross_entropy, backward_kernels),
                         weight_grad_s=logits, linear_forward_s=(logits,))


@cache
def _view_of(name: str, vocab_size: int, block: BlockSpec, rope_scaling: str | None) -> ModelSpec:
    h = block.hidden_size
    attention = block.attention or AttentionSpec("full", 1, 1, h)
    mlp = block.mlp or MlpSpec(h)
    return ModelSpec(
        name, 1, h, attention.num_attention_heads, mlp.ffn_hidden_size, vocab_size,
        num_key_value_heads=attention.num_key_value_heads, head_dim=attention.head_dim,
        activation="swiglu" if mlp.gated else "gelu",
        normalization=block.normalization, position_embedding="rope" if block.attention and attention.rope else "alibi",
        rope_scaling=rope_scaling, qkv_bias=attention.qkv_bias, num_experts=mlp.num_experts, moe_top_k=mlp.moe_top_k,
        moe_ffn_hidden_size=mlp.ffn_hidden_size if mlp.is_moe else None,
        shared_expert_ffn_hidden_size=mlp.shared_expert_ffn_hidden_size if mlp.is_moe else None, moe_bias=mlp.moe_bias,
        activation_clamp=mlp.activation_clamp,
        qk_norm=attention.qk_norm, q_lora_rank=attention.q_lora_rank, kv_lora_rank=attention.kv_lora_rank,
        qk_rope_head_dim=attention.qk_rope_head_dim, v_head_dim=attention.v_head_dim, dropout=block.dropout)


def _eager_extra_bytes(setting: UnitSetting, norms: int, norm_width: float, rope_width: float,
                       gated_channels: float) -> float:
    """HBM bytes per token eager PyTorch's element-wise ops add to a block's forward over fused kernels (none when
    fused): `norms` RMSNorms over `norm_width`, RoPE over `rope_width` (q and k), SwiGLU over `gated_channels`."""
    if setting.elementwise != "eager":
        return 0.0
    return (norms * _EAGER_NORM_EXTRA[0] * norm_width + _EAGER_ROPE_EXTRA[0] * rope_width
            + _EAGER_GATED_EXTRA[0] * gated_channels)


def _eager_extra_kernels(setting: UnitSetting, norms: int, rope: bool, gated: bool) -> int:
    """Kernels eager PyTorch's element-wise ops add to a block's forward over fused kernels (none when fused)."""
    if setting.elementwise != "eager":
        return 0
    rotated = 2 if rope else 0  # q and k
    return norms * _EAGER_NORM_EXTRA[1] + rotated * _EAGER_ROPE_EXTRA[1] + (_EAGER_GATED_EXTRA[1] if gated else 0)


def _block_view(model: ModelSpec, block: BlockSpec) -> ModelSpec:
    """A one-block uniform model whose scalar fields are `block`'s width, attention (full causal: the core of
    its kind is costed apart; RoPE, with the model's scaling, or none) and MLP (any gated one costs as SwiGLU, any
    other as GeLU: same shapes), so the mean-block rules cost the block's parts. Parts the block lacks get
    placeholder shapes that the callers do not read."""
    return _view_of(model.name, model.vocab_size, block, model.rope_scaling)


def unit_setting(training: Training, tp: int, micro_batch: int, sequence_parallel: bool, cp: int = 1, ep: int = 1,
                 etp: int = 1, dispatcher: str = "alltoall") -> UnitSetting:
    return UnitSetting(tp, micro_batch, training.seq_len, sequence_parallel, training.dtype, training.attention, cp,
                       ep, etp, training.expert_rank_load(ep), training.elementwise, dispatcher, training.cuda_graphs,
                       training.fp8_recipe, "fp8" if training.keeps_fp8_inputs(tp) else training.fp8_saved_input,
                       training.cuda_graph_modules)
