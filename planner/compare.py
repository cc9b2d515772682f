"""Plans side by side: the same fields of each, which rows differ, which plan is fastest and why,
term by term. Reads the plan documents as written (their estimate sections), so plans from
different planner versions or machines compare as their authors saw them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.cost.estimate import BREAKDOWN_KEYS
from planner.errors import PlannerError
from planner.gpu import GIB

__all__ = ["Comparison", "compare_plans"]

_PARALLELISM = ("dp", "tp", "pp", "vpp", "cp", "ep", "micro_batch", "num_microbatches", "recompute", "zero_stage",
                "distributed_optimizer", "sequence_parallel", "tp_comm_overlap", "schedule")


@dataclass(frozen=True)
class Comparison:
    """Rows of (field, value per plan, differs), the fastest plan (most tokens/s) and, per other plan,
    its breakdown terms' deltas against the fastest (seconds per the fastest plan's iteration)."""

    labels: tuple[str, ...]
    rows: tuple[tuple[str, tuple[str, ...], bool], ...]
    fastest: int
    deltas_s: tuple[dict[str, float], ...]  # per plan: term → (plan − fastest), scaled to equal tokens
    tokens_per_s: tuple[float, ...]

    def verdicts(self) -> list[str]:
        """One sentence per slower plan: how much slower and which terms account for it."""
        lines = []
        best = self.labels[self.fastest]
        for i, label in enumerate(self.labels):
            if i == self.fastest:
                continue
            gain = self.tokens_per_s[self.fastest] / self.tokens_per_s[i] - 1
            terms = sorted(self.deltas_s[i].items(), key=lambda item: -abs(item[1]))
            named = ", ".join(f"{k} {v:+.3f} s" for k, v in terms if abs(v) > 1e-4) or "no term differs"
            lines.append(f"{best} is {100 * gain:.1f} % faster than {label} (tokens/s); {label} − {best} per "
                         f"iteration of {best}: {named}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"plans": list(self.labels), "fastest": self.labels[self.fastest],
                "rows": [{"field": f, "values": list(v), "differs": d} for f, v, d in self.rows],
                "deltas_s": {self.labels[i]: d for i, d in enumerate(self.deltas_s) if i != self.fastest},
                "verdicts": self.verdicts()}


def _section(document: dict[str, Any], name: str, label: str) -> dict[str, Any]:
    value = document.get(name)
    if not isinstance(value, dict):
        raise PlannerError(f"{label}: plan file has no '{name}' section to compare")
    return value


def _fields(document: dict[str, Any], label: str) -> list[tuple[str, str]]:
    """The compared fields of one plan document, formatted."""
    model, cluster = _section(document, "model", label), _section(document, "cluster", label)
    training, par = _section(document, "training", label), _section(document, "parallelism", label)
    estimate = _section(document, "estimate", label)
    terms = estimate.get("breakdown_s", {})
    rows = [("model", str(model.get("name"))), ("cluster", f"{cluster.get('name')} ({cluster.get('num_gpus')} GPUs)"),
            ("global batch × sequence", f"{training.get('global_batch')} × {training.get('seq_len')}"),
            ("dtype", str(training.get("dtype")) + (f" ({training['fp8_recipe']} scaling)"
                                                   if training.get("fp8_recipe") else ""))]
    if training.get("finetune", "full") != "full" or training.get("optimizer_states", "fp32") != "fp32":
        adapters = (f" r={training.get('lora_rank')} {training.get('lora_targets')}"
                    if training.get("finetune", "full") != "full" else "")
        rows += [("finetune", f"{training.get('finetune', 'full')}{adapters}"),
                 ("optimizer states", str(training.get("optimizer_states", "fp32")))]
    rows += [(key, str(par[key])) for key in _PARALLELISM if key in par]
    rows.append(("blocks per stage", ",".join(str(s["blocks"][1] - s["blocks"][0]) for s in document["stages"])))
    rows += [("iteration time", f"{estimate['iteration_time_s']:.4f} s"),
             ("tokens/s", f"{estimate['tokens_per_s']:,.0f}"), ("MFU", f"{100 * estimate['mfu']:.1f} %"),
             ("peak memory", f"{estimate['peak_memory_bytes'] / GIB:.1f} GiB"), ("fits", str(estimate["fits"]))]
    rows += [(f"  {key}", f"{terms[key]:.4f} s") for key in BREAKDOWN_KEYS if key in terms]
    return rows


def compare_plans(labels: Sequence[str], documents: Sequence[dict[str, Any]]) -> Comparison:
    """Compare two or more plan documents (already validated by `planner.plan.load_plan`)."""
    if len(documents) < 2:
        raise PlannerError("compare needs at least two plan files")
    table = [dict(_fields(d, label)) for label, d in zip(labels, documents, strict=True)]
    names = list(dict.fromkeys(name for fields in table for name in fields))
    rows = tuple((name, values, len(set(values)) > 1)
                 for name in names for values in [tuple(fields.get(name, "-") for fields in table)])
    estimates = [d["estimate"] for d in documents]
    tokens = [d["training"]["global_batch"] * d["training"]["seq_len"] for d in documents]
    speeds = tuple(float(e["tokens_per_s"]) for e in estimates)
    fastest = max(range(len(documents)), key=lambda i: (speeds[i], -i))
    deltas = tuple({key: e["breakdown_s"].get(key, 0.0) * tokens[fastest] / tokens[i]
                    - estimates[fastest]["breakdown_s"].get(key, 0.0) for key in BREAKDOWN_KEYS}
                   for i, e in enumerate(estimates))
    return Comparison(tuple(labels), rows, fastest, deltas, speeds)
