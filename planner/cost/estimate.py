"""Time and memory of one fully specified plan, with the breakdown a user needs to see why.

`estimate` composes the pieces: unit costs on each pipeline rank's GPU (cost/time.py), stage
sums over the partition, the schedule's critical path (cost/schedule.py), exposed DP traffic,
the optimizer step, and per-GPU memory (cost/memory.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from planner.cluster import Cluster
from planner.config import ParallelConfig, Partition, Recompute, Training, fp8_param_gather_why_not
from planner.cost.local import aux_head_cost, local_queue_bytes
from planner.cost.memory import MemoryBreakdown, rank_memory_model
from planner.cost.schedule import PipelineTime, pipeline_time, schedule_of, simulated_pipeline_time
from planner.cost.time import (
    CostKey,
    UnitCost,
    UnitTimer,
    activation_offload_s,
    boundary_times,
    data_parallel_time,
    embedding_sync_time,
    optimizer_step_time,
    stage_boundary_s,
    unit_costs,
)
from planner.errors import PlannerError
from planner.finetune import parameter_states
from planner.gpu import GIB
from planner.model import ModelSpec, UnitKind
from planner.placement import GroupLinks, Placement, default_placement
from planner.profile.analytic import AnalyticProfile, block_type_forward_flops, head_forward_flops
from planner.profile.calibration import Calibration, default_calibration

__all__ = ["BREAKDOWN_KEYS", "TIGHT_MEMORY_EVIDENCE", "TIGHT_MEMORY_SHARE", "Estimate", "MemoryBreakdown",
           "StageEstimate", "estimate", "fit_advice", "model_flops_per_iteration", "moe_load_fit_limit",
           "moe_load_headroom"]

BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "tp_comm", "cp_comm", "pp_comm", "dp_comm", "optimizer", "other")
TIGHT_MEMORY_SHARE = 0.95
"""Above this share of a GPU's memory an estimate that fits is no promise: published runs estimated between it and
the whole memory both ran and ran out of memory (README "Memory margin", `python -m benchmarks.accuracy --margin`),
so a plan there gets a warning and `planner plan --memory-headroom` plans with room left."""
TIGHT_MEMORY_EVIDENCE = (f"published runs estimated above {100 * TIGHT_MEMORY_SHARE:g} % of their GPUs' memory both "
                         f"ran and ran out of memory")
"""What every warning about a plan above TIGHT_MEMORY_SHARE says."""


@dataclass(frozen=True)
class StageEstimate:
    """One virtual stage: its units, its GPU, time per micro-batch, and its rank's memory."""

    index: int
    pp_rank: int
    virtual_index: int
    units: tuple[int, int]
    blocks: tuple[int, int]
    embedding: bool
    head: bool
    gpu: str
    forward_s: float
    backward_s: float  # includes recompute and TP communication of the backward pass
    p2p_s: float
    memory: MemoryBreakdown
    weight_s: float = 0.0  # the weight-gradient part of backward_s (a zero-bubble schedule's W pass)


@dataclass(frozen=True)
class Estimate:
    """Iteration time, throughput, utilisation, per-stage detail and the breakdown (seconds)."""

    iteration_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    breakdown_s: dict[str, float]
    stages: tuple[StageEstimate, ...]
    num_microbatches: int
    # sub-terms of the breakdown (seconds), e.g. the tied-embedding all-reduce inside dp_comm
    breakdown_detail_s: dict[str, float] = field(default_factory=dict)

    @property
    def peak_memory_bytes(self) -> float:
        """The largest rank's bytes that must fit at once (`MemoryBreakdown.required`)."""
        return max(stage.memory.required for stage in self.stages)

    @property
    def peak_device_bytes(self) -> float:
        """The largest rank's `MemoryBreakdown.device_peak`: the high-water mark as nvidia-smi shows it."""
        return max(stage.memory.device_peak for stage in self.stages)

    @property
    def peak_reserved_bytes(self) -> float:
        """The largest rank's `MemoryBreakdown.reserved`: the peak as torch.cuda.max_memory_reserved reports it."""
        return max(stage.memory.reserved for stage in self.stages)

    @property
    def fits(self) -> bool:
        return all(stage.memory.fits for stage in self.stages)

    @property
    def memory_share(self) -> float:
        """The largest share of its GPU's memory a rank needs (`MemoryBreakdown.required` over its capacity)."""
        return max(stage.memory.required / stage.memory.capacity for stage in self.stages)

    def tightest_stage(self) -> StageEstimate:
        return max(self.stages, key=lambda s: (s.memory.required - s.memory.capacity, -s.index))


def model_flops_per_iteration(model: ModelSpec, training: Training) -> float:
    """Model FLOPs (forward + backward, no recompute, attention not halved for causality) —
    Korthikanti et al. eq. 7 for GPT, generalised to GQA/SwiGLU/MoE — summed block type by block type (each at
    its own width, token count and attention span); the MFU convention. With frozen base weights (LoRA, QLoRA) the
    backward computes input gradients only, as many FLOPs as the forward (the adapters' are < 1 %): 2 × forward."""
    tokens = training.global_batch * training.seq_len
    forward = sum(count * block_type_forward_flops(model, block, tokens, training.seq_len)
                  for block, count in model.block_types().items())
    forward += head_forward_flops(model, training.global_batch * model.head_tokens(training.seq_len))
    return (3 if training.finetune == "full" else 2) * forward


def mfu_convention(training: Training) -> str:
    """The FLOP convention behind `Estimate.mfu`, named in every output so a reader can compare it with others'
    (some halve causal attention, some count recompute: hardware FLOPs)."""
    passes = "forward + backward" if training.finetune == "full" else "forward + input-gradient backward (frozen base)"
    return (f"model FLOPs ({passes}, recompute not counted, causal attention counted whole) over the "
            f"{training.dtype} dense peak")


def _stage_units(keys: Sequence[CostKey], costs: dict[CostKey, UnitCost], kept: dict[CostKey, UnitCost] | None,
                 start: int, end: int, config: ParallelConfig) -> list[UnitCost]:
    """The costs of units start..end − 1 (one model chunk), each at its own type's cost; under a block recompute
    (`ParallelConfig.recompute_num_layers`) the chunk's blocks after the recomputed ones at their `kept` cost,
    without recompute."""
    units = [costs[key] for key in keys[start:end]]
    if kept is None:
        return units
    blocks = [i for i, key in enumerate(keys[start:end], start) if 0 < i < len(keys) - 1]
    recomputed = config.recomputed_blocks(len(blocks))
    for i in blocks[recomputed:]:
        units[i - start] = kept[keys[i]]
    return units


def _sum_costs(units: Sequence[UnitCost]) -> dict[str, float]:
    """Each cost term summed over a model chunk's units."""
    totals = dict.fromkeys(("forward", "backward", "recompute", "tp_forward", "tp_backward", "cp_forward",
                            "cp_backward", "activations", "params", "linear_params", "ep", "weight"), 0.0)
    for cost in units:
        _add_cost(totals, cost)
    return totals


def _add_cost(totals: dict[str, float], cost: UnitCost) -> None:
    """Add one unit's cost terms into a stage's `_sum_costs` totals."""
    totals["forward"] += cost.forward_s
    totals["backward"] += cost.backward_s
    totals["recompute"] += cost.recompute_s
    totals["tp_forward"] += cost.tp_forward_s
    totals["tp_backward"] += cost.tp_backward_s
    totals["cp_forward"] += cost.cp_forward_s
    totals["cp_backward"] += cost.cp_backward_s
    totals["activations"] += cost.activation_bytes
    totals["params"] += cost.params
    totals["linear_params"] += cost.linear_params
    totals["ep"] += cost.ep_s
    totals["weight"] += cost.weight_grad_s


def validate_layout(model: ModelSpec, config: ParallelConfig, partition: Partition) -> None:
    """The partition must fit the model and the configuration's virtual stages."""
    units = model.num_layers + 2
    if partition.num_units != units:
        raise PlannerError(
            f"partition covers {partition.num_units} units but {model.name} has {units} "
            f"(embedding + {model.num_layers} blocks + head)"
        )
    if partition.num_stages != config.num_virtual_stages:
        raise PlannerError(
            f"partition has {partition.num_stages} stages but pp × vpp = {config.pp} × {config.vpp} = "
            f"{config.num_virtual_stages}"
        )


def _pipeline(sums: list[dict[str, float]], p2p: list[float], stage_times: list[float], config: ParallelConfig,
              m: int) -> PipelineTime:
    """The schedule's iteration time from the event simulator (exact for the framework's order, see
    tests/test_schedule.py for how far the closed form can be off); the closed form where the
    simulator does not apply (pp = 1, or an interleaved schedule Megatron-LM cannot run)."""
    behaviour = config.pipeline_schedule
    if config.pp == 1 or not behaviour.runnable(config.pp, m):
        return pipeline_time(stage_times, config.pp, m, behaviour)
    forward, backward = _pass_times(sums, p2p, config)
    return simulated_pipeline_time(forward, backward, config.pp, m, behaviour, [s["weight"] for s in sums],
                                   behaviour.queue_depth(config.local_queue_depth))


def _pass_times(sums: list[dict[str, float]], p2p: list[float], config: ParallelConfig,
                ) -> tuple[list[float], list[float]]:
    """Each stage's forward and backward pass per micro-batch, each with the share of the stage's p2p its transfers
    take (`PipelineSchedule.forward_p2p_share`)."""
    forward_share = schedule_of(config.schedule).forward_p2p_share
    forward = [s["forward"] + s["tp_forward"] + s["cp_forward"] + p * forward_share for s, p in zip(sums, p2p,
                                                                                                    strict=True)]
    backward = [s["backward"] + s["recompute"] + s["tp_backward"] + s["cp_backward"] + p * (1 - forward_share)
                for s, p in zip(sums, p2p, strict=True)]
    return forward, backward


def _closed_form(sums: list[dict[str, float]], p2p: list[float], stage_times: list[float], config: ParallelConfig,
                 m: int) -> float:
    """The schedule's closed-form pipeline time: local learning's fill and steady state from each stage's forward
    and backward, the others' from the stage totals."""
    behaviour = schedule_of(config.schedule)
    if behaviour.local_losses:
        return behaviour.fill_form(*_pass_times(sums, p2p, config), m).total_s
    return pipeline_time(stage_times, config.pp, m, config.schedule).total_s


def estimate(
    model: ModelSpec,
    cluster: Cluster,
    training: Training,
    config: ParallelConfig,
    partition: Partition | None = None,
    placement: Placement | None = None,
    timer: UnitTimer | None = None,
    calibration: Calibration | None = None,
    links: GroupLinks | None = None,
    rank_costs: Sequence[dict[CostKey, UnitCost]] | None = None,
) -> Estimate:
    """Estimate one plan. Defaults: Megatron's uniform split, rank-order placement, analytic profile.
    `links` and `rank_costs` (each pipeline rank's `unit_costs`): what the caller has computed already for
    this placement and configuration (the search reuses them)."""
    calibration = calibration or default_calibration()
    timer = timer or AnalyticProfile(model, calibration)
    partition = partition or Partition.uniform(model.num_layers, config.num_virtual_stages)
    validate_layout(model, config, partition)
    placement = placement or default_placement(cluster, config)
    links = links or GroupLinks.from_placement(cluster, config, placement)
    m = config.num_microbatches(training.global_batch)
    config.check_sequence(training.seq_len)
    for rank, gpu in enumerate(links.gpu):
        if not gpu.supports(training.dtype):
            raise PlannerError(f"{training.dtype} is not supported by {gpu.name} (pipeline rank {rank})")

    config.check_experts(model.num_experts)
    config.check_cpu_offload(model.num_layers, training)
    config.check_recompute_blocks(model.num_layers)
    config.check_cuda_graph_modules(training, model.layer_kind_counts, model.dropout)
    if config.fp8_param_gather and (why := fp8_param_gather_why_not(training)):
        raise PlannerError(f"parallel config: fp8_param_gather {why}")
    rank_costs = rank_costs or [unit_costs(model, training, config, links.gpu[r], links.tp[r], timer, calibration,
                                           links.cp[r], links.ep[r]) for r in range(config.pp)]
    kept_costs: list[dict[CostKey, UnitCost] | None] = [None] * config.pp
    if config.recompute_num_layers is not None:  # the blocks a block recompute leaves alone: costed without it
        kept = replace(config, recompute=Recompute.NONE, recompute_num_layers=None)
        kept_costs = [unit_costs(model, training, kept, links.gpu[r], links.tp[r], timer, calibration, links.cp[r],
                                 links.ep[r]) for r in range(config.pp)]
    bounds = partition.bounds()
    boundary = boundary_times(model, training, config, links.pp, rank_costs, calibration)
    p2p = stage_boundary_s(boundary, len(bounds), config.schedule)
    ranks = config.stage_ranks
    keys = model.unit_cost_keys
    local = schedule_of(config.schedule).local_losses
    aux_heads = [aux_head_cost(model, training, config, links.gpu[r], links.tp[r], calibration,
                               rank_costs[r][UnitKind.HEAD]) for r in range(config.pp)] if local else []
    sums, stage_times = [], []
    stage_units = [_stage_units(keys, rank_costs[ranks[k]], kept_costs[ranks[k]], start, end, config)
                   for k, (start, end) in enumerate(bounds)]
    offload_s = (0.0, 0.0)
    for k in range(len(bounds)):
        totals = _sum_costs(stage_units[k])
        if config.cpu_offload_layers:  # pp 1: one stage, the embedding first, the head last
            blocks = stage_units[k][1:-1]
            offload_s = activation_offload_s(blocks[:config.cpu_offload_layers], blocks, links.gpu[ranks[k]])
            totals["forward"] += offload_s[0]
            totals["backward"] += offload_s[1]
        if local and k < len(bounds) - 1:  # every stage but the last trains its own auxiliary head
            _add_cost(totals, aux_heads[ranks[k]])
        if local and k:  # the queue of boundary tensors received ahead of use
            totals["activations"] += local_queue_bytes(model, training, config)
        sums.append(totals)
        stage_times.append(totals["forward"] + totals["backward"] + totals["recompute"] + totals["tp_forward"]
                           + totals["tp_backward"] + totals["cp_forward"] + totals["cp_backward"] + p2p[k])

    pipeline = _pipeline(sums, p2p, stage_times, config, m)
    states = parameter_states(model, training)
    memories, dp_exposed, optimizer = [], [], []
    head_activations = stage_units[-1][-1].activation_bytes  # the last stage ends with the head
    for r in range(config.pp):
        mine = [k for k in range(len(bounds)) if ranks[k] == r]
        params = sum(sums[k]["params"] for k in mine)
        rank_memory = rank_memory_model(model, training, config, r, m, links.gpu[r], calibration)
        head = head_activations if r == ranks[-1] else 0.0
        memories.append(rank_memory.breakdown(params, sum(sums[k]["activations"] for k in mine) - head,
                                              float(links.capacity_bytes[r]), head,
                                              sum(sums[k]["linear_params"] for k in mine)))
        units = [cost for k in mine for cost in stage_units[k]]
        units += [aux_heads[r] for k in mine if local and k < len(bounds) - 1]
        dp_time = data_parallel_time(units, training, config, links.dp[r], calibration, m, links.replicate[r],
                                     states, links.edp[r] if links.edp else None)
        dp_exposed.append(dp_time.exposed_s)
        optimizer.append(optimizer_step_time(params, config, links.gpu[r], calibration, states, training.grad_bytes))

    embedding_sync = embedding_sync_time(model, training, config, links.pp[-1], calibration)
    bottleneck = [k for k in range(len(bounds)) if ranks[k] == pipeline.bottleneck_rank]
    steady = {name: m * sum(sums[k][name] for k in bottleneck) for name in sums[0]}
    breakdown = {
        "compute": steady["forward"] + steady["backward"],
        "recompute": steady["recompute"],
        "bubble": pipeline.bubble_s,
        "tp_comm": steady["tp_forward"] + steady["tp_backward"],
        "cp_comm": steady["cp_forward"] + steady["cp_backward"],
        "pp_comm": m * sum(p2p[k] for k in bottleneck),
        "dp_comm": float(max(dp_exposed)) + embedding_sync,
        "optimizer": max(optimizer),
        "other": calibration.iteration_overhead_s,
    }
    iteration = sum(breakdown.values())
    detail = {
        "dp_gradient_exposed": max(dp_exposed),
        "embedding_grad_allreduce": embedding_sync,
        "p2p_per_microbatch": max(p2p),
        # the expert all-to-all inside tp_comm on the bottleneck rank (its MoE blocks)
        "ep_alltoall": steady["ep"],
        "pipeline_closed_form": _closed_form(sums, p2p, stage_times, config, m),
        "pipeline_simulated": pipeline.total_s,
        "fixed_per_iteration": calibration.iteration_overhead_s,
        # inside compute: the CPU-offloading copies the compute waits for (`activation_offload_s`)
        "activation_offload_exposed": m * sum(offload_s),
    }
    flops = model_flops_per_iteration(model, training)
    gpus_used = config.num_gpus
    peak = sum(links.gpu[r].peak_flops(training.dtype) for r in range(config.pp)) / config.pp
    stages = []
    for k, ((start, end), blocks) in enumerate(zip(bounds, partition.block_ranges(), strict=True)):
        r = ranks[k]
        stages.append(StageEstimate(
            index=k, pp_rank=r, virtual_index=k // config.pp, units=(start, end), blocks=blocks,
            embedding=start == 0, head=end == model.num_layers + 2, gpu=links.gpu[r].name,
            forward_s=sums[k]["forward"] + sums[k]["tp_forward"] + sums[k]["cp_forward"],
            backward_s=sums[k]["backward"] + sums[k]["recompute"] + sums[k]["tp_backward"] + sums[k]["cp_backward"],
            p2p_s=p2p[k], memory=memories[r], weight_s=sums[k]["weight"],
        ))
    return Estimate(
        iteration_time_s=iteration,
        tokens_per_s=training.tokens_per_iteration / iteration,
        model_tflops_per_gpu=flops / iteration / gpus_used / 1e12,
        mfu=flops / iteration / gpus_used / peak,
        breakdown_s=breakdown,
        stages=tuple(stages),
        num_microbatches=m,
        breakdown_detail_s=detail,
    )


def moe_load_headroom(training: Training, config: ParallelConfig, result: Estimate,
                      estimate_at: Callable[[Training], Estimate]) -> float | None:
    """The largest busiest-expert-rank load (`Training.moe_load_imbalance`, dropless) at which the plan of `config`
    estimated as `result` still fits (`moe_load_fit_limit`). None where the question does not arise: no expert
    parallelism (a dense model has none; without it the load moves nothing, `Training.expert_rank_load`: no second
    estimate is run), a plan that does not fit, a capacity factor capping the load, or memory the load leaves alone
    (full recompute)."""
    if config.ep == 1 or not result.fits or training.moe_capacity_factor is not None:
        return None
    return moe_load_fit_limit(training, result, estimate_at)


def moe_load_fit_limit(training: Training, result: Estimate,
                       estimate_at: Callable[[Training], Estimate]) -> float | None:
    """The busiest-expert-rank load at which the plan estimated as `result` (at `training`) changes between fitting
    and not: every rank's memory grows linearly with the load (its routed activations), so one more estimate
    (`estimate_at`, the same plan at another training) gives each rank's slope. For a plan that fits, the load its
    first rank to fill reaches; for one that does not, the load under which every rank would fit (below 1 where none
    does). None where no rank's memory moves with the load, or a rank over capacity does not move."""
    busier = estimate_at(replace(training, moe_load_imbalance=training.moe_load_imbalance + 1.0))
    room = [(stage.memory.capacity - stage.memory.required, more.memory.required - stage.memory.required)
            for stage, more in zip(result.stages, busier.stages, strict=True)]
    limits = [free / slope for free, slope in room if slope > 0]
    if not limits or any(free < 0 and slope <= 0 for free, slope in room):
        return None
    return training.moe_load_imbalance + min(limits)


def fit_advice(config: ParallelConfig, result: Estimate, training: Training | None = None,
               fp8_weights_gatherable: bool = True) -> str:
    """What would make a configuration that does not fit fit, naming only options that help: when the
    model states alone or the optimizer step's live set exceed the GPU, more sharding, smaller or offloaded
    optimizer states (with `training`: when they are fp32 Adam on the GPU), adapters instead of full fine-tuning, or
    more GPUs (a smaller batch or more recompute frees nothing there); otherwise what shrinks activations, never an
    option already in use. `fp8_weights_gatherable`: whether the target framework can gather FP8 weights under the
    recipe (`Framework.gathers_weights_in_fp8`)."""
    stage = result.tightest_stage()
    memory = stage.memory
    states = memory.weights + memory.gradients + memory.optimizer
    # FP8 weights in place of the 16-bit ones beside their FP8 copies (fp8_weight_copy_bytes), where weights are
    # sharded and the linears keep copies
    options = (["--fp8-param-gather"] if training is not None and training.caches_fp8_weights
               and not config.fp8_param_gather and config.optimizer_sharding in (1, 2) and fp8_weights_gatherable
               and fp8_param_gather_why_not(training) is None else [])
    states_short = states + memory.other > memory.capacity
    if states_short or memory.step_phase > memory.capacity:
        if config.optimizer_sharding < 3:
            options.append("--distributed-optimizer or --zero 3" if config.optimizer_sharding == 0 else "--zero 3")
        if training is not None and training.optimizer_states == "fp32" and memory.optimizer > 0:
            options.append("--optimizer-states 8bit or cpu")
        if training is not None and training.finetune == "full":
            options.append("--finetune lora or qlora (when fine-tuning)")
        options.append("a larger --tp/--pp")
        need = (f"the model states alone need {states / GIB:.1f} GiB" if states_short else
                f"the optimizer step needs {memory.step_phase / GIB:.1f} GiB (the model states and the gradient "
                "copies it makes)")
        return f"{need} on this GPU: try " + ", ".join(options) + " or more GPUs"
    if config.recompute is not Recompute.FULL:
        options.append("--recompute full")
    if config.pp == 1 and config.recompute is Recompute.NONE:
        options.append("a larger --cpu-offload-layers" if config.cpu_offload_layers
                       else "--cpu-offload-layers N (Megatron-LM: activations in host memory)")
    if config.micro_batch > 1:
        options.append("a smaller --micro-batch")
    if config.tp > 1 and not config.sequence_parallel:
        options.append("--sequence-parallel")
    options += ["a larger --tp/--pp/--cp", "a shorter --seq-len"]
    if config.optimizer_sharding == 0:
        options.append("--distributed-optimizer")
    return f"activations need {memory.activations / GIB:.1f} GiB: try " + ", ".join(options)
