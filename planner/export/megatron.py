"""Megatron-LM export: the plan as `pretrain_gpt.py` flags, a torchrun launch script and a hostfile.

Flag names and rules follow ../shared/REFERENCE.md §1 (Megatron-LM's arguments.py, TransformerConfig
and pipeline_parallel_layer_layout.py). The stage split is given the simplest way Megatron accepts:
nothing when uniform, `--decoder-first/last-pipeline-num-layers` when only the end stages differ
(one stage per rank), otherwise `--pipeline-model-parallel-layout` with stages in virtual-stage-major
order (stage k on pipeline rank k mod pp), which is also the order of the plan's stages.
"""

from __future__ import annotations

import re

from planner.config import Schedule
from planner.errors import PlannerError
from planner.export.common import (
    TRAIN_PLACEHOLDER_ARGS,
    ExportResult,
    export_header,
    host_files,
    host_order,
    placement_notes,
    stage_units,
)
from planner.export.flags import (
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
from planner.plan import Plan

__all__ = ["export_megatron", "layout_string", "megatron_arguments", "megatron_program", "parse_layout",
           "split_arguments"]

_REPEAT_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT_TOKEN = re.compile(r"([EtmL])\*(\d+)")


def _repeat(token: str, count: int) -> str:
    if count == 0:
        return ""
    return token if count == 1 else f"{token}*{count}"


def layout_string(plan: Plan) -> str:
    """The plan's split in Megatron's layout grammar: `E` embedding, `t` decoder layer, `L` loss, `|` stages."""
    stages = []
    for embedding, start, end, head in stage_units(plan):
        stages.append(("E" if embedding else "") + _repeat("t", end - start) + ("L" if head else ""))
    return "|".join(stages)


def parse_layout(text: str) -> list[list[str]]:
    """Expand a layout string into stages of layer tokens (E, t, m, L), per Megatron's grammar:
    commas are cosmetic, `x*n` and `(...)*n` repeat, `|` separates (possibly empty) stages."""
    expanded = text.replace(",", "").replace(" ", "")
    while (match := _REPEAT_GROUP.search(expanded)) is not None:
        expanded = expanded[:match.start()] + match[1] * int(match[2]) + expanded[match.end():]
    expanded = _REPEAT_TOKEN.sub(lambda m: m[1] * int(m[2]), expanded)
    stages = [list(stage) for stage in expanded.split("|")]
    bad = {token for stage in stages for token in stage} - set("EtmL")
    if bad:
        raise PlannerError(f"layout {text!r}: unknown symbol(s) {''.join(sorted(bad))}; allowed E, t, m, L, |, *, (, )")
    return stages


def split_arguments(plan: Plan) -> tuple[Flag, ...]:
    """The flags that give Megatron the plan's stage split (none for its default uniform split)."""
    blocks = plan.blocks_per_stage
    config = plan.parallel
    if len(set(blocks)) == 1:
        if config.vpp > 1:
            return (("--num-virtual-stages-per-pipeline-rank", str(config.vpp)),)
        return ()
    if config.vpp == 1 and min(blocks) >= 1 and len(set(blocks[1:-1])) <= 1:
        # pp = 2: giving the first stage alone leaves the rest to the last; no middle stages to divide.
        middle = blocks[1] if config.pp > 2 else blocks[-1]
        flags = []
        if blocks[0] != middle:
            flags.append(("--decoder-first-pipeline-num-layers", str(blocks[0])))
        if blocks[-1] != middle:
            flags.append(("--decoder-last-pipeline-num-layers", str(blocks[-1])))
        return tuple(flags)
    # The layout implies vpp = stages / pp; Megatron accepts only one of layout and vpp flags.
    return (("--pipeline-model-parallel-layout", layout_string(plan)),)


def megatron_arguments(plan: Plan) -> tuple[tuple[FlagGroup, ...], tuple[str, ...]]:
    """Every `pretrain_gpt.py` flag the plan decides, in titled groups, and what Megatron-LM has no flag for."""
    config = plan.parallel
    parallel = list(parallel_flags(config, plan.training.global_batch, split_arguments(plan)))
    if config.cp > 1:  # Megatron-LM spells the all-gather variant "allgather" (--cp-comm-type choices)
        parallel += [("--context-parallel-size", str(config.cp)),
                     ("--cp-comm-type", config.cp_comm.replace("all-gather", "allgather"))]
    if plan.model.is_moe:  # always explicit: Megatron-LM's etp default is tp, the planner's may differ
        parallel += [("--expert-model-parallel-size", str(config.ep)),
                     ("--expert-tensor-parallel-size", str(config.etp))]
    if config.tp_comm_overlap:
        parallel.append(("--tp-comm-overlap",))  # Transformer Engine userbuffers; asserts --sequence-parallel
    distributed_optimizer = config.optimizer_sharding >= 1
    if config.zero_stage >= 2:  # Megatron-FSDP (core 0.16 user guide's required flags); ZeRO-2 keeps weights whole
        strategy = "optim_grads_params" if config.zero_stage == 3 else "optim_grads"
        parallel += [("--use-megatron-fsdp",), ("--data-parallel-sharding-strategy", strategy),
                     ("--no-gradient-accumulation-fusion",), ("--ckpt-format", "fsdp_dtensor")]
    if distributed_optimizer:
        parallel.append(("--use-distributed-optimizer",))
    if config.dp > 1 and config.overlap_grad_reduce:
        parallel.append(("--overlap-grad-reduce",))
        if distributed_optimizer and config.overlap_param_gather:
            parallel.append(("--overlap-param-gather",))
    model = model_flags(plan.model, plan.training, Dialect.MEGATRON_LM)
    return (("parallelism, batch, recompute", tuple(parallel)), ("model and precision", model.flags)), model.unsupported


def megatron_notes(plan: Plan) -> tuple[str, ...]:
    """What a user must know: rules the plan meets only partly, and what Megatron has no flag for."""
    config, notes = plan.parallel, []
    m = config.num_microbatches(plan.training.global_batch)
    if config.schedule is Schedule.INTERLEAVED and m % config.pp:
        notes.append(f"Megatron's interleaved schedule needs num_microbatches ({m}) divisible by pp ({config.pp}); "
                     "pass --microbatch-group-size-per-virtual-pipeline-stage or change the global batch")
    return tuple(notes)


def megatron_program(plan: Plan, groups: tuple[FlagGroup, ...]) -> Program:
    """`pretrain_gpt.py` with the plan's flags, then the user's data, checkpoint and schedule flags."""
    setup = ('MEGATRON_LM="${MEGATRON_LM:-$PWD}"', *bash_array("MEGATRON_ARGS", groups),
             'read -r -a DATA <<< "$DATA_ARGS"', 'read -r -a CHECKPOINT <<< "$CHECKPOINT_ARGS"',
             f'read -r -a TRAIN <<< "${{TRAIN_ARGS:-{TRAIN_PLACEHOLDER_ARGS}}}"')
    return Program(setup, '"$MEGATRON_LM/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "${DATA[@]}" "${CHECKPOINT[@]}" '
                          '"${TRAIN[@]}"',
                   pretrain_placeholders(plan.model),
                   ("MEGATRON_LM: a Megatron-LM checkout (default: the current directory); TRAIN_ARGS: the "
                    "optimiser and schedule (default below)",))


def export_megatron(plan: Plan) -> ExportResult:
    """megatron_args.txt (one flag per line), torchrun.sh, slurm.sbatch and (several nodes) hostfile for the plan."""
    groups, unsupported = megatron_arguments(plan)
    order = host_order(plan)
    notes = megatron_notes(plan) + unsupported + placement_notes(order)
    header = export_header("megatron", plan, notes,
                           "rank order tp-cp-ep-dp-pp (Megatron's default): rank = tp + tp_size*(dp + dp_size*pp)")
    environment = tuple(line for line in (cuda_connections_line(plan.parallel),) if line)
    files = {"megatron_args.txt": args_text(groups, header),
             TORCHRUN: torchrun_script(order, header, megatron_program(plan, groups), environment),
             SLURM: slurm_script(plan, order, header)}
    return ExportResult(files=files | host_files(order), notes=notes)
