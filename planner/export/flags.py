"""`pretrain_gpt.py` flags shared by the Megatron-LM and Megatron-DeepSpeed exports.

Megatron-DeepSpeed is a 2023 fork of Megatron-LM: parallelism, batch and recompute flags are spelled
the same, model flags partly differ (../shared/REFERENCE.md §1, §2; Megatron-DeepSpeed's
megatron/arguments.py). Each rule below decides once what a plan needs and spells it per `Dialect`,
so the two exports cannot drift apart; what a parser has no flag for is returned as a note.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import Enum

from planner.config import ParallelConfig, Recompute, Training
from planner.errors import PlannerError
from planner.export.launch import Placeholder
from planner.model import ModelSpec

__all__ = [
    "FULL_RECOMPUTE_LAYERS",
    "Dialect",
    "Flag",
    "FlagGroup",
    "ModelFlags",
    "args_text",
    "bash_array",
    "cuda_connections_line",
    "model_flags",
    "parallel_flags",
    "pretrain_placeholders",
]

Flag = tuple[str, ...]
FlagGroup = tuple[str, tuple[Flag, ...]]  # (title, flags)

# The cost model's "full" recomputes every block: uniform chunks of one layer (also DeepSpeed's
# pipeline activation_checkpoint_interval, which Megatron-DeepSpeed takes from --recompute-num-layers).
FULL_RECOMPUTE_LAYERS = 1


class Dialect(str, Enum):
    """The `pretrain_gpt.py` argument parser a flag list is written for."""

    MEGATRON_LM = "Megatron-LM"
    MEGATRON_DEEPSPEED = "Megatron-DeepSpeed"


@dataclass(frozen=True)
class ModelFlags:
    """A model and its precision as one parser's flags, plus what that parser cannot express."""

    flags: tuple[Flag, ...]
    unsupported: tuple[str, ...] = ()


def model_flags(model: ModelSpec, training: Training, dialect: Dialect) -> ModelFlags:
    """The model's architecture, precision and attention kernel as `dialect` flags (the one model→flag mapping)."""
    if model.position_embedding == "alibi":
        raise PlannerError(f"model {model.name!r} uses ALiBi position embeddings, which {dialect.value} does not "
                           "implement")
    lm = dialect is Dialect.MEGATRON_LM
    flags: list[Flag] = [
        ("--num-layers", str(model.num_layers)),
        ("--hidden-size", str(model.hidden_size)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)),
        ("--num-attention-heads", str(model.num_attention_heads)),
    ]
    unsupported: list[str] = []
    if model.num_key_value_heads != model.num_attention_heads:
        groups = str(model.num_key_value_heads)
        flags += [("--group-query-attention",), ("--num-query-groups", groups)] if lm else [
            ("--num-key-value-heads", groups)]
    if model.head_dim * model.num_attention_heads != model.hidden_size:
        flags.append(("--kv-channels", str(model.head_dim)))
    flags += [("--seq-length", str(training.seq_len)),
              ("--max-position-embeddings", str(max(training.seq_len, model.max_position_embeddings)))]
    if model.activation == "swiglu":
        flags.append(("--swiglu",))
    norm = "RMSNorm" if model.normalization == "rmsnorm" else "LayerNorm"
    flags.append(("--normalization", norm if lm else norm.lower()))
    rope = model.position_embedding == "rope"
    if lm:
        flags.append(("--position-embedding-type", "rope" if rope else "learned_absolute"))
    elif rope:
        flags += [("--use-rotary-position-embeddings",), ("--no-position-embedding",)]
    if rope:
        rope_flags, rope_unsupported = _rope_flags(model, dialect)
        flags += rope_flags
        unsupported += rope_unsupported
    if model.sliding_window and lm:
        # (left, right) tokens besides the query's own; HF's sliding_window counts the query too.
        flags.append(("--window-size", f"{model.sliding_window - 1},0"))
    elif model.sliding_window:
        unsupported.append(f"{dialect.value} has no sliding-window attention; the model attends to the whole "
                           f"sequence instead of {model.sliding_window} tokens")
    if not model.tie_embeddings:
        flags.append(("--untie-embeddings-and-output-weights",))
    if not model.linear_bias:
        flags.append(("--disable-bias-linear",))
        if model.qkv_bias and lm:
            flags.append(("--add-qkv-bias",))
        elif model.qkv_bias:
            unsupported.append(f"{dialect.value} has no flag for biases on the QKV projection alone; the model is "
                               "built without them (without --disable-bias-linear every linear layer gets one)")
    if not model.dropout:
        flags += [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0")]
    if model.is_moe:
        experts, top_k = str(model.num_experts), str(model.moe_top_k)
        # Megatron-LM routes dropless by default; DeepSpeed's MoE drops over capacity and puts experts
        # in every second layer unless told otherwise.
        flags += [("--num-experts", experts), ("--moe-router-topk", top_k)] if lm else [
            ("--num-experts", experts), ("--topk", top_k), ("--expert-interval", "1"),
            ("--disable-moe-token-dropping",)]
        if lm:
            flags += _megatron_moe_flags(model)
        elif model.shared_expert_ffn_hidden_size or model.first_dense_layers or model.is_mla:
            unsupported.append(f"{dialect.value} has no shared experts, dense first layers or MLA; the model is "
                               "built without them")
    flags.append(("--fp16",) if training.dtype == "fp16" else ("--bf16",))
    if training.dtype == "fp8" and lm:
        flags.append(("--fp8-format", "hybrid"))
    elif training.dtype == "fp8":
        unsupported.append(f"{dialect.value} and DeepSpeed have no fp8 switch; exported as bf16 (fp8 needs "
                           "Transformer Engine)")
    if lm:
        flags.append(("--attention-backend", "flash" if training.attention == "flash" else "unfused"))
    elif training.attention == "flash":
        flags.append(("--use-flash-attn-v2",))
    return ModelFlags(tuple(flags), tuple(unsupported))


def _megatron_moe_flags(model: ModelSpec) -> list[Flag]:
    """Megatron-LM's expert, shared-expert, dense-first-layer and MLA flags (megatron/training/arguments.py
    MoE and MLA groups), with the grouped GEMM and the all-to-all dispatcher the cost model prices."""
    flags: list[Flag] = [("--moe-ffn-hidden-size", str(model.expert_ffn_hidden_size)), ("--moe-grouped-gemm",),
                         ("--moe-token-dispatcher-type", "alltoall")]
    if model.shared_expert_ffn_hidden_size:
        flags.append(("--moe-shared-expert-intermediate-size", str(model.shared_expert_ffn_hidden_size)))
    if model.first_dense_layers:  # a Python list expression: 0 = dense, 1 = MoE per layer
        dense, moe = model.first_dense_layers, model.num_moe_layers
        flags.append(("--moe-layer-freq", f"[0]*{dense}+[1]*{moe}"))
    if model.is_mla:
        flags += [("--multi-latent-attention",), ("--kv-lora-rank", str(model.kv_lora_rank)),
                  ("--qk-head-dim", str(model.head_dim)), ("--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)),
                  ("--v-head-dim", str(model.value_head_dim))]
        if model.q_lora_rank:
            flags.append(("--q-lora-rank", str(model.q_lora_rank)))
    return flags


def _rope_flags(model: ModelSpec, dialect: Dialect) -> tuple[list[Flag], list[str]]:
    """RoPE base and scaling as `dialect` flags (both parsers take the base as an integer), and what it cannot set."""
    lm = dialect is Dialect.MEGATRON_LM
    if model.rope_theta != int(model.rope_theta):
        raise PlannerError(f"model {model.name!r}: rope_theta {model.rope_theta} is not an integer, which "
                           f"{dialect.value}'s parser requires")
    flags: list[Flag] = [("--rotary-base" if lm else "--rotary-position-embeddings-theta", str(int(model.rope_theta)))]
    factor = model.rope_scaling_factor
    if model.rope_scaling is None:
        return flags, []
    if lm and model.rope_scaling == "llama3":
        return [*flags, ("--use-rope-scaling",), ("--rope-scaling-factor", f"{factor:g}")], []
    if lm and model.rope_scaling == "linear" and factor == int(factor):
        return [*flags, ("--rotary-seq-len-interpolation-factor", str(int(factor)))], []
    return flags, [f"{dialect.value} has no flag for {model.rope_scaling!r} RoPE scaling (factor {factor:g}); "
                   "the model is built without it"]


def parallel_flags(config: ParallelConfig, global_batch: int, split: tuple[Flag, ...] = ()) -> tuple[Flag, ...]:
    """Degrees, the stage split, batch and recompute: the flags both parsers spell alike."""
    flags: list[Flag] = [("--tensor-model-parallel-size", str(config.tp)),
                         ("--pipeline-model-parallel-size", str(config.pp))]
    if config.sequence_parallel:
        flags.append(("--sequence-parallel",))
    flags += split
    flags += [("--micro-batch-size", str(config.micro_batch)), ("--global-batch-size", str(global_batch))]
    if config.recompute is Recompute.SELECTIVE:
        flags.append(("--recompute-granularity", "selective"))
    elif config.recompute is Recompute.FULL:
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                  ("--recompute-num-layers", str(FULL_RECOMPUTE_LAYERS))]
    return tuple(flags)


def cuda_connections_line(config: ParallelConfig) -> str | None:
    """The export Megatron-LM asserts with TP or CP > 1 (Megatron-DeepSpeed with sequence parallelism); FSDP
    (ZeRO-2/3) asserts the opposite, so it runs without it."""
    if (config.tp > 1 or config.cp > 1) and config.zero_stage < 2:
        return "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts it with TP>1 or CP>1 (pre-Blackwell)"
    return None


def pretrain_placeholders(model: ModelSpec) -> tuple[Placeholder, ...]:
    """Data, tokenizer and checkpoint flags of `pretrain_gpt.py` that only the user can name (no mock data)."""
    return (Placeholder("DATA_ARGS", "data and tokenizer flags, e.g. --data-path /data/corpus_text_document "
                        "--tokenizer-type HuggingFaceTokenizer --tokenizer-model /models/tokenizer (a tokenizer "
                        f"of {model.vocab_size} entries)"),
            Placeholder("CHECKPOINT_ARGS", "e.g. --save /ckpt/run --load /ckpt/run --save-interval 1000 "
                        "(CHECKPOINT_ARGS= to train without checkpoints)", may_be_empty=True))


def _shell(flag: Flag, verbatim: dict[str, str]) -> str:
    return " ".join(verbatim.get(token, shlex.quote(token)) for token in flag)


def args_text(groups: tuple[FlagGroup, ...], header: list[str]) -> str:
    """An args file: header comments, then each group's title and its flags, one per line."""
    lines = [f"# {line}" for line in header]
    for title, flags in groups:
        lines.append(f"# {title}")
        lines += [_shell(flag, {}) for flag in flags]
    return "\n".join(lines) + "\n"


def bash_array(name: str, groups: tuple[FlagGroup, ...], verbatim: dict[str, str] | None = None) -> list[str]:
    """Lines defining a bash array of the flags; tokens in `verbatim` are written as the given shell text."""
    lines = [f"{name}=("]
    for title, flags in groups:
        lines.append(f"  # {title}")
        lines += ["  " + _shell(flag, verbatim or {}) for flag in flags]
    return [*lines, ")"]
