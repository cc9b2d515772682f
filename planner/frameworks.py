"""The export targets at a stated version: what each can run, and how its engine runs it.

A plan is only worth launching if the framework runs it as planned, so a `Framework` answers two
questions. `why_not(config)`: None when the framework runs the configuration exactly (sharding kind
with or without pipeline parallelism, schedule, sequence parallelism, TP communication overlap,
CP, EP, the MoE token dispatcher and EP communication overlap), else the reason in one line.
`runs(config)`: the configuration with the framework's execution semantics, the ParallelConfig flags the
cost model reads (`p2p_scatter_gather`, `overlap_grad_reduce`, `overlap_tp_backward`, whose order the pipeline
schedules run in: `pipeline_order`); a plan is estimated the way its engine runs.

Versions and sources (../shared/REFERENCE.md): Megatron-LM core 0.16 (`megatron/training/arguments.py`;
Megatron-FSDP: `--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads|optim_grads_params`),
DeepSpeed 0.19 driven by Megatron-DeepSpeed (`PipelineEngine` asserts ZeRO < 2 with PP, reduces
gradients after the pipeline flush, sends each TP rank's 1/tp slice of a boundary tensor and gathers it on the
receiver: `is_pipe_partitioned`; no interleaving),
torchtitan 0.2.2 (FSDP2/HSDP, TP always with sequence parallelism, async TP under torch.compile;
pipeline schedules from torch.distributed.pipelining, `torchtitan/distributed/pipeline_parallel.py`).
MoE token dispatch: Megatron-Core's --moe-token-dispatcher-type alltoall or flex (DeepEP / HybridEP) and
--overlap-moe-expert-parallel-comm; torchtitan's parallelism.expert_parallel_comm_backend "standard"
(all-to-all) or "deepep" (flex), its EP overlap only under the DualPipeV schedule without activation checkpointing;
Megatron-DeepSpeed's MoE all-to-all only.
"any" runs every configuration planner models, with Megatron-LM's semantics; its search leaves out the schedules
that split the backward (zero bubble) unless --schedule names one: only torchtitan runs them, and searching them
for every target would double the space (`Framework.searches`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from planner.config import (
    CP_COMMS,
    DEFAULT_RECOMPUTE_MODULES,
    FP8_RECIPES,
    MOE_DISPATCHERS,
    OPTIMIZER_STATES,
    ParallelConfig,
    Recompute,
    Schedule,
    Training,
)
from planner.cost.schedule import schedule_of
from planner.errors import PlannerError
from planner.model import ModelSpec
from planner.titan_models import find_flavor

__all__ = ["FRAMEWORKS", "FRAMEWORK_NAMES", "TARGET_NAMES", "Framework", "framework_named",
           "megatron_overlaps_param_gather", "runs_on"]

Semantics = Callable[[ParallelConfig], dict[str, bool | str]]


def megatron_overlaps_param_gather(optimizer_sharding: int) -> bool:
    """Whether Megatron-LM gathers the updated weights behind the next forward (--overlap-param-gather): wherever
    optimizer states are sharded (the distributed optimizer, Megatron-FSDP), as every NVIDIA recipe and
    Megatron-LM's scaling runs set it (it needs --overlap-grad-reduce and one of those)."""
    return optimizer_sharding >= 1


def _megatron_semantics(config: ParallelConfig) -> dict[str, bool | str]:
    """Megatron-LM: 1/tp of a boundary tensor per rank, gradient reduction and backward TP collectives overlapped,
    and with sharded optimizer states the weights' all-gather after the step (`megatron_overlaps_param_gather`);
    selective recompute of the attention core."""
    return {"p2p_scatter_gather": True, "p2p_duplex": True, "overlap_grad_reduce": True, "overlap_tp_backward": True,
            "overlap_param_gather": megatron_overlaps_param_gather(config.optimizer_sharding),
            "selective_recompute": "attention", "sp_saves_gathered_input": False}


def _deepspeed_semantics(config: ParallelConfig) -> dict[str, bool | str]:
    """DeepSpeed: with model parallelism the pipeline engine partitions a boundary's activation and gradient over
    the TP ranks, each sending its 1/tp slice, gathered on the receiver (`PipelineEngine.is_pipe_partitioned` and
    `is_grad_partitioned`, the `pipeline` config's pipe_partitioned / grad_partitioned, on by default; releases
    before v0.6.0 sent the gradient whole), and reduces gradients after
    the flush; without PP only ZeRO's overlap_comm hides the reduction (ZeRO-0 all-reduces after backward);
    Megatron-DeepSpeed's TP backward all-reduces are not overlapped; ZeRO-3 gathers a module's parameters
    together, prefetched (since v0.6.0; the per-tensor gathers before it are `zero3_collectives` "per-tensor")."""
    return {"p2p_scatter_gather": True, "p2p_duplex": False,
            "overlap_grad_reduce": config.pp == 1 and config.zero_stage >= 1,
            "overlap_param_gather": False, "overlap_tp_backward": False, "selective_recompute": "attention",
            "zero3_collectives": "per-unit", "fsdp_backward_prefetch": "pre", "sp_saves_gathered_input": False}


def _torchtitan_semantics(_config: ParallelConfig) -> dict[str, bool | str]:
    """torchtitan: DDP/FSDP2 reduce during backward (FSDP2 gathers per wrapped block, prefetched); DTensor TP's
    backward collectives are synchronous, and its colwise linears keep the all-gathered input of sequence
    parallelism for backward; selective recompute is its per-op SAC (the export's selective_ac_option "op");
    PyTorch's pipeline schedules wait on each step's batched sends and receives before the next action."""
    return {"p2p_scatter_gather": True, "p2p_duplex": True, "overlap_grad_reduce": True,
            "overlap_param_gather": False, "overlap_tp_backward": False, "selective_recompute": "op",
            "zero3_collectives": "per-unit",
            "overlap_p2p_comm": False, "fsdp_backward_prefetch": "pre", "sp_saves_gathered_input": True}


@dataclass(frozen=True)
class Framework:
    """One target at one version: what it runs (`why_not`) and how it runs it (`runs`)."""

    name: str
    version: str
    schedules: frozenset[Schedule]
    # (zero_stage, distributed_optimizer) it runs without and with pipeline parallelism
    sharding: frozenset[tuple[int, bool]]
    sharding_with_pp: frozenset[tuple[int, bool]]
    tp_without_sp: bool
    tp_comm_overlap: bool
    cp_comms: frozenset[str]  # context-parallel exchanges it runs (empty: no CP)
    expert_parallel: bool
    expert_tp_any: bool  # expert TP of any degree, not only 1 or tp
    moe_dispatchers: frozenset[str]  # token dispatchers it runs (MOE_DISPATCHERS)
    moe_ep_overlap: bool  # EP all-to-alls overlapped with another micro-batch's compute
    hsdp: bool  # ZeRO-3 sharded within replica groups
    keeps_gathered_weights: bool  # ZeRO-3 without re-sharding after forward
    semantics: Semantics
    # how it shards optimizer states only (the search's ZeRO-1 / distributed-optimizer option); None: it cannot
    optimizer_sharding_only: tuple[int, bool] | None
    tp_overlap_with_split_backward: bool = True  # TP communication overlap under a zero-bubble schedule
    # schedules the search tries when --schedule is left open (None: every one it runs)
    searched_schedules: frozenset[Schedule] | None = None
    # EP communication overlap only under these schedules and without activation recompute (None: wherever
    # moe_ep_overlap and ParallelConfig.ep_overlap_why_not allow it)
    ep_overlap_schedules: frozenset[Schedule] | None = None
    # why its launcher cannot train LoRA / QLoRA adapters (what is missing); None: it can
    no_adapters: str | None = None
    # Training.optimizer_states it runs, each with the sharding it needs (None: any), e.g. offload's
    optimizer_states: tuple[tuple[str, frozenset[tuple[int, bool]] | None], ...] = (("fp32", None),)
    pipelines: bool = True  # pipeline parallelism (pp > 1)
    flex_with_etp: bool = True  # the flex (DeepEP) dispatcher with expert tensor parallelism (etp > 1)
    # what its selective recompute re-runs when it takes no Megatron-LM --recompute-modules list (None: it takes one)
    fixed_selective_recompute: str | None = None
    # the fused kernels it always runs norms, RoPE and activations with (None: it runs eager ones too,
    # Training.elementwise)
    fused_elementwise_only: str | None = None
    # it runs the loss as PyTorch's F.cross_entropy, compiled with the model when its element-wise kernels are
    # (torchtitan compiles its loss since pytorch/torchtitan bbb1b616e, 2025-04); False: Megatron-LM's fused kernel
    loss_follows_compile: bool = False
    # it captures a whole iteration in one CUDA graph (Training.cuda_graphs "full_iteration"); where it cannot for a
    # model it otherwise could, why (`model_limits`)
    full_iteration_graphs: bool = False
    full_iteration_graphs_why_not: str | None = None
    # it captures parts of each layer in per-layer CUDA graphs (Training.cuda_graph_modules)
    module_graphs: bool = False
    # Training.fp8_recipe values it runs, its default first (with --dtype fp8 and no --fp8-recipe)
    fp8_recipes: tuple[str, ...] = FP8_RECIPES
    # what its FP8 linears keep of their input for the weight gradient (Training.fp8_saved_input)
    fp8_saved_input: str = "fp8"
    # the FP8 recipes under which it gathers weights in FP8 (ParallelConfig.fp8_param_gather); None: every one, (): none
    fp8_gather_recipes: tuple[str, ...] | None = None
    # the FP8 recipes under which sequence parallelism's all-gathers move FP8 activations (Training.fp8_tp_gather);
    # None: every one (Transformer Engine quantises a linear's input, or its output gradient, before gathering it)
    fp8_tp_gather_recipes: tuple[str, ...] | None = None
    # what it runs of a given model, narrowed from the above (None: every model alike); see `for_model`
    model_limits: Callable[[Framework, ModelSpec], dict[str, object]] | None = None
    # how it recomputes only some blocks of a chunk (ParallelConfig.recompute_num_layers): "first" (Megatron-LM's
    # block method, the first N of each chunk), "first without pp" (Megatron-DeepSpeed: its pipeline engine
    # recomputes every layer of a stage), "every k-th" (torchtitan's per-layer AC: N must divide a chunk's blocks)
    block_recompute: str = "first"
    # whose order it runs the pipeline schedules in (ParallelConfig.pipeline_order, PIPELINE_ORDERS)
    pipeline_order: str = "megatron"
    # it moves blocks' activations to host memory and back (ParallelConfig.cpu_offload_layers)
    activation_offload: bool = False

    def for_model(self, model: ModelSpec) -> Framework:
        """This framework as it runs `model`: some targets run only part of their features for some models
        (torchtitan 0.2.2's qwen3 has no pipelining and no DeepEP dispatcher)."""
        return replace(self, **self.model_limits(self, model)) if self.model_limits else self

    def gathers_weights_in_fp8(self, fp8_recipe: str | None) -> bool:
        """Whether under FP8 recipe `fp8_recipe` it can gather sharded weights in FP8 (`fp8_gather_recipes`)."""
        return self.fp8_gather_recipes is None or fp8_recipe in self.fp8_gather_recipes

    def fp8_gather_why_not(self, fp8_recipe: str | None) -> str | None:
        """None where it gathers sharded weights in FP8 under `fp8_recipe`, else why not (one line)."""
        if self.gathers_weights_in_fp8(fp8_recipe):
            return None
        if not self.fp8_gather_recipes:
            return f"{self.version} gathers its sharded weights in 16 bits, never in FP8"
        return (f"{self.version} gathers weights in FP8 only with {' or '.join(self.fp8_gather_recipes)} scaling, "
                f"got {fp8_recipe}")

    def gathers_tp_in_fp8(self, fp8_recipe: str | None) -> bool:
        """Whether under FP8 recipe `fp8_recipe` its sequence-parallel all-gathers move FP8 activations."""
        return self.fp8_tp_gather_recipes is None or fp8_recipe in self.fp8_tp_gather_recipes

    def loss_kernel(self, elementwise: str) -> str:
        """How it runs the loss over the logits (Training.cross_entropy) when its norms and activations run
        `elementwise` (fused: compiled; eager: op by op)."""
        if not self.loss_follows_compile:
            return "fused"
        return "compiled" if elementwise == "fused" else "eager"

    def overlaps_ep(self, config: ParallelConfig) -> bool:
        """Whether it can overlap `config`'s EP all-to-alls with compute (before ParallelConfig's own rules)."""
        if self.ep_overlap_schedules is None:
            return self.moe_ep_overlap
        return (self.moe_ep_overlap and config.schedule in self.ep_overlap_schedules
                and config.recompute is Recompute.NONE)

    def overlaps_tp(self, config: ParallelConfig) -> bool:
        """Whether it can overlap TP communication with the GEMMs under `config`'s pipeline schedule."""
        return self.tp_comm_overlap and (config.pp == 1 or self.tp_overlap_with_split_backward
                                         or not schedule_of(config.schedule).splits_backward)

    def searches(self, schedule: Schedule) -> bool:
        """Whether the search tries `schedule` when the user leaves --schedule open: every schedule a named
        target runs; "any" only those that do not split the backward (no target it stands for runs the
        zero-bubble ones except torchtitan, which `--framework torchtitan` searches), so its space stays bounded."""
        allowed = self.schedules if self.searched_schedules is None else self.searched_schedules
        return schedule in allowed

    def check_schedule(self, schedule: Schedule) -> None:
        """PlannerError naming `schedule` and what this framework runs when it cannot run it."""
        if schedule not in self.schedules:
            runs = ", ".join(s.value for s in Schedule if s in self.schedules)
            where = ", ".join(name for name in TARGET_NAMES if schedule in FRAMEWORKS[name].schedules)
            hint = (f"; --framework {where} runs it" if where
                    else f"; {_no_target(schedule)} (plan with --framework any)")
            raise PlannerError(f"--schedule {schedule.value}: {self.version} has no such pipeline schedule "
                               f"(it runs {runs}){hint}")

    def training_why_not(self, training: Training, config: ParallelConfig | None = None) -> str | None:
        """None if this framework trains `training` (fine-tuning mode, optimizer states) as planned, else why not;
        with `config`, also whether the optimizer states' placement fits its sharding (one line)."""
        if training.finetune != "full" and self.no_adapters:
            return f"{self.version} cannot fine-tune with {training.finetune}: {self.no_adapters}"
        if training.elementwise == "eager" and self.fused_elementwise_only:
            return f"{self.version} has no eager element-wise kernels: it runs {self.fused_elementwise_only}"
        if training.cuda_graphs != "none" and not self.full_iteration_graphs:
            why = f" ({self.full_iteration_graphs_why_not})" if self.full_iteration_graphs_why_not else ""
            return f"{self.version} cannot capture a whole iteration in one CUDA graph{why}"
        if training.cuda_graph_modules and not self.module_graphs:
            return f"{self.version} cannot capture parts of each layer in per-layer CUDA graphs"
        if training.dtype == "fp8" and training.fp8_recipe not in self.fp8_recipes:
            return (f"{self.version} has no {training.fp8_recipe} FP8 recipe (it runs "
                    f"{', '.join(self.fp8_recipes)})")
        if config is not None and config.fp8_param_gather and (why := self.fp8_gather_why_not(training.fp8_recipe)):
            return why
        needs = dict(self.optimizer_states)
        if training.optimizer_states not in needs:
            return f"{self.version} has no {training.optimizer_states} optimizer states"
        allowed = needs[training.optimizer_states]
        if config is not None and allowed and (config.zero_stage, config.distributed_optimizer) not in allowed:
            names = " or ".join(_sharding_name(sharding) for sharding in sorted(allowed))
            return f"{self.version} keeps {training.optimizer_states} optimizer states only with {names}"
        return None

    def require_training(self, training: Training, config: ParallelConfig | None = None) -> None:
        """PlannerError naming what is missing when this framework cannot train `training` (with `config`)."""
        why = self.training_why_not(training, config)
        if why:
            raise PlannerError(f"{why}; plan with --framework any to see the estimate")

    def why_not(self, config: ParallelConfig) -> str | None:
        """None if this framework runs `config` exactly as planned, else why not (one line)."""
        sharding = (config.zero_stage, config.distributed_optimizer)
        allowed = self.sharding_with_pp if config.pp > 1 else self.sharding
        if sharding not in allowed:
            with_pp = " with pipeline parallelism" if config.pp > 1 else ""
            return f"{self.version} cannot run {_sharding_name(sharding)}{with_pp}"
        if config.pp > 1 and config.schedule not in self.schedules:
            return f"{self.version} has no {config.schedule.value} pipeline schedule"
        if config.pp == 1 and config.schedule is Schedule.GPIPE and Schedule.GPIPE not in self.schedules:
            return f"{self.version} runs micro-batches one after another, not GPipe's all-forwards-first"
        if config.pp > 1 and not self.pipelines:
            return f"{self.version} has no pipeline parallelism (pp={config.pp})"
        if config.tp > 1 and not config.sequence_parallel and not self.tp_without_sp:
            return f"{self.version} always runs tensor parallelism with sequence parallelism"
        if config.tp_comm_overlap and not self.tp_comm_overlap:
            return f"{self.version} cannot overlap TP communication with its GEMMs"
        if config.tp_comm_overlap and not self.overlaps_tp(config):
            return (f"{self.version} cannot overlap TP communication (it needs torch.compile) under the "
                    f"{config.schedule.value} schedule")
        if config.cp > 1 and config.cp_comm not in self.cp_comms:
            return f"{self.version} has no {config.cp_comm} context parallelism (cp={config.cp})"
        if config.ep > 1 and not self.expert_parallel:
            return f"{self.version} has no expert parallelism"
        if config.ep > 1 and config.moe_dispatcher not in self.moe_dispatchers:
            return f"{self.version} has no {config.moe_dispatcher} MoE token dispatcher"
        if config.ep > 1 and config.moe_dispatcher == "flex" and config.etp > 1 and not self.flex_with_etp:
            return f"{self.version} runs DeepEP only without expert tensor parallelism (etp={config.etp})"
        if config.moe_ep_overlap and not self.moe_ep_overlap:
            return f"{self.version} cannot overlap EP communication with compute"
        if config.moe_ep_overlap and not self.overlaps_ep(config):
            names = ", ".join(s.value for s in Schedule if s in (self.ep_overlap_schedules or ()))
            return (f"{self.version} overlaps EP communication only under the {names} schedule without activation "
                    f"recompute, got {config.schedule.value} with recompute={config.recompute.value}")
        if config.moe_ep_overlap and (why := config.ep_overlap_why_not()):
            return f"{self.version}: {why}"
        if config.etp not in (1, config.tp) and not self.expert_tp_any:
            return f"{self.version} splits experts over 1 or tp={config.tp} ranks, not etp={config.etp}"
        if config.hsdp_replicas > 1 and not self.hsdp:
            return f"{self.version} has no HSDP (hsdp_replicas={config.hsdp_replicas})"
        if config.zero_stage == 3 and not config.reshard_after_forward and not self.keeps_gathered_weights:
            return f"{self.version} re-shards ZeRO-3 weights after every forward"
        if config.cpu_offload_layers and not self.activation_offload:
            return (f"{self.version} cannot move activations to host memory (cpu_offload_layers "
                    f"{config.cpu_offload_layers}: Megatron-LM's --cpu-offloading-num-layers)")
        return self.block_recompute_why_not(config) or self.recompute_modules_why_not(config.recompute_modules)

    def block_recompute_why_not(self, config: ParallelConfig,
                                blocks_per_chunk: Sequence[int] | None = None) -> str | None:
        """None if it runs `config`'s block recompute (`ParallelConfig.recompute_num_layers`) as planned, over chunks
        of `blocks_per_chunk` blocks when given (a count it cannot run, `block_recompute_counts`), else why not."""
        layers = config.recompute_num_layers
        if layers is None:
            return None
        if config.pp > 1 and self.block_recompute == "first without pp":
            return (f"{self.version}'s pipeline engine recomputes every layer of a stage, not "
                    f"recompute_num_layers={layers} of them")
        if (blocks_per_chunk is not None and layers < max(blocks_per_chunk)
                and layers not in self.block_recompute_counts(blocks_per_chunk)):
            return (f"{self.version} recomputes every k-th block (selective_ac_option = k), so the plan's "
                    f"recompute_num_layers {layers} must divide every stage's blocks equally; its stages hold "
                    f"{', '.join(map(str, blocks_per_chunk))}")
        return None

    def block_recompute_counts(self, blocks_per_chunk: Sequence[int]) -> list[int]:
        """The recompute_num_layers it can run for chunks of `blocks_per_chunk` blocks that recompute only some of
        them (fewer than the largest chunk): any count under Megatron-LM's block method, a count dividing every
        chunk's (equal) blocks under torchtitan's every-k-th-block AC."""
        largest = max(blocks_per_chunk)
        if self.block_recompute == "every k-th" and len(set(blocks_per_chunk)) > 1:
            return []
        return [n for n in range(1, largest) if self.block_recompute != "every k-th" or largest % n == 0]

    def recompute_modules_why_not(self, modules: tuple[str, ...]) -> str | None:
        """None if it runs selective recompute of `modules` (Megatron-LM's --recompute-modules), else why not."""
        if modules == DEFAULT_RECOMPUTE_MODULES or self.fixed_selective_recompute is None:
            return None
        return (f"{self.version} cannot recompute modules {','.join(modules)} (Megatron-LM's --recompute-modules): "
                f"its selective recompute is {self.fixed_selective_recompute}")

    def runs(self, config: ParallelConfig) -> ParallelConfig:
        """`config` with this framework's execution semantics (what the cost model reads of the engine)."""
        semantics = self.semantics(config) | {"pipeline_order": self.pipeline_order}
        if semantics.items() <= vars(config).items():  # every one a field already so (one C-level test per layout)
            return config
        return replace(config, **semantics)

    def require(self, config: ParallelConfig, model: ModelSpec | None = None,
                blocks_per_chunk: Sequence[int] | None = None) -> ParallelConfig:
        """`config` (of `model`, when given, split into chunks of `blocks_per_chunk` blocks, when given) as this
        framework runs it; PlannerError naming why and what to plan with when it cannot."""
        target = self if model is None else self.for_model(model)
        why = target.why_not(config) or target.block_recompute_why_not(config, blocks_per_chunk)
        if why:
            others = runs_on(config, model, blocks_per_chunk)
            where = f"it runs on {', '.join(others)}" if others else _no_target(config.schedule)
            raise PlannerError(f"{why} ({config.describe()}); {where}; plan with --framework {self.name} "
                               f"for a plan {self.version} runs")
        return self.runs(config)


def _no_target(schedule: Schedule) -> str:
    """What to say of a schedule no export target runs: what runs it outside them, where something does."""
    elsewhere = schedule_of(schedule).runs_elsewhere
    return f"no export target runs it, {elsewhere} does" if elsewhere else "no export target runs it"


def _torchtitan_model_limits(framework: Framework, model: ModelSpec) -> dict[str, object]:
    """What torchtitan 0.2.2 runs of `model`: its flavor's TrainSpec decides pipelining and the token dispatchers
    (planner.titan_models); a model without a flavor keeps the framework's rules (the export refuses it)."""
    flavor = find_flavor(model)
    if flavor is None:
        return {}
    return {"version": f"{framework.version}'s {flavor.name}", "pipelines": flavor.pipelines,
            "moe_dispatchers": framework.moe_dispatchers & flavor.dispatchers,
            "cp_comms": framework.cp_comms if flavor.context_parallel else frozenset()}


def _megatron_model_limits(framework: Framework, model: ModelSpec) -> dict[str, object]:
    """What Megatron-LM core 0.16 runs of `model`: no full-iteration CUDA graph of a model with dropless MoE layers,
    whose token dispatcher reads the routed token counts back to the host mid-layer (a sync no graph can capture;
    core 0.16's arguments.py asks for --moe-pad-experts-for-cuda-graph-inference, which pads only at inference).
    Megatron-Bridge's 26.06 presets capture such iterations on Megatron-Core 0.18's per-rank expert capacity
    (moe_expert_rank_capacity_factor) and paged stash, which planner's "any" target stands for."""
    if not model.is_moe:
        return {}
    return {"full_iteration_graphs": False, "full_iteration_graphs_why_not": (
        "its dropless MoE layers read token counts back to the host mid-layer; --cuda-graph-modules captures the "
        "parts before that")}


def _sharding_name(sharding: tuple[int, bool]) -> str:
    zero_stage, distributed_optimizer = sharding
    if distributed_optimizer:
        return "Megatron-LM's distributed optimizer"
    return f"ZeRO-{zero_stage}" if zero_stage else "unsharded data parallelism"


_ALL_SCHEDULES = frozenset(Schedule)
# searched unasked by "any": not the zero-bubble ones (only torchtitan runs them) nor local learning (another algorithm)
_UNSPLIT_SCHEDULES = frozenset(s for s in Schedule
                               if not schedule_of(s).splits_backward and not schedule_of(s).local_losses)
_ANY_SHARDING = frozenset({(0, False), (1, False), (2, False), (3, False), (0, True), (1, True)})

_CP_COMMS = frozenset(CP_COMMS)
_DISPATCHERS = frozenset(MOE_DISPATCHERS)

FRAMEWORKS: dict[str, Framework] = {
    "any": Framework(
        "any", "any framework", _ALL_SCHEDULES, _ANY_SHARDING, _ANY_SHARDING, True, True, _CP_COMMS, True, True,
        _DISPATCHERS, True, True, True, _megatron_semantics, (0, True), searched_schedules=_UNSPLIT_SCHEDULES,
        optimizer_states=tuple((states, None) for states in OPTIMIZER_STATES), full_iteration_graphs=True,
        module_graphs=True, activation_offload=True),
    # ZeRO-2/3 through Megatron-FSDP (optim_grads / optim_grads_params), which it does not claim with PP; no
    # zero-bubble schedule (core_v0.16.1's delay_wgrad_compute only overlaps MoE all-to-all in its 1F1B)
    "megatron": Framework(
        "megatron", "Megatron-LM core 0.16", frozenset({Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED}),
        frozenset({(0, False), (0, True), (2, False), (3, False)}), frozenset({(0, False), (0, True)}),
        True, True, _CP_COMMS, True, True, _DISPATCHERS, True, False, False, _megatron_semantics, (0, True),
        # pretrain_gpt.py has no adapters (LoRA lives in Megatron-Bridge's PEFT, a different entry point);
        # --optimizer-cpu-offload runs Adam on the host inside the distributed optimizer (HybridDeviceOptimizer)
        no_adapters="pretrain_gpt.py has no LoRA/PEFT (Megatron-Bridge's peft.LoRA has; planner does not export it)",
        fused_elementwise_only="Transformer Engine's fused norms, RoPE and activations",
        optimizer_states=(("fp32", None), ("cpu", frozenset({(0, True)}))),
        # --fp8-recipe's choices (TransformerConfig.fp8_recipe), delayed its default; full-iteration CUDA graphs
        # as --cuda-graph-impl local --cuda-graph-scope full_iteration, per-layer ones as --cuda-graph-impl
        # transformer_engine --cuda-graph-scope <parts> (core 0.16)
        fp8_recipes=("delayed", "tensorwise", "blockwise", "mxfp8"), full_iteration_graphs=True,
        # activation offload: --cpu-offloading-num-layers (Transformer Engine's offload handler)
        module_graphs=True, activation_offload=True, model_limits=_megatron_model_limits),
    # ZeRO-2/3 only without PP (PipelineEngine asserts stage < 2); CP only as Ulysses, which planner's cp is not
    "deepspeed": Framework(
        "deepspeed", "DeepSpeed 0.19 (Megatron-DeepSpeed)", frozenset({Schedule.ONE_F_ONE_B}),
        frozenset({(0, False), (1, False), (2, False), (3, False)}), frozenset({(0, False), (1, False)}),
        True, False, frozenset(), True, False, frozenset({"alltoall"}), False, False, False, _deepspeed_semantics,
        (1, False),
        # Megatron-DeepSpeed builds its own GPT model and optimizer: no PEFT adapters, no bitsandbytes optimizer;
        # ZeRO-Offload (offload_optimizer device cpu) with ZeRO stage 1-3 (REFERENCE.md, offload_config.py)
        no_adapters="Megatron-DeepSpeed's pretrain_gpt.py has no LoRA/PEFT (Hugging Face PEFT runs under "
                    "transformers' Trainer, not this launcher)",
        fixed_selective_recompute="the attention core's (Megatron-DeepSpeed has no --recompute-modules)",
        block_recompute="first without pp",
        fused_elementwise_only="apex's fused LayerNorm and the TorchScript bias-GeLU / bias-dropout-add fusions",
        # its ZeRO partitions and gathers the 16-bit weights (ZeRO++'s int8 weight gathers are not modelled)
        fp8_gather_recipes=(),
        optimizer_states=(("fp32", None), ("cpu", frozenset({(1, False), (2, False), (3, False)})))),
    # FSDP2 (reshard_after_forward never: ZeRO-2; default: ZeRO-3) or DDP, with PP too; CP rotates KV by
    # all-gather or a ring of exchanges; etp in {1, tp} (ParallelDims v0.2.2)
    # Its zero-bubble schedules are PyTorch's ScheduleInterleavedZeroBubble (at least 2 stages per rank, loop
    # layout), ScheduleZBVZeroBubble and ScheduleDualPipeV (exactly 2, "v" layout: pipeline_parallel.py picks the
    # style by class); the split backward does not run under torch.compile, which its async TP needs. EP
    # all-to-alls overlap the paired pass only under DualPipeV with activation checkpointing off
    # (dual_pipe_v.py get_dual_pipe_v_flag, pipeline_parallel_expert_parallel_overlap)
    "torchtitan": Framework(
        "torchtitan", "torchtitan 0.2.2",
        frozenset({Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED, Schedule.INTERLEAVED_ZB,
                   Schedule.ZB_V, Schedule.DUALPIPE_V}),
        frozenset({(0, False), (2, False), (3, False)}), frozenset({(0, False), (2, False), (3, False)}),
        False, True, frozenset({"p2p", "all-gather"}), True, False, _DISPATCHERS, True, True, True,
        _torchtitan_semantics, None,
        tp_overlap_with_split_backward=False, ep_overlap_schedules=frozenset({Schedule.DUALPIPE_V}),
        flex_with_etp=False,  # deepseek_v3's parallelize refuses DeepEP with expert TP
        # the LoRA converter landed after 0.2.2 (pytorch/torchtitan#2484, 2026-03); training.enable_cpu_offload
        # offloads parameters too, which planner does not price
        no_adapters="0.2.2 has no LoRA model converter (pytorch/torchtitan#2484 adds one after the release)",
        fixed_selective_recompute='per-op SAC (activation_checkpoint.selective_ac_option "op") or every k-th block',
        loss_follows_compile=True, model_limits=_torchtitan_model_limits, block_recompute="every k-th",
        pipeline_order="pytorch",  # torch.distributed.pipelining's schedules
        # torchao's float8 recipes ([quantize.linear.float8] recipe_name, tensorwise when unnamed) and MXFP8
        # ([quantize.linear.mx]); torchao dropped delayed scaling
        fp8_recipes=("tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8"), fp8_saved_input="bf16",
        # float8.py asserts no recipe_name beside enable_fsdp_float8_all_gather: FP8 gathers are tensorwise's
        fp8_gather_recipes=("tensorwise",),
        # parallelize.py applies torchao's Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput
        # only under tensorwise scaling (enable_float8_tensorwise_tp): a colwise linear's input is cast before its
        # all-gather, a rowwise linear's output gradient before the backward all-gather; rowwise recipes gather BF16
        fp8_tp_gather_recipes=("tensorwise",)),
}
FRAMEWORK_NAMES = tuple(FRAMEWORKS)
TARGET_NAMES = FRAMEWORK_NAMES[1:]


def framework_named(name: str) -> Framework:
    """The framework called `name` (one of FRAMEWORK_NAMES)."""
    if name not in FRAMEWORKS:
        raise PlannerError(f"unknown framework {name!r}: use one of {', '.join(FRAMEWORK_NAMES)}")
    return FRAMEWORKS[name]


def runs_on(config: ParallelConfig, model: ModelSpec | None = None,
            blocks_per_chunk: Sequence[int] | None = None, training: Training | None = None) -> list[str]:
    """The targets that run `config` exactly as planned (its layout; each with its own execution semantics), of
    `model` when given (`Framework.for_model`), over chunks of `blocks_per_chunk` blocks when given (a block
    recompute some targets run only for some splits), and with `training`'s options when given (fine-tuning, FP8
    recipe, element-wise kernels, CUDA graphs, optimizer states: `Framework.training_why_not`)."""
    targets = [FRAMEWORKS[name] if model is None else FRAMEWORKS[name].for_model(model) for name in TARGET_NAMES]
    return [target.name for target in targets
            if target.why_not(config) is None and target.block_recompute_why_not(config, blocks_per_chunk) is None
            and (training is None or target.training_why_not(training, config) is None)]
