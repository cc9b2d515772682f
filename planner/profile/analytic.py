"""Analytic per-unit compute profile: FLOPs and bytes of every kernel → time on a GPU.

GEMMs run on a roofline whose compute roof is the GPU's measured matmul efficiency, times the
calibrated fraction of it training GEMMs reach (and, for FP8, FP8's lower fraction of its own peak),
times a wave-quantisation factor (output tiles over whole waves of SMs), so small or oddly shaped
GEMMs are slower per FLOP, and a calibrated penalty applies when a 16-bit operand's leading dimension is
not a whole number of 16-byte vectors (BLOOM's 108-wide heads); element-wise work (norms, activations,
residuals, dropout, softmax) is memory bound at HBM bandwidth. Times are per micro-batch on one TP rank.

FLOP conventions (checked in tests against Narayanan et al. 2021 eq. 3 and Korthikanti et al.
2022 eq. 7): a GEMM of m×k by k×n costs 2mnk; backward costs twice the forward GEMMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.config import Training
from planner.gpu import GPUSpec
from planner.model import ModelSpec, UnitKind
from planner.profile.calibration import Calibration

__all__ = [
    "AnalyticProfile",
    "UnitSetting",
    "UnitTimes",
    "block_forward_flops",
    "head_forward_flops",
    "unit_setting",
    "weight_gradient_s",
]

_ATTENTION_BACKWARD_RATIO = 2.5  # FlashAttention-2 backward: 5 matmuls vs 2 forward (Dao 2023)
_FLASH_TILE = 128  # FlashAttention-2/3 query/key block (Dao 2023; Shah et al. 2024): diagonal blocks run whole
# FP8 (Transformer Engine, torchao float8) HBM bytes per element around each FP8 linear layer beyond the BF16
# path, per-tensor scaling: the backward casts the BF16 output gradient to FP8 twice (row-major for dgrad,
# transposed for wgrad; read 2 B, write 1 + 1 B) and the wgrad GEMM needs the saved FP8 input transposed
# (read 1 B, write 1 B; Hopper FP8 tensor cores take only the TN layout). The forward casts of the inputs
# are fused into the preceding LayerNorm / activation (LayerNormLinear, fp8 gelu/swiglu output), except the
# attention projection's input (read 2 B, write 1 B).
_FP8_GRAD_CAST_BYTES = 4
_FP8_INPUT_TRANSPOSE_BYTES = 2
_FP8_UNFUSED_CAST_BYTES = 3
_VECTOR_BYTES = 16  # tensor-core GEMM kernels load operands in 16-byte vectors


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


def block_forward_flops(model: ModelSpec, tokens: int, seq_len: int, causal_halving: bool = False) -> float:
    """Forward FLOPs of the mean transformer block over `tokens` tokens (whole model width, no TP): the
    attention linears (MHA/GQA or MLA), the dense MLP or the top-k routed experts + shared experts +
    router, averaged over the blocks (dense first layers included), and the attention core."""
    h, heads = model.hidden_size, model.num_attention_heads
    gemm = 2 * tokens * sum(a * b for a, b in model.attention_linears())
    mlp = model.mlp_matrices * 2 * tokens * h
    dense = mlp * model.ffn_hidden_size
    routed = mlp * (model.moe_top_k * model.expert_ffn_hidden_size + (model.shared_expert_ffn_hidden_size or 0))
    routed += 2 * tokens * h * model.num_experts
    gemm += (model.num_moe_layers * routed + (model.num_layers - model.num_moe_layers) * dense) / model.num_layers
    width = heads * (model.qk_head_dim + model.value_head_dim)
    attention = 2 * tokens * seq_len * width * (0.5 if causal_halving else 1.0)
    return gemm + attention


def head_forward_flops(model: ModelSpec, tokens: int) -> float:
    """Forward FLOPs of the output projection (logits)."""
    return 2 * tokens * model.hidden_size * model.vocab_size


@dataclass(frozen=True)
class AnalyticProfile:
    """Unit times from first principles for one model, with calibrated efficiencies."""

    model: ModelSpec
    calibration: Calibration

    def gemm_time(self, gpu: GPUSpec, dtype: str, m: float, n: float, k: float, count: float = 1) -> float:
        """Time of `count` independent m×k·k×n GEMMs on a wave-quantised roofline."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        cal = self.calibration
        tile = cal.gemm_tile
        tiles = math.ceil(m / tile) * math.ceil(n / tile) * count
        waves = math.ceil(tiles / gpu.sm_count)
        wave_efficiency = tiles / (waves * gpu.sm_count)
        efficiency = gpu.matmul_efficiency * cal.gemm_efficiency * wave_efficiency
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
        if kind is UnitKind.BLOCK:
            return self._block(setting, gpu)
        if kind is UnitKind.EMBEDDING:
            return self._embedding(setting, gpu)
        return self._head(setting, gpu)

    def _attention_core(self, setting: UnitSetting, gpu: GPUSpec) -> tuple[float, float]:
        m, s, b, cp = self.model, setting.seq_len, setting.micro_batch, setting.cp
        heads = _local_heads(m.num_attention_heads, setting.tp)
        attention_dtype = _gemm_dtype_outside_linears(setting.dtype, gpu)
        if setting.attention == "flash":
            # causal: masked blocks are skipped, the s/tile diagonal blocks run whole; context parallelism's
            # load balancing (2·cp chunks, rank i holding chunks i and 2cp−1−i) gives each rank 1/cp of the work
            width = heads * (m.qk_head_dim + m.value_head_dim)
            flops = 2 * b * s * s * width * 0.5 * (1 + min(_FLASH_TILE / s, 1.0)) / cp
            rate = gpu.peak_flops(attention_dtype) * self.calibration.flash_attention_efficiency
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
        ffn_local = m.ffn_hidden_size / t
        permute = 0.0
        if moe:
            routed = m.moe_top_k * setting.expert_load
            ffn_local = (routed * m.expert_ffn_hidden_size + (m.shared_expert_ffn_hidden_size or 0)) / t
            permute = 2 * 2 * 2 * routed * m.hidden_size / t
        activation = permute + 6 * ffn_local if m.activation == "swiglu" else 4 * ffn_local
        rope = 4 * (m.query_width + m.kv_width) / t if m.position_embedding == "rope" else 0.0
        return norms + residuals + dropouts + activation + rope


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
        qkv = sum(self.gemm_time(gpu, setting.dtype, tokens, n if k == h else n / t, k) for k, n in inputs)
        return qkv, self.gemm_time(gpu, setting.dtype, tokens, h, out_in / t), sum(
            n if k == h else n / t for k, n in inputs)

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
        f, etp, local = m.expert_ffn_hidden_size, setting.etp, m.num_experts / setting.ep
        rows = tokens / t * m.moe_top_k * setting.ep * etp / m.num_experts * setting.expert_load
        up = self.gemm_time(gpu, dtype, rows, gated * f / etp, h, local)
        down = self.gemm_time(gpu, dtype, rows, h, f / etp, local)
        if m.shared_expert_ffn_hidden_size:
            shared = m.shared_expert_ffn_hidden_size
            up += self.gemm_time(gpu, dtype, tokens, gated * shared / t, h)
            down += self.gemm_time(gpu, dtype, tokens, h, shared / t)
        router = self.gemm_time(gpu, _gemm_dtype_outside_linears(dtype, gpu), tokens / t, m.num_experts, h)
        return up, down, router

    def _block_of(self, setting: UnitSetting, gpu: GPUSpec, moe: bool) -> UnitTimes:
        m, t, dtype = self.model, setting.tp, setting.dtype
        tokens = setting.tokens
        h, q, f = m.hidden_size, m.query_width, m.ffn_hidden_size
        qkv, projection, qkv_width = self._attention_linears(setting, gpu)
        up, down, router = self._mlp_linears(setting, gpu, moe)
        linears = [qkv, projection, up, down]
        gemms = sum(linears) + router
        core_forward, core_backward = self._attention_core(setting, gpu)
        elementwise = self.memory_time(gpu, tokens * self._elementwise_bytes_per_token(setting, moe))
        cast_forward = cast_backward = 0.0
        if dtype == "fp8":  # (input, output) width of each linear layer per token, MoE tokens counted top-k times
            k = m.moe_top_k * setting.expert_load if moe else 1
            f = m.expert_ffn_hidden_size if moe else f
            up_width = (2 if m.activation == "swiglu" else 1) * f / t
            widths = ((h, qkv_width), (q / t, h), (h * k, up_width * k), (f / t * k, h * k))
            cast_forward = self.memory_time(gpu, tokens * _FP8_UNFUSED_CAST_BYTES * q / t)
            cast_backward = self.memory_time(gpu, tokens * sum(
                _FP8_GRAD_CAST_BYTES * n + _FP8_INPUT_TRANSPOSE_BYTES * k_in for k_in, n in widths))
        forward = gemms + core_forward + elementwise + cast_forward
        backward = 2 * gemms + core_backward + 2 * elementwise + cast_backward
        # W: each linear layer's and the router's weight-gradient GEMM (as long as its forward GEMM); the
        # input-gradient GEMMs, the attention core's backward and the element-wise work are B's
        return UnitTimes(forward, backward, core_forward, tuple(linears), core_backward, gemms)

    def _embedding(self, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        m = self.model
        tokens = setting.tokens
        width = m.hidden_size / setting.tp if setting.sequence_parallel else m.hidden_size
        forward_bytes = tokens * (2 * m.hidden_size + 2 * width * (2 if m.position_embedding == "learned" else 1))
        # backward accumulates row gradients into the (vocab-sharded) fp32 table gradient
        backward_bytes = tokens * m.hidden_size * (2 + 8)
        backward = self.memory_time(gpu, backward_bytes)  # all weight gradient: the tokens need no gradient
        return UnitTimes(self.memory_time(gpu, forward_bytes), backward, weight_grad_s=backward)

    def _head(self, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        m, t = self.model, setting.tp
        tokens = setting.tokens
        vocab_local = m.padded_vocab_size(t) / t
        width = m.hidden_size / t if setting.sequence_parallel else m.hidden_size
        logits = self.gemm_time(gpu, _gemm_dtype_outside_linears(setting.dtype, gpu), tokens, vocab_local,
                                m.hidden_size)
        norm = self.memory_time(gpu, tokens * 4 * width)
        # vocab-parallel cross entropy over fp32 logits: max, exp-sum and loss passes, then the gradient
        cross_entropy = self.memory_time(gpu, tokens * vocab_local * 4 * 4)
        return UnitTimes(logits + norm + cross_entropy, 2 * logits + 2 * norm + cross_entropy, weight_grad_s=logits)


def unit_setting(training: Training, tp: int, micro_batch: int, sequence_parallel: bool, cp: int = 1, ep: int = 1,
                 etp: int = 1) -> UnitSetting:
    return UnitSetting(tp, micro_batch, training.seq_len, sequence_parallel, training.dtype, training.attention, cp,
                       ep, etp, training.moe_expert_load)
