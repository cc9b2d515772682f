"""One simulated iteration as slices per pipeline rank: a Chrome/Perfetto trace and a static SVG.

The passes come from the schedule simulator (`planner.cost.schedule.simulate`) with the times
`estimate` gives it (each pass carries its share of its stage's p2p, as in `estimate`); each pass is
cut, in order, into its compute, recompute, exposed TP communication and p2p pieces (unit costs
of `planner.cost.time`). After the pipeline flush every rank shows the exposed DP traffic, the
optimizer step and the fixed overhead of the breakdown, so the last slice ends at the
estimate's iteration time. Memory per rank is its static bytes plus its peak activations
scaled by the micro-batches in flight at that moment (peak in flight = the estimate's peak).
Zero-bubble schedules show each split backward as a B pass and a later W pass (weight gradient),
activations held until the W; ZB-H2, whose iterations tile, is drawn as one period of the tiled
steady state, each rank's track starting at its first pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from planner.cost.estimate import Estimate
from planner.cost.schedule import BACKWARD, FORWARD, WEIGHT, PassEvent, simulate
from planner.cost.time import unit_costs
from planner.errors import PlannerError
from planner.gpu import GIB
from planner.placement import GroupLinks
from planner.profile.analytic import AnalyticProfile
from planner.replay import PlanProblem

__all__ = ["CATEGORIES", "IterationTimeline", "MemorySample", "Slice", "chrome_trace", "iteration_timeline",
           "timeline_svg"]

# slice category → colour (SVG and trace colour names where Chrome has one)
CATEGORIES = {"forward": "#4e79a7", "backward": "#59a14f", "weight_grad": "#8cd17d", "recompute": "#edc948",
              "tp_comm": "#b07aa1",
              "pp_comm": "#ff9da7", "dp_comm": "#e15759", "optimizer": "#9c755f", "other": "#bab0ac"}
_TAIL = (("dp_comm", "DP gradient sync (exposed)"), ("optimizer", "optimizer step"),
         ("other", "fixed per-iteration overhead"))


@dataclass(frozen=True)
class Slice:
    """One piece of work on one pipeline rank's track (seconds from the iteration's start)."""

    pp_rank: int
    name: str
    category: str
    start_s: float
    duration_s: float
    stage: int = -1
    microbatch: int = -1

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class MemorySample:
    """Bytes on one GPU of a pipeline rank from `time_s` on."""

    pp_rank: int
    time_s: float
    memory_bytes: float


@dataclass(frozen=True)
class IterationTimeline:
    """The slices and memory samples of one iteration, its length, and each rank's GPU and capacity."""

    slices: tuple[Slice, ...]
    memory: tuple[MemorySample, ...]
    iteration_s: float
    gpus: tuple[str, ...]
    capacity_bytes: tuple[float, ...]

    @property
    def pp(self) -> int:
        return len(self.gpus)


def _stage_parts(problem: PlanProblem, result: Estimate) -> list[dict[str, float]]:
    """Per virtual stage and micro-batch: seconds of recompute and exposed TP communication (forward,
    backward); compute is the rest of the estimate's pass times."""
    config = problem.config
    links = GroupLinks.from_placement(problem.cluster, config, problem.placement)
    calibration = problem.calibration
    timer = AnalyticProfile(problem.model, calibration)
    costs = [unit_costs(problem.model, problem.training, config, links.gpu[r], links.tp[r], timer, calibration,
                        links.cp[r], links.ep[r]) for r in range(config.pp)]
    keys = problem.model.unit_cost_keys  # each unit's own type, as estimate sums them
    parts = []
    for stage in result.stages:
        mine = [costs[stage.pp_rank][key] for key in keys[stage.units[0]:stage.units[1]]]
        parts.append({"recompute": sum(c.recompute_s for c in mine), "tp_forward": sum(c.tp_forward_s for c in mine),
                      "tp_backward": sum(c.tp_backward_s for c in mine)})
    return parts


def _pieces(event: PassEvent, parts: dict[str, float], forward_s: float, backward_s: float,
            p2p_s: tuple[float, float]) -> list[Slice]:
    """A simulated pass cut into its consecutive pieces; zero-length pieces are left out. A split backward's
    W pass is its weight-gradient GEMMs alone; its B pass the rest (`backward_s` is then B's share). `p2p_s`: the
    stage's p2p time the forward and the backward carry."""
    mb = event.microbatch
    if event.kind == WEIGHT:
        named = [(f"W{mb}", "weight_grad", event.end_s - event.start_s)]
    elif event.kind == FORWARD:
        named = [(f"F{mb}", "forward", forward_s - parts["tp_forward"]), ("TP", "tp_comm", parts["tp_forward"]),
                 ("p2p", "pp_comm", p2p_s[0])]
    else:
        named = [(f"R{mb}", "recompute", parts["recompute"]),
                 (f"B{mb}", "backward", backward_s - parts["recompute"] - parts["tp_backward"]),
                 ("TP", "tp_comm", parts["tp_backward"]), ("p2p", "pp_comm", p2p_s[1])]
    slices, start = [], event.start_s
    for name, category, seconds in named:
        if seconds > 0:
            slices.append(Slice(event.pp_rank, name, category, start, seconds, event.stage, mb))
            start += seconds
    return slices


def _memory(result: Estimate, events: list[PassEvent], pp: int) -> list[MemorySample]:
    """Each rank's memory over time: static bytes plus peak activations × in flight / peak in flight."""
    samples = []
    for r in range(pp):
        memory = next(s.memory for s in result.stages if s.pp_rank == r)
        static = memory.total - memory.activations
        # activations live from a forward to the pass that frees them: the backward, or a split backward's W
        frees = WEIGHT if any(e.kind == WEIGHT for e in events) else BACKWARD
        changes = sorted((e.end_s, 1 if e.kind == FORWARD else -1) for e in events
                         if e.pp_rank == r and e.kind in (FORWARD, frees))
        live, counts = 0, [(0.0, 0)]
        for time_s, step in changes:
            live += step
            counts.append((time_s, live))
        peak = max(count for _, count in counts) or 1
        samples += [MemorySample(r, t, static + memory.activations * count / peak) for t, count in counts]
    return samples


def iteration_timeline(problem: PlanProblem, result: Estimate) -> IterationTimeline:
    """The simulated iteration of a plan whose estimate is `result` (PlannerError where the schedule
    cannot be simulated, e.g. interleaving with micro-batches not a multiple of pp)."""
    config, m = problem.config, result.num_microbatches
    behaviour = config.pipeline_schedule
    if not behaviour.runnable(config.pp, m):
        raise PlannerError(f"timeline: the {config.schedule.value} schedule with pp={config.pp} needs "
                           f"{behaviour.runnable_rule}, got {m}; there is no order to draw")
    share = behaviour.forward_p2p_share
    p2p = [(s.p2p_s * share, s.p2p_s * (1 - share)) for s in result.stages]
    forward = [s.forward_s + sent for s, (sent, _) in zip(result.stages, p2p, strict=True)]
    backward = [s.backward_s + sent for s, (_, sent) in zip(result.stages, p2p, strict=True)]
    weight = [s.weight_s if behaviour.splits_backward else 0.0 for s in result.stages]
    simulated = simulate(forward, backward, [0.0] * len(forward), config.pp, m, behaviour, record=True,
                         weight_s=weight, queue_depth=behaviour.queue_depth(config.local_queue_depth))
    events = list(simulated.events)
    if behaviour.tiles_iterations:  # one period of the tiled steady state: each rank's track from its first pass
        first = {r: min(e.start_s for e in events if e.pp_rank == r) for r in range(config.pp)}
        events = [e._replace(start_s=e.start_s - first[e.pp_rank], end_s=e.end_s - first[e.pp_rank])
                  for e in events]
    parts = _stage_parts(problem, result)
    slices = [piece for e in events
              for piece in _pieces(e, parts[e.stage], result.stages[e.stage].forward_s,
                                   result.stages[e.stage].backward_s - weight[e.stage],
                                   p2p[e.stage])]
    start = simulated.iteration_s
    for category, name in _TAIL:
        seconds = result.breakdown_s[category]
        if seconds > 0:
            slices += [Slice(r, name, category, start, seconds) for r in range(config.pp)]
            start += seconds
    rank_stage = {s.pp_rank: s for s in result.stages}
    return IterationTimeline(
        tuple(sorted(slices, key=lambda s: (s.pp_rank, s.start_s))), tuple(_memory(result, events, config.pp)),
        start, tuple(rank_stage[r].gpu for r in range(config.pp)),
        tuple(rank_stage[r].memory.capacity for r in range(config.pp)))


def chrome_trace(timeline: IterationTimeline, title: str) -> dict[str, Any]:
    """The Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing): a thread per pipeline rank with
    complete ("X") events in microseconds, and a memory counter ("C") per rank in GiB."""
    events: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "tid": 0, "name": "process_name",
                                     "args": {"name": title}}]
    for r, gpu in enumerate(timeline.gpus):
        events += [{"ph": "M", "pid": 1, "tid": r + 1, "name": "thread_name",
                    "args": {"name": f"pipeline rank {r} ({gpu})"}},
                   {"ph": "M", "pid": 1, "tid": r + 1, "name": "thread_sort_index", "args": {"sort_index": r}}]
    for s in timeline.slices:
        args = {"stage": s.stage, "microbatch": s.microbatch} if s.stage >= 0 else {}
        events.append({"ph": "X", "pid": 1, "tid": s.pp_rank + 1, "name": s.name, "cat": s.category,
                       "ts": 1e6 * s.start_s, "dur": 1e6 * s.duration_s, "args": args})
    events += [{"ph": "C", "pid": 1, "name": f"memory pp{sample.pp_rank} (GiB)", "ts": 1e6 * sample.time_s,
                "args": {"GiB": round(sample.memory_bytes / GIB, 4)}} for sample in timeline.memory]
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "iteration_time_s": timeline.iteration_s}}


def _memory_path(timeline: IterationTimeline, r: int, x: Any, top: float, height: float) -> str:
    """A step polyline of rank r's memory, 0 at the bottom of its band and capacity at the top."""
    samples = [s for s in timeline.memory if s.pp_rank == r]
    points, capacity = [], timeline.capacity_bytes[r]
    for current, following in zip(samples, [*samples[1:], None], strict=True):
        y = top + height * (1 - min(current.memory_bytes / capacity, 1.0))
        end = following.time_s if following else timeline.iteration_s
        points += [f"{x(current.time_s):.1f},{y:.1f}", f"{x(end):.1f},{y:.1f}"]
    return " ".join(points)


def timeline_svg(timeline: IterationTimeline, title: str, width: int = 960) -> str:
    """A static picture of the same iteration: a row of slices per pipeline rank, then each rank's
    memory (as a share of its capacity), a time axis and a legend. Pure SVG, no dependencies."""
    left, row, gap, band = 110, 22, 6, 34
    plot = width - left - 20
    pp = timeline.pp
    memory_top = 40 + pp * (row + gap) + 16
    height = memory_top + pp * (band + gap) + 60

    def x(seconds: float) -> float:
        return left + plot * seconds / timeline.iteration_s

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="18" font-size="13">{escape(title)}</text>']
    for r in range(pp):
        y = 40 + r * (row + gap)
        parts.append(f'<text x="4" y="{y + 15}">pp {r} {escape(timeline.gpus[r])}</text>')
        parts += [f'<rect x="{x(s.start_s):.2f}" y="{y}" width="{max(x(s.end_s) - x(s.start_s), 0.3):.2f}" '
                  f'height="{row}" fill="{CATEGORIES[s.category]}"><title>{escape(s.name)} ({s.category}, '
                  f'{1e3 * s.duration_s:.2f} ms)</title></rect>' for s in timeline.slices if s.pp_rank == r]
    for r in range(pp):
        top = memory_top + r * (band + gap)
        parts += [f'<text x="4" y="{top + band / 2 + 4}">memory pp {r}</text>',
                  f'<rect x="{left}" y="{top}" width="{plot}" height="{band}" fill="none" stroke="#ddd"/>',
                  f'<polyline points="{_memory_path(timeline, r, x, top, band)}" fill="none" stroke="#333"/>']
    axis = memory_top + pp * (band + gap) + 4
    for i in range(6):
        seconds = timeline.iteration_s * i / 5
        parts.append(f'<text x="{x(seconds):.1f}" y="{axis + 12}" text-anchor="middle">{seconds:.3g} s</text>')
    for i, (category, colour) in enumerate(CATEGORIES.items()):
        parts += [f'<rect x="{left + i * 100}" y="{axis + 26}" width="10" height="10" fill="{colour}"/>',
                  f'<text x="{left + i * 100 + 14}" y="{axis + 35}">{category}</text>']
    return "\n".join([*parts, "</svg>"]) + "\n"
