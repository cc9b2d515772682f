"""Time-to-train, GPU-hours, cost and energy of a whole training run from one iteration's estimate.

A run of N tokens takes ⌈N / tokens per iteration⌉ iterations; GPU-hours count every GPU the plan
uses for that wall-clock time; energy is the GPUs' thermal design power (profiles/gpus.yaml,
`tdp_w`, vendor datasheets) over that time — the GPUs only, at their board limit (an upper
bound for the GPUs, no CPUs, network or cooling).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError
from planner.gpu import GPUSpec

__all__ = ["MAX_TOKENS", "TrainingCost", "parse_tokens", "training_cost"]

MAX_TOKENS = 1e18  # a million times today's largest runs; beyond it a typo is likelier than a plan
_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
_TOKENS = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGTP]?)\s*", re.IGNORECASE)
_JOULES_PER_KWH = 3.6e6


def parse_tokens(text: str) -> int:
    """Training tokens from `15T`, `300B`, `2e12` or `1000000` (K/M/B/G/T/P are powers of 1000)."""
    match = _TOKENS.fullmatch(text)
    if not match:
        raise PlannerError(f"--tokens {text!r} must be a number of tokens such as 15T, 300B or 2e12")
    tokens = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not 1 <= tokens <= MAX_TOKENS:
        raise PlannerError(f"--tokens {text!r} must be between 1 and {MAX_TOKENS:.0e} tokens")
    if tokens != round(tokens):
        raise PlannerError(f"--tokens {text!r} is not a whole number of tokens")
    return round(tokens)


@dataclass(frozen=True)
class TrainingCost:
    """A training run of `tokens` tokens: iterations, wall-clock time, GPU-hours, cost and GPU energy."""

    tokens: int
    iterations: int
    time_to_train_s: float
    gpu_hours: float
    energy_kwh: float | None  # None when a GPU type has no catalogued TDP
    gpu_hour_price_usd: float | None = None

    @property
    def cost_usd(self) -> float | None:
        return None if self.gpu_hour_price_usd is None else self.gpu_hours * self.gpu_hour_price_usd

    def as_dict(self) -> dict[str, Any]:
        """The plan JSON's `estimate` fields (DESIGN.md, "Contract additions")."""
        return {"training_tokens": self.tokens, "training_iterations": self.iterations,
                "time_to_train_s": self.time_to_train_s, "gpu_hours": self.gpu_hours,
                "gpu_hour_price_usd": self.gpu_hour_price_usd, "cost_usd": self.cost_usd,
                "energy_kwh": self.energy_kwh}

    def describe(self) -> str:
        """One line: days, GPU-hours, cost and energy."""
        parts = [f"{self.tokens:.3g} tokens in {self.iterations:,} iterations: {self.time_to_train_s / 86400:,.1f} "
                 f"days, {self.gpu_hours:,.0f} GPU-hours"]
        if self.cost_usd is not None:
            parts.append(f"${self.cost_usd:,.0f}")
        parts.append("energy unknown (a GPU has no TDP)" if self.energy_kwh is None
                     else f"{self.energy_kwh / 1e3:,.1f} MWh at TDP")
        return ", ".join(parts)


def training_cost(tokens: int, tokens_per_iteration: int, iteration_time_s: float, gpus: Sequence[GPUSpec],
                  gpu_hour_price_usd: float | None = None) -> TrainingCost:
    """The run's cost on the GPUs the plan uses (one GPUSpec per GPU)."""
    if gpu_hour_price_usd is not None and not (math.isfinite(gpu_hour_price_usd) and gpu_hour_price_usd >= 0):
        raise PlannerError(f"--gpu-hour-price must be a non-negative number of USD, got {gpu_hour_price_usd}")
    iterations = math.ceil(tokens / tokens_per_iteration)
    seconds = iterations * iteration_time_s
    watts = [gpu.tdp_w for gpu in gpus]
    energy = None if None in watts else seconds * sum(watts) / _JOULES_PER_KWH  # type: ignore[arg-type]
    return TrainingCost(tokens, iterations, seconds, seconds * len(gpus) / 3600, energy, gpu_hour_price_usd)
