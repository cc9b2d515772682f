"""Fine-tuning: which parameters train and how many bytes each parameter's states take.

Full training trains every parameter. LoRA (Hu et al. 2021) freezes the 16-bit base weights and trains, beside
every targeted linear W (d_in × d_out), two low-rank factors A (d_in × r) and B (r × d_out): r·(d_in + d_out)
parameters, with GQA's narrower key/value projections at their own width and every routed expert adapted when the
MLP is targeted. QLoRA (Dettmers et al. 2023) also stores the frozen linear weights in 4-bit NormalFloat with
double quantisation and de-quantises them to 16 bits for every GEMM.

The memory and time models charge states per parameter (`planner.cost.memory.RankMemoryModel` is linear in a
stage's parameters), so `parameter_states` states them as averages over the model's parameters: trainable
parameters per parameter, frozen bytes per parameter. Totals are exact; a pipeline stage's share is
proportional to its parameters (the embedding and head hold no adapters and stay 16-bit, so with pp > 1 their
stages are charged ~f · their parameters of adapter states they do not hold; f < 1 % at r = 16 on 7B+ models).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from planner.config import Training
from planner.errors import PlannerError
from planner.model import BlockSpec, ModelSpec

__all__ = [
    "ADAM_8BIT_STATE_BYTES",
    "NF4_BITS_PER_PARAM",
    "ParameterStates",
    "adapter_linears",
    "adapter_parameters",
    "block_linear_weights",
    "full_parameter_states",
    "parameter_states",
    "quantized_parameters",
]

PARAM_BYTES = 2  # 16-bit weights (fp8 training keeps bf16 weights too; its FP8 copies: memory.fp8_weight_copy_bytes)
FP8_PARAM_BYTES = 1  # an FP8 (E4M3) weight; per-tensor scales add a few bytes per tensor, not counted
ADAM_STATE_BYTES = 12  # fp32 master weights + momentum + variance (ZeRO's K = 12)

NF4_BITS_PER_PARAM = 4 + 8 / 64 + 32 / (64 * 256)
"""Bits per QLoRA base weight: 4-bit NF4 codes plus double quantisation's constants, one 8-bit absmax per block of
64 weights and one fp32 constant per 256 of those (Dettmers et al. 2023 §3, "Double Quantization":
8/64 + 32/(64·256) = 0.127 bits per parameter, down from 32/64 = 0.5)."""

ADAM_8BIT_STATE_BYTES = 4 + 2 + 2 * 4 / 2048
"""Bytes per trainable parameter of bitsandbytes' 8-bit Adam in mixed precision: the fp32 master weight (4), m and v
in one byte each (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", §2), and one fp32 absmax per
block of 2048 values for each of m and v (bitsandbytes' block size)."""


@dataclass(frozen=True)
class ParameterStates:
    """Model-state accounting per parameter of the model (averaged over all of them, see the module docstring).

    `trainable`: trainable parameters per parameter (1 for full training); `frozen_bytes`: bytes of frozen base
    weight per parameter (0 for full training; 2 for LoRA; NF4 linears and 16-bit rest for QLoRA); each
    trainable parameter holds a 16-bit weight, a gradient of `Training.grad_bytes` and `optimizer_bytes` of
    optimizer state on the GPU (0 when offloaded to the host); `optimizer` is `Training.optimizer_states`."""

    trainable: float
    frozen_bytes: float
    optimizer_bytes: float
    optimizer: str = "fp32"

    @property
    def offload(self) -> bool:
        """Optimizer states and the Adam update on the host (ZeRO-Offload / FSDP CPU offload)."""
        return self.optimizer == "cpu"

    @property
    def weight_bytes(self) -> float:
        """16-bit and frozen weight bytes per parameter: what ZeRO-3 / FSDP gathers."""
        return self.frozen_bytes + self.trainable * PARAM_BYTES


def _optimizer_bytes(training: Training) -> float:
    """GPU bytes of optimizer state per trainable parameter under `training.optimizer_states`."""
    return {"fp32": ADAM_STATE_BYTES, "8bit": ADAM_8BIT_STATE_BYTES, "cpu": 0.0}[training.optimizer_states]


def full_parameter_states(training: Training) -> ParameterStates:
    """Every parameter trains (pre-training and full fine-tuning); needs no model."""
    if training.finetune != "full":
        raise ValueError(f"full_parameter_states: training fine-tunes with {training.finetune}; use parameter_states")
    return ParameterStates(1.0, 0.0, _optimizer_bytes(training), training.optimizer_states)


def _attention_targets(block: BlockSpec, targets: str) -> tuple[tuple[int, int, int], ...]:
    """(d_in, d_out, copies) of the mixer's adapted linears: q, k, v and o separately (PEFT adapts HF's separate
    projections), MLA's and Mamba's projections as they are; "qv" only the query and value projections, which
    MLA and Mamba mixers do not have (PEFT skips modules its target names do not match)."""
    h = block.hidden_size
    if block.attention is not None and not block.attention.is_mla:
        a = block.attention
        q, k, v, o = (h, a.query_width, 1), (h, a.kv_width, 1), (h, a.kv_width, 1), (a.value_width, h, 1)
        return (q, v) if targets == "qv" else (q, k, v, o)
    if targets == "qv":
        return ()
    return tuple((d_in, d_out, 1) for d_in, d_out in block.mixer_linears)


def _mlp_targets(block: BlockSpec, active: bool = False) -> tuple[tuple[int, int, int], ...]:
    """(d_in, d_out, copies) of the MLP's adapted linears: up (and gate), down, per routed and shared expert;
    `active`: only the top-k routed experts a token runs through (compute, not parameters)."""
    mlp, h = block.mlp, block.hidden_size
    if mlp is None:
        return ()
    ups = mlp.matrices - 1
    experts = (mlp.moe_top_k if active else mlp.num_experts) if mlp.is_moe else 1
    out = [(h, mlp.ffn_hidden_size, ups * experts), (mlp.ffn_hidden_size, h, experts)]
    if mlp.is_moe and mlp.shared_expert_ffn_hidden_size:
        shared = mlp.shared_expert_ffn_hidden_size
        out += [(h, shared, ups), (shared, h, 1)]
    return tuple(out)


def adapter_linears(block: BlockSpec, targets: str, active: bool = False) -> tuple[tuple[int, int, int], ...]:
    """(d_in, d_out, copies) of every linear of `block` that `targets` (one of LORA_TARGETS) adapts; `active`: the
    routed experts a token runs through rather than all of them."""
    out: tuple[tuple[int, int, int], ...] = ()
    if targets in ("qv", "attention", "all-linear"):
        out += _attention_targets(block, "qv" if targets == "qv" else "attention")
    if targets in ("mlp", "all-linear"):
        out += _mlp_targets(block, active)
    if targets == "all-linear":
        out += tuple((d_in, d_out, 1) for d_in, d_out, _ in block.linears)
    return out


def _check_rank(block: BlockSpec, training: Training) -> None:
    """A rank at or above a targeted linear's narrower side adds parameters without lowering the rank."""
    widths = [min(d_in, d_out) for d_in, d_out, _ in adapter_linears(block, training.lora_targets or "")]
    if widths and training.lora_rank is not None and training.lora_rank >= min(widths):
        raise PlannerError(f"lora rank {training.lora_rank} must be below {min(widths)}, the narrowest side of a "
                           f"targeted linear ({block.describe()} block, hidden size {block.hidden_size})")


def adapter_parameters(model: ModelSpec, training: Training) -> int:
    """Trainable adapter parameters: r·(d_in + d_out) per adapted linear, over every block (0 for full training)."""
    if training.finetune == "full":
        return 0
    total = 0
    for block, count in model.block_types().items():
        _check_rank(block, training)
        linears = adapter_linears(block, training.lora_targets or "")
        total += count * sum(copies * training.lora_rank * (d_in + d_out) for d_in, d_out, copies in linears)
    if total == 0:
        raise PlannerError(f"lora targets {training.lora_targets} adapt no linear of {model.name} (qv needs separate "
                           f"query and value projections): use attention or all-linear")
    return total


def block_linear_weights(block: BlockSpec) -> int:
    """Weights (no biases) of a block's linears: the mixer's, the MLP's (every expert's) and the further ones."""
    return (sum(d_in * d_out * copies for d_in, d_out, copies in (*_attention_targets(block, "attention"),
                                                                   *_mlp_targets(block)))
            + sum(d_in * d_out for d_in, d_out, _ in block.linears))


def quantized_parameters(model: ModelSpec) -> int:
    """Parameters QLoRA stores in NF4: every block linear's weight (bitsandbytes replaces nn.Linear; embeddings,
    norms, biases and the output head stay 16-bit, transformers' BitsAndBytesConfig skips lm_head)."""
    return sum(count * block_linear_weights(block) for block, count in model.block_types().items())


@cache
def parameter_states(model: ModelSpec, training: Training) -> ParameterStates:
    """The per-parameter accounting of `training` on `model` (once per pair: the search asks per configuration)."""
    if training.finetune == "full":
        return full_parameter_states(training)
    total = model.num_parameters
    trainable = adapter_parameters(model, training) / total
    optimizer = _optimizer_bytes(training)
    if training.finetune == "lora":
        return ParameterStates(trainable, float(PARAM_BYTES), optimizer, training.optimizer_states)
    quantized = quantized_parameters(model)
    frozen = (quantized * NF4_BITS_PER_PARAM / 8 + (total - quantized) * PARAM_BYTES) / total
    return ParameterStates(trainable, frozen, optimizer, training.optimizer_states)
