"""Cluster sizing: the best plan for each GPU type and cluster size, time-to-train and cost of each,
and the Pareto front of time against cost (nothing else is both faster and cheaper).

Cost is USD when every swept GPU type has a price per GPU-hour, else GPU-hours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

import pandas as pd

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError, PlannerError
from planner.gpu import lookup_gpu
from planner.model import ModelSpec
from planner.search.planning import plan
from planner.search.space import FixedOptions
from planner.training_cost import TrainingCost, training_cost

__all__ = ["SweepPoint", "cheapest_by", "cluster_spec", "fastest_within", "pareto_front", "parse_prices", "sweep",
           "sweep_frame", "sweep_svg"]


@dataclass(frozen=True)
class SweepPoint:
    """One swept cluster: its best plan and the run's cost, or (`cost` None) why nothing fits.
    `price` is what the front minimises besides time: USD when every swept GPU type is priced,
    else GPU-hours."""

    gpu: str
    num_gpus: int
    cluster: str
    config: ParallelConfig | None
    iteration_time_s: float | None
    mfu: float | None
    cost: TrainingCost | None
    price: float | None = None
    note: str = ""
    memory_share: float | None = None  # the share of its GPUs' memory the best plan needs (`Estimate.memory_share`)


@dataclass(frozen=True)
class _Fitting:
    """A point that fits, with its time-to-train (s) and price as plain numbers."""

    point: SweepPoint
    time_s: float
    price: float


def _fitting(points: Sequence[SweepPoint]) -> list[_Fitting]:
    return [_Fitting(p, p.cost.time_to_train_s, p.price) for p in points if p.cost is not None and p.price is not None]


def parse_prices(text: str | None, gpus: Sequence[str]) -> dict[str, float]:
    """`2.5` (every GPU type) or `H100-80GB=2.5,B200=4` into USD per GPU-hour by catalog GPU name: each priced type
    once, and one of the swept `gpus`."""
    if text is None:
        return {}
    try:
        if "=" not in text:
            return dict.fromkeys(gpus, _price(float(text), text))
        pairs = [item.split("=", 1) for item in text.split(",")]
        prices = [(lookup_gpu(name.strip()).name, _price(float(value), text)) for name, value in pairs]
    except ValueError:
        raise PlannerError(f"--gpu-hour-price {text!r} must be USD per GPU-hour, e.g. 2.5 or H100-80GB=2.5,B200=4"
                           ) from None
    names = [name for name, _ in prices]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated:
        raise PlannerError(f"--gpu-hour-price {text!r} prices {repeated} twice")
    unswept = next((name for name in names if name not in gpus), None)
    if unswept:
        raise PlannerError(f"--gpu-hour-price {text!r} prices {unswept}, which --gpu does not sweep "
                           f"({', '.join(gpus)})")
    return dict(prices)


def _price(value: float, text: str) -> float:
    if not 0 <= value < float("inf"):
        raise PlannerError(f"--gpu-hour-price {text!r}: prices must be non-negative USD")
    return value


def cluster_spec(gpu: str, num_gpus: int) -> str:
    """The NODESxGPUSxGPU shorthand of `num_gpus` GPUs in the GPU type's usual nodes (or one smaller node)."""
    per_node = lookup_gpu(gpu).gpus_per_node
    if num_gpus < per_node:
        return f"1x{num_gpus}x{gpu}"
    if num_gpus % per_node:
        raise PlannerError(f"--gpus {num_gpus} is not a whole number of {per_node}-GPU {gpu} nodes")
    return f"{num_gpus // per_node}x{per_node}x{gpu}"


def sweep(model: ModelSpec, training: Training, gpus: Sequence[str], sizes: Sequence[int], tokens: int,
          prices: dict[str, float], fixed: FixedOptions | None = None, time_limit_s: float = 1.0,
          progress: Callable[[int, int, str], None] | None = None, memory_headroom: float = 0.0) -> list[SweepPoint]:
    """The best plan on every (GPU type, size) cluster, in the order given, leaving `memory_headroom` of every GPU's
    memory free (`planner.search.planning.plan`); `progress(done, total, name)`."""
    specs = [(lookup_gpu(gpu).name, size, cluster_spec(lookup_gpu(gpu).name, size)) for gpu in gpus for size in sizes]
    priced = all(gpu in prices for gpu, _, _ in specs)
    points = []
    for done, (gpu, size, spec) in enumerate(specs):
        if progress:
            progress(done, len(specs), spec)
        cluster = load_cluster(spec)
        try:
            best = plan(model, cluster, training, fixed, 1, time_limit_s, memory_headroom=memory_headroom).best
        except (InfeasibleError, PlannerError) as exc:
            points.append(SweepPoint(gpu, size, spec, None, None, None, None, note=str(exc)))
            continue
        cost = training_cost(tokens, training.tokens_per_iteration, best.estimate.iteration_time_s,
                             [cluster.gpu_spec(g) for g in best.placement.gpus], prices.get(gpu))
        points.append(SweepPoint(gpu, size, spec, best.config, best.estimate.iteration_time_s, best.estimate.mfu,
                                 cost, cost.cost_usd if priced else cost.gpu_hours,
                                 memory_share=best.estimate.memory_share))
    return points


def pareto_front(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The fitting points no other point beats on both time-to-train and price, fastest first."""
    front: list[_Fitting] = []
    for item in sorted(_fitting(points), key=lambda f: (f.time_s, f.price)):
        if not front or item.price < front[-1].price:
            front.append(item)
    return [item.point for item in front]


def fastest_within(points: Sequence[SweepPoint], budget: float) -> SweepPoint | None:
    """The fastest point whose price is at most `budget` (USD, or GPU-hours when unpriced)."""
    within = [p for p in pareto_front(points) if p.price is not None and p.price <= budget]
    return within[0] if within else None


def cheapest_by(points: Sequence[SweepPoint], deadline_s: float) -> SweepPoint | None:
    """The cheapest point that trains within `deadline_s` seconds."""
    within = [p for p in pareto_front(points) if p.cost is not None and p.cost.time_to_train_s <= deadline_s]
    return within[-1] if within else None


def sweep_frame(points: Sequence[SweepPoint]) -> pd.DataFrame:
    """One row per swept cluster in SI units (what `sweep` prints and `--csv` writes)."""
    front = {id(p) for p in pareto_front(points)}
    costs = ("time_to_train_s", "gpu_hours", "cost_usd", "energy_kwh")
    return pd.DataFrame([{
        "gpu": p.gpu, "num_gpus": p.num_gpus, "cluster": p.cluster,
        "parallelism": p.config.describe() if p.config else None, "iteration_time_s": p.iteration_time_s,
        "mfu": p.mfu, "memory_share": p.memory_share,
        **({key: None for key in costs} if p.cost is None else {key: p.cost.as_dict()[key] for key in costs}),
        "price": p.price, "pareto": id(p) in front, "note": p.note,
    } for p in points])


def sweep_svg(points: Sequence[SweepPoint], unit: str, width: int = 640, height: int = 420) -> str:
    """Time-to-train (days, x) against price (y) of the fitting points, the Pareto front joined by a
    line. Pure SVG."""
    fitting = _fitting(points)
    left, bottom, top, right = 70, 50, 30, 20
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11">\n<rect width="{width}" height="{height}" fill="white"/>')
    if not fitting:
        return f'{head}\n<text x="20" y="30">no swept cluster fits</text>\n</svg>\n'
    x_max = max(f.time_s for f in fitting) / 86400 * 1.1
    y_max = max(f.price for f in fitting) * 1.1 or 1.0

    def xy(time_s: float, price: float) -> tuple[float, float]:
        return (left + (width - left - right) * time_s / 86400 / x_max,
                height - bottom - (height - top - bottom) * price / y_max)

    parts = [head, f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" '
                   'stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">time to train (days)</text>',
             f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">'
             f'cost ({escape(unit)})</text>']
    for i in range(6):
        gx, gy = xy(86400 * x_max * i / 5, 0)[0], xy(0, y_max * i / 5)[1]
        parts += [f'<text x="{gx:.1f}" y="{height - bottom + 14}" text-anchor="middle">{x_max * i / 5:.3g}</text>',
                  f'<text x="{left - 4}" y="{gy + 4:.1f}" text-anchor="end">{y_max * i / 5:.3g}</text>']
    on_front = {id(p) for p in pareto_front(points)}
    line = " ".join("{:.1f},{:.1f}".format(*xy(f.time_s, f.price)) for f in sorted(fitting, key=lambda f: f.time_s)
                    if id(f.point) in on_front)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#e15759" stroke-width="1.5"/>')
    for item in fitting:
        x, y = xy(item.time_s, item.price)
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#4e79a7"/>',
                  f'<text x="{x + 6:.1f}" y="{y - 6:.1f}">{item.point.num_gpus}×{escape(item.point.gpu)}</text>']
    return "\n".join([*parts, "</svg>"]) + "\n"
