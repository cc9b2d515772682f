"""DeepSpeed export: ds_config.json, Megatron-DeepSpeed flags, a `deepspeed` launch script and hostfile.

Rules from ../shared/REFERENCE.md §2: train_batch_size = micro-batch × gradient_accumulation_steps × dp,
with GAS = the pipeline's micro-batches; ZeRO ≤ 1 with pipeline parallelism (the plan loader refuses
ZeRO-2/3 with PP). DeepSpeed's PipelineModule takes no explicit stage boundaries, only a
`partition_method`; this module reproduces its partitioners (`partition_uniform`,
`partition_balanced`) so an uneven plan can be compared with what each method would build. Blocks
Megatron-DeepSpeed does not build (vision encoder, MTP, Mamba) are refused (flags.py).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from itertools import accumulate, pairwise

from planner.config import ParallelConfig, Recompute, Schedule
from planner.errors import PlannerError
from planner.export.common import (
    TRAIN_PLACEHOLDER_ARGS,
    ExportResult,
    HostOrder,
    estimate_split,
    export_header,
    host_files,
    host_order,
    placement_notes,
    slower_attention_notes,
)
from planner.export.flags import (
    FULL_RECOMPUTE_LAYERS,
    Dialect,
    Flag,
    FlagGroup,
    args_text,
    bash_array,
    cuda_connections_line,
    model_flags,
    parallel_flags,
    pretrain_placeholders,
)
from planner.export.launch import SLURM, TORCHRUN, Program, slurm_script, torchrun_script
from planner.frameworks import FRAMEWORKS
from planner.model import ModelSpec, UnitKind
from planner.plan import Plan

__all__ = [
    "PARTITION_METHODS",
    "PartitionOption",
    "deepspeed_config",
    "export_deepspeed",
    "megatron_deepspeed_arguments",
    "megatron_deepspeed_program",
    "method_split",
    "partition_balanced",
    "partition_options",
    "partition_uniform",
]

DS_CONFIG = "ds_config.json"
DEEPSPEED_LAUNCHER = "deepspeed.sh"
# Megatron-DeepSpeed's GPTModelPipe hard-codes the last one.
PARTITION_METHODS = ("uniform", "parameters", "type:transformer")


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Stage boundaries with equal item counts; the first `num_items mod num_parts` stages take one more."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


def _probe(prefix: list[float], num_parts: int, bottleneck: float) -> tuple[list[int], bool]:
    """DeepSpeed's linear probe: greedily close each stage before its prefix weight passes the target."""
    num_items = len(prefix)
    parts = [0] + [num_items] * num_parts
    target = bottleneck
    chunk = num_items // num_parts
    step = chunk
    for p in range(1, num_parts):
        while step < num_items and prefix[step] < target:
            step += chunk
        parts[p] = bisect.bisect_left(prefix, target, lo=step - chunk, hi=min(step, num_items))
        if parts[p] == num_items:
            return parts, prefix[-1] - prefix[parts[p - 1]] < bottleneck
        target = prefix[parts[p] - 1] + bottleneck
    return parts, target >= prefix[-1]


def partition_balanced(weights: list[float], num_parts: int, eps: float = 1e-3) -> list[int]:
    """Stage boundaries minimising the heaviest stage: binary search on the bottleneck, as DeepSpeed does."""
    if len(weights) <= num_parts:
        return partition_uniform(len(weights), num_parts)
    prefix = list(accumulate(weights))
    lower, upper = prefix[-1] / num_parts, prefix[-1]
    while upper > lower + eps:
        middle = lower + (upper - lower) / 2
        if _probe(prefix, num_parts, middle)[1]:
            upper = middle
        else:
            lower = middle + eps
    parts, ok = _probe(prefix, num_parts, upper)
    if not ok:
        raise AssertionError(f"partition_balanced found no split under its own bottleneck {upper}")
    return parts


def method_split(model: ModelSpec, num_stages: int, method: str) -> tuple[int, ...]:
    """Transformer blocks per stage that `PipelineModule(partition_method=method)` builds.

    Layers are the planner's units (embedding, blocks, head), weighted per method: `uniform` counts
    layers, `parameters` weighs them by parameter count, `type:transformer` counts only blocks.
    """
    units = model.units()
    if method == "uniform":
        parts = partition_uniform(len(units), num_stages)
    elif method == "parameters":
        parts = partition_balanced([float(u.num_parameters) for u in units], num_stages)
    elif method == "type:transformer":
        parts = partition_balanced([1.0 if u.kind is UnitKind.BLOCK else 0.0 for u in units], num_stages)
    else:
        raise PlannerError(f"unknown partition_method {method!r}: use {', '.join(PARTITION_METHODS)}")
    return tuple(sum(1 for u in units[a:b] if u.kind is UnitKind.BLOCK) for a, b in pairwise(parts))


@dataclass(frozen=True)
class PartitionOption:
    """What one partition_method builds and its estimated iteration time (None: a stage is empty)."""

    method: str
    blocks_per_stage: tuple[int, ...]
    iteration_time_s: float | None


def partition_options(plan: Plan) -> list[PartitionOption]:
    """Each supported partition_method's split of the plan's model over its pipeline, with its cost."""
    options = []
    for method in PARTITION_METHODS:
        blocks = method_split(plan.model, plan.parallel.pp, method)
        try:
            seconds: float | None = estimate_split(plan, blocks, without_interleaving=True)
        except PlannerError:
            seconds = None
        options.append(PartitionOption(method, blocks, seconds))
    return options


def deepspeed_config(plan: Plan) -> dict:
    """ds_config.json contents; batch keys satisfy DeepSpeed's batch assertion with dp as world size."""
    config, training = plan.parallel, plan.training
    m = config.num_microbatches(training.global_batch)
    zero = config.optimizer_sharding
    document: dict = {
        "train_batch_size": training.global_batch,
        "train_micro_batch_size_per_gpu": config.micro_batch,
        "gradient_accumulation_steps": m,
        "zero_optimization": {"stage": zero},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if zero >= 1:
        document["zero_optimization"].update({"overlap_comm": config.overlap_grad_reduce,
                                              "contiguous_gradients": True, "reduce_scatter": True})
    if training.optimizer_states == "cpu":  # ZeRO-Offload: states and the Adam step on the host (stage 1-3)
        document["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if training.dtype == "fp16":
        document["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                            "hysteresis": 2, "min_loss_scale": 1}
    else:
        document["bf16"] = {"enabled": True}
    document["activation_checkpointing"] = {
        "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
        "number_checkpoints": None, "synchronize_checkpoint_boundary": False, "profile": False,
    }
    if config.pp > 1:
        if why := FRAMEWORKS["deepspeed"].block_recompute_why_not(config):  # activation_checkpoint_interval: all
            raise PlannerError(why)
        interval = FULL_RECOMPUTE_LAYERS if config.recompute is Recompute.FULL else 0
        # the pipeline engine partitions boundary tensors over the TP ranks as the plan was costed (its default)
        document["pipeline"] = {"activation_checkpoint_interval": interval,
                                "pipe_partitioned": config.p2p_scatter_gather,
                                "grad_partitioned": config.p2p_scatter_gather}
    return document


def _moe_flags(config: ParallelConfig) -> list[Flag]:
    """Megatron-DeepSpeed's expert-parallel flags, or a PlannerError where DeepSpeed cannot lay out the plan's
    experts: it splits experts over all TP ranks (--enable-expert-tensor-parallelism) or none (tp = 1), and
    carves expert groups out of the data-parallel ranks (groups.py asserts dp % ep == 0), which etp = tp
    and the plan's ep·etp | tp·dp already imply (DeepSpeed runs no CP)."""
    if config.etp != config.tp:
        raise PlannerError(f"DeepSpeed cannot run etp={config.etp} with tp={config.tp}: it splits experts over all "
                           f"TP ranks or none, so etp must equal tp (Megatron-LM folds EP over the TP ranks too)")
    flags: list[Flag] = [("--moe-expert-parallel-size", str(config.ep))]
    if config.tp > 1:
        flags.append(("--enable-expert-tensor-parallelism",))  # the plan shards experts over TP too
    return flags


def megatron_deepspeed_arguments(plan: Plan, zero: int) -> tuple[tuple[FlagGroup, ...], tuple[str, ...]]:
    """Megatron-DeepSpeed flags in titled groups (the Megatron ones it shares, then its DeepSpeed switches),
    and what it has no flag for."""
    config = plan.parallel
    deepspeed: list[Flag] = []
    if config.recompute is Recompute.FULL:
        deepspeed.append(("--deepspeed-activation-checkpointing",))
    if plan.model.is_moe:
        deepspeed += _moe_flags(config)
    if config.pp == 1:
        deepspeed.append(("--no-pipeline-parallel",))
    deepspeed += [("--zero-stage", str(zero)), ("--deepspeed",), ("--deepspeed_config", DS_CONFIG)]
    model = model_flags(plan.model, plan.training, Dialect.MEGATRON_DEEPSPEED)
    groups = (("parallelism, batch, recompute", parallel_flags(config, plan.training.global_batch)),
              ("model and precision", model.flags), ("DeepSpeed", tuple(deepspeed)))
    return groups, model.unsupported


def pipeline_notes(plan: Plan, options: list[PartitionOption]) -> tuple[str, ...]:
    """Whether DeepSpeed can build the plan's split, and the cost of each method it offers instead."""
    config = plan.parallel
    if config.pp == 1:
        return ()
    notes = []
    wanted = plan.blocks_per_stage
    if config.schedule is Schedule.INTERLEAVED:
        notes.append(f"DeepSpeed's PipelineEngine has no interleaved schedule: the plan's {config.pp}×{config.vpp} "
                     f"virtual stages become {config.pp} stages under 1F1B, split by a partition_method")
    else:
        exact = [o.method for o in options if o.blocks_per_stage == wanted]
        if exact:
            return (f"partition_method {exact[0]!r} builds the plan's split exactly ({_split(wanted)})",)
        notes.append(f"no partition_method builds the plan's split ({_split(wanted)} blocks per stage) and "
                     "DeepSpeed's PipelineModule cannot take explicit stage boundaries (DeepSpeed#2974)")
    try:
        baseline = estimate_split(plan)
    except PlannerError as exc:
        notes.append(f"splits not costed ({exc}): "
                     + "; ".join(f"{o.method}: {_split(o.blocks_per_stage)}" for o in options))
        return tuple(notes)
    costed = [o for o in options if o.iteration_time_s is not None]
    for option in options:
        if option.iteration_time_s is None:
            notes.append(f"  {option.method}: {_split(option.blocks_per_stage)} leaves a stage empty; not estimated")
        else:
            delta = option.iteration_time_s - baseline
            notes.append(f"  {option.method}: {_split(option.blocks_per_stage)} → "
                         f"{option.iteration_time_s:.3f} s/iteration "
                         f"({delta:+.3f} s, {100 * delta / baseline:+.1f} % vs the plan's {baseline:.3f} s)")
    if costed:
        best = min(costed, key=lambda o: o.iteration_time_s or 0.0)
        notes.append(f"fastest supported: partition_method={best.method!r}; Megatron-DeepSpeed's GPTModelPipe "
                     "hard-codes 'type:transformer' (edit megatron/model/gpt_model.py to change it)")
    return tuple(notes)


def _split(blocks: tuple[int, ...]) -> str:
    return ",".join(map(str, blocks))


def megatron_deepspeed_program(plan: Plan, groups: tuple[FlagGroup, ...]) -> Program:
    """Megatron-DeepSpeed's `pretrain_gpt.py` with the plan's flags, then the user's data, checkpoint and schedule."""
    setup = ('MEGATRON_DS="${MEGATRON_DS:-$PWD}"',
             *bash_array("MEGATRON_DS_ARGS", groups, {DS_CONFIG: f'"$HERE/{DS_CONFIG}"'}),
             'read -r -a DATA <<< "$DATA_ARGS"', 'read -r -a CHECKPOINT <<< "$CHECKPOINT_ARGS"',
             f'read -r -a TRAIN <<< "${{TRAIN_ARGS:-{TRAIN_PLACEHOLDER_ARGS}}}"')
    return Program(setup, '"$MEGATRON_DS/pretrain_gpt.py" "${MEGATRON_DS_ARGS[@]}" "${DATA[@]}" "${CHECKPOINT[@]}" '
                          '"${TRAIN[@]}"',
                   pretrain_placeholders(plan.model),
                   ("MEGATRON_DS: a Megatron-DeepSpeed checkout (default: the current directory); TRAIN_ARGS: the "
                    "optimiser and schedule (default below)",))


def deepspeed_launcher_script(program: Program, header: list[str], environment: tuple[str, ...],
                              order: HostOrder) -> str:
    """`deepspeed.sh`: the deepspeed launcher, run once; over ssh to every hostfile host, or locally on one node."""
    multi_node = len(order.hosts) > 1
    where = ('--hostfile "$HERE/hostfile" --master_addr "${MASTER_ADDR:-$(awk \'!/^#/ && NF {print $1; exit}\' '
             f'"$HERE/hostfile")}}" --num_nodes {len(order.hosts)}') if multi_node else "--num_nodes 1"
    lines = ["#!/usr/bin/env bash", *(f"# {line}" for line in header),
             ("# Run once, on the first host of ./hostfile: the deepspeed launcher starts every host over "
              "pdsh/ssh." if multi_node else "# Run on the node: one node needs no hostfile."),
             f"# Without ssh between nodes use {TORCHRUN} or {SLURM}. Extra arguments go to pretrain_gpt.py.",
             *(f"# {line}" for line in program.about),
             *(f"# {p.name}: {p.what}" for p in program.placeholders),
             "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             *(p.check_line() for p in program.placeholders),
             *environment, *program.setup,
             f"exec deepspeed {where} --num_gpus {order.nproc_per_node} --master_port \"${{MASTER_PORT:-29500}}\" \\",
             f'  {program.command} "$@"']
    return "\n".join(lines) + "\n"


def _attention_notes(plan: Plan) -> tuple[str, ...]:
    """Megatron-DeepSpeed's fused attention is the flash-attn package's FlashAttention-2, slower than the native kernel
    a "flash" plan was costed with on GPUs where FA2 is not native (Hopper, Blackwell; on ROCm flash-attn is)."""
    return slower_attention_notes(plan, "Megatron-DeepSpeed runs FlashAttention-2 (--use-flash-attn-v2)",
                                  lambda gpu: gpu.flash_attention_2_share < 1 and not gpu.flash_attn_native)


def export_deepspeed(plan: Plan) -> ExportResult:
    """ds_config.json, megatron_deepspeed_args.txt, deepspeed.sh, torchrun.sh, slurm.sbatch and (several nodes)
    hostfile, plus split/cost notes."""
    document = deepspeed_config(plan)
    groups, unsupported = megatron_deepspeed_arguments(plan, document["zero_optimization"]["stage"])
    order = host_order(plan)
    notes = (pipeline_notes(plan, partition_options(plan)) + unsupported + _attention_notes(plan)
             + placement_notes(order))
    if order.problem is None and any(order.device_order):
        notes += ("the plan uses GPUs in a non-default order on some hosts; the deepspeed launcher ignores "
                  "CUDA_VISIBLE_DEVICES from the hostfile comments (use --include host:gpus)",)
    header = export_header("deepspeed", plan, notes)
    program = megatron_deepspeed_program(plan, groups)
    environment = tuple(line for line in (cuda_connections_line(plan.parallel),) if line)
    files = {DS_CONFIG: json.dumps(document, indent=2) + "\n",
             "megatron_deepspeed_args.txt": args_text(groups, header),
             DEEPSPEED_LAUNCHER: deepspeed_launcher_script(program, header, environment, order),
             TORCHRUN: torchrun_script(order, header, program, environment),
             SLURM: slurm_script(plan, order, header)}
    return ExportResult(files=files | host_files(order), notes=notes)
