"""torchtitan export: a job TOML for the last TOML release, v0.2.2 (`torchtitan/config/job_config.py`).

Keys and rules from ../shared/REFERENCE.md §3: world = dp_replicate · dp_shard · cp · tp · pp;
`module_fqns_per_model_part` lists each stage's modules (tok_embeddings, layers.N, norm, output) in
stage order, stage s on pipeline rank s mod pp (loop style); n_microbatches = local_batch_size /
pipeline_parallel_microbatch_size.
"""

from __future__ import annotations

import json

from planner.config import Recompute, Schedule
from planner.export.common import ExportResult, export_header, stage_units
from planner.plan import Plan

__all__ = ["SCHEDULE_NAMES", "export_torchtitan", "module_fqns", "torchtitan_toml"]

SCHEDULE_NAMES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.GPIPE: "GPipe", Schedule.INTERLEAVED: "Interleaved1F1B"}
_MODEL_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B")}


def module_fqns(plan: Plan) -> list[list[str]]:
    """Module names per model part (virtual stage), in stage order."""
    parts = []
    for embedding, start, end, head in stage_units(plan):
        names = ["tok_embeddings"] if embedding else []
        names += [f"layers.{i}" for i in range(start, end)]
        names += ["norm", "output"] if head else []
        parts.append(names)
    return parts


def _value(value: object) -> str:
    """A TOML value (strings, ints, booleans and lists of those; JSON spells them the same way)."""
    return json.dumps(value)


def torchtitan_toml(plan: Plan, notes: tuple[str, ...] = ()) -> str:
    """The [job]/[model]/[training]/[parallelism]/[activation_checkpoint] TOML for the plan, notes in its header."""
    config, training = plan.parallel, plan.training
    m = config.num_microbatches(training.global_batch)
    sharded = config.optimizer_sharding >= 1
    lines = [*(f"# {line}" for line in export_header("torchtitan (v0.2.2 TOML)", plan, notes)),
             "# run: CONFIG_FILE=this.toml ./run_train.sh   (any key can be overridden as --section.key)",
             "", "[job]", f"description = {_value(f'planner plan: {plan.model.name}')}", ""]
    flavor = _MODEL_FLAVORS.get(plan.model.name)
    lines.append("[model]")
    if flavor:
        lines += [f"name = {_value(flavor[0])}", f"flavor = {_value(flavor[1])}"]
    else:
        lines.append(f"# set name/flavor to torchtitan's model matching {plan.model.name} "
                     f"({plan.model.num_layers} layers, hidden {plan.model.hidden_size})")
    lines += ["", "[training]"]
    if config.pp > 1:
        lines += ["# per DP rank: all the plan's micro-batches pass the pipeline in one step (no grad accumulation)",
                  f"local_batch_size = {config.micro_batch * m}"]
    else:
        lines += ["# per DP rank: one micro-batch; torchtitan accumulates global/(local*dp) = "
                  f"{m} steps", f"local_batch_size = {config.micro_batch}"]
    lines += [f"global_batch_size = {training.global_batch}", f"seq_len = {training.seq_len}",
              f"mixed_precision_param = {_value('float16' if training.dtype == 'fp16' else 'bfloat16')}",
              'mixed_precision_reduce = "float32"']
    if training.dtype == "fp8":
        lines.append('# fp8: add [model] converters = ["float8"] with a [float8] section (torchao)')
    lines += ["", "[parallelism]",
              "# ZeRO / Megatron's distributed optimizer map to FSDP (data_parallel_shard_degree): FSDP shards",
              "# parameters, gradients and optimizer states; without sharding the plan's dp is plain DDP (replicate).",
              f"data_parallel_replicate_degree = {1 if sharded else config.dp}",
              f"data_parallel_shard_degree = {config.dp if sharded else 1}"]
    if sharded and config.optimizer_sharding < 3:
        lines.append('fsdp_reshard_after_forward = "never"  # keep parameters gathered between forward and '
                     "backward, like ZeRO-1/2")
    lines += [f"tensor_parallel_degree = {config.tp}",
              f"disable_loss_parallel = {_value(False)}",
              f"context_parallel_degree = {config.cp}",
              f"pipeline_parallel_degree = {config.pp}"]
    if config.pp > 1:
        lines += [f"pipeline_parallel_schedule = {_value(SCHEDULE_NAMES[config.schedule])}",
                  f"pipeline_parallel_microbatch_size = {config.micro_batch}  # n_microbatches = {m}",
                  "# one list per stage; stage s runs on pipeline rank s mod pp",
                  "module_fqns_per_model_part = ["]
        lines += [f"  {_value(part)}," for part in module_fqns(plan)]
        lines.append("]")
    mode = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[config.recompute]
    lines += ["", "[activation_checkpoint]", f"mode = {_value(mode)}"]
    if config.recompute is Recompute.SELECTIVE:
        lines.append('selective_ac_option = "op"  # op-level: recompute cheap ops, keep matmul outputs '
                     "(closest to Megatron's selective)")
    return "\n".join(lines) + "\n"


def export_torchtitan(plan: Plan) -> ExportResult:
    """torchtitan.toml for the plan."""
    notes = ()
    if plan.parallel.sequence_parallel is False and plan.parallel.tp > 1:
        notes = ("torchtitan's tensor parallelism always shards activations along the sequence "
                 "(sequence parallel); the plan has it off",)
    return ExportResult(files={"torchtitan.toml": torchtitan_toml(plan, notes)}, notes=notes)
