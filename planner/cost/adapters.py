"""Compute of one block when its base weights are frozen (planner.finetune): the backward without weight-gradient
GEMMs, the adapters' low-rank GEMMs, and QLoRA's de-quantisation of its NF4 weights before every GEMM pass.

A frozen linear's backward still computes the input gradient (dgrad: later layers' adapters need it), so a block's
backward loses exactly its weight-gradient GEMMs, which take as long as its forward GEMMs
(`UnitTimes.linear_forward_s`). Each adapter x·A·B adds two skinny GEMMs forward and their dgrad and wgrad backward.
"""

from __future__ import annotations

from dataclasses import replace

from planner.config import Training
from planner.errors import PlannerError
from planner.finetune import NF4_BITS_PER_PARAM, PARAM_BYTES, adapter_linears, block_linear_weights
from planner.gpu import GPUSpec
from planner.model import BlockSpec, UnitKind
from planner.profile.analytic import AnalyticProfile, UnitSetting, UnitTimes

__all__ = ["DEQUANT_BYTES_PER_PARAM", "adapter_block_times", "dequant_s", "frozen_end_times"]

DEQUANT_BYTES_PER_PARAM = NF4_BITS_PER_PARAM / 8 + PARAM_BYTES
"""HBM bytes per weight of one de-quantisation: read the NF4 code and its share of the constants, write the 16-bit
weight the GEMM then reads (bitsandbytes' dequantize_4bit before a 16-bit matmul; the GEMM's own read is already in
its time)."""


def dequant_s(block: BlockSpec, setting: UnitSetting, gpu: GPUSpec, profile: AnalyticProfile) -> float:
    """One memory-bound de-quantisation of the block's linear weights held on this rank (TP-split, the routed experts
    over ep·etp)."""
    routed = block.routed_expert_parameters()
    local = (block_linear_weights(block) - routed) / setting.tp + routed / (setting.ep * setting.etp)
    return profile.memory_time(gpu, local * DEQUANT_BYTES_PER_PARAM)


def _adapter_forward_s(block: BlockSpec, training: Training, setting: UnitSetting, gpu: GPUSpec,
                       profile: AnalyticProfile) -> float:
    """Forward of every adapter of the block on one TP rank: x·A (tokens × r × d_in) and (x·A)·B (tokens × d_out × r)
    per adapted linear and routed expert a token runs through, split over tp like their base layer."""
    dtype = "bf16" if setting.dtype == "fp8" else setting.dtype  # adapters run in 16 bits
    r, tokens, tp = training.lora_rank, setting.tokens, setting.tp
    return sum(profile.gemm_time(gpu, dtype, tokens, r, d_in / tp, copies)
               + profile.gemm_time(gpu, dtype, tokens, d_out / tp, r, copies)
               for d_in, d_out, copies in adapter_linears(block, training.lora_targets, active=True))


def adapter_block_times(block: BlockSpec, times: UnitTimes, training: Training, setting: UnitSetting, gpu: GPUSpec,
                        timer: object) -> UnitTimes:
    """`times` of a block with frozen base weights: backward without the weight-gradient GEMMs, plus the adapters
    (backward: dgrad and wgrad of both factors, twice their forward) and, for QLoRA, one de-quantisation per pass
    (the forward, and the backward's dgrad; a recomputed forward repeats the forward's). Full training: `times`."""
    if training.finetune == "full":
        return times
    if not isinstance(timer, AnalyticProfile):
        raise PlannerError(f"--finetune {training.finetune} needs the analytic profile: a measured --profile times "
                           f"full-training backward passes (weight gradients included)")
    adapters = _adapter_forward_s(block, training, setting, gpu, timer)
    dequant = dequant_s(block, setting, gpu, timer) if training.finetune == "qlora" else 0.0
    weight_gradients = sum(times.linear_forward_s)
    return replace(times, forward_s=times.forward_s + adapters + dequant,
                   backward_s=times.backward_s - weight_gradients + 2 * adapters + dequant)


def frozen_end_times(kind: UnitKind, times: UnitTimes, training: Training) -> UnitTimes:
    """The embedding or output head with frozen weights: the embedding runs no backward (nothing before it needs a
    gradient and its table gets none); the head computes its logits GEMM's input gradient but not its weight
    gradient (`linear_forward_s`, empty for a measured profile). Full training: `times`."""
    if training.finetune == "full":
        return times
    if kind is UnitKind.EMBEDDING:
        return replace(times, backward_s=0.0)
    return replace(times, backward_s=times.backward_s - sum(times.linear_forward_s))
