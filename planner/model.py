"""Model architecture (`ModelSpec`), its partitionable units, the model catalog and HF config import.

A model is a sequence of units that pipeline stages take contiguously: the embedding, one unit
per transformer block, and the head (final norm + output projection + loss). Parameter counts
are exact (they reproduce the published counts of Llama 3, Mixtral and Narayanan et al. eq. 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.limits import MAX_LAYERS, MAX_MODEL_WIDTH, MAX_SEQ_LEN
from planner.resources import load_structured_file, profiles_dir

__all__ = [
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


@dataclass(frozen=True)
class Unit:
    """One partitionable piece of the model; blocks carry their index among transformer blocks."""

    kind: UnitKind
    index: int = 0
    num_parameters: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. Dimensions are per the whole model (before any parallelism).

    ``ffn_hidden_size`` is the dense MLP's intermediate size; an MoE block has ``num_experts`` routed
    experts of ``moe_ffn_hidden_size`` (default ``ffn_hidden_size``), ``moe_top_k`` of them per token, plus
    an always-active shared expert MLP of ``shared_expert_ffn_hidden_size`` (all shared experts together,
    Megatron-LM's ``--moe-shared-expert-intermediate-size``); the first ``first_dense_layers`` blocks have a
    dense MLP instead (DeepSeek-V3: 3). ``moe_bias`` adds a bias to every expert linear and to the router
    (GPT-OSS). ``kv_lora_rank`` switches attention to multi-head latent attention (MLA, DeepSeek-V2/V3):
    queries through a ``q_lora_rank`` bottleneck (None: a full projection), keys and values through a
    ``kv_lora_rank`` latent, per head ``head_dim`` (no-RoPE part) + ``qk_rope_head_dim`` for queries and
    keys and ``v_head_dim`` for values. DeepSeek-V3's multi-token-prediction module is not counted (its
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
    activation: str = "swiglu"  # "swiglu" | "gelu"
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
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check_fields(self)
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
            "activation": ("swiglu", "gelu"),
            "normalization": ("rmsnorm", "layernorm"),
            "position_embedding": ("rope", "learned", "alibi"),
        }
        for name, allowed in checks.items():
            if getattr(self, name) not in allowed:
                raise PlannerError(f"model {self.name!r}: {name} must be one of {', '.join(allowed)}")
        if self.num_experts < 1 or not 1 <= self.moe_top_k <= self.num_experts:
            raise PlannerError(
                f"model {self.name!r}: need 1 <= moe_top_k ({self.moe_top_k}) <= num_experts ({self.num_experts})"
            )
        if (self.first_dense_layers or 0) >= self.num_layers and self.is_moe:
            raise PlannerError(f"model {self.name!r}: first_dense_layers ({self.first_dense_layers}) must be "
                               f"below num_layers ({self.num_layers}) for an MoE model")
        if self.is_mla and (self.qk_rope_head_dim is None or self.v_head_dim is None):
            raise PlannerError(f"model {self.name!r}: MLA (kv_lora_rank set) needs qk_rope_head_dim and v_head_dim")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        """Blocks with routed experts (all but the first dense ones); 0 for a dense model."""
        return self.num_layers - (self.first_dense_layers or 0) if self.is_moe else 0

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

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

    @property
    def norm_parameters(self) -> int:
        """Parameters of one norm layer (LayerNorm has a bias)."""
        return 2 * self.hidden_size if self.normalization == "layernorm" else self.hidden_size

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of size h × ffn per expert: 3 for SwiGLU (gate, up, down), 2 for GeLU."""
        return 3 if self.activation == "swiglu" else 2

    def attention_linears(self) -> tuple[tuple[int, int], ...]:
        """(input, output) width of every attention weight matrix, in execution order. MHA/GQA: QKV and
        the output projection. MLA (DeepSeek-V3 §2.1.1): query down / up (or one query projection), the
        joint KV down projection (latent + shared RoPE key), the KV up projection, the output projection."""
        h, heads = self.hidden_size, self.num_attention_heads
        if not self.is_mla:
            return (h, self.query_width + 2 * self.kv_width), (self.query_width, h)
        query = ((h, self.q_lora_rank), (self.q_lora_rank, self.query_width)) if self.q_lora_rank else (
            (h, self.query_width),)
        return (*query, (h, self.kv_lora_rank + self.qk_rope_head_dim),
                (self.kv_lora_rank, heads * (self.head_dim + self.value_head_dim)), (self.value_width, h))

    def attention_parameters(self) -> int:
        h, q, kv = self.hidden_size, self.query_width, self.kv_width
        weights = sum(a * b for a, b in self.attention_linears())
        if self.is_mla:  # RMSNorms on the query and KV latents
            return weights + (self.q_lora_rank or 0) + self.kv_lora_rank
        bias = 2 * self.head_dim if self.qk_norm else 0
        if self.qkv_bias or self.linear_bias:
            bias += q + 2 * kv
        if self.linear_bias:
            bias += h
        return weights + bias

    def mlp_parameters(self, ffn: int, bias: bool) -> int:
        """Parameters of one MLP (a dense one, an expert or the shared experts) of intermediate size `ffn`."""
        h = self.hidden_size
        bias_count = ((self.mlp_matrices - 1) * ffn + h) if bias else 0
        return self.mlp_matrices * h * ffn + bias_count

    def expert_parameters(self) -> int:
        """Parameters of one routed expert's MLP (the whole MLP for a dense model)."""
        return self.mlp_parameters(self.expert_ffn_hidden_size, self.linear_bias or self.moe_bias)

    def router_parameters(self) -> int:
        return (self.hidden_size + (1 if self.moe_bias else 0)) * self.num_experts

    def shared_expert_parameters(self) -> int:
        size = self.shared_expert_ffn_hidden_size
        return self.mlp_parameters(size, self.linear_bias) if size else 0

    def dense_block_parameters(self) -> int:
        """A block with a dense MLP of `ffn_hidden_size`."""
        return (self.attention_parameters() + self.mlp_parameters(self.ffn_hidden_size, self.linear_bias)
                + 2 * self.norm_parameters)

    def moe_block_parameters(self, active: bool = False) -> int:
        """A block with routed experts (only the top-k of them when `active`), router and shared experts."""
        experts = self.moe_top_k if active else self.num_experts
        return (self.attention_parameters() + experts * self.expert_parameters() + self.router_parameters()
                + self.shared_expert_parameters() + 2 * self.norm_parameters)

    def block_parameters(self) -> float:
        """Parameters of the mean block: the cost model treats all blocks alike, so dense first layers
        (DeepSeek-V3's 3 of 61) are averaged into every block; the total stays exact."""
        dense = self.num_layers - self.num_moe_layers
        return (dense * self.dense_block_parameters() + self.num_moe_layers * self.moe_block_parameters()) / (
            self.num_layers)

    def expert_fraction(self) -> float:
        """Share of the mean block's parameters in routed experts (sharded over EP and ETP, not TP)."""
        return self.num_moe_layers * self.num_experts * self.expert_parameters() / (
            self.num_layers * self.block_parameters())

    def padded_vocab_size(self, tp: int, divisible_by: int = 128) -> int:
        """Vocabulary padded as Megatron-LM pads it (`--make-vocab-size-divisible-by 128`, times tp),
        so every TP shard of the logits GEMM has an aligned width."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def embedding_parameters(self) -> int:
        positions = self.max_position_embeddings * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + positions

    def head_parameters(self) -> int:
        """Final norm plus the output projection (zero extra when tied to the embedding)."""
        output = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.norm_parameters + output

    @property
    def num_parameters(self) -> int:
        """Unique parameters (a tied output matrix counts once)."""
        dense = self.num_layers - self.num_moe_layers
        blocks = dense * self.dense_block_parameters() + self.num_moe_layers * self.moe_block_parameters()
        return self.embedding_parameters() + blocks + self.head_parameters()

    @property
    def active_parameters(self) -> int:
        """Parameters one token runs through (top-k routed experts), embedding and head included."""
        dense = self.num_layers - self.num_moe_layers
        blocks = dense * self.dense_block_parameters() + self.num_moe_layers * self.moe_block_parameters(True)
        return self.embedding_parameters() + blocks + self.head_parameters()

    def units(self) -> tuple[Unit, ...]:
        """Embedding, every block in order, then the head."""
        first_moe = self.num_layers - self.num_moe_layers
        dense = self.dense_block_parameters()
        moe = self.moe_block_parameters() if self.is_moe else dense
        return (
            Unit(UnitKind.EMBEDDING, 0, self.embedding_parameters()),
            *(Unit(UnitKind.BLOCK, i, moe if i >= first_moe else dense) for i in range(self.num_layers)),
            Unit(UnitKind.HEAD, 0, self.head_parameters()),
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields a planner model file holds (also the plan JSON's model section, plus counts)."""
        return {k: v for k, v in self.__dict__.items() if k != "source"}



_FIELD_LIMITS = {"num_layers": MAX_LAYERS, "max_position_embeddings": MAX_SEQ_LEN}


def _check_fields(spec: ModelSpec) -> None:
    """Every field has its annotated type (a bool is no integer, a float is finite and positive) and every
    count lies in 1..its limit (planner.limits), so a bad model file fails here in one line, not later."""
    where = f"model {spec.name!r}" + (f" ({spec.source})" if spec.source else "")
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
        else:
            ok, allowed = isinstance(value, str), "a string"
        if not ok:
            raise PlannerError(f"{where}: {item.name} must be {allowed}, got {value!r}")


# ---- catalog and file loading ----------------------------------------------------------------

_MODEL_FIELDS = set(ModelSpec.__dataclass_fields__) - {"source"}


def model_from_dict(data: dict[str, Any], source: str) -> ModelSpec:
    """Build a ModelSpec from a planner model document (catalog entry or user file)."""
    unknown = set(data) - _MODEL_FIELDS
    if unknown:
        raise PlannerError(f"{source}: unknown model field(s) {', '.join(sorted(unknown))}")
    missing = {"name", "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size"} - set(
        data
    )
    if missing:
        raise PlannerError(f"{source}: model is missing {', '.join(sorted(missing))}")
    try:
        return ModelSpec(**data, source=source)
    except TypeError as exc:
        raise PlannerError(f"{source}: {exc}") from None


@cache
def _catalog() -> dict[str, dict[str, Any]]:
    document = load_structured_file(profiles_dir() / "models.yaml")
    return {entry["name"]: entry for entry in document["models"]}


def catalog_model_names() -> list[str]:
    return list(_catalog())


def _optional_int(config: dict[str, Any], key: str, path: Path) -> int | None:
    """`config[key]` when it is a positive integer, None when absent or null."""
    return None if config.get(key) is None else _require_int(config, key, path)


def _require_int(config: dict[str, Any], key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlannerError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return value


_HF_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3",
                  "gpt_oss")
_HF_SUPPORTED = (*_HF_LLAMA_LIKE, "gpt2", "gpt_neox")


def model_from_hf_config(config: dict[str, Any], path: Path, name: str | None = None) -> ModelSpec:
    """Translate a Hugging Face ``config.json`` (already parsed) into a ModelSpec, offline."""
    model_type = config.get("model_type")
    if model_type not in _HF_SUPPORTED:
        raise PlannerError(
            f"{path}: model_type {model_type!r} is not supported; supported: {', '.join(_HF_SUPPORTED)}"
        )
    name = name or config.get("_name_or_path") or path.parent.name or model_type
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
    return ModelSpec(
        name=name,
        num_layers=_require_int(config, "num_hidden_layers", path),
        hidden_size=_require_int(config, "hidden_size", path),
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("qk_nope_head_dim") or config.get("head_dim"),
        ffn_hidden_size=_require_int(config, "intermediate_size", path),
        vocab_size=_require_int(config, "vocab_size", path),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type.startswith("qwen2") or bool(config.get("attention_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        dropout=bool(config.get("attention_dropout", 0.0)),
        **_hf_moe(config, path),
        **_hf_mla(config, path),
        **_hf_rope_and_window(config),
        source=str(path),
    )


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
    }


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


def load_model(spec: str) -> ModelSpec:
    """A catalog name, a path to an HF ``config.json``, or a planner model file (YAML/JSON)."""
    catalog = _catalog()
    if spec in catalog:
        return model_from_dict(catalog[spec], f"catalog model {spec!r}")
    path = Path(spec)
    if not path.exists():
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
