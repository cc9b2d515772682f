"""DeepSpeed export: ds_config.json, Megatron-DeepSpeed flags, a `deepspeed` launch script and hostfile.

Rules from ../shared/REFERENCE.md §2: train_batch_size = micro-batch × gradient_accumulation_steps × dp,
with GAS = the pipeline's micro-batches; ZeRO ≤ 1 with pipeline parallelism (the plan loader refuses
ZeRO-2/3 with PP). DeepSpeed's PipelineModule takes no explicit stage boundaries, only a
`partition_method`; this module reproduces its partitioners (`partition_uniform`,
`partition_balanced`) so an uneven plan can be compared with what each method would build.
"""

from __future__ import annotations

import bisect
import json
import shlex
from dataclasses import dataclass
from itertools import accumulate, pairwise

from planner.config import Recompute, Schedule
from planner.errors import PlannerError
from planner.export.common import (
    TRAIN_PLACEHOLDER_ARGS,
    ExportResult,
    estimate_split,
    host_order,
    hostfile_text,
    plan_summary,
)
from planner.model import ModelSpec, UnitKind
from planner.plan import Plan

__all__ = [
    "PARTITION_METHODS",
    "PartitionOption",
    "deepspeed_config",
    "export_deepspeed",
    "method_split",
    "partition_balanced",
    "partition_options",
    "partition_uniform",
]

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
    zero = max(config.zero_stage, 1 if config.distributed_optimizer else 0)
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
        interval = 1 if config.recompute is Recompute.FULL else 0
        document["pipeline"] = {"activation_checkpoint_interval": interval}
    return document


def _flags(plan: Plan, zero: int) -> list[tuple[str, ...]]:
    """Megatron-DeepSpeed flags: the Megatron ones it shares, plus its DeepSpeed switches."""
    model, config = plan.model, plan.parallel
    parallel: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(config.tp)), ("--pipeline-model-parallel-size", str(config.pp)),
        ("--micro-batch-size", str(config.micro_batch)), ("--global-batch-size", str(plan.training.global_batch)),
    ]
    if config.sequence_parallel:
        parallel.append(("--sequence-parallel",))
    if config.recompute is Recompute.SELECTIVE:
        parallel.append(("--recompute-granularity", "selective"))
    elif config.recompute is Recompute.FULL:
        # DeepSpeed's pipeline supports only uniform recompute; its interval is --recompute-num-layers.
        parallel += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                     ("--recompute-num-layers", "1"), ("--deepspeed-activation-checkpointing",)]
    if config.pp == 1:
        parallel.append(("--no-pipeline-parallel",))
    parallel += [("--zero-stage", str(zero)), ("--deepspeed",), ("--deepspeed_config", "ds_config.json")]
    model_flags: list[tuple[str, ...]] = [
        ("--num-layers", str(model.num_layers)), ("--hidden-size", str(model.hidden_size)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)), ("--num-attention-heads", str(model.num_attention_heads)),
        ("--num-key-value-heads", str(model.num_key_value_heads)),
        ("--seq-length", str(plan.training.seq_len)),
        ("--max-position-embeddings", str(max(plan.training.seq_len, model.max_position_embeddings))),
    ]
    if model.activation == "swiglu":
        model_flags.append(("--swiglu",))
    if model.normalization == "rmsnorm":
        model_flags.append(("--normalization", "rmsnorm"))
    if model.position_embedding == "rope":
        model_flags += [("--use-rotary-position-embeddings",), ("--no-position-embedding",)]
    if not model.tie_embeddings:
        model_flags.append(("--untie-embeddings-and-output-weights",))
    if not model.linear_bias:
        model_flags.append(("--disable-bias-linear",))
    if not model.dropout:
        model_flags += [("--attention-dropout", "0"), ("--hidden-dropout", "0")]
    model_flags.append(("--fp16",) if plan.training.dtype == "fp16" else ("--bf16",))
    if plan.training.attention == "flash":
        model_flags.append(("--use-flash-attn-v2",))
    return parallel + model_flags


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


def launch_script(plan: Plan, flags: list[tuple[str, ...]], header: list[str], num_hosts: int, slots: int) -> str:
    lines = ["#!/usr/bin/env bash", *(f"# {line}" for line in header),
             "# Run once, on the first host: the deepspeed launcher starts every host of ./hostfile over ssh.",
             "# MEGATRON_DS: a Megatron-DeepSpeed checkout; DATA_ARGS, TRAIN_ARGS: your data and schedule.",
             "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             'MEGATRON_DS="${MEGATRON_DS:-$PWD}"']
    if plan.parallel.tp > 1:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts it with TP>1")
    lines.append("MEGATRON_DS_ARGS=(")
    lines += ["  " + " ".join(shlex.quote(t) if t != "ds_config.json" else '"$HERE/ds_config.json"' for t in flag)
              for flag in flags]
    lines.append(")")
    lines += [f'# the model has a {plan.model.vocab_size}-entry vocabulary; DATA_ARGS names your data and tokenizer',
              'read -r -a DATA <<< "${DATA_ARGS:?set DATA_ARGS: --data-path ... --tokenizer-type ...}"',
              f'read -r -a TRAIN <<< "${{TRAIN_ARGS:-{TRAIN_PLACEHOLDER_ARGS}}}"',
              f'exec deepspeed --hostfile "$HERE/hostfile" --num_nodes {num_hosts} --num_gpus {slots} \\',
              '  "$MEGATRON_DS/pretrain_gpt.py" "${MEGATRON_DS_ARGS[@]}" "${DATA[@]}" "${TRAIN[@]}"']
    return "\n".join(lines) + "\n"


def export_deepspeed(plan: Plan) -> ExportResult:
    """ds_config.json, megatron_deepspeed_args.txt, launch.sh and hostfile, plus split/cost notes."""
    document = deepspeed_config(plan)
    zero = document["zero_optimization"]["stage"]
    flags = _flags(plan, zero)
    notes = pipeline_notes(plan, partition_options(plan))
    if plan.training.dtype == "fp8":
        notes += ("DeepSpeed has no fp8 config key; exported as bf16 (fp8 needs Transformer Engine)",)
    order = host_order(plan)
    if order.problem:
        notes += (f"placement not realisable by host order ({order.problem})",)
    elif any(order.device_order):
        notes += ("the plan uses GPUs in a non-default order on some hosts; the deepspeed launcher ignores "
                  "CUDA_VISIBLE_DEVICES from the hostfile comments (use --include host:gpus)",)
    header = [f"planner export --to deepspeed: {plan_summary(plan)}", *(f"NOTE: {note}" for note in notes)]
    args_lines = [f"# {line}" for line in header] + [" ".join(shlex.quote(t) for t in flag) for flag in flags]
    return ExportResult(
        files={"ds_config.json": json.dumps(document, indent=2) + "\n",
               "megatron_deepspeed_args.txt": "\n".join(args_lines) + "\n",
               "launch.sh": launch_script(plan, flags, header, len(order.hosts), order.nproc_per_node),
               "hostfile": hostfile_text(order)},
        notes=notes,
    )
