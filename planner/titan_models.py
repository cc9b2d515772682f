"""torchtitan 0.2.2's model registry (`torchtitan/models/<name>/__init__.py`): which of its models and flavors
has a planner model's architecture, and what that model's TrainSpec can run (pipelines, token dispatchers). The
framework rules (`planner.frameworks`, hence the search) and the torchtitan export both read it."""

from __future__ import annotations

from dataclasses import dataclass

from planner.config import MOE_DISPATCHERS
from planner.errors import PlannerError
from planner.model import ModelSpec

__all__ = ["FLAVORS", "Flavor", "find_flavor", "model_flavor"]


@dataclass(frozen=True)
class Flavor:
    """One model of torchtitan 0.2.2's registry (`torchtitan/models/<name>/__init__.py`) and its architecture.

    Every llama3 flavor is a SwiGLU/RMSNorm/RoPE decoder without biases, with untied embeddings and
    Llama 3.1's RoPE scaling (factor 8) always on; vocabulary 128256. FFN sizes follow its
    ffn_dim_multiplier/multiple_of rule (8B: 1.3, 1024 → 14336). qwen3's are the same decoder with QK-norm
    and head_dim 128 (weights tied up to 4B); its MoE flavors put routed experts (`moe_ffn_hidden_size` each,
    top-k, no shared expert) in every block. qwen3's TrainSpec has no pipelining function (`pipelines`).
    deepseek_v3's 671B is DeepSeek-V3: MLA (`mla`: q_lora, kv_lora, RoPE and value head widths), its first
    `first_dense_layers` blocks dense, then routed and shared experts with group-limited routing; its FlexAttention
    has no context parallelism (`context_parallel`), and only it runs DeepEP, without expert TP (`flex_with_etp`).
    """

    name: str
    flavor: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    ffn_hidden_size: int
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    head_dim: int | None = None  # None: hidden / heads
    qk_norm: bool = False
    tie_embeddings: bool = False
    num_experts: int = 1
    moe_top_k: int = 1
    moe_ffn_hidden_size: int | None = None
    pipelines: bool = True  # its TrainSpec has a pipelining function
    dispatchers: frozenset[str] = frozenset(MOE_DISPATCHERS)  # how its MoE blocks move tokens (MOE_DISPATCHERS)
    first_dense_layers: int = 0
    shared_expert_ffn_hidden_size: int | None = None
    mla: tuple[int | None, int, int, int] | None = None  # q_lora_rank, kv_lora_rank, qk_rope_head_dim, v_head_dim
    router_groups: tuple[int, int] | None = None  # expert groups, groups a token may use
    context_parallel: bool = True

    def matches(self, model: ModelSpec) -> bool:
        """Whether `model` has exactly this flavor's shapes (the RoPE base is a weights matter: `flavor_notes`)."""
        moe = self.num_experts > 1
        mla = ((model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim, model.v_head_dim)
               if model.is_mla else None)
        groups = (model.moe_router_groups, model.moe_router_group_topk) if model.moe_router_groups else None
        return (_swiglu_decoder(model)
                and model.num_moe_layers == (model.num_layers - self.first_dense_layers if moe else 0)
                and (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_key_value_heads,
                     model.head_dim, model.ffn_hidden_size, model.vocab_size, model.qk_norm, model.tie_embeddings,
                     model.num_experts, model.moe_top_k, model.expert_ffn_hidden_size if moe else None,
                     model.shared_expert_ffn_hidden_size if moe else None, mla, groups)
                == (self.num_layers, self.hidden_size, self.num_attention_heads, self.num_key_value_heads,
                    self.head_dim or self.hidden_size // self.num_attention_heads, self.ffn_hidden_size,
                    self.vocab_size, self.qk_norm, self.tie_embeddings, self.num_experts, self.moe_top_k,
                    self.moe_ffn_hidden_size, self.shared_expert_ffn_hidden_size, self.mla, self.router_groups))


def _qwen3(flavor: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, tied: bool = False,
           experts: int = 1, moe_ffn: int | None = None, rope_theta: float = 1e6) -> Flavor:
    """A qwen3 flavor: vocabulary 151936, head_dim 128, QK-norm, no pipelining in 0.2.2; MoE ones top-8."""
    return Flavor("qwen3", flavor, layers, hidden, heads, kv_heads, ffn, 151936, rope_theta, 128, True, tied,
                  experts, 8 if experts > 1 else 1, moe_ffn, pipelines=False, dispatchers=frozenset({"alltoall"}))


FLAVORS = (Flavor("llama3", "8B", 32, 4096, 32, 8, 14336), Flavor("llama3", "70B", 80, 8192, 64, 8, 28672),
           Flavor("llama3", "405B", 126, 16384, 128, 8, 53248),
           _qwen3("0.6B", 28, 1024, 16, 8, 3072, tied=True), _qwen3("1.7B", 28, 2048, 16, 8, 6144, tied=True),
           _qwen3("4B", 36, 2560, 32, 8, 9728, tied=True), _qwen3("8B", 36, 4096, 32, 8, 12288),
           _qwen3("14B", 40, 5120, 40, 8, 17408), _qwen3("32B", 64, 5120, 64, 8, 25600),
           _qwen3("30B-A3B", 48, 2048, 32, 4, 6144, experts=128, moe_ffn=768),
           # torchtitan's 235B flavor sets rope_theta 5e6 where the released model has 1e6
           _qwen3("235B-A22B", 94, 4096, 64, 4, 12288, experts=128, moe_ffn=1536, rope_theta=5e6))
# DeepSeek-V3 (deepseek_v3's "671B"): 128 heads of 128 (+64 RoPE) over MLA latents, 3 dense blocks then 256
# routed experts of 2048 (top-8 of 8 groups, 4 used) and one shared expert; FlexAttention (no CP in 0.2.2)
FLAVORS += (Flavor("deepseek_v3", "671B", 61, 7168, 128, 128, 18432, 129280, 10000.0, 128, num_experts=256,
                   moe_top_k=8, moe_ffn_hidden_size=2048, first_dense_layers=3, shared_expert_ffn_hidden_size=2048,
                   mla=(1536, 512, 64, 128), router_groups=(8, 4), context_parallel=False),)
# The rest of 0.2.2's language models have blocks the planner does not map onto them yet (deepseek_v3's 16B and
# 236B are DeepSeek-V2-Lite and DeepSeek-V2, not in the catalog).
_OTHER_MODELS = "llama4, gpt_oss"


def _swiglu_decoder(model: ModelSpec) -> bool:
    """Whether the model is a stack of torchtitan's SwiGLU/RMSNorm/RoPE decoder blocks without biases, with full
    attention, all alike or dense-then-MoE (the scalar fields' stack, not a model stated layer by layer)."""
    return (model.activation == "swiglu" and model.normalization == "rmsnorm" and model.position_embedding == "rope"
            and model.layers is None and not (model.linear_bias or model.qkv_bias or model.moe_bias
                                               or model.sliding_window))


def find_flavor(model: ModelSpec) -> Flavor | None:
    """torchtitan's model and flavor with exactly `model`'s architecture, or None."""
    return next((flavor for flavor in FLAVORS if flavor.matches(model)), None)


def model_flavor(model: ModelSpec) -> Flavor:
    """torchtitan's model and flavor with exactly the plan's architecture; PlannerError when it has none."""
    flavor = find_flavor(model)
    if flavor:
        return flavor
    known = ", ".join(f"{f.name} {f.flavor}" for f in FLAVORS)
    raise PlannerError(f"torchtitan 0.2.2 has no model with {model.name}'s architecture (it has {known}, and "
                       f"{_OTHER_MODELS}); export to megatron or deepspeed")
