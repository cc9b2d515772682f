"""Human-readable text for the CLI: tables of estimates and stages. Formatting only, no planning."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from planner.compare import Comparison
from planner.config import ParallelConfig
from planner.cost.estimate import BREAKDOWN_KEYS, TIGHT_MEMORY_EVIDENCE, TIGHT_MEMORY_SHARE, Estimate
from planner.explain import Alternative, Explanation
from planner.gpu import GIB
from planner.search.search import RankedPlan
from planner.training_cost import TrainingCost

__all__ = [
    "format_breakdown",
    "format_comparison",
    "format_explanation",
    "format_memory",
    "format_ranked",
    "format_stages",
    "format_sweep",
    "format_table",
    "gib",
    "node_list",
    "ranked_frame",
    "stage_split_summary",
    "with_training_costs",
]


def node_list(names: Sequence[str], shown: int = 6) -> str:
    """Node names, the first few and the last when there are many (a pipeline rank may span 128 nodes)."""
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, …, {names[-1]} ({len(names)} nodes)"


def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns separated by two spaces."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def ranked_frame(plans: Sequence[RankedPlan]) -> pd.DataFrame:
    """The ranked plans as one row each, in SI units: what `plan` prints and what `--csv` writes."""
    rows = []
    for rank, plan in enumerate(plans, 1):
        c, e = plan.config, plan.estimate
        rows.append({
            "rank": rank, "dp": c.dp, "tp": c.tp, "pp": c.pp, "vpp": c.vpp, "cp": c.cp, "cp_comm": c.cp_comm,
            "micro_batch": c.micro_batch,
            "num_microbatches": e.num_microbatches, "recompute": c.recompute.value,
            "recompute_num_layers": c.recompute_num_layers,
            "sharding": "dist-opt" if c.distributed_optimizer else f"zero{c.zero_stage}",
            "sequence_parallel": c.sequence_parallel, "schedule": c.schedule.value, "stages": stage_split_summary(e),
            "iteration_time_s": e.iteration_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
            "peak_memory_bytes": e.peak_memory_bytes, "capacity_bytes": e.stages[0].memory.capacity,
            "split_optimal": plan.optimal, "split_lower_bound_s": plan.lower_bound_s,
            **{f"{key}_s": e.breakdown_s[key] for key in BREAKDOWN_KEYS},
        })
    return pd.DataFrame(rows)


def with_training_costs(frame: pd.DataFrame, costs: Sequence[TrainingCost]) -> pd.DataFrame:
    """The ranked plans with each one's time-to-train, GPU-hours, cost and energy (`--tokens`)."""
    return frame.assign(**{key: [cost.as_dict()[key] for cost in costs]
                           for key in ("time_to_train_s", "gpu_hours", "cost_usd", "energy_kwh")})


def _money(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"${value:,.0f}"


def format_ranked(frame: pd.DataFrame) -> str:
    """The ranked-plans table of `planner plan` (with time-to-train and cost columns after `--tokens`)."""
    costed = "time_to_train_s" in frame
    rows = [(r.rank, f"{r.dp}/{r.tp}/{r.pp}/{r.vpp}" + (f" cp{r.cp} {r.cp_comm}" if r.cp > 1 else ""),
             r.micro_batch, r.num_microbatches,
             r.recompute + ("" if pd.isna(r.recompute_num_layers) else f":{int(r.recompute_num_layers)}"), r.sharding,
             r.schedule, r.stages, f"{r.iteration_time_s:.3f} s", f"{r.tokens_per_s:,.0f}", f"{100 * r.mfu:.1f} %",
             f"{gib(r.peak_memory_bytes)} / {gib(r.capacity_bytes)}",
             *((f"{r.time_to_train_s / 86400:,.1f} d", f"{r.gpu_hours:,.0f}", _money(r.cost_usd)) if costed else ()))
            for r in frame.itertuples()]
    return format_table(("#", "dp/tp/pp/vpp", "mb", "#mb", "recompute", "ZeRO", "schedule", "stages", "time/iter",
                         "tokens/s", "MFU", "peak / capacity",
                         *(("to train", "GPU-hours", "cost") if costed else ())), rows)


def format_breakdown(result: Estimate) -> str:
    """Iteration time split into the DESIGN.md breakdown terms, with shares."""
    total = result.iteration_time_s
    rows = [(key, f"{result.breakdown_s[key]:.4f} s", f"{100 * result.breakdown_s[key] / total:5.1f} %")
            for key in BREAKDOWN_KEYS]
    rows.append(("total", f"{total:.4f} s", "100.0 %"))
    return format_table(("term", "time", "share"), rows)


def stage_split_summary(result: Estimate) -> str:
    """Blocks per stage, E/H marking the embedding and head, runs of equal stages as `count*n`
    (e.g. `E8|8*2|8H`, or `E3|3*30|3H` for 32 interleaved chunks)."""
    labels = [("E" if s.embedding else "") + str(s.blocks[1] - s.blocks[0]) + ("H" if s.head else "")
              for s in result.stages]
    runs: list[list[object]] = []
    for label in labels:
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return "|".join(f"{label}*{count}" if count > 1 else str(label) for label, count in runs)


def format_stages(result: Estimate) -> str:
    rows = []
    for s in result.stages:
        mem = s.memory
        blocks = f"{s.blocks[0]}-{s.blocks[1] - 1}" if s.blocks[1] > s.blocks[0] else "-"
        rows.append((
            s.index, s.pp_rank, s.virtual_index, blocks,
            ("E" if s.embedding else "") + ("H" if s.head else ""), s.gpu,
            f"{1e3 * s.forward_s:.2f}", f"{1e3 * s.backward_s:.2f}", f"{1e3 * s.p2p_s:.2f}",
            gib(mem.weights + mem.gradients + mem.optimizer), gib(mem.activations), gib(mem.total),
            gib(mem.capacity), "yes" if mem.fits else "NO",
        ))
    headers = ("stage", "pp", "chunk", "blocks", "ends", "gpu", "fwd ms", "bwd ms", "p2p ms", "states",
               "activations", "total", "capacity", "fits")
    return format_table(headers, rows)


def format_memory(result: Estimate) -> str:
    """Per pipeline rank, the memory of one GPU term by term, the frozen base weights apart from the trainable
    states (weights, gradients, optimizer states of what trains: all parameters, or the adapters), and the FP8
    linears' weight copies apart from the weights where there are any."""
    copies = any(s.memory.fp8_weight_copies for s in result.stages)
    rows, seen = [], set()
    for s in result.stages:
        if s.pp_rank in seen:
            continue
        seen.add(s.pp_rank)
        mem = s.memory
        trainable = mem.weights - mem.frozen_weights - mem.fp8_weight_copies
        rows.append((s.pp_rank, gib(mem.frozen_weights), gib(trainable),
                     *((gib(mem.fp8_weight_copies),) if copies else ()), gib(mem.gradients),
                     gib(mem.optimizer), gib(mem.activations), gib(mem.other), gib(mem.total)))
    headers = ("pp", "frozen weights", "trainable weights", *(("fp8 weight copies",) if copies else ()),
               "gradients", "optimizer", "activations", "other", "total")
    return format_table(headers, rows)


def describe_estimate(config: ParallelConfig, result: Estimate, num_gpus: int, mfu_convention: str) -> str:
    """The estimate's headline lines; `mfu_convention` names the FLOPs behind MFU (`cost.estimate.mfu_convention`)."""
    lines = [
        f"configuration   {config.describe()}  ({num_gpus} GPUs, {result.num_microbatches} micro-batches)",
        f"iteration time  {result.iteration_time_s:.4f} s",
        f"throughput      {result.tokens_per_s:,.0f} tokens/s ({result.tokens_per_s / num_gpus:,.0f} per GPU)",
        f"model TFLOP/s   {result.model_tflops_per_gpu:.1f} per GPU, MFU {100 * result.mfu:.1f} %",
        f"MFU counts      {mfu_convention}",
        f"peak memory     {gib(result.peak_memory_bytes)} "
        f"({'fits' if result.fits else 'DOES NOT FIT'})",
    ]
    step_bound = [s for s in result.stages if s.memory.step_phase > s.memory.total]
    if step_bound:
        stage = max(step_bound, key=lambda s: s.memory.step_phase)
        lines.append(f"                at the optimizer step (stage {stage.index}: the model states and the gradient "
                     f"copies the step makes, {gib(stage.memory.step_phase)}, over the backward's "
                     f"{gib(stage.memory.total)})")
    return "\n".join(lines)


def _alternative_rows(alternatives: Sequence[Alternative], base_s: float) -> list[tuple[str, ...]]:
    return [(a.change, "does not fit" if a.iteration_time_s is None else f"{a.iteration_time_s:.4f} s",
             "" if a.delta_s is None else f"{a.delta_s:+.4f} s ({100 * a.delta_s / base_s:+.1f} %)")
            for a in alternatives]


def format_explanation(explanation: Explanation) -> str:
    """`planner explain`: bottleneck, breakdown, memory, one step of each knob, the search's best, the advice."""
    e = explanation
    total = e.iteration_time_s
    lines = [f"plan            {e.describe}", f"iteration time  {total:.4f} s", "",
             f"bottleneck: {e.verdict}", e.memory_note, "", "breakdown of one iteration",
             format_table(("term", "time", "share"),
                          [(k, f"{v:.4f} s", f"{100 * v / total:5.1f} %") for k, v in e.breakdown_s.items()]),
             "", "one step of each knob (each re-planned with its best stage split)",
             format_table(("change", "time/iter", "delta"), _alternative_rows(e.what_ifs, total)) if e.what_ifs
             else "(no valid neighbour on these GPUs)",
             "", "the search's best plans on this cluster",
             format_table(("plan", "time/iter", "delta"), _alternative_rows(e.alternatives, total))
             if e.alternatives else "(no plan fits)", ""]
    if e.best_change:
        lines.append(f"the one change that buys the most: {e.best_change.change} "
                     f"({e.best_change.delta_s:+.4f} s, {100 * e.best_change.delta_s / total:+.1f} %)")
    else:
        lines.append("no single step of one knob makes it faster")
    return "\n".join(lines)


def format_comparison(comparison: Comparison) -> str:
    """`planner compare`: the fields side by side (`*` marks rows that differ), then the verdicts."""
    rows = [("*" if differs else "", name, *values) for name, values, differs in comparison.rows]
    return "\n".join([format_table(("", "field", *comparison.labels), rows), "", *comparison.verdicts()])


def format_sweep(frame: pd.DataFrame, unit: str) -> str:
    """`planner sweep`: one row per cluster, `*` on the Pareto front of time-to-train against cost."""
    rows = [("*" if r.pareto else "", r.gpu, r.num_gpus, r.parallelism or "does not fit",
             "-" if pd.isna(r.iteration_time_s) else f"{r.iteration_time_s:.3f} s",
             "-" if pd.isna(r.mfu) else f"{100 * r.mfu:.1f} %",
             "-" if pd.isna(r.memory_share) else f"{100 * r.memory_share:.1f} %"
                                                 + (" !" if r.memory_share > TIGHT_MEMORY_SHARE else ""),
             "-" if pd.isna(r.time_to_train_s) else f"{r.time_to_train_s / 86400:,.1f} d",
             "-" if pd.isna(r.gpu_hours) else f"{r.gpu_hours:,.0f}", _money(r.cost_usd),
             "-" if pd.isna(r.energy_kwh) else f"{r.energy_kwh / 1e3:,.1f}") for r in frame.itertuples()]
    lines = [format_table(("", "gpu", "GPUs", "best plan", "time/iter", "MFU", "memory", "to train", "GPU-hours",
                           "cost", "MWh"), rows),
             f"* Pareto front: nothing else is both faster and cheaper (cost in {unit})"]
    if (frame["memory_share"] > TIGHT_MEMORY_SHARE).any():
        lines.append(f"! needs more than {100 * TIGHT_MEMORY_SHARE:g} % of its GPUs' memory; {TIGHT_MEMORY_EVIDENCE} "
                     f"(--memory-headroom plans with room left)")
    return "\n".join(lines)
