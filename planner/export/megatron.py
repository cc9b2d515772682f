"""Megatron-LM export: the plan as `pretrain_gpt.py` flags, a torchrun launch script and a hostfile.

Flag names and rules follow ../shared/REFERENCE.md §1 (Megatron-LM's arguments.py, TransformerConfig
and pipeline_parallel_layer_layout.py). The stage split is given the simplest way Megatron accepts:
nothing when uniform, `--decoder-first/last-pipeline-num-layers` when only the end stages differ
(one stage per rank), otherwise `--pipeline-model-parallel-layout` with stages in virtual-stage-major
order (stage k on pipeline rank k mod pp), which is also the order of the plan's stages.
"""

from __future__ import annotations

import re
import shlex

from planner.config import Recompute, Schedule
from planner.errors import PlannerError
from planner.export.common import (
    TRAIN_PLACEHOLDER_ARGS,
    ExportResult,
    HostOrder,
    host_order,
    hostfile_text,
    plan_summary,
    stage_units,
)
from planner.model import ModelSpec
from planner.plan import Plan

__all__ = ["export_megatron", "layout_string", "megatron_arguments", "parse_layout", "split_arguments"]

ArgGroup = tuple[str, tuple[tuple[str, ...], ...]]

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


def split_arguments(plan: Plan) -> tuple[tuple[str, ...], ...]:
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


def _parallel_group(plan: Plan) -> ArgGroup:
    config = plan.parallel
    flags: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(config.tp)),
        ("--pipeline-model-parallel-size", str(config.pp)),
    ]
    if config.sequence_parallel:
        flags.append(("--sequence-parallel",))
    flags += split_arguments(plan)
    flags += [("--micro-batch-size", str(config.micro_batch)),
              ("--global-batch-size", str(plan.training.global_batch))]
    if config.recompute is Recompute.SELECTIVE:
        flags.append(("--recompute-granularity", "selective"))
    elif config.recompute is Recompute.FULL:
        # The cost model's "full" recomputes every block: uniform chunks of one layer.
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                  ("--recompute-num-layers", "1")]
    distributed_optimizer = config.optimizer_sharding >= 1
    if distributed_optimizer:
        flags.append(("--use-distributed-optimizer",))
    if config.dp > 1 and config.overlap_grad_reduce:
        flags.append(("--overlap-grad-reduce",))
        if distributed_optimizer and config.overlap_param_gather:
            flags.append(("--overlap-param-gather",))
    return ("parallelism, batch, recompute", tuple(flags))


def _model_group(model: ModelSpec, plan: Plan) -> ArgGroup:
    if model.position_embedding == "alibi":
        raise PlannerError(f"model {model.name!r} uses ALiBi position embeddings, which Megatron-LM does not implement")
    training = plan.training
    flags: list[tuple[str, ...]] = [
        ("--num-layers", str(model.num_layers)),
        ("--hidden-size", str(model.hidden_size)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)),
        ("--num-attention-heads", str(model.num_attention_heads)),
    ]
    if model.num_key_value_heads != model.num_attention_heads:
        flags += [("--group-query-attention",), ("--num-query-groups", str(model.num_key_value_heads))]
    if model.head_dim * model.num_attention_heads != model.hidden_size:
        flags.append(("--kv-channels", str(model.head_dim)))
    flags += [("--seq-length", str(training.seq_len)),
              ("--max-position-embeddings", str(max(training.seq_len, model.max_position_embeddings)))]
    if model.activation == "swiglu":
        flags.append(("--swiglu",))
    flags.append(("--normalization", "RMSNorm" if model.normalization == "rmsnorm" else "LayerNorm"))
    flags.append(("--position-embedding-type", "rope" if model.position_embedding == "rope" else "learned_absolute"))
    if not model.tie_embeddings:
        flags.append(("--untie-embeddings-and-output-weights",))
    if not model.linear_bias:
        flags.append(("--disable-bias-linear",))
        if model.qkv_bias:
            flags.append(("--add-qkv-bias",))
    if not model.dropout:
        flags += [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0")]
    if model.is_moe:
        flags += [("--num-experts", str(model.num_experts)), ("--moe-router-topk", str(model.moe_top_k))]
    flags.append(("--bf16",) if training.dtype in ("bf16", "fp8") else ("--fp16",))
    if training.dtype == "fp8":
        flags.append(("--fp8-format", "hybrid"))
    flags.append(("--attention-backend", "flash" if training.attention == "flash" else "unfused"))
    return ("model and precision", tuple(flags))


def megatron_arguments(plan: Plan) -> tuple[ArgGroup, ...]:
    """Every `pretrain_gpt.py` flag the plan decides, in titled groups."""
    return (_parallel_group(plan), _model_group(plan.model, plan))


def megatron_notes(plan: Plan) -> tuple[str, ...]:
    """What a user must know: rules the plan meets only partly, and what Megatron has no flag for."""
    config, notes = plan.parallel, []
    m = config.num_microbatches(plan.training.global_batch)
    if config.schedule is Schedule.INTERLEAVED and m % config.pp:
        notes.append(f"Megatron's interleaved schedule needs num_microbatches ({m}) divisible by pp ({config.pp}); "
                     "pass --microbatch-group-size-per-virtual-pipeline-stage or change the global batch")
    if config.schedule is Schedule.GPIPE:
        notes.append("Megatron-LM has no GPipe schedule; it runs 1F1B (same bubble, less activation memory)")
    if config.zero_stage >= 2:
        notes.append(f"ZeRO-{config.zero_stage} has no stock Megatron-LM flag; --use-distributed-optimizer shards "
                     "optimizer states only (ZeRO-1); Megatron-FSDP (--use-megatron-fsdp) shards more")
    return tuple(notes)


def _args_text(groups: tuple[ArgGroup, ...], header: list[str]) -> str:
    lines = [f"# {line}" for line in header]
    for title, flags in groups:
        lines.append(f"# {title}")
        lines += [" ".join(shlex.quote(token) for token in flag) for flag in flags]
    return "\n".join(lines) + "\n"


def launch_script(plan: Plan, groups: tuple[ArgGroup, ...], order: HostOrder, header: list[str]) -> str:
    """A bash script that runs torchrun on one host; run it on every host of the hostfile."""
    config = plan.parallel
    lines = ["#!/usr/bin/env bash", *(f"# {line}" for line in header),
             "# Run on every host listed in ./hostfile (line i = node rank i); set NODE_RANK where hostnames",
             "# differ from the plan's node names. MEGATRON_LM: a Megatron-LM checkout; DATA_ARGS, TRAIN_ARGS:",
             "# override the placeholders below with your data, tokenizer and schedule.",
             "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             'HOSTFILE="${HOSTFILE:-$HERE/hostfile}"',
             'MEGATRON_LM="${MEGATRON_LM:-$PWD}"',
             "mapfile -t HOSTS < <(awk '!/^#/ && NF {print $1}' \"$HOSTFILE\")",
             'if [[ -z "${NODE_RANK:-}" ]]; then',
             '  for i in "${!HOSTS[@]}"; do',
             '    if [[ "${HOSTS[$i]}" == "$(hostname)" || "${HOSTS[$i]}" == "$(hostname -s)" ]]; then',
             '      NODE_RANK=$i',
             '    fi',
             "  done",
             "fi",
             ': "${NODE_RANK:?this host is not listed in $HOSTFILE; set NODE_RANK}"',
             'MASTER_ADDR="${MASTER_ADDR:-${HOSTS[0]}}"',
             'MASTER_PORT="${MASTER_PORT:-6000}"']
    if order.problem:
        lines.append(f"# WARNING: the plan's placement cannot be realised by host order: {order.problem}")
    if config.tp > 1 or config.cp > 1:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts it with TP>1 or CP>1 (pre-Blackwell)")
    if any(order.device_order):
        lines.append('case "$NODE_RANK" in  # GPU order per host that realises the plan\'s placement')
        lines += [f"  {rank}) export CUDA_VISIBLE_DEVICES={','.join(map(str, devices))} ;;"
                  for rank, devices in enumerate(order.device_order) if devices]
        lines.append("esac")
    lines.append("MEGATRON_ARGS=(")
    for title, flags in groups:
        lines.append(f"  # {title}")
        lines += ["  " + " ".join(shlex.quote(token) for token in flag) for flag in flags]
    lines.append(")")
    data = f"--mock-data --tokenizer-type NullTokenizer --vocab-size {plan.model.vocab_size}"
    lines += [f'read -r -a DATA <<< "${{DATA_ARGS:-{data}}}"',
              f'read -r -a TRAIN <<< "${{TRAIN_ARGS:-{TRAIN_PLACEHOLDER_ARGS}}}"',
              f"exec torchrun --nnodes {len(order.hosts)} --nproc-per-node {order.nproc_per_node} "
              '--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
              '  "$MEGATRON_LM/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "${DATA[@]}" "${TRAIN[@]}"']
    return "\n".join(lines) + "\n"


def export_megatron(plan: Plan) -> ExportResult:
    """megatron_args.txt (one flag per line), launch.sh (torchrun) and hostfile for the plan."""
    groups = megatron_arguments(plan)
    order = host_order(plan)
    notes = megatron_notes(plan)
    if order.problem:
        notes += (f"placement not realisable by host order ({order.problem}); Megatron will use the launcher's "
                  "default rank placement",)
    header = [f"planner export --to megatron: {plan_summary(plan)}",
              "rank order tp-cp-ep-dp-pp (Megatron's default): rank = tp + tp_size*(dp + dp_size*pp)",
              *(f"NOTE: {note}" for note in notes)]
    return ExportResult(
        files={"megatron_args.txt": _args_text(groups, header),
               "launch.sh": launch_script(plan, groups, order, header),
               "hostfile": hostfile_text(order)},
        notes=notes,
    )
