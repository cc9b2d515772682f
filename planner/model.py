"""Model architecture (`ModelSpec`), its partitionable units, the model catalog and HF config import.

A model is a sequence of units that pipeline stages take contiguously: the embedding, one unit
per block, and the head (final norm + output projection + loss). A block is typed (`BlockSpec`): its
attention kind (full, bidirectional, sliding window, chunked), MLP or MoE, Mamba-2 mixer, width and token
count, so costs can be kept per block type. Parameter counts are exact (they reproduce the published
counts of Llama 3, Mixtral, DeepSeek-V3, Gemma 3, Nemotron-H, LLaVA and Narayanan et al. eq. 2).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from enum import Enum
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.limits import MAX_LAYERS, MAX_MODEL_WIDTH, MAX_SEQ_LEN, name_problem
from planner.resources import load_structured_file, profiles_dir

__all__ = [
    "AttentionSpec",
    "BlockSpec",
    "MambaSpec",
    "MlpSpec",
    "ModelSpec",
    "Unit",
    "UnitKind",
    "catalog_model_names",
    "load_model",
    "model_from_hf_config",
]


class UnitKind(str, Enum):
    """What a partitionable unit is."""

    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"


ATTENTION_KINDS = ("full", "bidirectional", "sliding", "chunked")
WINDOWED_ATTENTION = ("sliding", "chunked")
ACTIVATIONS = ("swiglu", "geglu", "gelu", "relu2")
GATED_ACTIVATIONS = ("swiglu", "geglu")  # three MLP matrices (gate, up, down); the others have two
NORMALIZATIONS = ("rmsnorm", "layernorm")
BLOCK_ROLES = ("decoder", "vision", "projector", "mtp")
_FIELD_LIMITS = {"num_layers": MAX_LAYERS, "max_position_embeddings": MAX_SEQ_LEN, "tokens": MAX_SEQ_LEN,
                 "extra_parameters": MAX_MODEL_WIDTH**2}


def _check_fields(spec: Any, where: str) -> None:
    """Every scalar field has its annotated type (a bool is no integer, a float is finite and positive) and
    every count lies in 1..its limit (planner.limits), so a bad model file fails here in one line, not later.
    Nested specs and tuples are checked by their own types."""
    for item in fields(spec):
        value, kind = getattr(spec, item.name), str(item.type)
        if value is None and "None" in kind:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind.startswith("int"):
            limit = _FIELD_LIMITS.get(item.name, MAX_MODEL_WIDTH)
            ok, allowed = number and isinstance(value, int) and 1 <= value <= limit, f"an integer in 1..{limit:,}"
        elif kind.startswith("float"):
            ok, allowed = number and math.isfinite(value) and value > 0, "a finite positive number"
        elif kind.startswith("bool"):
            ok, allowed = isinstance(value, bool), "true or false"
        elif kind.startswith("str"):
            ok, allowed = isinstance(value, str), "a string"
        else:
            continue
        if not ok:
            raise PlannerError(f"{where}: {item.name} must be {allowed}, got {value!r}")


def _check_router_groups(experts: int, groups: int | None, picked: int | None, where: str) -> None:
    """Group-limited routing needs both settings, the groups dividing the routed experts and at most all picked."""
    if (groups is None) != (picked is None) or (groups and picked and (experts % groups or picked > groups)):
        raise PlannerError(f"{where}: group-limited routing needs router groups dividing the {experts} routed "
                           f"experts and 1 <= group top-k <= groups, got {groups} groups and top-{picked}")


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise PlannerError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def _mlp_parameters(hidden: int, ffn: int, matrices: int, bias: bool) -> int:
    """Parameters of one MLP (dense, one expert or the shared experts) of intermediate size `ffn`."""
    return matrices * hidden * ffn + (((matrices - 1) * ffn + hidden) if bias else 0)


def norm_tensor_sizes(hidden: int, normalization: str) -> tuple[int, ...]:
    """Elements of one norm's parameter tensors: a weight, and a bias for LayerNorm."""
    return (hidden, hidden) if normalization == "layernorm" else (hidden,)


@dataclass(frozen=True)
class AttentionSpec:
    """One block's attention. ``kind``: full (causal), bidirectional (an encoder's, no mask), sliding (a query
    sees the ``window`` most recent tokens, itself included, as HF's ``sliding_window`` counts) or chunked (a
    query sees the earlier tokens of its own ``window``-token chunk: Llama 4's ``attention_chunk_size``).
    ``kv_lora_rank`` switches to multi-head latent attention (MLA, DeepSeek-V2/V3): queries through a
    ``q_lora_rank`` bottleneck (None: a full projection), keys and values through a ``kv_lora_rank`` latent,
    per head ``head_dim`` (no-RoPE part) + ``qk_rope_head_dim`` for queries and keys, ``v_head_dim`` for values.
    ``rope`` says whether queries and keys are rotated (Llama 4's NoPE layers are not)."""

    kind: str
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    window: int | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each query and key head (Qwen3, Gemma 3)
    rope: bool = True
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None

    def __post_init__(self) -> None:
        _check_fields(self, "attention")
        _one_of(self.kind, ATTENTION_KINDS, "attention kind")
        if (self.kind in WINDOWED_ATTENTION) != (self.window is not None):
            raise PlannerError(f"attention kind {self.kind!r} " + (
                "needs a window (tokens per query window or chunk)" if self.window is None else
                f"takes no window (got {self.window}); windows belong to {' and '.join(WINDOWED_ATTENTION)}"))
        kv = self.num_key_value_heads
        if self.num_attention_heads % kv:
            raise PlannerError(f"num_key_value_heads {kv} must divide num_attention_heads {self.num_attention_heads}")
        if self.is_mla and (self.qk_rope_head_dim is None or self.v_head_dim is None):
            raise PlannerError("MLA (kv_lora_rank set) needs qk_rope_head_dim and v_head_dim")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: head_dim, plus the decoupled RoPE part under MLA."""
        return self.head_dim + (self.qk_rope_head_dim or 0)

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def query_width(self) -> int:
        """Width of the query projection output (heads × query/key head width)."""
        return self.num_attention_heads * self.qk_head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def value_width(self) -> int:
        """Width of the attention output that the output projection reads (heads × value head width)."""
        return self.num_attention_heads * self.value_head_dim

    def linears(self, hidden: int) -> tuple[tuple[int, int], ...]:
        """(input, output) width of every attention weight matrix, in execution order. MHA/GQA: QKV and
        the output projection. MLA (DeepSeek-V3 §2.1.1): query down / up (or one query projection), the
        joint KV down projection (latent + shared RoPE key), the KV up projection, the output projection."""
        h, heads = hidden, self.num_attention_heads
        if not self.is_mla:
            return (h, self.query_width + 2 * self.kv_width), (self.query_width, h)
        query = ((h, self.q_lora_rank), (self.q_lora_rank, self.query_width)) if self.q_lora_rank else (
            (h, self.query_width),)
        return (*query, (h, self.kv_lora_rank + self.qk_rope_head_dim),
                (self.kv_lora_rank, heads * (self.head_dim + self.value_head_dim)), (self.value_width, h))

    def parameters(self, hidden: int) -> int:
        weights = sum(a * b for a, b in self.linears(hidden))
        if self.is_mla:  # RMSNorms on the query and KV latents
            return weights + (self.q_lora_rank or 0) + self.kv_lora_rank
        bias = 2 * self.head_dim if self.qk_norm else 0
        if self.qkv_bias:
            bias += self.query_width + 2 * self.kv_width
        if self.out_bias:
            bias += hidden
        return weights + bias

    def tensor_sizes(self, hidden: int) -> tuple[int, ...]:
        """Elements of each parameter tensor, Megatron-LM's layout (one fused QKV weight and bias)."""
        weights = tuple(a * b for a, b in self.linears(hidden))
        if self.is_mla:
            return weights + tuple(rank for rank in (self.q_lora_rank, self.kv_lora_rank) if rank)
        norms = (self.head_dim, self.head_dim) if self.qk_norm else ()
        qkv_bias = (self.query_width + 2 * self.kv_width,) if self.qkv_bias else ()
        return weights + norms + qkv_bias + ((hidden,) if self.out_bias else ())

    def keys_per_query(self, seq_len: int, causal_halving: bool = False) -> float:
        """Mean keys a query attends to in a sequence of `seq_len` tokens. Unhalved (the MFU convention) a
        causal mask counts its whole span (s; a window's or chunk's width when narrower); halved, the causal
        mean: s/2 full, c/2 per chunk, w − w²/(2s) for a window of w < s (a query at position p sees min(p, w))."""
        s = seq_len
        if self.kind == "bidirectional":
            return float(s)
        span = s if self.kind == "full" or self.window >= s else self.window
        if not causal_halving:
            return float(span)
        if self.kind == "sliding" and span < s:
            return span - span * span / (2 * s)
        return 0.5 * span


@dataclass(frozen=True)
class MlpSpec:
    """One block's MLP: dense of ``ffn_hidden_size``, or (``num_experts`` > 1) MoE of routed experts of
    ``ffn_hidden_size`` each, ``moe_top_k`` per token, a router, and an always-active shared MLP of
    ``shared_expert_ffn_hidden_size`` (all shared experts together, Megatron-LM's
    ``--moe-shared-expert-intermediate-size``). ``activation``: swiglu / geglu (gated, three matrices) or
    gelu / relu2 (squared ReLU, Nemotron-H; two matrices). ``bias`` adds biases to the dense or shared MLP
    (GPT-2/3, vision towers); ``moe_bias`` to every expert linear and the router (GPT-OSS).
    ``activation_clamp``: the gated activation clamps its gate input to at most, and its linear input to within ±,
    this value (GPT-OSS: 7.0, HF ``swiglu_limit``, Megatron-Core ``activation_func_clamp_value``); None: no clamp."""

    ffn_hidden_size: int
    activation: str = "swiglu"
    bias: bool = False
    num_experts: int = 1
    moe_top_k: int = 1
    shared_expert_ffn_hidden_size: int | None = None
    moe_bias: bool = False
    router_groups: int | None = None  # group-limited routing, see ModelSpec.moe_router_groups
    router_group_topk: int | None = None
    activation_clamp: float | None = None

    def __post_init__(self) -> None:
        _check_fields(self, "mlp")
        _one_of(self.activation, ACTIVATIONS, "activation")
        if not 1 <= self.moe_top_k <= self.num_experts:
            raise PlannerError(f"need 1 <= moe_top_k ({self.moe_top_k}) <= num_experts ({self.num_experts})")
        _check_router_groups(self.num_experts, self.router_groups, self.router_group_topk, "mlp")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def matrices(self) -> int:
        """Weight matrices of size h × ffn per expert: 3 gated (gate, up, down), 2 otherwise."""
        return 3 if self.gated else 2

    def expert_parameters(self, hidden: int) -> int:
        """Parameters of one routed expert's MLP (the whole MLP when dense)."""
        return _mlp_parameters(hidden, self.ffn_hidden_size, self.matrices, self.bias or self.moe_bias)

    def router_parameters(self, hidden: int) -> int:
        return (hidden + (1 if self.moe_bias else 0)) * self.num_experts if self.is_moe else 0

    def shared_expert_parameters(self, hidden: int) -> int:
        size = self.shared_expert_ffn_hidden_size
        return _mlp_parameters(hidden, size, self.matrices, self.bias) if size and self.is_moe else 0

    def routed_parameters(self, hidden: int) -> int:
        """All routed experts' parameters (sharded over EP and ETP, not TP); 0 for a dense MLP."""
        return self.num_experts * self.expert_parameters(hidden) if self.is_moe else 0

    def parameters(self, hidden: int, active: bool = False) -> int:
        """The MLP's parameters; `active`: only the top-k routed experts a token runs through."""
        if not self.is_moe:
            return self.expert_parameters(hidden)
        experts = self.moe_top_k if active else self.num_experts
        return (experts * self.expert_parameters(hidden) + self.router_parameters(hidden)
                + self.shared_expert_parameters(hidden))

    def tensor_sizes(self, hidden: int) -> tuple[int, ...]:
        """Elements of each parameter tensor: per MLP (each expert, the shared one) a fused input weight
        (gate and up together when gated, as Megatron-LM's fc1) and an output weight, with their biases;
        the router's weight and bias."""
        def mlp(ffn: int, bias: bool) -> tuple[int, ...]:
            width = (self.matrices - 1) * ffn
            return (hidden * width, ffn * hidden) + ((width, hidden) if bias else ())
        if not self.is_moe:
            return mlp(self.ffn_hidden_size, self.bias)
        shared = self.shared_expert_ffn_hidden_size
        return (mlp(self.ffn_hidden_size, self.bias or self.moe_bias) * self.num_experts
                + (hidden * self.num_experts,) + ((self.num_experts,) if self.moe_bias else ())
                + (mlp(shared, self.bias) if shared else ()))


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba-2 mixer (Dao & Gu 2024): ``num_heads`` SSM heads of ``head_dim`` channels (inner width
    heads × head_dim), a ``state_size`` state per head, B and C shared by each of ``num_groups`` head groups,
    a depthwise causal conv1d of ``conv_kernel`` taps, scanned by the chunked SSD algorithm in chunks of
    ``chunk_size`` tokens. Parameters (HF NemotronH / mamba_ssm Mamba2): in_proj h → (z, x, B, C, dt),
    conv1d, A_log, D and dt_bias per head, the gated RMSNorm over the inner width, out_proj inner → h."""

    num_heads: int
    head_dim: int
    state_size: int
    num_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 256
    bias: bool = False
    conv_bias: bool = True

    def __post_init__(self) -> None:
        _check_fields(self, "mamba")
        if self.num_heads % self.num_groups:
            raise PlannerError(f"mamba num_groups {self.num_groups} must divide num_heads {self.num_heads}")

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """Channels the conv1d runs over: x, B and C."""
        return self.inner_size + 2 * self.num_groups * self.state_size

    @property
    def in_proj_width(self) -> int:
        """in_proj output: z and x (inner each), B and C (groups × state each), dt (one per head)."""
        return 2 * self.inner_size + 2 * self.num_groups * self.state_size + self.num_heads

    def linears(self, hidden: int) -> tuple[tuple[int, int], ...]:
        return (hidden, self.in_proj_width), (self.inner_size, hidden)

    def parameters(self, hidden: int) -> int:
        weights = sum(a * b for a, b in self.linears(hidden))
        bias = self.in_proj_width + hidden if self.bias else 0
        conv = self.conv_channels * (self.conv_kernel + (1 if self.conv_bias else 0))
        return weights + bias + conv + 3 * self.num_heads + self.inner_size

    def tensor_sizes(self, hidden: int) -> tuple[int, ...]:
        """Elements of each parameter tensor: in/out projections (and biases), the convolution (and its
        bias), A_log, D, dt_bias and the gated norm."""
        biases = (self.in_proj_width, hidden) if self.bias else ()
        conv_bias = (self.conv_channels,) if self.conv_bias else ()
        return (tuple(a * b for a, b in self.linears(hidden)) + biases
                + (self.conv_channels * self.conv_kernel,) + conv_bias + (self.num_heads,) * 3 + (self.inner_size,))


@dataclass(frozen=True)
class BlockSpec:
    """One partitionable block's shape and type; equal blocks are one type, so costs can be keyed by it.

    A mixer (``attention`` or ``mamba``, at most one) and/or an ``mlp``, each behind a pre-norm with a residual
    (``post_norms``: Gemma 2/3's extra norm after each), at width ``hidden_size`` over ``tokens`` tokens per
    sample (None: the training sequence; a vision encoder: its patches). ``linears`` are further per-token
    linear layers (input, output, bias) that run whole on every rank: a vision stem's patch embedding, a
    projector, DeepSeek-V3's MTP input projection; ``extra_parameters`` their non-linear parameters (position
    and class embeddings, extra norms). ``output_head`` gives the block its own output projection and loss
    (DeepSeek-V3's multi-token prediction; weights shared with the model's head). ``role`` names what the
    block is for (decoder, vision, projector, mtp): frameworks place and split vision encoders, projectors
    and MTP layers by their own rules (e.g. Megatron-LM's --encoder-tensor-model-parallel-size, MTP on the
    last pipeline stage)."""

    hidden_size: int
    attention: AttentionSpec | None = None
    mamba: MambaSpec | None = None
    mlp: MlpSpec | None = None
    normalization: str = "rmsnorm"
    post_norms: bool = False
    dropout: bool = False
    tokens: int | None = None
    role: str = "decoder"
    linears: tuple[tuple[int, int, bool], ...] = ()
    extra_parameters: int | None = None
    output_head: bool = False

    def __post_init__(self) -> None:
        _check_fields(self, "layer")
        _one_of(self.normalization, NORMALIZATIONS, "normalization")
        _one_of(self.role, BLOCK_ROLES, "role")
        if self.attention is not None and self.mamba is not None:
            raise PlannerError("a layer has one mixer: attention or mamba, not both")
        if not (self.attention or self.mamba or self.mlp or self.linears):
            raise PlannerError("a layer needs attention, mamba, an mlp or linears")
        for linear in self.linears:
            ok = (isinstance(linear, tuple) and len(linear) == 3 and isinstance(linear[2], bool)
                  and all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_MODEL_WIDTH
                          for n in linear[:2]))
            if not ok:
                raise PlannerError(f"layer linears entries must be [inputs, outputs, bias], got {linear!r}")
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, item.name) for item in fields(self))))

    def __hash__(self) -> int:
        """Hashed once: block types key the cost model's tables, looked up per unit and configuration."""
        return self._hash

    @property
    def sublayers(self) -> int:
        """Residual sub-layers (mixer, MLP), each with its own pre-norm."""
        return (self.attention is not None or self.mamba is not None) + (self.mlp is not None)

    @property
    def norm_parameters(self) -> int:
        """Parameters of the block's norms (LayerNorm has a bias)."""
        per_norm = 2 * self.hidden_size if self.normalization == "layernorm" else self.hidden_size
        return self.sublayers * (2 if self.post_norms else 1) * per_norm

    @property
    def mixer_linears(self) -> tuple[tuple[int, int], ...]:
        """(input, output) width of the mixer's weight matrices: attention's or Mamba's; () without a mixer."""
        mixer = self.attention or self.mamba
        return mixer.linears(self.hidden_size) if mixer else ()

    def parameters(self, active: bool = False) -> int:
        """Parameters of the block; `active`: with only the top-k routed experts a token runs through."""
        h = self.hidden_size
        mixer = self.attention or self.mamba
        return ((mixer.parameters(h) if mixer else 0) + (self.mlp.parameters(h, active) if self.mlp else 0)
                + self.norm_parameters + self.linear_parameters() + (self.extra_parameters or 0))

    def linear_parameters(self) -> int:
        """Parameters (weights and biases) of the block's further `linears`."""
        return sum(a * b + (b if bias else 0) for a, b, bias in self.linears)

    def separate_matmuls(self) -> tuple[tuple[int, int, bool], ...] | None:
        """(input width, output width, row-parallel) of each matrix multiply the block runs in forward order with
        its projections unfused, as torchtitan's and HF's Llama-style blocks do (wq, wk, wv, wo, then w1, w3, w2;
        w1, w2 when not gated); None for blocks outside that family (MLA, Mamba, MoE, further linears)."""
        a, mlp = self.attention, self.mlp
        if a is None or a.is_mla or self.mamba or self.linears or (mlp is not None and mlp.is_moe):
            return None
        h = self.hidden_size
        attention = ((h, a.query_width, False), (h, a.kv_width, False), (h, a.kv_width, False),
                     (a.value_width, h, True))
        if mlp is None:
            return attention
        ffn = mlp.ffn_hidden_size
        return attention + ((h, ffn, False),) * (mlp.matrices - 1) + ((ffn, h, True),)

    def linear_weight_parameters(self) -> int:
        """Parameters of the block's linear-layer weight matrices (attention or Mamba projections, MLP and expert
        matrices, further linears; no biases, norms or router): what FP8 training runs in FP8 and can gather
        in FP8."""
        h = self.hidden_size
        mixer = sum(a * b for a, b in self.mixer_linears)
        mlp = 0
        if self.mlp is not None:
            shared = self.mlp.shared_expert_ffn_hidden_size if self.mlp.is_moe else None
            experts = self.mlp.num_experts if self.mlp.is_moe else 1
            mlp = self.mlp.matrices * h * (experts * self.mlp.ffn_hidden_size + (shared or 0))
        return mixer + mlp + sum(a * b for a, b, _ in self.linears)

    def tensor_sizes(self) -> tuple[int, ...]:
        """Elements of each parameter tensor of the block (what a framework that gathers or reduces tensor by
        tensor issues one collective for); they add up to `parameters()`."""
        h = self.hidden_size
        norms = self.sublayers * (2 if self.post_norms else 1) * norm_tensor_sizes(h, self.normalization)
        mixer = self.attention or self.mamba
        linears = tuple(size for a, b, bias in self.linears for size in ((a * b, b) if bias else (a * b,)))
        return (norms + (mixer.tensor_sizes(h) if mixer else ()) + (self.mlp.tensor_sizes(h) if self.mlp else ())
                + linears + ((self.extra_parameters,) if self.extra_parameters else ()))

    def routed_expert_parameters(self) -> int:
        return self.mlp.routed_parameters(self.hidden_size) if self.mlp else 0

    def describe(self) -> str:
        """A short name of the block type, e.g. 'sliding(1024)+dense', 'mamba', 'vision full+dense'."""
        if self.attention:
            mixer = self.attention.kind + (f"({self.attention.window})" if self.attention.window else "")
        else:
            mixer = "mamba" if self.mamba else ""
        mlp = ("moe" if self.mlp.is_moe else "dense") if self.mlp else ""
        body = "+".join(part for part in (mixer, mlp) if part) or "linears"
        return body if self.role == "decoder" else f"{self.role} {body}"

    @property
    def hybrid_symbol(self) -> str | None:
        """The block as one letter of a hybrid layer pattern (HF Nemotron-H's and Megatron-LM's
        hybrid_override_pattern): M Mamba-2, * attention, - MLP, E MoE; None when it has several of them."""
        parts = [self.mamba and "M", self.attention and "*", self.mlp and ("E" if self.mlp.is_moe else "-")]
        present = [part for part in parts if part]
        return present[0] if len(present) == 1 and not self.linears else None


@dataclass(frozen=True)
class Unit:
    """One partitionable piece of the model; blocks carry their index among the blocks and their type."""

    kind: UnitKind
    index: int = 0
    num_parameters: int = 0
    block: BlockSpec | None = None

    @property
    def cost_key(self) -> UnitKind | BlockSpec:
        """What the cost model keys this unit's cost by: a block's type, an end's kind."""
        return self.kind if self.block is None else self.block


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, or any stack of typed blocks. Dimensions are per the whole model (before
    any parallelism).

    The scalar fields describe a uniform model: ``num_layers`` blocks of MHA/GQA/MLA attention (a
    ``sliding_window`` when set) and a dense MLP of ``ffn_hidden_size``, or MoE blocks (``num_experts`` routed
    experts of ``moe_ffn_hidden_size``, default ``ffn_hidden_size``, see `MlpSpec`) after the first
    ``first_dense_layers`` dense ones (DeepSeek-V3: 3). ``layers`` states the blocks one by one instead
    (`BlockSpec`: each with its own attention kind, MLP, Mamba mixer, width and token count); the scalar
    fields are then the defaults the model file's layers inherit, and ``num_layers`` is the number of blocks,
    all roles included. DeepSeek-V3's multi-token-prediction module is not in the catalog entry (its
    published 671B excludes it). ``dropout`` says whether training applies hidden/attention dropout
    (GPT-3-era runs did; Llama-era runs do not), which decides whether dropout masks are kept as activations.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    activation: str = "swiglu"  # see ACTIVATIONS
    normalization: str = "rmsnorm"  # "rmsnorm" | "layernorm"
    position_embedding: str = "rope"  # "rope" | "learned" | "alibi" (ALiBi has no parameters)
    tie_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False  # biases on every linear layer and norm (GPT-2/3, NeoX)
    num_experts: int = 1
    moe_top_k: int = 1
    moe_ffn_hidden_size: int | None = None
    shared_expert_ffn_hidden_size: int | None = None
    first_dense_layers: int | None = None
    moe_bias: bool = False
    # group-limited routing (DeepSeek-V3's node-limited routing; HF n_group / topk_group, Megatron-Core
    # --moe-router-num-groups / --moe-router-group-topk): the routed experts form `moe_router_groups` equal
    # groups and a token picks its experts inside at most `moe_router_group_topk` of them
    moe_router_groups: int | None = None
    moe_router_group_topk: int | None = None
    activation_clamp: float | None = None  # see MlpSpec.activation_clamp
    qk_norm: bool = False  # RMSNorm over each query and key head (Qwen3)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    dropout: bool = False
    rope_theta: float = 10000.0  # RoPE base (HF rope_theta): Llama 3's 500000 changes the model, not its cost
    rope_scaling: str | None = None  # HF rope_scaling type: "llama3" (Llama 3.1), "linear", "yarn", …; None: none
    rope_scaling_factor: float = 1.0
    sliding_window: int | None = None  # tokens a query attends to (Mistral 7B v0.1: 4096); None: full causal
    # False: the model reads no tokens (a ViT: its first block is the patch-embedding stem); the embedding unit then
    # holds no parameters and does no work, and `vocab_size` is what the head predicts (a ViT's classes)
    token_embedding: bool = True
    # a norm right after the token embedding (BLOOM's word_embeddings_layernorm; Megatron-DeepSpeed's
    # --embed-layernorm): its parameters sit with the embedding, and it keeps its 16-bit input for backward
    embedding_norm: bool = False
    layers: tuple[BlockSpec, ...] | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if why := name_problem(self.name):
            raise PlannerError(f"model name {why}" + (f" ({self.source})" if self.source else ""))
        where = f"model {self.name!r}" + (f" ({self.source})" if self.source else "")
        _check_fields(self, where)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise PlannerError(
                    f"model {self.name!r}: hidden_size {self.hidden_size} is not divisible by "
                    f"num_attention_heads {self.num_attention_heads}; give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        kv = self.num_key_value_heads
        if kv < 1 or self.num_attention_heads % kv:
            raise PlannerError(
                f"model {self.name!r}: num_key_value_heads {kv} must divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        checks = {
            "activation": ACTIVATIONS,
            "normalization": NORMALIZATIONS,
            "position_embedding": ("rope", "learned", "alibi"),
        }
        for name, allowed in checks.items():
            if getattr(self, name) not in allowed:
                raise PlannerError(f"model {self.name!r}: {name} must be one of {', '.join(allowed)}")
        if self.num_experts < 1 or not 1 <= self.moe_top_k <= self.num_experts:
            raise PlannerError(
                f"model {self.name!r}: need 1 <= moe_top_k ({self.moe_top_k}) <= num_experts ({self.num_experts})"
            )
        _check_router_groups(self.num_experts, self.moe_router_groups, self.moe_router_group_topk,
                             f"model {self.name!r}")
        if (self.first_dense_layers or 0) >= self.num_layers and self.num_experts > 1 and self.layers is None:
            raise PlannerError(f"model {self.name!r}: first_dense_layers ({self.first_dense_layers}) must be "
                               f"below num_layers ({self.num_layers}) for an MoE model")
        if self.is_mla and (self.qk_rope_head_dim is None or self.v_head_dim is None):
            raise PlannerError(f"model {self.name!r}: MLA (kv_lora_rank set) needs qk_rope_head_dim and v_head_dim")
        if self.layers is not None and (not isinstance(self.layers, tuple) or len(self.layers) != self.num_layers
                                        or not all(isinstance(b, BlockSpec) for b in self.layers)):
            raise PlannerError(f"{where}: layers must be a tuple of num_layers ({self.num_layers}) BlockSpecs")

    # ---- the blocks ----------------------------------------------------------------------
    @cached_property
    def attention_spec(self) -> AttentionSpec:
        """The attention the scalar fields describe (every block's in a uniform model)."""
        return AttentionSpec(
            "sliding" if self.sliding_window else "full", self.num_attention_heads, self.num_key_value_heads,
            self.head_dim, self.sliding_window, self.qkv_bias or self.linear_bias, self.linear_bias, self.qk_norm,
            self.position_embedding == "rope", self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim,
            self.v_head_dim)

    def mlp_spec(self, moe: bool) -> MlpSpec:
        """The dense MLP, or (`moe`) the MoE layer, that the scalar fields describe."""
        if not moe:
            return MlpSpec(self.ffn_hidden_size, self.activation, self.linear_bias,
                           activation_clamp=self.activation_clamp)
        return MlpSpec(self.expert_ffn_hidden_size, self.activation, self.linear_bias, self.num_experts,
                       self.moe_top_k, self.shared_expert_ffn_hidden_size, self.moe_bias, self.moe_router_groups,
                       self.moe_router_group_topk, self.activation_clamp)

    def block_spec(self, moe: bool) -> BlockSpec:
        """A block of the scalar fields' attention and dense (or MoE) MLP."""
        return BlockSpec(self.hidden_size, self.attention_spec, mlp=self.mlp_spec(moe),
                         normalization=self.normalization, dropout=self.dropout)

    @cached_property
    def blocks(self) -> tuple[BlockSpec, ...]:
        """Every block in order: `layers`, or the uniform (dense-then-MoE) stack of the scalar fields."""
        if self.layers is not None:
            return self.layers
        dense = self.block_spec(moe=False)
        if self.num_experts == 1:
            return (dense,) * self.num_layers
        first = self.first_dense_layers or 0
        return (dense,) * first + (self.block_spec(moe=True),) * (self.num_layers - first)

    def block_types(self) -> dict[BlockSpec, int]:
        """Each distinct block type and how many blocks have it, in order of first appearance."""
        return dict(self._block_type_counts)

    @cached_property
    def _block_type_counts(self) -> tuple[tuple[BlockSpec, int], ...]:
        """Counted once per model: the search asks for every configuration."""
        return tuple(Counter(self.blocks).items())

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_moe_layers > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @cached_property
    def num_moe_layers(self) -> int:
        """Blocks with routed experts (all but the first dense ones); 0 for a dense model."""
        return sum(1 for block in self.blocks if block.mlp is not None and block.mlp.is_moe)

    @cached_property
    def layer_kind_counts(self) -> tuple[int, int, int]:
        """(blocks with routed experts, blocks with a dense MLP, blocks with a Mamba mixer): the layer parts
        Megatron-Core's per-layer CUDA graphs capture apart (Training.cuda_graph_modules)."""
        dense = sum(1 for block in self.blocks if block.mlp is not None and not block.mlp.is_moe)
        return self.num_moe_layers, dense, sum(1 for block in self.blocks if block.mamba is not None)

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: head_dim, plus the decoupled RoPE part under MLA."""
        return self.attention_spec.qk_head_dim

    @property
    def value_head_dim(self) -> int:
        return self.attention_spec.value_head_dim

    @property
    def query_width(self) -> int:
        """Width of the query projection output (heads × query/key head width)."""
        return self.attention_spec.query_width

    @property
    def kv_width(self) -> int:
        return self.attention_spec.kv_width

    @property
    def value_width(self) -> int:
        """Width of the attention output that the output projection reads (heads × value head width)."""
        return self.attention_spec.value_width

    @property
    def norm_parameters(self) -> int:
        """Parameters of one norm layer (LayerNorm has a bias)."""
        return 2 * self.hidden_size if self.normalization == "layernorm" else self.hidden_size

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of size h × ffn per expert: 3 gated (SwiGLU, GeGLU: gate, up, down), 2 otherwise."""
        return 3 if self.activation in GATED_ACTIVATIONS else 2

    def attention_linears(self) -> tuple[tuple[int, int], ...]:
        """See `AttentionSpec.linears`."""
        return self.attention_spec.linears(self.hidden_size)

    def attention_parameters(self) -> int:
        return self.attention_spec.parameters(self.hidden_size)

    def mlp_parameters(self, ffn: int, bias: bool) -> int:
        """Parameters of one MLP (a dense one, an expert or the shared experts) of intermediate size `ffn`."""
        return _mlp_parameters(self.hidden_size, ffn, self.mlp_matrices, bias)

    def expert_parameters(self) -> int:
        """Parameters of one routed expert's MLP (the whole MLP for a dense model)."""
        return self.mlp_spec(moe=True).expert_parameters(self.hidden_size)

    def router_parameters(self) -> int:
        return (self.hidden_size + (1 if self.moe_bias else 0)) * self.num_experts

    def shared_expert_parameters(self) -> int:
        return self.mlp_spec(moe=True).shared_expert_parameters(self.hidden_size)

    def dense_block_parameters(self) -> int:
        """A block with a dense MLP of `ffn_hidden_size`."""
        return self.block_spec(moe=False).parameters()

    def moe_block_parameters(self, active: bool = False) -> int:
        """A block with routed experts (only the top-k of them when `active`), router and shared experts."""
        return self.block_spec(moe=True).parameters(active)

    @cached_property
    def _block_parameter_sum(self) -> int:
        return sum(count * block.parameters() for block, count in self.block_types().items())

    def block_parameters(self) -> float:
        """Parameters of the mean block: the per-kind cost model treats all blocks alike, so dense first
        layers (DeepSeek-V3's 3 of 61) are averaged into every block; the total stays exact."""
        return self._block_parameter_sum / self.num_layers

    def expert_fraction(self) -> float:
        """Share of the mean block's parameters in routed experts (sharded over EP and ETP, not TP)."""
        routed = sum(count * block.routed_expert_parameters() for block, count in self.block_types().items())
        return routed / (self.num_layers * self.block_parameters())

    def padded_vocab_size(self, tp: int, divisible_by: int = 128) -> int:
        """Vocabulary padded as Megatron-LM pads it (`--make-vocab-size-divisible-by 128`, times tp),
        so every TP shard of the logits GEMM has an aligned width."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def head_tokens(self, seq_len: float) -> float:
        """Tokens per sample the head and its loss read: every one of a language model's `seq_len`, a classifier's
        (no token embedding: a ViT) class token alone."""
        return seq_len if self.token_embedding else 1

    def embedding_parameters(self) -> int:
        return sum(self.embedding_tensor_sizes())

    def head_parameters(self) -> int:
        """Final norm plus the output projection (zero extra when tied to the embedding)."""
        return sum(self.head_tensor_sizes())

    def embedding_tensor_sizes(self) -> tuple[int, ...]:
        """Elements of the embedding's parameter tensors (word, learned positions, the embedding norm; none without
        a token embedding, e.g. a ViT's, whose stem is a block)."""
        if not self.token_embedding:
            return ()
        positions = self.max_position_embeddings * self.hidden_size
        norm = norm_tensor_sizes(self.hidden_size, self.normalization) if self.embedding_norm else ()
        return ((self.vocab_size * self.hidden_size,) + ((positions,) if self.position_embedding == "learned" else ())
                + norm)

    def head_tensor_sizes(self) -> tuple[int, ...]:
        """Elements of the head's parameter tensors (final norm, untied output weight)."""
        output = () if self.tie_embeddings else (self.vocab_size * self.hidden_size,)
        return norm_tensor_sizes(self.hidden_size, self.normalization) + output

    @property
    def num_parameters(self) -> int:
        """Unique parameters (a tied output matrix counts once)."""
        return self.embedding_parameters() + self._block_parameter_sum + self.head_parameters()

    @property
    def active_parameters(self) -> int:
        """Parameters one token runs through (top-k routed experts), embedding and head included."""
        blocks = sum(count * block.parameters(active=True) for block, count in self.block_types().items())
        return self.embedding_parameters() + blocks + self.head_parameters()

    def units(self) -> tuple[Unit, ...]:
        """Embedding, every block in order (with its type), then the head."""
        params = {block: block.parameters() for block in self.block_types()}
        return (
            Unit(UnitKind.EMBEDDING, 0, self.embedding_parameters()),
            *(Unit(UnitKind.BLOCK, i, params[block], block) for i, block in enumerate(self.blocks)),
            Unit(UnitKind.HEAD, 0, self.head_parameters()),
        )

    @cached_property
    def unit_cost_keys(self) -> tuple[UnitKind | BlockSpec, ...]:
        """`Unit.cost_key` of every unit in order, once per model (the cost model looks them up per plan)."""
        return tuple(unit.cost_key for unit in self.units())

    def to_dict(self) -> dict[str, Any]:
        """The fields a planner model file holds (also the plan JSON's model section, plus counts);
        `layers` written out block by block (consecutive equal blocks as one entry with a repeat)."""
        data = {item.name: getattr(self, item.name) for item in fields(self) if item.name not in ("source", "layers")}
        if self.layers is not None:
            data["layers"] = [{"repeat": count, **_block_to_dict(block)} for block, count in _runs(self.layers)]
        return data


def _runs(blocks: tuple[BlockSpec, ...]) -> list[tuple[BlockSpec, int]]:
    """Consecutive equal blocks as (block, count)."""
    runs: list[tuple[BlockSpec, int]] = []
    for block in blocks:
        if runs and runs[-1][0] == block:
            runs[-1] = (block, runs[-1][1] + 1)
        else:
            runs.append((block, 1))
    return runs


def _block_to_dict(block: BlockSpec) -> dict[str, Any]:
    """A block as a model file's layer entry, every field explicit (nothing inherited)."""
    data: dict[str, Any] = {item.name: getattr(block, item.name) for item in fields(block)}
    data["attention"] = asdict(block.attention) if block.attention else "none"
    data["mlp"] = {"kind": "moe" if block.mlp.is_moe else "dense", **asdict(block.mlp)} if block.mlp else "none"
    data["linears"] = [list(linear) for linear in block.linears]
    if block.mamba is not None:
        data["mamba"] = asdict(block.mamba)
    return {key: value for key, value in data.items() if value is not None and value != []}


# ---- catalog and file loading ----------------------------------------------------------------

_MODEL_FIELDS = set(ModelSpec.__dataclass_fields__) - {"source"}
_REQUIRED_FIELDS = {"name", "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size"}
_LAYER_KEYS = set(BlockSpec.__dataclass_fields__) | {"type", "repeat"}


def model_from_dict(data: dict[str, Any], source: str) -> ModelSpec:
    """Build a ModelSpec from a planner model document (catalog entry or user file). With `layers` the
    document states the blocks (see README, "Models"); `num_layers` may then be left out."""
    unknown = set(data) - _MODEL_FIELDS - {"block_types"}
    if unknown:
        raise PlannerError(f"{source}: unknown model field(s) {', '.join(sorted(unknown))}")
    missing = _REQUIRED_FIELDS - {"num_layers" if "layers" in data else ""} - set(data)
    if missing:
        raise PlannerError(f"{source}: model is missing {', '.join(sorted(missing))}")
    if "block_types" in data and "layers" not in data:
        raise PlannerError(f"{source}: block_types needs layers that use them")
    scalars = {key: value for key, value in data.items() if key not in ("layers", "block_types")}
    try:
        if "layers" not in data:
            return ModelSpec(**scalars, source=source)
        flat = _expand_layers(data["layers"], _block_types(data.get("block_types"), source), "layers", source)
        if scalars.setdefault("num_layers", len(flat)) != len(flat):
            raise PlannerError(f"{source}: num_layers is {scalars['num_layers']} but layers give {len(flat)} blocks")
        base = ModelSpec(**scalars, source=source)
        return replace(base, layers=tuple(_block_from_entry(entry, base, at, source) for at, entry in flat))
    except TypeError as exc:
        raise PlannerError(f"{source}: {exc}") from None


def _block_types(types: Any, source: str) -> dict[str, dict[str, Any]]:
    if types is None:
        return {}
    if not isinstance(types, dict) or not all(isinstance(value, dict) for value in types.values()):
        raise PlannerError(f"{source}: block_types must map each type name to a mapping of layer keys")
    return types


def _expand_layers(entries: Any, types: dict[str, dict[str, Any]], where: str,
                   source: str) -> list[tuple[str, dict[str, Any]]]:
    """The layer entries with repeats and groups unrolled, each as (its place in the file, its keys).
    An entry is a block-type name, a mapping of layer keys (optionally `type` and `repeat`), or a group
    `{repeat: n, layers: [...]}`."""
    if not isinstance(entries, list) or not entries:
        raise PlannerError(f"{source}: {where} must be a non-empty list of layer entries")
    flat: list[tuple[str, dict[str, Any]]] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if isinstance(entry, str):
            entry = {"type": entry}
        if not isinstance(entry, dict):
            raise PlannerError(f"{source}: {at} must be a block-type name or a mapping, got {entry!r}")
        repeat = entry.get("repeat", 1)
        if not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= MAX_LAYERS:
            raise PlannerError(f"{source}: {at}: repeat must be an integer in 1..{MAX_LAYERS:,}, got {repeat!r}")
        if "layers" in entry:
            extra = set(entry) - {"repeat", "layers"}
            if extra:
                raise PlannerError(f"{source}: {at}: a group takes only repeat and layers, not "
                                   f"{', '.join(sorted(extra))}")
            inner = _expand_layers(entry["layers"], types, f"{at}.layers", source)
        else:
            keys = {key: value for key, value in entry.items() if key != "repeat"}
            if "type" in keys:
                name = keys.pop("type")
                if name not in types:
                    raise PlannerError(f"{source}: {at}: unknown block type {name!r}; block_types defines "
                                       f"{', '.join(map(str, types)) or 'none'}")
                keys = {**types[name], **keys}
            inner = [(at, keys)]
        if len(flat) + repeat * len(inner) > MAX_LAYERS:
            raise PlannerError(f"{source}: {at}: repeats give more than {MAX_LAYERS:,} layers")
        flat.extend(inner * repeat)
    return flat


def _block_from_entry(entry: dict[str, Any], base: ModelSpec, at: str, source: str) -> BlockSpec:
    """One layer entry as a BlockSpec; what it leaves out it inherits from the model's scalar fields."""
    unknown = set(entry) - _LAYER_KEYS
    if unknown:
        raise PlannerError(f"{source}: {at}: unknown layer key(s) {', '.join(sorted(unknown))}; allowed: "
                           f"{', '.join(sorted(_LAYER_KEYS - {'type', 'repeat'}))}")
    try:
        hidden = entry.get("hidden_size", base.hidden_size)
        mamba = _spec_from(MambaSpec, entry["mamba"], None, "mamba") if "mamba" in entry else None
        attention = _attention_from(entry.get("attention", "none" if mamba else base.attention_spec), base, hidden)
        mlp = _mlp_from(entry.get("mlp", "moe" if base.num_experts > 1 else "dense"), base)
        linears = entry.get("linears", [])
        if not isinstance(linears, list) or not all(isinstance(x, list) and len(x) in (2, 3) for x in linears):
            raise PlannerError("linears must be a list of [inputs, outputs] or [inputs, outputs, bias]")
        return BlockSpec(
            hidden, attention, mamba, mlp, entry.get("normalization", base.normalization),
            entry.get("post_norms", False), entry.get("dropout", base.dropout), entry.get("tokens"),
            entry.get("role", "decoder"), tuple((x[0], x[1], x[2] if len(x) == 3 else False) for x in linears),
            entry.get("extra_parameters"), entry.get("output_head", False))
    except PlannerError as exc:
        raise PlannerError(f"{source}: {at}: {exc}") from None


def _spec_from(cls: type, value: Any, template: Any, what: str) -> Any:
    """`cls` from a mapping of its fields (over `template` when given), naming unknown or missing keys."""
    if not isinstance(value, dict):
        raise PlannerError(f"{what} must be a mapping of {', '.join(cls.__dataclass_fields__)}, got {value!r}")
    unknown = set(value) - set(cls.__dataclass_fields__)
    if unknown:
        raise PlannerError(f"unknown {what} key(s) {', '.join(sorted(unknown))}; allowed: "
                           f"{', '.join(cls.__dataclass_fields__)}")
    if template is not None:
        return replace(template, **value)
    required = [f.name for f in fields(cls) if f.default is MISSING]
    absent = [name for name in required if name not in value]
    if absent:
        raise PlannerError(f"{what} is missing {', '.join(absent)}")
    return cls(**value)


def _attention_from(value: Any, base: ModelSpec, hidden: int) -> AttentionSpec | None:
    """`none`, a kind name, a mapping of AttentionSpec fields (over the model's attention), or the model's
    attention itself. A block of another width than the model's derives head_dim from its own heads."""
    if isinstance(value, AttentionSpec) or value == "none":
        return value if isinstance(value, AttentionSpec) else None
    keys = {"kind": value} if isinstance(value, str) else value
    if not isinstance(keys, dict):
        raise PlannerError(f"attention must be none, one of {', '.join(ATTENTION_KINDS)} or a mapping, "
                           f"got {value!r}")
    keys = dict(keys)
    kind = keys.setdefault("kind", base.attention_spec.kind)
    if not isinstance(kind, str):
        raise PlannerError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
    if kind not in WINDOWED_ATTENTION or base.attention_spec.kind != kind:
        keys.setdefault("window", None)
    if hidden != base.hidden_size and "head_dim" not in keys:
        heads = keys.get("num_attention_heads", base.num_attention_heads)
        if not isinstance(heads, int) or hidden % heads:
            raise PlannerError(f"hidden_size {hidden} is not divisible by num_attention_heads {heads!r}; "
                               "give head_dim")
        keys["head_dim"] = hidden // heads
        keys.setdefault("num_key_value_heads", heads)
    return _spec_from(AttentionSpec, keys, base.attention_spec, "attention")


def _mlp_from(value: Any, base: ModelSpec) -> MlpSpec | None:
    """`none`, `dense`, `moe` (the model's dense MLP or MoE layer) or a mapping of MlpSpec fields over one
    of them (`kind`: dense or moe, default moe when it sets num_experts)."""
    if value == "none":
        return None
    keys = {"kind": value} if isinstance(value, str) else value
    if not isinstance(keys, dict):
        raise PlannerError(f"mlp must be none, dense, moe or a mapping, got {value!r}")
    keys = dict(keys)
    kind = keys.pop("kind", "moe" if keys.get("num_experts", 1) != 1 else "dense")
    _one_of(kind, ("dense", "moe"), "mlp kind")
    mlp = _spec_from(MlpSpec, keys, base.mlp_spec(kind == "moe"), "mlp")
    if mlp.is_moe != (kind == "moe"):
        raise PlannerError(f"mlp kind {kind} " + ("needs num_experts > 1 (in the mlp or the model)" if kind == "moe"
                                                  else f"takes no experts (num_experts {mlp.num_experts})"))
    return mlp


@cache
def _catalog() -> dict[str, dict[str, Any]]:
    document = load_structured_file(profiles_dir() / "models.yaml")
    return {entry["name"]: entry for entry in document["models"]}


def catalog_model_names() -> list[str]:
    return list(_catalog())


def _optional_int(config: dict[str, Any], key: str, path: Path) -> int | None:
    """`config[key]` when it is a positive integer, None when absent or null."""
    return None if config.get(key) is None else _require_int(config, key, path)


def _flag(config: dict[str, Any], key: str, default: bool, path: Path) -> bool:
    """`config[key]` as a JSON true/false (the string "false" is not true), `default` when absent or null."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PlannerError(f"{path}: '{key}' must be true or false, got {value!r:.40}")
    return value


def _require_int(config: dict[str, Any], key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlannerError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return value


_HF_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3",
                  "gpt_oss")
_HF_HETEROGENEOUS = ("gemma2", "gemma3", "gemma3_text", "llama4", "llama4_text", "nemotron_h", "llava")
_HF_SUPPORTED = (*_HF_LLAMA_LIKE, "gpt2", "gpt_neox", *_HF_HETEROGENEOUS)


def model_from_hf_config(config: dict[str, Any], path: Path, name: str | None = None) -> ModelSpec:
    """Translate a Hugging Face ``config.json`` (already parsed) into a ModelSpec, offline."""
    model_type = config.get("model_type")
    if model_type not in _HF_SUPPORTED:
        raise PlannerError(
            f"{path}: model_type {model_type!r} is not supported; supported: {', '.join(_HF_SUPPORTED)}"
        )
    name = name or config.get("_name_or_path") or path.parent.name or model_type
    if model_type in _HF_HETEROGENEOUS:
        return _HF_IMPORTERS[model_type](config, path, name)
    if model_type == "gpt2":
        hidden = _require_int(config, "n_embd", path)
        return ModelSpec(
            name=name,
            num_layers=_require_int(config, "n_layer", path),
            hidden_size=hidden,
            num_attention_heads=_require_int(config, "n_head", path),
            ffn_hidden_size=config.get("n_inner") or 4 * hidden,
            vocab_size=_require_int(config, "vocab_size", path),
            max_position_embeddings=_require_int(config, "n_positions", path),
            activation="gelu",
            normalization="layernorm",
            position_embedding="learned",
            tie_embeddings=config.get("tie_word_embeddings", True),
            linear_bias=True,
            dropout=bool(config.get("resid_pdrop", 0.1) or config.get("attn_pdrop", 0.1)),
            source=str(path),
        )
    if model_type == "gpt_neox":
        return ModelSpec(
            name=name,
            num_layers=_require_int(config, "num_hidden_layers", path),
            hidden_size=_require_int(config, "hidden_size", path),
            num_attention_heads=_require_int(config, "num_attention_heads", path),
            ffn_hidden_size=_require_int(config, "intermediate_size", path),
            vocab_size=_require_int(config, "vocab_size", path),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            activation="gelu",
            normalization="layernorm",
            position_embedding="rope",
            rope_theta=float(config.get("rotary_emb_base", config.get("rope_theta", 10000.0))),
            tie_embeddings=config.get("tie_word_embeddings", False),
            linear_bias=True,
            dropout=bool(config.get("hidden_dropout", 0.0) or config.get("attention_dropout", 0.0)),
            source=str(path),
        )
    heads = _require_int(config, "num_attention_heads", path)
    model = ModelSpec(
        name=name,
        num_layers=_require_int(config, "num_hidden_layers", path),
        hidden_size=_require_int(config, "hidden_size", path),
        num_attention_heads=heads,
        num_key_value_heads=_optional_int(config, "num_key_value_heads", path) or heads,
        head_dim=config.get("qk_nope_head_dim") or config.get("head_dim"),
        ffn_hidden_size=_require_int(config, "intermediate_size", path),
        vocab_size=_require_int(config, "vocab_size", path),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_embeddings=_flag(config, "tie_word_embeddings", False, path),
        qkv_bias=model_type.startswith("qwen2") or _flag(config, "attention_bias", False, path),
        qk_norm=model_type.startswith("qwen3"),
        dropout=bool(config.get("attention_dropout", 0.0)),
        **_hf_moe(config, path),
        **_hf_mla(config, path),
        **_hf_rope_and_window(config),
        source=str(path),
    )
    model = _with_layer_windows(model, config, path)
    mtp = config.get("num_nextn_predict_layers") or 0
    if not mtp:
        return model
    count = _require_int(config, "num_nextn_predict_layers", path)
    if count > MAX_LAYERS - model.num_layers:
        raise PlannerError(f"{path}: num_nextn_predict_layers {count:,} would take the model past {MAX_LAYERS:,} "
                           f"blocks")
    return _with_mtp(model, count)


def _with_layer_windows(model: ModelSpec, config: dict[str, Any], path: Path) -> ModelSpec:
    """A llama-like model whose `layer_types` mix "sliding_attention" and "full_attention" layers (GPT-OSS
    alternates 128-token windows with full attention), stated layer by layer; unchanged without such a list."""
    kinds = _hf_layer_flags(config, "layer_types", model.num_layers, path)
    if not kinds or "full_attention" not in kinds or "sliding_attention" not in kinds:
        return model
    window = _require_int(config, "sliding_window", path)
    return replace(model, layers=tuple(
        replace(block, attention=replace(block.attention, kind="sliding", window=window))
        if kind == "sliding_attention" else block for block, kind in zip(model.blocks, kinds, strict=True)))


def _with_mtp(model: ModelSpec, count: int) -> ModelSpec:
    """DeepSeek-V3's multi-token-prediction modules as blocks after the last one (§2.2 of its report): each
    an MoE block over the hidden state joined with the next token's embedding (the input projection 2h → h,
    after an RMSNorm on each, enorm and hnorm), its own final norm and output projection and loss. Training
    shares the embedding and the output matrix with the main model, so those are not counted again (the
    checkpoint's 14B MTP weights include copies of both); the published 671B excludes the MTP modules."""
    h = model.hidden_size
    mtp = replace(model.block_spec(moe=model.num_experts > 1), role="mtp", linears=((2 * h, h, False),),
                  extra_parameters=3 * model.norm_parameters, output_head=True)
    blocks = (*model.blocks, *(mtp,) * count)
    return replace(model, num_layers=len(blocks), layers=blocks)


def _hf_moe(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """Routed and shared experts and dense first layers of an HF config (Mixtral / GPT-OSS
    `num_local_experts`, Qwen `num_experts`, DeepSeek `n_routed_experts`); {} for a dense model."""
    experts = next((_require_int(config, key, path) for key in ("num_local_experts", "num_experts", "n_routed_experts")
                    if config.get(key) is not None), 1)
    if experts == 1:
        return {}
    expert_ffn = _optional_int(config, "moe_intermediate_size", path)
    shared = _optional_int(config, "shared_expert_intermediate_size", path)
    if config.get("n_shared_experts"):
        shared = _require_int(config, "n_shared_experts", path) * (expert_ffn or _require_int(
            config, "intermediate_size", path))
    return {
        "num_experts": experts,
        "moe_top_k": _require_int(config, "num_experts_per_tok", path),
        "moe_ffn_hidden_size": expert_ffn,
        "shared_expert_ffn_hidden_size": shared,
        "first_dense_layers": config.get("first_k_dense_replace") or None,
        "moe_bias": config.get("model_type") == "gpt_oss",
        "activation_clamp": _hf_activation_clamp(config),
        **_hf_router_groups(config, path),
    }


def _hf_activation_clamp(config: dict[str, Any]) -> float | None:
    """GPT-OSS's clamp of its gated activation's inputs (HF GptOssConfig `swiglu_limit`, checked as ModelSpec checks
    its fields); None for other models."""
    return config.get("swiglu_limit") if config.get("model_type") == "gpt_oss" else None


def _hf_router_groups(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """Group-limited routing of an HF MoE config (`n_group` groups, `topk_group` per token); {} when ungrouped."""
    if (config.get("n_group") or 1) == 1:
        return {}
    return {"moe_router_groups": _require_int(config, "n_group", path),
            "moe_router_group_topk": _require_int(config, "topk_group", path)}


def _hf_mla(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """DeepSeek-V3's multi-head latent attention dimensions; {} without `kv_lora_rank`."""
    if config.get("kv_lora_rank") is None:
        return {}
    return {key: _optional_int(config, key, path) for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                                                              "v_head_dim")}


def _hf_rope_and_window(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling and the sliding window of a llama-like HF config (Qwen2 sets a window it never uses)."""
    scaling = config.get("rope_scaling") or {}
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    if "full_attention" in (config.get("layer_types") or ()):  # GPT-OSS alternates windowed and full layers
        window = None
    return {
        "rope_theta": float(config.get("rope_theta", 10000.0)),
        "rope_scaling": scaling.get("rope_type") or scaling.get("type") if scaling else None,
        "rope_scaling_factor": float(scaling.get("factor", 1.0)) if scaling else 1.0,
        "sliding_window": window or None,
    }


def _hf_text_config(config: dict[str, Any], path: Path, wrapper: str) -> dict[str, Any]:
    """The language model's config: `text_config` of a multimodal `wrapper` config, else the config itself."""
    if config.get("model_type") != wrapper:
        return config
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise PlannerError(f"{path}: a {wrapper} config needs a text_config mapping")
    return text


_LAYER_TYPES = ("full_attention", "sliding_attention")  # HF `layer_types` entries planner costs


def _hf_layer_flags(config: dict[str, Any], key: str, layers: int, path: Path) -> list[Any] | None:
    """A per-layer list (HF `layer_types`, `no_rope_layers`) checked to have one entry per layer, `layer_types`'
    entries among _LAYER_TYPES (another kind would be costed as full attention); None if absent."""
    values = config.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != layers:
        raise PlannerError(f"{path}: '{key}' must list one entry per layer ({layers}), got {values!r:.80}")
    odd = next((value for value in values if key == "layer_types" and value not in _LAYER_TYPES), None)
    if odd is not None:
        raise PlannerError(f"{path}: layer_types entries must be among {', '.join(_LAYER_TYPES)}, got {odd!r:.40}")
    return values


def _hf_gemma(config: dict[str, Any], path: Path, name: str) -> ModelSpec:
    """Gemma 2 and Gemma 3 text models: GeGLU MLP (gated, gelu_pytorch_tanh), a norm before and after each
    sub-layer, tied embeddings, sliding-window layers of `sliding_window` tokens interleaved with global ones
    (`layer_types`; else Gemma 2 alternates from a sliding first layer and Gemma 3 makes every
    `sliding_window_pattern`-th layer global, default 6). Gemma 3 adds per-head query/key RMSNorms. A
    `gemma3` config's SigLIP vision tower and projector (0.42B of Gemma-3-27B's 27.4B) are not imported.
    Attention soft-capping and `query_pre_attn_scalar` change no shape or cost."""
    gemma3 = config["model_type"] != "gemma2"
    text = _hf_text_config(config, path, "gemma3")
    layers = _require_int(text, "num_hidden_layers", path)
    heads = _require_int(text, "num_attention_heads", path)
    base = ModelSpec(
        name=name, num_layers=layers, hidden_size=_require_int(text, "hidden_size", path),
        num_attention_heads=heads, ffn_hidden_size=_require_int(text, "intermediate_size", path),
        # Gemma3TextConfig's default vocabulary: the published gemma-3 configs leave it out
        vocab_size=_require_int({"vocab_size": 262_208, **text}, "vocab_size", path) if gemma3 else _require_int(
            text, "vocab_size", path),
        num_key_value_heads=_optional_int(text, "num_key_value_heads", path) or heads,
        head_dim=_optional_int(text, "head_dim", path), max_position_embeddings=text.get("max_position_embeddings",
                                                                                          8192),
        activation="geglu", tie_embeddings=_flag(text, "tie_word_embeddings", True, path),
        qkv_bias=_flag(text, "attention_bias", False, path), qk_norm=gemma3,
        rope_theta=float(text.get("rope_theta", 10000.0)), source=str(path))
    window = _require_int(text, "sliding_window", path)
    kinds = _hf_layer_flags(text, "layer_types", layers, path)
    if kinds is not None:
        sliding = [kind == "sliding_attention" for kind in kinds]
    elif gemma3:
        pattern = _require_int({"sliding_window_pattern": 6, **text}, "sliding_window_pattern", path)
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    else:
        sliding = [i % 2 == 0 for i in range(layers)]
    full = replace(base.block_spec(moe=False), post_norms=True)
    local = replace(full, attention=replace(full.attention, kind="sliding", window=window))
    return replace(base, layers=tuple(local if s else full for s in sliding))


def _hf_llama4(config: dict[str, Any], path: Path, name: str) -> ModelSpec:
    """Llama 4's language model: MoE blocks (`num_local_experts` experts of `intermediate_size`, top
    `num_experts_per_tok`, one shared expert of the same size) on every `interleave_moe_layer_step`-th layer
    (or the listed `moe_layers`), dense MLPs of `intermediate_size_mlp` elsewhere; RoPE layers attend within
    chunks of `attention_chunk_size` tokens, the NoPE layers (`no_rope_layers` entry 0; default every 4th)
    attend globally. Its L2 query/key norm has no parameters. A `llama4` config's vision tower is not imported."""
    text = _hf_text_config(config, path, "llama4")
    layers = _require_int(text, "num_hidden_layers", path)
    heads = _require_int(text, "num_attention_heads", path)
    expert_ffn = _require_int(text, "intermediate_size", path)
    base = ModelSpec(
        name=name, num_layers=layers, hidden_size=_require_int(text, "hidden_size", path),
        num_attention_heads=heads, ffn_hidden_size=_require_int(text, "intermediate_size_mlp", path),
        vocab_size=_require_int(text, "vocab_size", path),
        num_key_value_heads=_optional_int(text, "num_key_value_heads", path) or heads,
        head_dim=_optional_int(text, "head_dim", path), max_position_embeddings=text.get("max_position_embeddings",
                                                                                          8192),
        tie_embeddings=_flag(text, "tie_word_embeddings", False, path),
        num_experts=_require_int(text, "num_local_experts", path),
        moe_top_k=_require_int(text, "num_experts_per_tok", path), moe_ffn_hidden_size=expert_ffn,
        shared_expert_ffn_hidden_size=expert_ffn, **_hf_rope_and_window(text), source=str(path))
    step = _require_int({"interleave_moe_layer_step": 1, **text}, "interleave_moe_layer_step", path)
    moe_layers = set(text.get("moe_layers") or range(step - 1, layers, step))
    rope = _hf_layer_flags(text, "no_rope_layers", layers, path) or [int((i + 1) % 4 != 0) for i in range(layers)]
    chunk = _optional_int(text, "attention_chunk_size", path)
    blocks = []
    for i in range(layers):
        block = base.block_spec(moe=i in moe_layers)
        global_attention = replace(block.attention, kind="full", window=None, rope=bool(rope[i]))
        attention = replace(block.attention, kind="chunked", window=chunk) if rope[i] and chunk else global_attention
        blocks.append(replace(block, attention=attention))
    return replace(base, layers=tuple(blocks))


_NEMOTRON_H_LAYERS = {"M": "a Mamba-2 layer", "*": "an attention layer", "-": "an MLP layer", "E": "an MoE layer"}


def _hf_nemotron_h(config: dict[str, Any], path: Path, name: str) -> ModelSpec:
    """Nemotron-H and Nemotron 3: one layer per character of `hybrid_override_pattern` (M Mamba-2, * attention,
    - MLP, E MoE), each a pre-norm and its residual; squared-ReLU MLPs (`mlp_hidden_act` relu2); Mamba-2 mixers
    of `mamba_num_heads` heads of `mamba_head_dim`, `ssm_state_size`, `n_groups`, `conv_kernel`, SSD chunks of
    `chunk_size`. MoE layers (Nemotron 3): `n_routed_experts` squared-ReLU experts of `moe_intermediate_size`,
    `num_experts_per_tok` per token, and a shared expert of `moe_shared_expert_intermediate_size` (all shared
    experts together, as Megatron-Bridge's NemotronH bridge passes it to --moe-shared-expert-intermediate-size);
    the sigmoid router's correction bias is a buffer, not a parameter, and `n_group` > 1 limits routing to groups."""
    layers = _require_int(config, "num_hidden_layers", path)
    pattern = config.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - set(_NEMOTRON_H_LAYERS):
        raise PlannerError(f"{path}: 'hybrid_override_pattern' must have one character per layer ({layers}), each "
                           f"one of {', '.join(f'{c} ({what})' for c, what in _NEMOTRON_H_LAYERS.items())}; "
                           f"got {pattern!r}")
    heads = _require_int(config, "num_attention_heads", path)
    activation = config.get("mlp_hidden_act", "relu2")
    moe = _hf_nemotron_h_moe(config, path) if "E" in pattern else {}
    base = ModelSpec(
        name=name, num_layers=layers, hidden_size=_require_int(config, "hidden_size", path),
        num_attention_heads=heads, ffn_hidden_size=_require_int(config, "intermediate_size", path),
        vocab_size=_require_int(config, "vocab_size", path),
        num_key_value_heads=_optional_int(config, "num_key_value_heads", path) or heads,
        head_dim=_optional_int(config, "head_dim", path) or _optional_int(config, "attention_head_dim", path),
        max_position_embeddings=config.get("max_position_embeddings", 8192),
        activation=activation if activation in ACTIVATIONS else "relu2",
        tie_embeddings=_flag(config, "tie_word_embeddings", False, path),
        qkv_bias=_flag(config, "attention_bias", False, path), rope_theta=float(config.get("rope_theta", 10000.0)),
        **moe, source=str(path))
    mamba = MambaSpec(
        _require_int(config, "mamba_num_heads", path), _require_int(config, "mamba_head_dim", path),
        _require_int(config, "ssm_state_size", path), _require_int({"n_groups": 1, **config}, "n_groups", path),
        _require_int({"conv_kernel": 4, **config}, "conv_kernel", path),
        _require_int({"chunk_size": 256, **config}, "chunk_size", path), bool(config.get("use_bias", False)),
        bool(config.get("use_conv_bias", True)))
    mlp = replace(base.mlp_spec(moe=False), bias=bool(config.get("mlp_bias", False)))
    kinds = {"M": BlockSpec(base.hidden_size, mamba=mamba), "*": BlockSpec(base.hidden_size, base.attention_spec),
             "-": BlockSpec(base.hidden_size, mlp=mlp)}
    if moe:
        kinds["E"] = BlockSpec(base.hidden_size, mlp=base.mlp_spec(moe=True))
    return replace(base, layers=tuple(kinds[c] for c in pattern))


def _hf_nemotron_h_moe(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The ModelSpec MoE fields of a Nemotron 3 config (its E layers)."""
    shared = _optional_int(config, "moe_shared_expert_intermediate_size", path)
    return {
        "num_experts": _require_int(config, "n_routed_experts", path),
        "moe_top_k": _require_int(config, "num_experts_per_tok", path),
        "moe_ffn_hidden_size": _require_int(config, "moe_intermediate_size", path),
        "shared_expert_ffn_hidden_size": shared if (config.get("n_shared_experts") or 0) > 0 else None,
        **_hf_router_groups(config, path),
    }


def _hf_llava(config: dict[str, Any], path: Path, name: str) -> ModelSpec:
    """LLaVA(-1.5): a CLIP ViT over (image_size / patch_size)² patches plus a class token (pre-norm LayerNorm
    blocks, bidirectional attention, quick-GELU MLP, biases everywhere), a two-layer GELU projector from the
    patch features to the language model's width, then the language model (`text_config`, a llama-like type).
    The ViT's stem (patch embedding, class and position embeddings, pre- and post-LayerNorm) is a block of
    its own; every ViT layer is costed, though LLaVA reads the second-to-last one's output."""
    vision, text = config.get("vision_config"), config.get("text_config")
    if not isinstance(vision, dict) or not isinstance(text, dict):
        raise PlannerError(f"{path}: a llava config needs vision_config and text_config mappings")
    if text.get("model_type", "llama") not in _HF_LLAMA_LIKE:
        raise PlannerError(f"{path}: llava text_config model_type {text.get('model_type')!r} is not one of "
                           f"{', '.join(_HF_LLAMA_LIKE)}")
    language = model_from_hf_config({"model_type": "llama", **text}, path, name)
    width, heads = _require_int(vision, "hidden_size", path), _require_int(vision, "num_attention_heads", path)
    if width % heads:
        raise PlannerError(f"{path}: vision hidden_size {width} is not divisible by num_attention_heads {heads}")
    patch = _require_int(vision, "patch_size", path)
    patches = (_require_int(vision, "image_size", path) // patch) ** 2
    channels = _require_int({"num_channels": 3, **vision}, "num_channels", path)
    attention = AttentionSpec("bidirectional", heads, heads, width // heads, qkv_bias=True, out_bias=True, rope=False)
    layer = BlockSpec(width, attention, mlp=MlpSpec(_require_int(vision, "intermediate_size", path), "gelu", True),
                      normalization="layernorm", tokens=patches + 1, role="vision")
    stem = BlockSpec(width, tokens=patches + 1, role="vision", linears=((channels * patch * patch, width, False),),
                     extra_parameters=width + (patches + 1) * width + 2 * 2 * width)
    bias = bool(config.get("multimodal_projector_bias", True))
    h = language.hidden_size
    projector = BlockSpec(width, tokens=patches, role="projector", linears=((width, h, bias), (h, h, bias)))
    blocks = (stem, *(layer,) * _require_int(vision, "num_hidden_layers", path), projector, *language.blocks)
    return replace(language, num_layers=len(blocks), layers=blocks)


_HF_IMPORTERS = {"gemma2": _hf_gemma, "gemma3": _hf_gemma, "gemma3_text": _hf_gemma, "llama4": _hf_llama4,
                 "llama4_text": _hf_llama4, "nemotron_h": _hf_nemotron_h, "llava": _hf_llava}


def load_model(spec: str) -> ModelSpec:
    """A catalog name, a path to an HF ``config.json``, or a planner model file (YAML/JSON)."""
    catalog = _catalog()
    if spec in catalog:
        return model_from_dict(catalog[spec], f"catalog model {spec!r}")
    path = Path(spec)
    if not spec.strip() or not path.exists():
        raise PlannerError(
            f"unknown model {spec!r}: not a catalog name ({', '.join(catalog)}) nor an existing file"
        )
    document = load_structured_file(path)
    if not isinstance(document, dict):
        raise PlannerError(f"{path}: expected a mapping of model fields, got {type(document).__name__}")
    if "model_type" in document:
        try:
            return model_from_hf_config(document, path)
        except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type, e.g. rope_scaling: 2
            raise PlannerError(f"{path}: a field has the wrong type ({exc})") from None
    if isinstance(document.get("model"), dict):  # a plan or profile file carries its model
        document = {k: v for k, v in document["model"].items() if k in _MODEL_FIELDS}
    return model_from_dict(document, str(path))
