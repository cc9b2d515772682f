"""`pretrain_gpt.py` flags shared by the Megatron-LM and Megatron-DeepSpeed exports.

Megatron-DeepSpeed is a 2023 fork of Megatron-LM: parallelism, batch and recompute flags are spelled
the same, model flags partly differ (../shared/REFERENCE.md §1, §2; Megatron-DeepSpeed's
megatron/arguments.py). Each rule below decides once what a plan needs and spells it per `Dialect`,
so the two exports cannot drift apart; what a parser has no flag for is returned as a note.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from itertools import groupby

from planner.config import DEFAULT_RECOMPUTE_MODULES, ParallelConfig, Recompute, Training
from planner.errors import PlannerError
from planner.export.launch import Placeholder
from planner.model import BlockSpec, ModelSpec

__all__ = [
    "FULL_RECOMPUTE_LAYERS",
    "Dialect",
    "Flag",
    "FlagGroup",
    "ModelFlags",
    "args_text",
    "bash_array",
    "cuda_connections_line",
    "decoder_blocks",
    "is_hybrid",
    "layer_pattern",
    "model_flags",
    "moe_dispatch_flags",
    "parallel_flags",
    "pretrain_placeholders",
]

Flag = tuple[str, ...]
FlagGroup = tuple[str, tuple[Flag, ...]]  # (title, flags)

# The cost model's "full" recomputes every block: uniform chunks of one layer (also DeepSpeed's
# pipeline activation_checkpoint_interval, which Megatron-DeepSpeed takes from --recompute-num-layers).
FULL_RECOMPUTE_LAYERS = 1
# Megatron-Core's --attention-backend per attention kernel: Transformer Engine's cuDNN fused attention is the native
# kernel ("fused"), its "flash" backend runs the flash-attn package (FlashAttention-2 unless FA3 is installed).
_MEGATRON_ATTENTION_BACKENDS = {"flash": "fused", "flash2": "flash", "unfused": "unfused"}


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
    _require_buildable(model, dialect)
    lm = dialect is Dialect.MEGATRON_LM
    blocks = decoder_blocks(model)
    flags: list[Flag] = [
        ("--num-layers", str(len(blocks))),
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
    elif model.activation == "relu2" and lm:
        flags.append(("--squared-relu",))
    elif model.activation != "gelu":
        unsupported.append(f"{dialect.value} has no {model.activation} MLP activation; the model is built with GELU")
    norm = "RMSNorm" if model.normalization == "rmsnorm" else "LayerNorm"
    flags.append(("--normalization", norm if lm else norm.lower()))
    if model.embedding_norm:
        unsupported.append(f"{dialect.value} has no norm after the token embedding (BLOOM's; bigscience's fork of "
                           "Megatron-DeepSpeed has --embed-layernorm); the model is built without it")
    rope = model.position_embedding == "rope"
    if lm:
        flags.append(("--position-embedding-type", "rope" if rope else "learned_absolute"))
    elif rope:
        flags += [("--use-rotary-position-embeddings",), ("--no-position-embedding",)]
    if rope:
        rope_flags, rope_unsupported = _rope_flags(model, dialect)
        flags += rope_flags
        unsupported += rope_unsupported
    block_flags, block_unsupported = _block_flags(blocks, dialect)
    flags += block_flags
    unsupported += block_unsupported
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
        capacity = training.moe_capacity_factor
        flags += [("--num-experts", experts), ("--moe-router-topk", top_k)] if lm else [
            ("--num-experts", experts), ("--topk", top_k), ("--expert-interval", "1")]
        if capacity is not None:  # tokens over capacity × the mean per expert are dropped
            flags.append(("--moe-expert-capacity-factor" if lm else "--moe-train-capacity-factor", f"{capacity:g}"))
        elif not lm:
            flags.append(("--disable-moe-token-dropping",))
        moe_layers = [int(block.mlp is not None and block.mlp.is_moe) for block in blocks]
        if lm:
            flags += _megatron_moe_flags(model, moe_layers)
        elif model.shared_expert_ffn_hidden_size or not all(moe_layers) or model.is_mla:
            unsupported.append(f"{dialect.value} has no shared experts, dense layers among MoE ones or MLA; the "
                               "model is built without them")
    if lm:
        flags += _megatron_layer_kind_flags(model, blocks)
    flags.append(("--fp16",) if training.dtype == "fp16" else ("--bf16",))
    if training.dtype == "fp8" and lm:
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", training.fp8_recipe)]
    elif training.dtype == "fp8":
        unsupported.append(f"{dialect.value} and DeepSpeed have no fp8 switch; exported as bf16 (fp8 needs "
                           "Transformer Engine)")
    if lm and training.cuda_graphs == "full_iteration":  # core 0.16: the local implementation's whole-iteration
        # scope, which needs the NaN check of loss and gradients off (arguments.py validate_args)
        flags += [("--cuda-graph-impl", "local"), ("--cuda-graph-scope", "full_iteration"),
                  ("--no-check-for-nan-in-loss-and-grad",)]
    if lm and training.cuda_graph_modules:  # core 0.16: Transformer Engine's per-layer graphs of these parts
        flags += [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", *training.cuda_graph_modules)]
    if lm:
        flags.append(("--attention-backend", _MEGATRON_ATTENTION_BACKENDS[training.attention]))
    elif training.attention != "unfused":
        flags.append(("--use-flash-attn-v2",))
    return ModelFlags(tuple(flags), tuple(unsupported))


def decoder_blocks(model: ModelSpec) -> tuple[BlockSpec, ...]:
    """The language model's layers, Megatron's --num-layers: every block but vision, projector and MTP ones."""
    return tuple(block for block in model.blocks if block.role == "decoder")


def is_hybrid(model: ModelSpec) -> bool:
    """Whether the model has Mamba layers (Megatron-LM builds it with pretrain_mamba.py's hybrid stack)."""
    return any(block.mamba is not None for block in model.blocks)


def _runs(bits: list[int]) -> str:
    """Each run of equal values as [v]*n, joined by +."""
    return "+".join(f"[{bit}]*{len(list(run))}" for bit, run in groupby(bits))


def layer_pattern(bits: list[int]) -> str:
    """A 0/1 per layer as the Python list expression that Megatron-LM's --moe-layer-freq and
    --window-attn-skip-freq evaluate (`moe_freq_type`): the shortest of its runs, or a leading period
    repeated, (...)*k, then the runs of the rest (Gemma 3: ([1]*5+[0]*1)*10+[1]*2)."""
    best = _runs(bits)
    for period in range(2, len(bits) // 2 + 1):
        repeats = 1
        while bits[repeats * period:(repeats + 1) * period] == bits[:period]:
            repeats += 1
        rest = bits[repeats * period:]
        candidate = f"({_runs(bits[:period])})*{repeats}" + (f"+{_runs(rest)}" if rest else "")
        if repeats > 1 and len(candidate) < len(best):
            best = candidate
    return best


def _require_buildable(model: ModelSpec, dialect: Dialect) -> None:
    """PlannerError for blocks `dialect`'s language-model pretraining cannot build: a vision encoder and
    projector (both), multi-token prediction and Mamba layers (Megatron-DeepSpeed)."""
    roles = Counter(block.role for block in model.blocks)
    encoder = roles["vision"] + roles["projector"]
    if encoder and not model.token_embedding:
        raise PlannerError(f"model {model.name!r} is an image classifier (ViT: a patch stem and {encoder - 1} encoder "
                           f"blocks, no language model), which {dialect.value}'s pretrain_gpt.py does not build "
                           "(Megatron-LM's pretrain_vision_classify.py does; planner does not export it)")
    if encoder:
        raise PlannerError(
            f"model {model.name!r} has a vision encoder and projector ({encoder} blocks), which {dialect.value}'s "
            "pretrain_gpt.py does not build and Megatron's --pipeline-model-parallel-layout cannot place (no encoder "
            "unit; megatron-core 0.16 raises NotImplementedError for one); Megatron-LM trains LLaVA-style models "
            "with examples/multimodal (vision encoder and projector on the first pipeline stage), which planner does "
            "not export")
    if dialect is Dialect.MEGATRON_LM:
        return
    if roles["mtp"]:
        raise PlannerError(f"model {model.name!r} has {roles['mtp']} multi-token-prediction block(s), which "
                           f"{dialect.value} does not build; export to megatron (--mtp-num-layers)")
    if is_hybrid(model):
        raise PlannerError(f"model {model.name!r} has Mamba layers, which {dialect.value} does not build; export to "
                           "megatron (pretrain_mamba.py)")


def _block_flags(blocks: tuple[BlockSpec, ...], dialect: Dialect) -> tuple[list[Flag], list[str]]:
    """The decoder layers' attention kinds, query/key norms and post-sub-layer norms as `dialect` flags, and what
    it cannot build. Megatron-LM takes one sliding window, for every layer or those a 0/1 pattern marks."""
    lm = dialect is Dialect.MEGATRON_LM
    attention = [block.attention for block in blocks]
    sliding = [int(a is not None and a.kind == "sliding") for a in attention]
    windows = sorted({a.window for a in attention if a is not None and a.kind == "sliding"})
    flags: list[Flag] = []
    unsupported: list[str] = []
    if len(windows) > 1 and lm:
        raise PlannerError(f"{dialect.value} takes one --window-size; the model's sliding windows are "
                           f"{', '.join(map(str, windows))} tokens")
    if windows and lm:
        # (left, right) tokens besides the query's own; HF's sliding_window counts the query too.
        flags.append(("--window-size", f"{windows[0] - 1},0"))
        if not all(sliding):  # 1: sliding window, 0: full attention (or no attention), per layer
            flags.append(("--window-attn-skip-freq", layer_pattern(sliding)))
    elif windows:
        unsupported.append(f"{dialect.value} has no sliding-window attention; the model attends to the whole "
                           f"sequence instead of {' or '.join(map(str, windows))} tokens")
    chunked = sum(1 for a in attention if a is not None and a.kind == "chunked")
    if chunked:
        unsupported.append(f"{dialect.value} has no chunked attention; the model's {chunked} chunked layers attend "
                           "to the whole sequence")
    if any(a is not None and a.qk_norm for a in attention):
        if lm:
            flags.append(("--qk-layernorm",))
        else:
            unsupported.append(f"{dialect.value} has no query/key norm; the model is built without it")
    if any(block.post_norms for block in blocks):
        unsupported.append(f"{dialect.value} has no norm after each sub-layer (Gemma's post-norms); the model is "
                           "built without them")
    return flags, unsupported


def _megatron_layer_kind_flags(model: ModelSpec, blocks: tuple[BlockSpec, ...]) -> list[Flag]:
    """Megatron-LM's multi-token-prediction depth and hybrid (Mamba) layer pattern, with the Mamba-2 mixer's
    shape (TransformerConfig mamba_* fields) and the layer spec pretrain_mamba.py requires."""
    mtp = sum(1 for block in model.blocks if block.role == "mtp")
    flags: list[Flag] = [("--mtp-num-layers", str(mtp))] if mtp else []
    if not is_hybrid(model):
        return flags
    if mtp:
        raise PlannerError(f"model {model.name!r}: Megatron-LM's hybrid (Mamba) model has no multi-token prediction")
    symbols = [block.hybrid_symbol for block in blocks]
    if None in symbols:
        index = symbols.index(None)
        raise PlannerError(f"model {model.name!r}: decoder layer {index} ({blocks[index].describe()}) is not one "
                           "Mamba, attention, MLP or MoE layer, which is all Megatron-LM's hybrid pattern can state")
    mixers = {block.mamba for block in blocks if block.mamba is not None}
    if len(mixers) > 1:
        raise PlannerError(f"model {model.name!r}: Megatron-LM gives every Mamba layer one shape; the model has "
                           f"{len(mixers)}")
    mamba = mixers.pop()
    return [*flags, ("--hybrid-override-pattern", "".join(map(str, symbols))),
            ("--mamba-num-heads", str(mamba.num_heads)), ("--mamba-head-dim", str(mamba.head_dim)),
            ("--mamba-state-dim", str(mamba.state_size)), ("--mamba-num-groups", str(mamba.num_groups)),
            ("--spec", "megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")]


def _megatron_moe_flags(model: ModelSpec, moe_layers: list[int]) -> list[Flag]:
    """Megatron-LM's expert, shared-expert, dense-layer and MLA flags (megatron/training/arguments.py MoE and
    MLA groups), with the grouped GEMM (the plan's dispatcher: `moe_dispatch_flags`). `moe_layers`: 1 per
    MoE decoder layer, 0 per dense one (a hybrid model's pattern says it instead)."""
    flags: list[Flag] = [("--moe-ffn-hidden-size", str(model.expert_ffn_hidden_size)), ("--moe-grouped-gemm",)]
    if model.shared_expert_ffn_hidden_size:
        flags.append(("--moe-shared-expert-intermediate-size", str(model.shared_expert_ffn_hidden_size)))
    if model.moe_router_groups:  # group-limited (DeepSeek-V3's node-limited) routing
        flags += [("--moe-router-num-groups", str(model.moe_router_groups)),
                  ("--moe-router-group-topk", str(model.moe_router_group_topk))]
    if not all(moe_layers) and not is_hybrid(model):
        flags.append(("--moe-layer-freq", layer_pattern(moe_layers)))
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


def moe_dispatch_flags(config: ParallelConfig) -> tuple[Flag, ...]:
    """Megatron-LM's token dispatcher and EP communication overlap for the plan (TransformerConfig's
    moe_token_dispatcher_type and overlap_moe_expert_parallel_comm, flags through core 0.16's
    ArgumentGroupFactory); flex runs its default DeepEP backend (--moe-flex-dispatcher-backend hybridep is the
    one for NVLink domains larger than a node)."""
    flags: list[Flag] = [("--moe-token-dispatcher-type", config.moe_dispatcher)]
    if config.moe_ep_overlap:
        flags.append(("--overlap-moe-expert-parallel-comm",))
    return tuple(flags)


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
        if config.recompute_modules != DEFAULT_RECOMPUTE_MODULES:  # Megatron-LM's list (str+); the default: core_attn
            flags.append(("--recompute-modules", *config.recompute_modules))
    elif config.recompute_num_layers is not None:  # the first N blocks of each model chunk
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                  ("--recompute-num-layers", str(config.recompute_num_layers))]
    elif config.recompute is Recompute.FULL:
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                  ("--recompute-num-layers", str(FULL_RECOMPUTE_LAYERS))]
    if config.cpu_offload_layers:  # Megatron-LM only (the other targets refuse the plan); it sets --cpu-offloading
        flags.append(("--cpu-offloading-num-layers", str(config.cpu_offload_layers)))
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
