"""What a training job is (`Training`), how it is split (`ParallelConfig`) and the stage split (`Partition`).

Conventions used everywhere: dp·tp·pp·cp = GPUs used; micro-batches per iteration
m = global_batch / (micro_batch · dp); the model's units are [embedding, block 0 … block L−1,
head] and a `Partition` gives each *virtual* stage a contiguous run of them, in virtual-pipeline
order (virtual stage k runs on pipeline rank k mod pp as its (k div pp)-th model chunk — the
order of Megatron-LM's `--pipeline-model-parallel-layout`).
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, fields, replace
from enum import Enum
from types import MappingProxyType

from planner.cost.schedule import PIPELINE_ORDERS, PipelineSchedule, Schedule, schedule_of, stage_ranks
from planner.errors import PlannerError
from planner.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, finite_number

__all__ = [
    "CP_COMMS",
    "CROSS_ENTROPY_KERNELS",
    "CUDA_GRAPH_MODES",
    "CUDA_GRAPH_MODULES",
    "DEEPSPEED_MODERN_PIPELINE",
    "DEEPSPEED_OPTIMIZERS",
    "DEEPSPEED_PER_UNIT_ZERO3",
    "DEFAULT_LOCAL_QUEUE_DEPTH",
    "DEFAULT_LORA_RANK",
    "DEFAULT_LORA_TARGETS",
    "DEFAULT_RECOMPUTE_MODULES",
    "DTYPES",
    "ELEMENTWISE_MODES",
    "FINETUNE_MODES",
    "FP8_RECIPES",
    "FP8_SAVED_INPUTS",
    "FSDP_BACKWARD_PREFETCHES",
    "LOCAL_HEADS",
    "LORA_TARGETS",
    "MOE_DISPATCHERS",
    "OPTIMIZER_STATES",
    "RECOMPUTE_MODULES",
    "SELECTIVE_RECOMPUTES",
    "ZERO3_COLLECTIVES",
    "ParallelConfig",
    "Partition",
    "Recompute",
    "Schedule",
    "Training",
    "deepspeed_legacy_pipeline",
    "deepspeed_zero3_collectives",
    "ep_overlap_why_not",
    "graphed_recompute_why_not",
    "optimizer_sharding_of",
    "parse_cuda_graph_modules",
    "parse_recompute_modules",
    "recomputes_pre_mlp_norm",
]

DTYPES = ("bf16", "fp16", "fp8")


def optimizer_sharding_of(zero_stage: int, distributed_optimizer: bool) -> int:
    """What a ZeRO stage and the distributed optimizer shard together (`ParallelConfig.optimizer_sharding`)."""
    return max(zero_stage, 1 if distributed_optimizer else 0)

# How a context-parallel group exchanges keys and values (Megatron-LM's --cp-comm-type): "p2p" rotates KV
# chunks around a ring behind the attention compute (ring attention with causal load balancing), "all-gather"
# gathers the whole KV before attention (Llama 3 style), "a2a" re-shards sequence ↔ heads (DeepSpeed Ulysses).
CP_COMMS = ("p2p", "all-gather", "a2a")
# How ZeRO-3 issues its collectives. "per-unit": one all-gather / reduce-scatter per wrapped unit (a flat buffer),
# asynchronous and prefetched behind the neighbouring unit's compute (PyTorch FSDP; DeepSpeed from v0.6.0, whose
# PR #1453 of 2022-01-20 batches a module's gathers and reduce-scatters into flat *_base collectives and waits
# on their own handles). "per-tensor": DeepSpeed ZeRO-3 up to v0.5.10 — one collective per parameter tensor,
# each followed or preceded by a device-wide torch.cuda.synchronize() (partition_parameters._allgather_param;
# v0.5.5's PR #1188 only launches a submodule's per-tensor gathers back to back before one synchronize,
# `_allgather_params_coalesced`), so nothing overlaps and every tensor pays the ring's latency.
ZERO3_COLLECTIVES = ("per-unit", "per-tensor")
# When ZeRO-3 / FSDP all-gathers the next unit's weights in the backward pass. "pre": before the current unit's
# gradient computation, so the gather hides behind it (PyTorch FSDP1's default BackwardPrefetch.BACKWARD_PRE; FSDP2,
# Megatron-FSDP and DeepSpeed ZeRO-3 prefetch alike). "post": after it (BACKWARD_POST, the default of MosaicML
# Composer's FSDPConfig, which llm-foundry runs), queued ahead of the current unit's reduce-scatter on the
# communicator's one NCCL stream: PyTorch's BackwardPrefetch docs say it overlaps the current reduce-scatter with
# the next gradient computation, so the gather itself waits in full.
FSDP_BACKWARD_PREFETCHES = ("pre", "post")
# The first DeepSpeed release whose ZeRO-3 runs "per-unit" (v0.6.0, 2022-03-07, with PR #1453).
DEEPSPEED_PER_UNIT_ZERO3 = (0, 6)
# The first DeepSpeed release whose pipeline engine planner costs without the legacy engine's fixed time per layer
# and micro-batch (ParallelConfig.legacy_pipeline_engine): runs on v0.5 (MT-NLG, 2021) and v0.6 (BLOOM's BigScience
# fork, 2022) show it, vTrain's Megatron-DeepSpeed runs of 2023 do not; v0.8.0 (2023-01) is the first release
# after BLOOM's training, the change that removed it is not identified (docs/accuracy.md).
DEEPSPEED_MODERN_PIPELINE = (0, 8)
# What selective recomputation keeps. "attention": Megatron-LM's --recompute-granularity selective (Korthikanti et
# al. 2022: everything but the attention core, which is recomputed). "op": torchtitan's per-op SAC
# (activation_checkpoint.selective_ac_option "op"): the outputs of every other matrix multiply (the 1st, 3rd, … of a
# block) and of the attention kernel are kept, everything else, norms and activations included, is recomputed.
SELECTIVE_RECOMPUTES = ("attention", "op")
# Which DeepSpeed optimizer wrapper runs a ZeRO-1 step. "zero": ZeRO's FP16_DeepSpeedZeroOptimizer
# (runtime/zero/stage_1_and_2.py), whose gradient buckets framework_buffer_bytes counts. "bf16": BF16_Optimizer
# (runtime/bf16_optimizer.py; written for BLOOM on the olruwase/bf16-updates branch from 2022-02-24, in releases
# from v0.6.2), which DeepSpeed runs at zero stage 0 and which shards fp32 master weights and Adam states itself, as
# ZeRO-1 does; it keeps the 16-bit gradients autograd makes besides its fp32 accumulation buffer.
DEEPSPEED_OPTIMIZERS = ("zero", "bf16")
# What Megatron-Core's selective recompute re-runs (--recompute-modules, TransformerConfig.recompute_modules), in
# its own order: the attention core, the routed experts' activation function, the norms that are modules of their
# own, MLA's up projections and RoPE, a dense MLP, a whole MoE layer, its shared experts. Its further choices
# (gdn_norm_out, gdp_in_proj, gdp_qkv, mhc) belong to layers planner does not model.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)  # Megatron-Core's default, Korthikanti et al.'s selective recompute
# How routed tokens reach their experts (Megatron-Core's --moe-token-dispatcher-type): "alltoall" sends one
# copy per (token, expert) straight to the expert's rank; "flex" (DeepEP / HybridEP kernels) sends a token once
# per destination node over the network and fans it out to that node's expert ranks over NVLink.
MOE_DISPATCHERS = ("alltoall", "flex")
# Local learning's auxiliary head on every stage but the last (cost/local.py): "linear" is the model's own head
# (final norm + linear to the vocabulary, or to the classes of a ViT), "mlp" a norm + hidden linear of the model's
# width + GELU + that output linear.
LOCAL_HEADS = ("linear", "mlp")
# Boundary tensors a local-learning stage may send ahead of its consumer: 2 lets a stage run one micro-batch ahead
# while the next one is taken, at two boundary tensors of memory.
DEFAULT_LOCAL_QUEUE_DEPTH = 2
# Attention kernels: "flash", the GPU's native fused attention (cuDNN via Transformer Engine or PyTorch SDPA's cuDNN
# backend, FlashAttention-3 on Hopper; FlashAttention-2 on Ampere); "flash2", FlashAttention-2's kernels on every GPU
# (flash-attn 2, PyTorch SDPA's flash backend), slower where they are not native (`GPUSpec.flash_attention_2_share`);
# "unfused", the score matrix materialised (Megatron-LM before FlashAttention).
ATTENTION_KERNELS = ("flash", "flash2", "unfused")
# Element-wise kernels (norms, RoPE, the MLP activation): "fused", one kernel per op over 16-bit tensors (Megatron-LM's
# Transformer Engine / apex kernels, torch.compile's); "eager", eager PyTorch's op-by-op kernels as torchtitan's Llama
# code runs without torch.compile (RMSNorm and RoPE through fp32 copies, SiLU and the gate product apart).
ELEMENTWISE_MODES = ("fused", "eager")
# How the host launches a step's kernels: "none", eager PyTorch launching each kernel (a pass takes at least the host's
# launch time, and an MoE layer's dropless dispatch reads its token counts back to the host); "full_iteration",
# Megatron-Core's full-iteration CUDA graph (--cuda-graph-impl full_iteration: the forward and backward of every
# micro-batch captured once and replayed, dropless MoE padded to a static per-rank capacity so nothing syncs), where
# the GPU runs the kernels back to back and no launch or sync time shows.
CUDA_GRAPH_MODES = ("none", "full_iteration")
# Parts of every layer Megatron-Core can capture in per-layer Transformer Engine CUDA graphs instead (--cuda-graph-impl
# transformer_engine --cuda-graph-scope ..., core 0.16; forward and backward each replayed as one graph per part and
# micro-batch), in its order: "attn" the attention half (TransformerLayer._forward_attention: input norm, QKV, RoPE,
# attention core, output projection, residual add), "mlp" a dense layer's MLP half, "moe_router" an MoE layer's
# pre-MLP norm, router and shared experts, "moe_preprocess" its token dispatcher's preprocessing (only with
# moe_router), "mamba" a Mamba layer. The rest of a dropless MoE layer stays eager: its dispatch waits on token counts
# read back to the host.
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe_router", "moe_preprocess", "mamba")
# How the loss runs over the logits (planner/cost/memory.py `LOSS_BYTES_PER_LOGIT` holds what each keeps): "fused",
# Megatron-LM's vocab-parallel cross-entropy, in place on one fp32 copy; "eager", PyTorch's F.cross_entropy on an fp32
# copy op by op (torchtitan before it compiled its loss, pytorch/torchtitan bbb1b616e of 2025-04-02, and since
# whenever it runs without torch.compile); "compiled", that loss under torch.compile (one fused kernel each way).
CROSS_ENTROPY_KERNELS = ("fused", "eager", "compiled")
# How FP8 GEMM operands are scaled (planner/profile/analytic.py `_FP8_CASTS` holds what each costs): one scale
# per tensor from the amax history ("delayed", Transformer Engine's DelayedScaling, Megatron-LM's default) or from
# the tensor itself ("tensorwise", current scaling: TE's Float8CurrentScaling, torchao's tensorwise); one per row
# ("rowwise", torchao; "rowwise_with_gw_hp" keeps the weight-gradient GEMM in BF16); one per 1×128 / 128×128 tile
# ("blockwise", TE's Float8BlockScaling, DeepSeek-V3's recipe); one per 32 elements in hardware ("mxfp8", OCP MX on
# GPUs with FP4 tensor cores: Blackwell).
FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise", "mxfp8")
# What an FP8 linear layer keeps of its input for the weight gradient: its FP8 copy ("fp8", Transformer Engine), or
# the BF16 tensor it casts again in backward ("bf16", torchao's Float8Linear: save_for_backward(input_hp, ...)).
FP8_SAVED_INPUTS = ("fp8", "bf16")
# What trains: every parameter ("full", pre-training's accounting), or low-rank adapters on frozen 16-bit ("lora",
# Hu et al. 2021) or 4-bit NF4 ("qlora", Dettmers et al. 2023) base weights (planner/finetune.py owns the rules).
FINETUNE_MODES = ("full", "lora", "qlora")
# Which linears get adapters: "qv" the query and value projections (Hu et al. 2021 §4.2 on GPT-3; Hugging Face
# PEFT's default target_modules for Llama), "attention" every attention (or Mamba mixer) projection, "mlp" the MLP
# (every expert's too), "all-linear" both and the block's further linears (PEFT's target_modules="all-linear",
# QLoRA's setting: the output head stays frozen).
LORA_TARGETS = ("qv", "attention", "mlp", "all-linear")
DEFAULT_LORA_TARGETS = "all-linear"
# r = 16: the rank of PEFT's and Megatron-Bridge's LoRA examples and of most published Llama recipes; QLoRA used 64
# and found the rank mattered little once every linear is adapted (Dettmers et al. 2023 §4, Figure 4), LoRA used 4-8
# on q, v. The adapters are < 1 % of a 7B+ model at r = 16, so the choice barely moves memory.
DEFAULT_LORA_RANK = 16
# Where the optimizer states live: fp32 Adam on the GPU (m, v and the fp32 master weights), "8bit" bitsandbytes'
# block-wise 8-bit Adam (m and v in 1 byte each, Dettmers et al. 2022), "cpu" ZeRO-Offload / FSDP CPU offload
# (states and the update on the host, Ren et al. 2021).
OPTIMIZER_STATES = ("fp32", "8bit", "cpu")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def deepspeed_zero3_collectives(version: str) -> str:
    """How DeepSpeed `version` ("0.5.7", "0.3") issues ZeRO-3 collectives (one of ZERO3_COLLECTIVES), so that a
    run is costed as its release ran it: "per-tensor" before DEEPSPEED_PER_UNIT_ZERO3, "per-unit" from it."""
    return "per-unit" if _release(version) >= DEEPSPEED_PER_UNIT_ZERO3 else "per-tensor"


def deepspeed_legacy_pipeline(version: str) -> bool:
    """Whether DeepSpeed `version`'s pipeline engine is costed with the legacy engine's fixed time per layer and
    micro-batch (`ParallelConfig.legacy_pipeline_engine`): releases before DEEPSPEED_MODERN_PIPELINE."""
    return _release(version) < DEEPSPEED_MODERN_PIPELINE


def _parse_module_list(option: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated option's names in `allowed`'s order, once each (PlannerError naming the first unknown one,
    or the text when it names none)."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise PlannerError(f"{option} must be among {', '.join(allowed)} (comma-separated), "
                           f"got {(unknown[0] or text)!r}")
    if len(set(names)) < len(names):
        raise PlannerError(f"{option} {text!r} names a module twice")
    return tuple(name for name in allowed if name in names)


def graphed_recompute_why_not(graphed: tuple[str, ...], recompute: Recompute, selective: frozenset[str],
                              dropout: bool) -> str | None:
    """Why Megatron-Core 0.16 refuses `recompute` (re-running the `selective` modules) beside per-layer CUDA graphs of
    the `graphed` parts (Training.cuda_graph_modules), or None: full recompute (whole blocks are recomputed only under
    a full-iteration graph), moe recompute where moe_router's graph covers part of the module, and with dropout the
    attention core or MLP recomputed inside a graph that cannot redraw its masks."""
    if not graphed:
        return None
    named = f"per-layer CUDA graphs of {','.join(graphed)}"
    if recompute is Recompute.FULL:
        return f"recompute full does not run with {named} (only a full-iteration graph recomputes whole blocks)"
    redrawn = {"core_attn": "attn", "mlp": "mlp"} if dropout else {}
    clash = next((m for m in sorted(selective)
                  if (m == "moe" and "moe_router" in graphed) or redrawn.get(m) in graphed), None)
    if clash is not None:
        return (f"selective recompute of {clash} does not run with {named} (a recomputed module its graph covers in "
                f"part, or whose dropout the replay cannot redraw)")
    return None


def recomputes_pre_mlp_norm(graphed: tuple[str, ...], dispatcher: str) -> bool:
    """Whether the layernorm recompute module re-runs an MoE layer's pre-MLP norm beside per-layer CUDA graphs of the
    `graphed` parts: Megatron-Core 0.16 (transformer_layer.py, can_recompute_pre_mlp_layernorm_for_cudagraph) turns
    it off under a moe_router graph, which returns the norm's output from a static buffer, unless moe_preprocess is
    graphed too with the alltoall dispatcher, whose graph consumes it inside."""
    return "moe_router" not in graphed or ("moe_preprocess" in graphed and dispatcher == "alltoall")


def parse_recompute_modules(text: str) -> tuple[str, ...]:
    """`--recompute-modules layernorm,moe_act`: the named modules in Megatron's order."""
    return _parse_module_list("--recompute-modules", text, RECOMPUTE_MODULES)


def parse_cuda_graph_modules(text: str) -> tuple[str, ...]:
    """`--cuda-graph-modules attn,moe_router`: the named CUDA_GRAPH_MODULES in Megatron's order."""
    return _parse_module_list("--cuda-graph-modules", text, CUDA_GRAPH_MODULES)


class Recompute(str, Enum):
    """Activation recomputation: none, selective (attention core, Korthikanti et al.) or full (whole block)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


def _not_one_of(owner: str, name: str, value: object, allowed: tuple[str, ...]) -> PlannerError:
    """The refusal of `value` for `name`, naming what is allowed (callers test membership inline: the search
    builds 10⁵ configurations)."""
    return PlannerError(f"{owner}: {name} must be one of {', '.join(allowed)}, got {value!r}")


def _positive(owner: str, name: str, value: object, limit: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"{owner}: {name} must be a positive integer, got {value!r}")
    if limit is not None and value > limit:
        raise PlannerError(f"{owner}: {name} must be at most {limit:,}, got {value:,}")


# The largest value of each ParallelConfig count: degrees are GPUs; micro-batches and queued micro-batches sequences
_CONFIG_LIMITS = {"dp": MAX_GPUS, "tp": MAX_GPUS, "pp": MAX_GPUS, "vpp": MAX_LAYERS, "cp": MAX_GPUS,
                  "hsdp_replicas": MAX_GPUS, "ep": MAX_GPUS, "etp": MAX_GPUS, "micro_batch": MAX_GLOBAL_BATCH,
                  "local_queue_depth": MAX_GLOBAL_BATCH}


@dataclass(frozen=True)
class Training:
    """The training job: global batch (sequences per iteration), sequence length, precision.

    `attention` is the attention kernel (ATTENTION_KERNELS): "flash" or "flash2" (fused, no s² activations, causal
    work halved; the GPU's native kernel or FlashAttention-2's) or "unfused" (softmax/dropout materialised, as in
    Megatron-LM runs before FlashAttention).
    `elementwise` (ELEMENTWISE_MODES) is how the norms, RoPE and activation run: fused kernels or eager PyTorch's.
    `cuda_graphs` (CUDA_GRAPH_MODES) is how the host launches the kernels: one by one, or one full-iteration graph;
    `cuda_graph_modules` (CUDA_GRAPH_MODULES, stored in that order) the parts of each layer replayed from per-layer
    graphs instead (only with cuda_graphs "none"; moe_preprocess only with moe_router).
    `cross_entropy` (CROSS_ENTROPY_KERNELS) is how the loss over the logits runs: Megatron-LM's fused kernel, eager
    PyTorch's or torch.compile's; it sets what the loss holds in memory.
    `fp8_recipe` (FP8_RECIPES) is how dtype fp8 scales its GEMM operands (None with dtype fp8 takes "delayed"); it
    must stay None for other dtypes. `fp8_saved_input` (FP8_SAVED_INPUTS) is what an FP8 linear keeps of its input
    for the weight gradient, and `fp8_tp_gather` whether sequence parallelism's all-gathers move the FP8 activation
    (1 byte an element) rather than the 16-bit one (the reduce-scatters stay 16-bit), both set by the framework that
    runs it (`Framework.gathers_tp_in_fp8`).
    `grad_bytes` is the per-parameter gradient size: 4 when gradients accumulate in fp32
    (Megatron-LM's default for bf16 and fp8), 2 when they stay 16-bit (its fp16 optimizer);
    None takes that dtype's default.
    `finetune` (one of FINETUNE_MODES) says what trains; `lora_rank` and `lora_targets` (LORA_TARGETS) shape the
    adapters of "lora" / "qlora" and must stay None for "full" (None takes DEFAULT_LORA_RANK / DEFAULT_LORA_TARGETS).
    `optimizer_states` (OPTIMIZER_STATES) is where and how wide the Adam states are.
    `moe_load_imbalance` is the busiest expert-parallel rank's routed tokens over the mean (1.0: a
    force-balanced router, as Megatron-Bridge's MoE benchmarks run): that rank's expert GEMMs and the routed
    activations it keeps, the time every rank waits for and the memory that runs out first; `moe_capacity_factor`
    caps each expert at that multiple of its mean tokens and drops the rest (None: dropless).
    """

    global_batch: int = 512
    seq_len: int = 4096
    dtype: str = "bf16"
    attention: str = "flash"
    grad_bytes: int | None = None
    moe_load_imbalance: float = 1.0
    moe_capacity_factor: float | None = None
    finetune: str = "full"
    lora_rank: int | None = None
    lora_targets: str | None = None
    optimizer_states: str = "fp32"
    elementwise: str = "fused"
    cross_entropy: str = "fused"
    cuda_graphs: str = "none"
    fp8_recipe: str | None = None
    fp8_saved_input: str = "fp8"
    fp8_tp_gather: bool = True
    cuda_graph_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.grad_bytes is None:
            object.__setattr__(self, "grad_bytes", 2 if self.dtype == "fp16" else 4)
        self._check_fp8_recipe()
        self._check_finetune()
        _positive("training", "global_batch", self.global_batch)
        _positive("training", "seq_len", self.seq_len)
        if self.dtype not in DTYPES:
            raise _not_one_of("training", "dtype", self.dtype, DTYPES)
        if self.attention not in ATTENTION_KERNELS:
            raise _not_one_of("training", "attention", self.attention, ATTENTION_KERNELS)
        if self.elementwise not in ELEMENTWISE_MODES:
            raise _not_one_of("training", "elementwise", self.elementwise, ELEMENTWISE_MODES)
        if self.cross_entropy not in CROSS_ENTROPY_KERNELS:
            raise _not_one_of("training", "cross_entropy", self.cross_entropy, CROSS_ENTROPY_KERNELS)
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise _not_one_of("training", "cuda_graphs", self.cuda_graphs, CUDA_GRAPH_MODES)
        self._check_cuda_graph_modules()
        if self.grad_bytes not in (2, 4):
            raise PlannerError(f"training: grad_bytes must be 2 or 4, got {self.grad_bytes!r}")
        for name in ("moe_load_imbalance", "moe_capacity_factor"):
            value = getattr(self, name)
            if value is None and name == "moe_capacity_factor":  # none: dropless
                continue
            if not finite_number(value) or value < 1:
                raise PlannerError(f"training: {name} must be a finite number >= 1, got {value!r}")

    def _check_cuda_graph_modules(self) -> None:
        """Store `cuda_graph_modules` in CUDA_GRAPH_MODULES' order, once each; refuse what Megatron-Core refuses:
        unknown parts, moe_preprocess without moe_router, per-layer graphs beside a full-iteration one (one-line
        errors)."""
        modules = self.cuda_graph_modules
        if isinstance(modules, str) or not isinstance(modules, (tuple, list)):
            raise PlannerError(f"training: cuda_graph_modules must be a list of module names, got {modules!r}")
        odd = next((name for name in modules if name not in CUDA_GRAPH_MODULES), None)
        if odd is not None:
            raise PlannerError(f"training: cuda_graph_modules must be among {', '.join(CUDA_GRAPH_MODULES)}, "
                               f"got {odd!r}")
        ordered = tuple(name for name in CUDA_GRAPH_MODULES if name in modules)
        if "moe_preprocess" in ordered and "moe_router" not in ordered:
            raise PlannerError("training: cuda_graph_modules moe_preprocess needs moe_router too (Megatron-Core "
                               "captures the dispatcher's preprocessing only behind the router)")
        if ordered and self.cuda_graphs != "none":
            raise PlannerError(f"training: cuda_graph_modules {','.join(ordered)} need cuda_graphs 'none' (per-layer "
                               f"graphs and a full-iteration one are different Megatron-Core implementations), got "
                               f"{self.cuda_graphs!r}")
        object.__setattr__(self, "cuda_graph_modules", ordered)

    @property
    def graphs_anything(self) -> bool:
        """Whether any kernels are replayed from CUDA graphs (full-iteration or per-layer)."""
        return self.cuda_graphs != "none" or bool(self.cuda_graph_modules)

    def _check_fp8_recipe(self) -> None:
        """A recipe only with dtype fp8, one of FP8_RECIPES; fp8 without one scales as Megatron-LM's default."""
        if self.fp8_saved_input not in FP8_SAVED_INPUTS:
            raise _not_one_of("training", "fp8_saved_input", self.fp8_saved_input, FP8_SAVED_INPUTS)
        if not isinstance(self.fp8_tp_gather, bool):
            raise PlannerError(f"training: fp8_tp_gather must be true or false, got {self.fp8_tp_gather!r}")
        if self.dtype != "fp8":
            if self.fp8_recipe is not None:
                raise PlannerError(f"training: fp8_recipe applies to dtype fp8 only, got dtype {self.dtype!r} "
                                   f"with fp8_recipe {self.fp8_recipe!r}")
            return
        if self.fp8_recipe is None:
            object.__setattr__(self, "fp8_recipe", "delayed")
        if self.fp8_recipe not in FP8_RECIPES:
            raise _not_one_of("training", "fp8_recipe", self.fp8_recipe, FP8_RECIPES)

    def _check_finetune(self) -> None:
        """Adapter options only with adapters; their defaults filled in; QLoRA computes in 16 bits."""
        if self.finetune not in FINETUNE_MODES:
            raise _not_one_of("training", "finetune", self.finetune, FINETUNE_MODES)
        if self.optimizer_states not in OPTIMIZER_STATES:
            raise _not_one_of("training", "optimizer_states", self.optimizer_states, OPTIMIZER_STATES)
        if self.finetune == "full":
            given = [name for name in ("lora_rank", "lora_targets") if getattr(self, name) is not None]
            if given:
                names = " and ".join(name.replace("_", "-") for name in given)
                raise PlannerError(f"training: {names} only shape LoRA adapters: use finetune lora or qlora, "
                                   f"got finetune 'full'")
            return
        if self.lora_rank is None:
            object.__setattr__(self, "lora_rank", DEFAULT_LORA_RANK)
        if self.lora_targets is None:
            object.__setattr__(self, "lora_targets", DEFAULT_LORA_TARGETS)
        _positive("training", "lora_rank", self.lora_rank)
        if self.lora_targets not in LORA_TARGETS:
            raise _not_one_of("training", "lora_targets", self.lora_targets, LORA_TARGETS)
        if self.finetune == "qlora" and self.dtype == "fp8":
            raise PlannerError("training: qlora de-quantises its NF4 weights to 16 bits for every GEMM; "
                               "use dtype bf16 or fp16, got fp8")

    def keeps_fp8_inputs(self, tp: int) -> bool:
        """Whether an FP8 linear keeps its input for the weight gradient in FP8 at TP degree `tp`: Transformer
        Engine's always (`fp8_saved_input` "fp8"); torchao's, which keeps what it is handed, where tensor
        parallelism hands it an input already quantised (`fp8_tp_gather`: torchtitan's Float8 TP plans cast the
        input of every colwise and rowwise linear before it is gathered or used)."""
        return self.dtype == "fp8" and (self.fp8_saved_input == "fp8" or (self.fp8_tp_gather and tp > 1))

    @property
    def caches_fp8_weights(self) -> bool:
        """Whether its FP8 linears keep FP8 copies of their weights through an iteration: Transformer Engine's (the
        linears that keep FP8 inputs, `fp8_saved_input` "fp8") quantise a weight once per iteration when handed
        is_first_microbatch, as Megatron-LM does unless disable_parameter_transpose_cache, and reuse that workspace in
        every micro-batch's forward and backward; torchao's Float8Linear casts the weight in every pass and keeps no
        copy."""
        return self.dtype == "fp8" and self.fp8_saved_input == "fp8"

    @property
    def moe_expert_load(self) -> float:
        """Tokens the busiest expert rank processes over the mean: the imbalance, capped by the capacity."""
        return min(self.moe_load_imbalance, self.moe_capacity_factor or float("inf"))

    def expert_rank_load(self, ep: int) -> float:
        """`moe_expert_load` under expert parallelism; without it (ep 1) every rank runs every expert on its own
        tokens' routed copies, top-k each, so no rank gets more than the mean."""
        return self.moe_expert_load if ep > 1 else 1.0

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch * self.seq_len


@functools.cache
def _ordered_recompute_modules(modules: tuple[str, ...], recompute: Recompute, selective_recompute: str
                               ) -> tuple[str, ...]:
    """`ParallelConfig.recompute_modules` as stored: known modules, at least one, in Megatron's order once each; the
    default outside selective recompute; none but the default under torchtitan's per-op policy (one-line errors).
    Cached: the search builds every configuration with one of a few lists."""
    unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
    if unknown:
        raise PlannerError(f"parallel config: recompute_modules must be among {', '.join(RECOMPUTE_MODULES)}, "
                           f"got {unknown[0]!r}")
    if not modules:
        raise PlannerError("parallel config: recompute_modules must name at least one module (selective "
                           "recompute of nothing is recompute none), got none")
    ordered = tuple(name for name in RECOMPUTE_MODULES if name in modules)
    if recompute is not Recompute.SELECTIVE:
        ordered = DEFAULT_RECOMPUTE_MODULES
    if ordered != DEFAULT_RECOMPUTE_MODULES and selective_recompute != "attention":
        raise PlannerError(f"parallel config: recompute_modules {','.join(ordered)} are Megatron-LM's selective "
                           f"recompute; selective_recompute {selective_recompute!r} has its own policy")
    return ordered


def ep_overlap_why_not(ep: int, recompute: Recompute, pp: int, vpp: int) -> str | None:
    """None if Megatron-Core 0.16 can overlap EP all-to-alls with compute under these degrees, else why not
    (TransformerConfig.__post_init__: expert parallelism, no full recompute, and with pp > 1 a virtual pipeline,
    since the overlap pairs one micro-batch's forward with another's backward); a function of the fields, so the
    search decides it before building a configuration."""
    if ep == 1:
        return "EP communication overlap needs expert parallelism (ep > 1)"
    if recompute is Recompute.FULL:
        return "EP communication overlap cannot run with full recompute"
    if pp > 1 and vpp == 1:
        return f"EP communication overlap with pp={pp} needs the interleaved schedule (vpp > 1)"
    return None


@dataclass(frozen=True)
class ParallelConfig:
    """How one training job is split. Degrees multiply to the GPUs used: dp·tp·pp·cp.

    `vpp` is the number of model chunks per pipeline rank (interleaved schedule only).
    `cp` splits every sequence into cp parts (2·cp chunks, causally load-balanced) exchanged by `cp_comm`;
    ranks follow Megatron-LM's order tp-cp-dp-pp, so a CP group is cp ranks at stride tp.
    Weights are replicated over dp·cp ranks, which reduce gradients together and shard optimizer states
    (Megatron-LM's data-parallel group with CP, torchtitan's dp_shard_cp mesh).
    `zero_stage` follows DeepSpeed (1: optimizer states, 2: + gradients, 3: + parameters,
    sharded over dp·cp); `distributed_optimizer` is Megatron-LM's, which shards like ZeRO-1.
    `hsdp_replicas` R > 1 is HSDP: ZeRO-3 shards within groups of dp·cp/R consecutive ranks and the R
    replicas all-reduce the sharded gradients once per iteration (torchtitan data_parallel_replicate_degree).
    `ep` / `etp`: expert parallelism and expert tensor parallelism. The expert layers fold their own grid
    over the same ranks (Megatron-Core's parallel folding): etp·ep·edp = tp·cp·dp per pipeline stage,
    ranks in order etp-ep-edp, so an EP group is ep ranks at stride etp; each rank holds
    num_experts / ep experts, each split etp ways, replicated over edp = tp·cp·dp / (ep·etp) ranks
    that reduce their gradients and shard their optimizer states.
    `moe_dispatcher` (one of MOE_DISPATCHERS) moves the routed tokens; `moe_ep_overlap` runs the dispatch /
    combine all-to-alls of one micro-batch behind the compute of another (Megatron-Core's
    --overlap-moe-expert-parallel-comm, `ep_overlap_why_not` says when it can).
    `reshard_after_forward` (ZeRO-3/FSDP): free the gathered weights after each unit's forward and gather
    them again for its backward; None takes torchtitan's default, on without and off with pipelining.
    `zero3_collectives` (one of ZERO3_COLLECTIVES): per unit and prefetched, or per tensor and synchronous.
    `fsdp_backward_prefetch` (one of FSDP_BACKWARD_PREFETCHES): whether per-unit ZeRO-3 gathers the next unit's
    weights in backward before or after the current unit's gradient computation.
    `selective_recompute` (one of SELECTIVE_RECOMPUTES): what `Recompute.SELECTIVE` keeps, Megatron-LM's or
    torchtitan's policy.
    `recompute_modules` (RECOMPUTE_MODULES, at least one): what Megatron-LM's selective recompute re-runs, stored
    once each in Megatron's order; it means something only under `Recompute.SELECTIVE` (elsewhere it is reset to
    the default) and only Megatron's policy has it (`selective_recompute` "attention").
    `deepspeed_optimizer` (one of DEEPSPEED_OPTIMIZERS): DeepSpeed's optimizer wrapper for ZeRO-1 sharding; "bf16"
    (BF16_Optimizer) needs zero_stage 1, the planner's name for the sharding it does itself.
    `fp8_param_gather` (FP8 training with sharded weights): the linear weights are gathered in FP8, one byte each
    (torchao's enable_fsdp_float8_all_gather under FSDP2, Megatron-LM's --fp8-param-gather).
    `recompute_num_layers` (at least 1; it means something only under `Recompute.FULL`, elsewhere it is reset to
    None): each model chunk recomputes its first N blocks in full and keeps the others' activations, as
    Megatron-LM's block method does (a chunk of at most N blocks recomputes them all); None recomputes every block.
    """

    dp: int
    tp: int
    pp: int
    micro_batch: int = 1
    vpp: int = 1
    cp: int = 1
    cp_comm: str = "p2p"
    ep: int = 1
    etp: int = 1
    moe_dispatcher: str = "alltoall"
    moe_ep_overlap: bool = False
    hsdp_replicas: int = 1
    reshard_after_forward: bool | None = None
    zero3_collectives: str = "per-unit"
    fsdp_backward_prefetch: str = "pre"
    selective_recompute: str = "attention"
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    fp8_param_gather: bool = False
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    # under full recompute, the blocks of each model chunk recomputed: its first N (Megatron-LM's
    # --recompute-method block --recompute-num-layers N), the rest keep their activations; None: every block
    recompute_num_layers: int | None = None
    # activations of this many blocks moved to host memory during the forward and back for their backward
    # (Megatron-Core's --cpu-offloading-num-layers; `offloaded_activation_bytes`, `activation_offload_s`)
    cpu_offload_layers: int = 0
    zero_stage: int = 0
    distributed_optimizer: bool = False
    deepspeed_optimizer: str = "zero"
    schedule: Schedule = Schedule.ONE_F_ONE_B
    local_queue_depth: int = DEFAULT_LOCAL_QUEUE_DEPTH  # the local schedule's queue between stages (slots)
    local_head: str = "linear"  # the local schedule's auxiliary head, one of LOCAL_HEADS
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    # each TP rank sends 1/tp of a boundary tensor (Megatron-LM's scatter/gather, DeepSpeed's partitioned
    # pipeline transfers); off: every TP rank sends it whole
    p2p_scatter_gather: bool = True
    # a boundary's activation and gradient cross at once, one each way over the full-duplex link (Megatron-LM's
    # batched isend/irecv pairs, send_forward_recv_backward; torch.distributed.pipelining's batched sends and
    # receives): one transfer time per boundary and micro-batch; off: one after the other (DeepSpeed's
    # PipelineEngine, blocking p2p.send / p2p.recv of one tensor at a time)
    p2p_duplex: bool = True
    # DeepSpeed's pipeline engine as released before DEEPSPEED_MODERN_PIPELINE: with pp > 1 every transformer layer
    # pays `Calibration.legacy_pipeline_layer_s` per forward pass of a micro-batch (twice in its backward), a cost
    # of the engine whose mechanism is not identified (`deepspeed_legacy_pipeline`, docs/accuracy.md)
    legacy_pipeline_engine: bool = False
    overlap_tp_backward: bool = True  # backward TP all-reduce overlapped with wgrad GEMMs (Megatron-LM ≥ 2021-11)
    # SP all-gathers / reduce-scatters chunked and pipelined with their GEMMs: Megatron-LM's
    # --tp-comm-overlap (Transformer Engine userbuffers), torchtitan's async TP
    tp_comm_overlap: bool = False
    # pipeline sends/receives issued ahead and waited on only when the next chunk needs them (`p2p_overlapped`);
    # None takes Megatron-LM's default: on under the interleaved schedule, off otherwise
    overlap_p2p_comm: bool | None = None
    # torchtitan's per-op SAC keeps the attention kernel's output and log-sum-exp (its save list names the SDPA op
    # that ran); False where it does not, and the attention runs again in backward: cuDNN attention (first on B200
    # from pytorch/torchtitan 3b85aa31f, 2025-05-14) until b39377f9f (2025-12-01) added every SDPA backend to the list
    sac_keeps_attention: bool = True
    # under sequence parallelism a column-parallel linear keeps for its weight gradient the all-gathered input
    # (DTensor's ColwiseParallel: the redistribute's output is what the matmul saves; torchtitan), so backward
    # gathers nothing more, rather than its own sequence shard, gathered again in backward (Megatron-LM's
    # linear_with_grad_accumulation_and_async_allreduce)
    sp_saves_gathered_input: bool = False
    # whose implementation of the schedule's order runs (PIPELINE_ORDERS): Megatron-LM's, or
    # torch.distributed.pipelining's (torchtitan), which differ for the interleaved schedule (`PyTorchInterleaved`)
    pipeline_order: str = "megatron"

    @property
    def pipeline_schedule(self) -> PipelineSchedule:
        """The schedule's behaviour in the framework's order (`schedule_of(schedule, pipeline_order)`)."""
        return schedule_of(self.schedule, self.pipeline_order)

    def column_input_shards(self) -> int:
        """Ranks a column-parallel linear's saved input is split over: tp where it keeps its sequence shard
        (Megatron-LM's sequence parallelism), else 1 (the whole input: replicated without SP, or gathered)."""
        return self.tp if self.sequence_parallel and not self.sp_saves_gathered_input else 1

    def __post_init__(self) -> None:
        for name, limit in _CONFIG_LIMITS.items():
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= limit:  # the search builds 10⁵ configurations
                _positive("parallel config", name, value, limit)
        if self.local_head not in LOCAL_HEADS:
            raise _not_one_of("parallel config", "local_head", self.local_head, LOCAL_HEADS)
        if self.pipeline_order not in PIPELINE_ORDERS:
            raise _not_one_of("parallel config", "pipeline_order", self.pipeline_order, PIPELINE_ORDERS)
        if self.cp_comm not in CP_COMMS:
            raise _not_one_of("parallel config", "cp_comm", self.cp_comm, CP_COMMS)
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise _not_one_of("parallel config", "moe_dispatcher", self.moe_dispatcher, MOE_DISPATCHERS)
        if self.selective_recompute not in SELECTIVE_RECOMPUTES:
            raise _not_one_of("parallel config", "selective_recompute", self.selective_recompute, SELECTIVE_RECOMPUTES)
        if self.fp8_param_gather and self.optimizer_sharding == 0:
            raise PlannerError("parallel config: fp8_param_gather gathers sharded weights and needs ZeRO-1/2/3 or the "
                               "distributed optimizer, got neither")
        if self.zero3_collectives not in ZERO3_COLLECTIVES:
            raise _not_one_of("parallel config", "zero3_collectives", self.zero3_collectives, ZERO3_COLLECTIVES)
        if self.zero3_collectives == "per-tensor" and (self.zero_stage != 3 or self.pp > 1):
            raise PlannerError(f"parallel config: zero3_collectives 'per-tensor' is DeepSpeed's ZeRO-3 without "
                               f"pipelining; needs zero_stage 3 and pp 1, got zero_stage {self.zero_stage}, "
                               f"pp {self.pp}")
        if self.fsdp_backward_prefetch not in FSDP_BACKWARD_PREFETCHES:
            raise _not_one_of("parallel config", "fsdp_backward_prefetch", self.fsdp_backward_prefetch,
                              FSDP_BACKWARD_PREFETCHES)
        if self.fsdp_backward_prefetch == "post" and (self.zero_stage != 3 or self.pp > 1
                                                      or self.zero3_collectives != "per-unit"):
            raise PlannerError(f"parallel config: fsdp_backward_prefetch 'post' is FSDP's BACKWARD_POST, for per-unit "
                               f"ZeRO-3 without pipelining; needs zero_stage 3, pp 1 and zero3_collectives "
                               f"'per-unit', got zero_stage {self.zero_stage}, pp {self.pp}, zero3_collectives "
                               f"{self.zero3_collectives!r}")
        if self.deepspeed_optimizer not in DEEPSPEED_OPTIMIZERS:
            raise _not_one_of("parallel config", "deepspeed_optimizer", self.deepspeed_optimizer, DEEPSPEED_OPTIMIZERS)
        if self.deepspeed_optimizer == "bf16" and (self.zero_stage != 1 or self.distributed_optimizer):
            raise PlannerError("parallel config: deepspeed_optimizer 'bf16' (BF16_Optimizer) shards like ZeRO-1; "
                               f"needs zero_stage 1 without the distributed optimizer, got zero_stage {self.zero_stage}"
                               + (" and distributed_optimizer" if self.distributed_optimizer else ""))
        if self.overlap_p2p_comm and not (self.schedule is Schedule.INTERLEAVED and self.pp > 1):
            raise PlannerError("parallel config: overlap_p2p_comm needs the interleaved schedule with pp > 1 "
                               f"(Megatron-LM overlaps pipeline sends only there), got {self.schedule.value} "
                               f"with pp={self.pp}")
        self._normalise()
        self._check_recompute_num_layers()
        self._check_cpu_offload()
        if self.zero_stage not in (0, 1, 2, 3):
            raise PlannerError(f"parallel config: zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.distributed_optimizer and self.zero_stage > 1:
            raise PlannerError(
                f"parallel config: the distributed optimizer shards like ZeRO-1; it cannot be combined "
                f"with zero_stage {self.zero_stage}"
            )
        if self.sequence_parallel and self.tp == 1:
            raise PlannerError("parallel config: sequence_parallel needs tp > 1 (Megatron-LM turns it off at tp=1)")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise PlannerError(
                f"parallel config: tp_comm_overlap overlaps the sequence-parallel collectives and needs "
                f"sequence_parallel with tp > 1 (Megatron-LM asserts it), got tp={self.tp}, sequence_parallel=False"
            )
        schedule_of(self.schedule).check(self.pp, self.vpp)
        if self.hsdp_replicas > 1 and self.zero_stage != 3:
            raise PlannerError(f"parallel config: hsdp_replicas {self.hsdp_replicas} shards within replicas and needs "
                               f"zero_stage 3 (FSDP), got zero_stage {self.zero_stage}")
        if self.replicas % self.hsdp_replicas:
            raise PlannerError(f"parallel config: hsdp_replicas {self.hsdp_replicas} must divide dp·cp = "
                               f"{self.replicas}")

    def _check_cpu_offload(self) -> None:
        """Megatron-Core 0.16 offloads activations only without pipelining and without recompute
        (TransformerConfig.__post_init__)."""
        layers = self.cpu_offload_layers
        if type(layers) is not int or layers < 0:
            raise PlannerError(f"parallel config: cpu_offload_layers must be a whole number >= 0 (blocks whose "
                               f"activations go to host memory), got {layers!r}")
        if layers and self.pp > 1:
            raise PlannerError(f"parallel config: cpu_offload_layers {layers} needs pp 1 (Megatron-Core has no CPU "
                               f"offloading with pipeline parallelism), got pp={self.pp}")
        if layers and self.recompute is not Recompute.NONE:
            raise PlannerError(f"parallel config: cpu_offload_layers {layers} needs recompute none (Megatron-Core's "
                               f"CPU offloading does not run with activation recompute), got {self.recompute.value}")

    def check_recompute_blocks(self, num_layers: int) -> None:
        """A block recompute (`recompute_num_layers`, Megatron-LM's --recompute-num-layers) re-runs at most every
        block the model has."""
        layers = self.recompute_num_layers
        if layers is not None and layers > num_layers:
            raise PlannerError(f"recompute_num_layers {layers} exceeds the model's {num_layers} blocks")

    def check_cpu_offload(self, num_layers: int, training: Training) -> None:
        """Megatron-Core offloads fewer blocks than the model has, and not under CUDA graphs."""
        layers = self.cpu_offload_layers
        if layers >= num_layers:
            raise PlannerError(f"parallel config: cpu_offload_layers {layers} must be below the model's {num_layers} "
                               f"blocks (Megatron-Core offloads fewer layers than it has)")
        if layers and training.graphs_anything:
            graphs = ",".join(training.cuda_graph_modules) or training.cuda_graphs
            raise PlannerError(f"parallel config: cpu_offload_layers {layers} does not run under CUDA graphs "
                               f"(Megatron-Core refuses them with CPU offloading), got CUDA graphs {graphs!r}")

    def check_cuda_graph_modules(self, training: Training, layer_kinds: tuple[int, int, int], dropout: bool) -> None:
        """What Megatron-Core 0.16's TransformerConfig refuses of per-layer CUDA graphs (Training.cuda_graph_modules)
        in a model of `layer_kinds` (ModelSpec.layer_kind_counts: MoE, dense-MLP and Mamba blocks): moe_router
        without MoE layers, mlp without a dense MLP (and mamba without a Mamba layer, which would capture nothing),
        full recompute (only a full-iteration graph recomputes whole blocks), a selectively recomputed module the graph
        covers only in part (moe under moe_router) or whose dropout the replay cannot redraw, and moe_preprocess where
        the alltoall dispatcher's preprocessing syncs (a capacity factor)."""
        modules = training.cuda_graph_modules
        if not modules:
            return
        named = f"cuda_graph_modules {','.join(modules)}"
        moe_layers, dense_layers, mamba_layers = layer_kinds
        if "moe_router" in modules and not moe_layers:
            raise PlannerError(f"training: {named}: moe_router needs MoE layers; the model has none")
        if "mlp" in modules and not dense_layers:
            raise PlannerError(f"training: {named}: mlp captures dense MLPs; the model has none")
        if "mamba" in modules and not mamba_layers:
            raise PlannerError(f"training: {named}: mamba captures Mamba layers; the model has none")
        if (why := graphed_recompute_why_not(modules, self.recompute, self.selective_modules, dropout)) is not None:
            raise PlannerError(f"parallel config: {why}")
        if "moe_preprocess" in modules and self.preprocess_syncs(training):
            raise PlannerError(f"training: {named}: the alltoall dispatcher's preprocessing syncs with a capacity "
                               f"factor, so Megatron-Core cannot capture moe_preprocess there")

    def preprocess_syncs(self, training: Training) -> bool:
        """Whether the token dispatcher's preprocessing reads token counts back to the host, so that Megatron-Core
        cannot capture it (moe_preprocess): the alltoall dispatcher's under a capacity factor."""
        return self.moe_dispatcher == "alltoall" and training.moe_capacity_factor is not None

    def _check_recompute_num_layers(self) -> None:
        """`recompute_num_layers` is a positive block count (`_normalise` has dropped it without full recompute)."""
        layers = self.recompute_num_layers
        if layers is not None and (type(layers) is not int or layers < 1):
            raise PlannerError(f"parallel config: recompute_num_layers must be a whole number >= 1 (blocks per model "
                               f"chunk recomputed), got {layers!r}")

    def recomputed_blocks(self, blocks: int) -> int:
        """How many of a model chunk's `blocks` are recomputed in full: all under full recompute unless
        `recompute_num_layers` picks fewer, none otherwise."""
        if self.recompute is not Recompute.FULL:
            return 0
        return blocks if self.recompute_num_layers is None else min(self.recompute_num_layers, blocks)

    def _normalise(self) -> None:
        """Fill the defaults that follow from other fields and store enums and recompute modules in their one form."""
        if self.reshard_after_forward is None:
            object.__setattr__(self, "reshard_after_forward", self.pp == 1)
        if not isinstance(self.recompute, Recompute):
            object.__setattr__(self, "recompute", Recompute(self.recompute))
        if self.recompute is not Recompute.FULL and self.recompute_num_layers is not None:
            object.__setattr__(self, "recompute_num_layers", None)  # only full recompute picks blocks
        self._check_recompute_modules()
        if not isinstance(self.schedule, Schedule):
            object.__setattr__(self, "schedule", Schedule(self.schedule))

    @classmethod
    def unchecked(cls, values: dict[str, object]) -> ParallelConfig:
        """The configuration of `values` (every field: `{**PARALLEL_DEFAULTS, ...}`), normalised as `__init__` does
        but not checked: for the search's space, whose 10⁵ layouts come from option lists checked once (space.py);
        `checked` runs the checks on one it uses. Equal to the checked configuration whenever that exists. The
        configuration keeps `values` as its fields (no copy): pass a dict of its own."""
        config = object.__new__(cls)
        object.__setattr__(config, "__dict__", values)
        config._normalise()
        return config

    def checked(self) -> ParallelConfig:
        """This configuration with every check of `__init__` run (PlannerError naming what is wrong)."""
        return replace(self)

    def _check_recompute_modules(self) -> None:
        """Store `recompute_modules` as `_ordered_recompute_modules` orders and checks them; a list that is not one of
        module names is refused first (one-line errors)."""
        modules = self.recompute_modules
        if modules is DEFAULT_RECOMPUTE_MODULES:  # valid and stored as it is under every recompute and policy
            return
        if isinstance(modules, str) or not isinstance(modules, (tuple, list)):
            raise PlannerError(f"parallel config: recompute_modules must be a list of module names, got {modules!r}")
        odd = next((name for name in modules if not isinstance(name, str)), None)
        if odd is not None:  # before hashing: the ordering is cached per list
            raise PlannerError(f"parallel config: recompute_modules must be among {', '.join(RECOMPUTE_MODULES)}, "
                               f"got {odd!r}")
        object.__setattr__(self, "recompute_modules",
                           _ordered_recompute_modules(tuple(modules), self.recompute, self.selective_recompute))

    @property
    def selective_modules(self) -> frozenset[str]:
        """The Megatron-Core modules the backward re-runs: `recompute_modules` under selective recompute, none
        otherwise (full recompute re-runs whole blocks; torchtitan's per-op policy is costed apart and leaves its
        other blocks with the default, the attention core)."""
        return frozenset(self.recompute_modules) if self.recompute is Recompute.SELECTIVE else frozenset()

    def check_experts(self, num_experts: int) -> None:
        """EP must divide the routed experts and ep·etp the tp·cp·dp ranks of a stage (one-line errors)."""
        if num_experts == 1 and self.ep * self.etp > 1:
            raise PlannerError(f"ep={self.ep}, etp={self.etp}: expert parallelism needs an MoE model; use ep=etp=1")
        if num_experts % self.ep:
            raise PlannerError(f"ep={self.ep} must divide the model's {num_experts} routed experts "
                               f"(an EP group larger than the expert count is not allowed)")
        if self.expert_group_ranks % (self.ep * self.etp):
            ranks = self.expert_group_ranks
            allowed = ", ".join(str(d) for d in range(1, ranks + 1) if ranks % d == 0)
            raise PlannerError(f"ep·etp = {self.ep}·{self.etp} must divide tp·cp·dp = {ranks}, the ranks of one "
                               f"pipeline stage (allowed ep·etp: {allowed})")

    def ep_overlap_why_not(self) -> str | None:
        """None if Megatron-Core 0.16 can overlap this configuration's EP all-to-alls with compute, else why not
        (`ep_overlap_why_not`)."""
        return ep_overlap_why_not(self.ep, self.recompute, self.pp, self.vpp)

    @property
    def expert_group_ranks(self) -> int:
        """Ranks of one pipeline stage, over which the expert grid etp·ep·edp folds: tp·cp·dp."""
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """Expert data parallelism: replicas of each expert shard, tp·cp·dp / (ep·etp)."""
        return max(self.expert_group_ranks // (self.ep * self.etp), 1)

    def check_sequence(self, seq_len: int) -> None:
        """Causal load balancing cuts each sequence into 2·cp chunks, so it must divide by 2·cp."""
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise PlannerError(f"sequence length {seq_len} must be divisible by 2·cp = {2 * self.cp} for context "
                               f"parallelism's causal load balancing (cp={self.cp})")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights, which reduce gradients together: dp·cp."""
        return self.dp * self.cp

    @property
    def shard_group(self) -> int:
        """Ranks ZeRO / the distributed optimizer shard states over: dp·cp, or dp·cp / R under HSDP."""
        return self.replicas // self.hsdp_replicas

    @property
    def stage_ranks(self) -> tuple[int, ...]:
        """The pipeline rank of each virtual stage, the schedule's layout (cost/schedule.py `stage_ranks`)."""
        return stage_ranks(self.schedule, self.pp, self.pp * self.vpp)

    @property
    def num_virtual_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def optimizer_sharding(self) -> int:
        """0: replicated; 1: optimizer states sharded; 2: + grads; 3: + params (over `shard_group`)."""
        return optimizer_sharding_of(self.zero_stage, self.distributed_optimizer)

    def num_microbatches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per iteration; the global batch must divide evenly."""
        per_step = self.micro_batch * self.dp
        if global_batch % per_step:
            raise PlannerError(
                f"global batch {global_batch} is not divisible by micro_batch × dp = "
                f"{self.micro_batch} × {self.dp} = {per_step}"
            )
        return global_batch // per_step

    @property
    def p2p_overlapped(self) -> bool:
        """Whether stage-boundary transfers hide behind the chunks' compute: Megatron-LM's interleaved schedule
        posts each chunk's sends and receives asynchronously and waits on them only before the chunk that needs
        them (--overlap-p2p-communication, its default there: arguments.py turns it off for other schedules)."""
        if self.overlap_p2p_comm is None:
            return self.schedule is Schedule.INTERLEAVED and self.pp > 1
        return self.overlap_p2p_comm

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.cp > 1:
            parts.append(f"cp={self.cp}/{self.cp_comm}")
        if self.ep * self.etp > 1:
            parts.append(f"ep={self.ep}" + (f"/etp={self.etp}" if self.etp > 1 else "")
                         + ("/flex" if self.moe_dispatcher == "flex" else "")
                         + ("/overlap" if self.moe_ep_overlap else ""))
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        modules = "" if self.recompute_modules == DEFAULT_RECOMPUTE_MODULES else f"[{','.join(self.recompute_modules)}]"
        layers = "" if self.recompute_num_layers is None else f":{self.recompute_num_layers}"
        parts += [f"mb={self.micro_batch}", f"recompute={self.recompute.value}{layers}{modules}"]
        if self.cpu_offload_layers:
            parts.append(f"offload={self.cpu_offload_layers}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.tp_comm_overlap:
            parts.append("tp-overlap")
        if self.distributed_optimizer:
            parts.append("dist-opt")
        elif self.zero_stage:
            parts.append(f"zero{self.zero_stage}" + ("/per-tensor" if self.zero3_collectives == "per-tensor" else "")
                         + ("/post-prefetch" if self.fsdp_backward_prefetch == "post" else "")
                         + ("/bf16-opt" if self.deepspeed_optimizer == "bf16" else ""))
        if self.fp8_param_gather:
            parts.append("fp8-gather")
        if self.hsdp_replicas > 1:
            parts.append(f"hsdp{self.hsdp_replicas}")
        parts.append(self.schedule.value)
        if schedule_of(self.schedule).local_losses:
            parts.append(f"queue={self.local_queue_depth} head={self.local_head}")
        return " ".join(parts)


PARALLEL_DEFAULTS = MappingProxyType({f.name: f.default for f in fields(ParallelConfig) if f.default is not MISSING})
"""Every defaulted field of ParallelConfig with its default (what `ParallelConfig.unchecked` values start from)."""


def fp8_param_gather_why_not(training: Training) -> str | None:
    """None when `training` can gather its weights in FP8 (`ParallelConfig.fp8_param_gather`), else what it needs:
    FP8 training, every parameter trained (adapters' frozen base weights are gathered as stored), and with optimizer
    states in host memory delayed scaling (Megatron-LM's validate_args; no other target offloads them beside FP8
    weights)."""
    if training.dtype != "fp8":
        return f"needs FP8 training (--dtype fp8), got {training.dtype}"
    if training.finetune != "full":
        return f"needs every parameter trained (--finetune full), got {training.finetune}"
    if training.optimizer_states == "cpu" and training.fp8_recipe != "delayed":
        return ("with optimizer states in host memory needs --fp8-recipe delayed (Megatron-LM's optimizer CPU offload "
                f"keeps FP8 weights only under delayed scaling), got {training.fp8_recipe}")
    return None


@dataclass(frozen=True)
class Partition:
    """Units per virtual stage, in virtual-pipeline order; together they cover every unit once, in order."""

    unit_counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.unit_counts or any(c < 1 for c in self.unit_counts):
            raise PlannerError(f"partition: every stage needs at least one unit, got {list(self.unit_counts)}")

    @property
    def num_stages(self) -> int:
        return len(self.unit_counts)

    @property
    def num_units(self) -> int:
        return sum(self.unit_counts)

    def bounds(self) -> list[tuple[int, int]]:
        """[start, end) unit indices per virtual stage."""
        out, start = [], 0
        for count in self.unit_counts:
            out.append((start, start + count))
            start += count
        return out

    def block_ranges(self) -> list[tuple[int, int]]:
        """[start, end) transformer-block indices per stage (units minus embedding and head)."""
        num_layers = self.num_units - 2
        return [(min(max(a - 1, 0), num_layers), min(max(b - 1, 0), num_layers)) for a, b in self.bounds()]

    def blocks_per_stage(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.block_ranges())

    @classmethod
    def from_blocks(cls, blocks_per_stage: tuple[int, ...] | list[int], num_layers: int) -> Partition:
        """Embedding joins the first stage and the head the last (Megatron-LM's default placement)."""
        counts = list(blocks_per_stage)
        text = ",".join(map(str, counts))
        if any(c < 0 for c in counts):
            raise PlannerError(f"partition {text}: block counts must be non-negative")
        if sum(counts) != num_layers:
            raise PlannerError(
                f"partition {text} must give block counts summing to {num_layers} (the model's layers), "
                f"got a sum of {sum(counts)}"
            )
        counts[0] += 1
        counts[-1] += 1
        return cls(tuple(counts))

    @classmethod
    def uniform(cls, num_layers: int, num_stages: int) -> Partition:
        """Blocks spread as evenly as possible, the earlier stages taking the remainder."""
        if num_stages > num_layers:
            raise PlannerError(f"cannot split {num_layers} layers into {num_stages} non-empty stages")
        base, extra = divmod(num_layers, num_stages)
        return cls.from_blocks([base + (1 if i < extra else 0) for i in range(num_stages)], num_layers)
