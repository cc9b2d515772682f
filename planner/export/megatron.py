"""Megatron-LM export: the plan as `pretrain_gpt.py` flags, a torchrun launch script and a hostfile.

Flag names and rules follow ../shared/REFERENCE.md §1 (Megatron-LM's arguments.py, TransformerConfig
and pipeline_parallel_layer_layout.py). The stage split is given the simplest way Megatron accepts:
nothing when uniform, `--decoder-first/last-pipeline-num-layers` when only the end stages differ
(one stage per rank), otherwise `--pipeline-model-parallel-layout` with stages in virtual-stage-major
order (stage k on pipeline rank k mod pp), which is also the order of the plan's stages. A model with
multi-token prediction always gets the layout (its `m` units on the last stage); a hybrid Mamba model runs
`pretrain_mamba.py`, whose stack (megatron/core/ssm/mamba_block.py) splits only evenly or by first/last.
"""

from __future__ import annotations

import re
from itertools import groupby

from planner.config import Schedule
from planner.errors import PlannerError
from planner.export.common import (
    TRAIN_PLACEHOLDER_ARGS,
    ExportResult,
    export_header,
    host_files,
    host_order,
    placement_notes,
)
from planner.export.flags import (
    Dialect,
    Flag,
    FlagGroup,
    args_text,
    bash_array,
    cuda_connections_line,
    is_hybrid,
    model_flags,
    moe_dispatch_flags,
    parallel_flags,
    pretrain_placeholders,
)
from planner.export.launch import SLURM, TORCHRUN, Program, slurm_script, torchrun_script
from planner.model import UnitKind
from planner.plan import Plan

__all__ = ["export_megatron", "layout_string", "megatron_arguments", "megatron_program", "parse_layout",
           "split_arguments", "stage_letters"]

_REPEAT_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT_TOKEN = re.compile(r"([EtmL])\*(\d+)")


def layout_string(plan: Plan) -> str:
    """The plan's split in Megatron's layout grammar: per virtual stage its units in order, `E` embedding,
    `t` decoder layer, `m` MTP layer, `L` loss (the head), runs of one letter as `x*n`, stages joined by `|`."""
    stages = []
    for letters in stage_letters(plan):
        runs = [(letter, len(list(run))) for letter, run in groupby(letters)]
        stages.append("".join(letter if count == 1 else f"{letter}*{count}" for letter, count in runs))
    return "|".join(stages)


def stage_letters(plan: Plan) -> list[list[str]]:
    """Each virtual stage's units as Megatron layout letters (vision and projector blocks have none: refused)."""
    letters = {UnitKind.EMBEDDING: "E", UnitKind.HEAD: "L"}
    roles = {"decoder": "t", "mtp": "m"}
    units = plan.model.units()
    return [[letters.get(unit.kind) or roles[unit.block.role] for unit in units[start:end]]
            for start, end in plan.partition.bounds()]


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


def _require_mtp_with_loss(plan: Plan, stages: list[list[str]]) -> None:
    """MTP layers are exported on the last virtual stage beside the loss, whose output layer they share
    (Megatron also wants them after every decoder layer); PlannerError naming the stages otherwise."""
    holding = [k for k, letters in enumerate(stages) if "m" in letters]
    if holding and holding != [len(stages) - 1]:
        raise PlannerError(
            f"model {plan.model.name!r}: its multi-token-prediction block(s) must sit on the last pipeline stage, "
            f"with the loss whose output layer they share; the plan puts them on stage(s) "
            f"{', '.join(map(str, holding))} of 0..{len(stages) - 1}; re-plan or give a partition that ends with them")


def split_arguments(plan: Plan) -> tuple[Flag, ...]:
    """The flags that give Megatron the plan's stage split: none for its default uniform split,
    `--decoder-first/last-pipeline-num-layers` when only the end stages differ (one stage per rank), else the
    layout, which MTP layers always get. A hybrid (Mamba) model takes no layout and no virtual stages."""
    stages = stage_letters(plan)
    _require_mtp_with_loss(plan, stages)
    layers = [letters.count("t") for letters in stages]
    config = plan.parallel
    layout = ("--pipeline-model-parallel-layout", layout_string(plan))
    hybrid = is_hybrid(plan.model)
    if hybrid and config.vpp > 1:
        raise PlannerError(f"Megatron-LM's hybrid (Mamba) stack has no virtual pipeline stages; the plan has "
                           f"vpp={config.vpp}")
    if any("m" in letters for letters in stages):
        return (layout,)
    if len(set(layers)) == 1:
        if config.vpp > 1:
            return (("--num-virtual-stages-per-pipeline-rank", str(config.vpp)),)
        return ()
    if config.vpp == 1 and min(layers) >= 1 and len(set(layers[1:-1])) <= 1:
        # pp = 2: giving the first stage alone leaves the rest to the last; no middle stages to divide.
        middle = layers[1] if config.pp > 2 else layers[-1]
        flags = []
        if layers[0] != middle:
            flags.append(("--decoder-first-pipeline-num-layers", str(layers[0])))
        if layers[-1] != middle:
            flags.append(("--decoder-last-pipeline-num-layers", str(layers[-1])))
        return tuple(flags)
    if hybrid:
        raise PlannerError(
            f"Megatron-LM's hybrid (Mamba) stack splits its layers evenly or with only the first and last stage "
            f"different (--decoder-first/last-pipeline-num-layers); the plan's split {','.join(map(str, layers))} "
            "needs a layout, which the hybrid stack ignores")
    # The layout implies vpp = stages / pp; Megatron accepts only one of layout and vpp flags.
    return (layout,)


def megatron_arguments(plan: Plan) -> tuple[tuple[FlagGroup, ...], tuple[str, ...]]:
    """Every `pretrain_gpt.py` (hybrid: `pretrain_mamba.py`) flag the plan decides, in titled groups, and what
    Megatron-LM has no flag for."""
    config = plan.parallel
    model = model_flags(plan.model, plan.training, Dialect.MEGATRON_LM)  # first: it refuses what has no layout
    parallel = list(parallel_flags(config, plan.training.global_batch, split_arguments(plan)))
    if config.cp > 1:  # Megatron-LM spells the all-gather variant "allgather" (--cp-comm-type choices)
        parallel += [("--context-parallel-size", str(config.cp)),
                     ("--cp-comm-type", config.cp_comm.replace("all-gather", "allgather"))]
    if plan.model.is_moe:  # always explicit: Megatron-LM's etp default is tp, the planner's may differ
        parallel += [("--expert-model-parallel-size", str(config.ep)),
                     ("--expert-tensor-parallel-size", str(config.etp)), *moe_dispatch_flags(config)]
    if config.tp_comm_overlap:
        parallel.append(("--tp-comm-overlap",))  # Transformer Engine userbuffers; asserts --sequence-parallel
    if config.schedule is Schedule.INTERLEAVED and not config.p2p_overlapped:
        parallel.append(("--no-overlap-p2p-communication",))  # overlapped is Megatron-LM's interleaved default
    distributed_optimizer = config.optimizer_sharding >= 1
    if config.zero_stage >= 2:  # Megatron-FSDP (core 0.16 user guide's required flags); ZeRO-2 keeps weights whole
        strategy = "optim_grads_params" if config.zero_stage == 3 else "optim_grads"
        parallel += [("--use-megatron-fsdp",), ("--data-parallel-sharding-strategy", strategy),
                     ("--no-gradient-accumulation-fusion",), ("--ckpt-format", "fsdp_dtensor")]
    if distributed_optimizer:
        parallel.append(("--use-distributed-optimizer",))
    if config.fp8_param_gather:  # FP8 weights gathered by the distributed optimizer or Megatron-FSDP
        parallel.append(("--fp8-param-gather",))
    if plan.training.optimizer_states == "cpu":  # HybridDeviceOptimizer: every state and the step on the host
        parallel += [("--optimizer-cpu-offload",), ("--optimizer-offload-fraction", "1.0"),
                     ("--use-precision-aware-optimizer",)]
    if config.dp > 1 and config.overlap_grad_reduce:
        parallel.append(("--overlap-grad-reduce",))
        if distributed_optimizer and config.overlap_param_gather:
            parallel.append(("--overlap-param-gather",))
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
    """`pretrain_gpt.py` (a hybrid model: `pretrain_mamba.py`) with the plan's flags, then the user's data,
    checkpoint and schedule flags."""
    setup = ('MEGATRON_LM="${MEGATRON_LM:-$PWD}"', *bash_array("MEGATRON_ARGS", groups),
             'read -r -a DATA <<< "$DATA_ARGS"', 'read -r -a CHECKPOINT <<< "$CHECKPOINT_ARGS"',
             f'read -r -a TRAIN <<< "${{TRAIN_ARGS:-{TRAIN_PLACEHOLDER_ARGS}}}"')
    script = "pretrain_mamba.py" if is_hybrid(plan.model) else "pretrain_gpt.py"
    return Program(setup, f'"$MEGATRON_LM/{script}" "${{MEGATRON_ARGS[@]}}" "${{DATA[@]}}" "${{CHECKPOINT[@]}}" '
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
