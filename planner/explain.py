"""Why a plan is as fast as it is: its bottleneck in words, one step of each knob re-planned, the
search's nearest alternatives, and the one change that buys the most.

Every what-if is planned, not just re-estimated: a neighbour (tp doubled, one more recompute level,
…) runs the search with every option fixed, so it gets its own best stage split — a fair
comparison with a plan whose split was optimised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from planner.config import ParallelConfig, Recompute, Schedule, Training
from planner.cost.estimate import (
    BREAKDOWN_KEYS,
    TIGHT_MEMORY_EVIDENCE,
    TIGHT_MEMORY_SHARE,
    Estimate,
    moe_load_headroom,
)
from planner.cost.schedule import schedule_of
from planner.errors import InfeasibleError, PlannerError
from planner.frameworks import framework_named
from planner.gpu import GIB
from planner.model import ModelSpec
from planner.replay import PlanProblem
from planner.search.planning import plan
from planner.search.space import FixedOptions

__all__ = ["Alternative", "Explanation", "bottleneck", "explain", "fixed_of", "host_launch_s", "neighbours"]

COMPUTE_BOUND_SHARE = 0.75  # compute at least this share of the iteration: the layout is not the limit
HOST_BOUND_SHARE = 0.2  # compute-bound, and the host's kernel launches add at least this share: the host is the limit
WORTH_IT = 1e-3  # a change must save more than this fraction of the iteration to be recommended
_RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
_SHARDING = ((0, False), (0, True), (2, False), (3, False))  # ZeRO-0, dist-opt (≈ ZeRO-1), ZeRO-2, ZeRO-3

_WORDS = {
    "compute": "compute: the GPUs spend {share} of the iteration on the model's own math (MFU {mfu}); the layout "
               "is not the limit — faster kernels, FP8 or more GPUs are",
    "recompute": "activation recompute: {share} of the iteration repeats forward work to save memory; "
                 "a lighter recompute, where memory allows, gives it back",
    "bubble": "pipeline bubble: ranks idle {share} of the iteration while the pipeline fills and drains "
              "(pp={pp}, {m} micro-batches); more micro-batches, interleaving (vpp) or a smaller pp shrink it",
    "tp_comm": "tensor-parallel communication: {share} of the iteration is exposed TP collectives (tp={tp}); "
               "a smaller tp or TP communication overlap hides it",
    "pp_comm": "pipeline p2p: {share} of the iteration sends activations and gradients between stages (pp={pp}); "
               "a smaller pp or a larger micro-batch amortises it",
    "dp_comm": "data-parallel communication: {share} of the iteration is gradient/parameter sync the backward "
               "cannot hide (dp={dp}); fewer, larger micro-batches or a less sharded optimizer expose less",
    "optimizer": "optimizer step: {share} of the iteration updates the weights; sharding it (distributed "
                 "optimizer / ZeRO) splits this work over dp",
    "other": "fixed per-iteration overhead: {share} of the iteration; a larger global batch amortises it",
}
_HOST_WORDS = ("compute, held back by the host: eager PyTorch launches the kernels slower than the GPUs run them, "
               "which adds {host} of the iteration (MFU {mfu}); a larger micro-batch (now {mb}), a smaller tp "
               "(tp={tp}) or CUDA graphs (--cuda-graphs full_iteration) hide the launches")


@dataclass(frozen=True)
class Alternative:
    """A planned configuration next to the explained one: what changed, its time, and the delta."""

    change: str
    config: ParallelConfig | None
    iteration_time_s: float | None  # None: no stage split fits in memory
    delta_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"change": self.change, "parallelism": self.config.describe() if self.config else None,
                "iteration_time_s": self.iteration_time_s, "delta_s": self.delta_s,
                "fits": self.iteration_time_s is not None}


@dataclass(frozen=True)
class Explanation:
    """The explained plan's bottleneck, breakdown, headroom, what-ifs, search alternatives and best change."""

    describe: str
    iteration_time_s: float
    breakdown_s: dict[str, float]
    bottleneck: str
    verdict: str
    host_launch_s: float
    headroom_bytes: float
    capacity_bytes: float
    what_ifs: tuple[Alternative, ...]
    alternatives: tuple[Alternative, ...]
    best_change: Alternative | None
    moe_load_headroom: float | None = None  # `cost.estimate.moe_load_headroom` of the plan
    # CPU offloading: activation bytes in host memory at the peak and the iteration's copy stalls (none: 0, 0)
    offloaded_bytes: float = 0.0
    offload_exposed_s: float = 0.0

    @property
    def memory_note(self) -> str:
        """The memory headroom in words (tight when the plan needs more than TIGHT_MEMORY_SHARE of capacity), and for
        an MoE plan the busiest expert rank's load it stays within."""
        share = self.headroom_bytes / self.capacity_bytes
        text = (f"memory headroom {self.headroom_bytes / GIB:.1f} GiB ({100 * share:.0f} % of "
                f"{self.capacity_bytes / GIB:.0f} GiB)")
        offload = (f"; {self.offloaded_bytes / GIB:.1f} GiB of activations in host memory at the peak, their copies "
                   f"stalling the GPU {self.offload_exposed_s:.3f} s per iteration" if self.offloaded_bytes else "")
        if self.headroom_bytes < 0:
            return text + ": it does NOT fit; only changes that save memory help" + offload
        if share < 1 - TIGHT_MEMORY_SHARE:
            text += f"; tight: a change that needs more memory will not fit, and {TIGHT_MEMORY_EVIDENCE}"
        if self.moe_load_headroom is not None:
            text += (f"; a router sending its busiest expert rank more than {self.moe_load_headroom:.2f}x the mean "
                     f"routed tokens would not fit")
        return text + offload

    def as_dict(self) -> dict[str, Any]:
        return {"parallelism": self.describe, "iteration_time_s": self.iteration_time_s,
                "breakdown_s": self.breakdown_s, "bottleneck": self.bottleneck, "verdict": self.verdict,
                "host_launch_s": self.host_launch_s,
                "memory": {"headroom_bytes": self.headroom_bytes, "capacity_bytes": self.capacity_bytes,
                           "moe_load_headroom": self.moe_load_headroom, "offloaded_bytes": self.offloaded_bytes,
                           "note": self.memory_note},
                "what_ifs": [w.as_dict() for w in self.what_ifs],
                "alternatives": [a.as_dict() for a in self.alternatives],
                "best_change": self.best_change.as_dict() if self.best_change else None}


def bottleneck(result: Estimate, config: ParallelConfig, host_launch_s: float = 0.0) -> tuple[str, str]:
    """The breakdown term that limits the plan and a sentence saying so: compute when it is at least
    COMPUTE_BOUND_SHARE of the iteration, else the largest overhead term. Compute whose kernels the host launches
    slower than the GPUs run them (`host_launch_s`, at least HOST_BOUND_SHARE of the iteration) says so, since
    faster kernels would not help it."""
    terms = result.breakdown_s
    total = result.iteration_time_s
    key = "compute" if terms["compute"] >= COMPUTE_BOUND_SHARE * total else max(
        (k for k in BREAKDOWN_KEYS if k != "compute"), key=lambda k: terms[k])
    words = _HOST_WORDS if key == "compute" and host_launch_s >= HOST_BOUND_SHARE * total else _WORDS[key]
    return key, words.format(share=f"{100 * terms[key] / total:.1f} %", mfu=f"{100 * result.mfu:.1f} %",
                             pp=config.pp, tp=config.tp, dp=config.dp, m=result.num_microbatches,
                             mb=config.micro_batch, host=f"{100 * host_launch_s / total:.1f} %")


def host_launch_s(problem: PlanProblem, result: Estimate) -> float:
    """Seconds of the plan's iteration (`result`) that the host's kernel launches add over the GPUs' own work: its
    time less the same plan's with launches free (`Calibration.host_kernel_s`, `grouped_gemm_host_s`)."""
    free = replace(problem, calibration=problem.calibration.updated(host_kernel_s=0.0, grouped_gemm_host_s=0.0))
    return max(0.0, result.iteration_time_s - free.estimate().iteration_time_s)


def fixed_of(config: ParallelConfig) -> FixedOptions:
    """Every option of a configuration fixed, so the search plans exactly it (its split optimised); local learning's
    queue and head only under its schedule (elsewhere they mean nothing, and the search refuses them)."""
    local = schedule_of(config.schedule).local_losses
    return FixedOptions(**{f.name: getattr(config, f.name) for f in fields(FixedOptions)
                           if hasattr(config, f.name) and (local or not f.name.startswith("local_"))})


def _degree_steps(config: ParallelConfig, name: str) -> list[tuple[str, dict[str, Any]]]:
    """`name` doubled and halved with dp taking the difference (the GPUs stay the same)."""
    value, steps = getattr(config, name), []
    for new in (value * 2, value // 2):
        if new < 1 or new == value or (config.dp * value) % new:
            continue
        change: dict[str, Any] = {name: new, "dp": config.dp * value // new}
        if name == "tp":
            change["sequence_parallel"] = new > 1
            change["tp_comm_overlap"] = config.tp_comm_overlap and new > 1
        if name == "pp" and new == 1:
            change.update(vpp=1, schedule=Schedule.ONE_F_ONE_B)
        steps.append((f"{name} {value}→{new}", change))
    return steps


def _ladder_steps(label: str, levels: tuple[Any, ...], current: Any,
                  change: Callable[[Any], dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """One rung down and one up a ladder of settings (recompute levels, optimizer sharding)."""
    if current not in levels:
        return []
    i = levels.index(current)
    return [(f"{label} {_rung(current)}→{_rung(levels[j])}", change(levels[j]))
            for j in (i - 1, i + 1) if 0 <= j < len(levels)]


def _rung(level: Any) -> str:
    """A ladder setting as the CLI writes it: `selective`, `dist-opt`, `zero2`."""
    if isinstance(level, Recompute):
        return level.value
    zero, dist_opt = level
    return "dist-opt" if dist_opt else f"zero{zero}"


def neighbours(config: ParallelConfig) -> list[tuple[str, ParallelConfig]]:
    """One step of each knob (tp, pp, cp/ep where modelled, micro-batch, vpp, recompute, ZeRO),
    as valid configurations on the same GPUs; steps the configuration rules refuse are left out."""
    steps = [*_degree_steps(config, "tp"), *_degree_steps(config, "pp")]
    steps += [step for name in ("cp", "ep") if hasattr(config, name) for step in _degree_steps(config, name)]
    steps += [(f"micro-batch {config.micro_batch}→{mb}", {"micro_batch": mb})
              for mb in (config.micro_batch * 2, config.micro_batch // 2) if mb >= 1]
    # a zero-bubble plan stays zero bubble: interleaved-zb over chunks, zb-h1 without; local learning has no chunks
    if config.pp > 1 and not schedule_of(config.schedule).local_losses:
        split = schedule_of(config.schedule).splits_backward
        chunked, single = ((Schedule.INTERLEAVED_ZB, Schedule.ZB_H1) if split
                           else (Schedule.INTERLEAVED, Schedule.ONE_F_ONE_B))
        steps += [(f"vpp {config.vpp}→{v}", {"vpp": v, "schedule": chunked if v > 1 else single})
                  for v in (config.vpp + 1, config.vpp - 1) if v >= 1]
    steps += _ladder_steps("recompute", _RECOMPUTE, config.recompute, lambda r: {"recompute": r})
    sharding = (0, True) if config.zero_stage == 1 else (config.zero_stage, config.distributed_optimizer)
    steps += _ladder_steps("sharding", _SHARDING, sharding,
                           lambda s: {"zero_stage": s[0], "distributed_optimizer": s[1]})
    out = []
    for label, change in steps:
        try:
            out.append((label, replace(config, **change)))
        except (PlannerError, ValueError):
            continue
    return out


def _planned(problem: PlanProblem, config: ParallelConfig, time_limit_s: float) -> tuple[float | None, bool]:
    """The configuration's time with its best split (None when no split fits), and whether it is valid."""
    try:
        found = plan(problem.model, problem.cluster, problem.training, fixed_of(config), 1, time_limit_s,
                     calibration=problem.calibration)
    except InfeasibleError:
        return None, True
    except PlannerError:
        return None, False
    return found.best.estimate.iteration_time_s, True


def graphable_parts(model: ModelSpec, training: Training, config: ParallelConfig) -> tuple[str, ...]:
    """The parts of every layer per-layer CUDA graphs (Training.cuda_graph_modules) could capture in this plan:
    attention, a dense layer's MLP, an MoE layer's router and its preprocessing (without the preprocessing where the
    alltoall dispatcher syncs in it); none where its recompute rules them out (`check_cuda_graph_modules`)."""
    moe_layers, dense_layers, _ = model.layer_kind_counts
    parts = ["attn"]
    if dense_layers:
        parts.append("mlp")
    if moe_layers:
        parts += ["moe_router"] if config.preprocess_syncs(training) else ["moe_router", "moe_preprocess"]
    try:
        config.check_cuda_graph_modules(replace(training, cuda_graph_modules=tuple(parts)), model.layer_kind_counts,
                                        model.dropout)
    except PlannerError:
        return ()
    return tuple(parts)


def _graphed_what_if(problem: PlanProblem, base_s: float, host_s: float, time_limit_s: float,
                     framework: str = "any") -> list[Alternative]:
    """For an eager plan held back by the host (`host_s`, at least HOST_BOUND_SHARE of `base_s`): the same layout
    with the iteration in one CUDA graph (`Training.cuda_graphs`), which launches nothing from the host, and with
    per-layer graphs of the parts `graphable_parts` allows (`Training.cuda_graph_modules`), each where the plan's
    `framework` captures them, re-planned like the other what-ifs."""
    training = problem.training
    if training.graphs_anything or host_s < HOST_BOUND_SHARE * base_s:
        return []
    target = framework_named(framework).for_model(problem.model)
    parts = graphable_parts(problem.model, training, problem.config)
    steps = []
    if target.full_iteration_graphs:
        steps.append(("cuda graphs none→full_iteration", replace(training, cuda_graphs="full_iteration")))
    if target.module_graphs and parts:
        steps.append((f"cuda graph modules none→{','.join(parts)}", replace(training, cuda_graph_modules=parts)))
    found = []
    for change, graphed in steps:
        seconds, valid = _planned(replace(problem, training=graphed), problem.config, time_limit_s)
        if valid:
            found.append(Alternative(change, problem.config, seconds, None if seconds is None else seconds - base_s))
    return found


def explain(problem: PlanProblem, result: Estimate, top_k: int = 5, time_limit_s: float = 1.0,
            framework: str = "any") -> Explanation:
    """The explanation of a plan whose estimate is `result` (see the module docstring); `framework` is the plan's
    target, which decides whether capturing the iteration in a CUDA graph is a step it can take."""
    base = result.iteration_time_s
    what_ifs = []
    for label, config in neighbours(problem.config):
        seconds, valid = _planned(problem, config, time_limit_s)
        if valid:
            what_ifs.append(Alternative(label, config, seconds, None if seconds is None else seconds - base))
    try:
        searched = plan(problem.model, problem.cluster, problem.training, None, top_k, time_limit_s,
                        calibration=problem.calibration).plans
    except InfeasibleError:
        searched = ()
    alternatives = tuple(Alternative(p.config.describe(), p.config, p.estimate.iteration_time_s,
                                     p.estimate.iteration_time_s - base) for p in searched)
    host = host_launch_s(problem, result)
    what_ifs += _graphed_what_if(problem, base, host, time_limit_s, framework)
    gains = [(w.delta_s, i) for i, w in enumerate(what_ifs) if w.delta_s is not None and w.delta_s < -WORTH_IT * base]
    key, verdict = bottleneck(result, problem.config, host)
    tightest = result.tightest_stage().memory
    router = moe_load_headroom(problem.training, problem.config, result,
                               lambda training: replace(problem, training=training).estimate())
    return Explanation(
        problem.config.describe(), base, dict(result.breakdown_s), key, verdict, host,
        tightest.capacity - tightest.required, tightest.capacity, tuple(what_ifs), alternatives,
        what_ifs[min(gains)[1]] if gains else None, router,
        tightest.offloaded, result.breakdown_detail_s["activation_offload_exposed"])
