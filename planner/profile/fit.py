"""`planner calibrate`: fit the analytic model's efficiencies for one GPU to a measured profile.

The analytic unit time is piecewise linear in the inverse efficiencies x = (1/matmul, 1/memory-bound,
1/flash-attention): each GEMM is compute- or memory-bound (a max of two linear terms), everything
else is a sum. Gauss–Newton on relative residuals (every measurement counts alike, from a 50 µs
embedding to a 50 ms block) therefore converges in a few steps once each GEMM's bound settles.
An efficiency the profile cannot inform (flash attention in an unfused profile) keeps its default.
A fit that breaks a stated bound (`MAX_RMS_RELATIVE_ERROR`, `EFFICIENCY_RANGE`) is named by
`fit_problems`; the CLI refuses to write it unless forced, and the documents then carry the warnings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.gpu import GPUSpec, catalog_entry
from planner.model import UnitKind
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import EFFICIENCY_RANGE, Calibration, check_efficiency
from planner.profile.measured import MeasuredProfile

__all__ = ["MAX_RMS_RELATIVE_ERROR", "PARAMETERS", "EfficiencyFit", "calibration_document", "fit_efficiencies",
           "fit_problems", "gpu_profile_document"]

PARAMETERS = ("matmul_efficiency", "memory_bound_efficiency", "flash_attention_efficiency")
MAX_RMS_RELATIVE_ERROR = 0.25
"""Largest rms relative error of an acceptable fit. The analytic model reproduces a profile of a
real GPU to a few per cent (its synthetic profiles exactly); a quarter off on average means the
model's shape does not match the measurements (a CPU or throttled device, the wrong --gpu, noise),
so the fitted efficiencies would not describe the GPU."""
_FIELDS = ("forward_s", "backward_s", "attention_core_forward_s")
_MAX_STEPS = 50


@dataclass(frozen=True)
class EfficiencyFit:
    """Fitted efficiencies (fractions of the GPU spec's peaks) and how well they explain the profile."""

    matmul_efficiency: float
    memory_bound_efficiency: float
    flash_attention_efficiency: float
    fitted: tuple[str, ...]
    observations: int
    rms_relative_error: float


def _observations(profile: MeasuredProfile) -> list[tuple[UnitKind, UnitSetting, str, float]]:
    rows = []
    for (kind, tp), by_batch in sorted(profile.times_by_setting.items()):
        for batch, times in sorted(by_batch.items()):
            setting = UnitSetting(tp, batch, profile.seq_len, False, profile.dtype, profile.attention)
            rows.extend((kind, setting, name, getattr(times, name)) for name in _FIELDS if getattr(times, name) > 0)
    return rows


def _predict(profile: MeasuredProfile, gpu: GPUSpec, calibration: Calibration, inverse: np.ndarray,
             rows: list[tuple[UnitKind, UnitSetting, str, float]]) -> np.ndarray:
    matmul, memory, flash = (1.0 / inverse).tolist()
    analytic = AnalyticProfile(profile.model, calibration.updated(memory_bound_efficiency=memory,
                                                                  flash_attention_efficiency=flash))
    device = replace(gpu, matmul_efficiency=matmul, rated_power_w=None)  # measured: whatever limit it ran under
    return np.array([getattr(analytic.times(kind, setting, device), name) for kind, setting, name, _ in rows])


def fit_efficiencies(profile: MeasuredProfile, gpu: GPUSpec, calibration: Calibration) -> EfficiencyFit:
    """Least-squares efficiencies of `gpu` (its peaks and HBM bandwidth) that reproduce the profile."""
    if not gpu.supports(profile.dtype):
        raise PlannerError(f"{profile.source} was measured in {profile.dtype}; {gpu.name} has no {profile.dtype} peak "
                           "to fit against (profile with --dtype bf16 or fp16)")
    rows = _observations(profile)
    if not rows:
        raise PlannerError(f"{profile.source}: every measured time is 0; there is nothing to fit")
    measured = np.array([row[3] for row in rows])
    x = 1.0 / np.array([gpu.matmul_efficiency, calibration.memory_bound_efficiency,
                        calibration.flash_attention_efficiency])
    informative = np.zeros(3, dtype=bool)
    for _ in range(_MAX_STEPS):
        predicted = _predict(profile, gpu, calibration, x, rows)
        jacobian = np.empty((len(rows), 3))
        for j in range(3):
            step = np.zeros(3)
            step[j] = 1e-6 * x[j]
            jacobian[:, j] = (_predict(profile, gpu, calibration, x + step, rows) - predicted) / step[j]
        informative = np.abs(jacobian).sum(axis=0) > 0
        delta = np.zeros(3)
        delta[informative] = np.linalg.lstsq(jacobian[:, informative] / measured[:, None],
                                             (measured - predicted) / measured, rcond=None)[0]
        x = np.maximum(x + delta, 1e-3)  # an efficiency cannot exceed 1000× the spec's peak
        if np.max(np.abs(delta) / x) < 1e-9:
            break
    residual = (_predict(profile, gpu, calibration, x, rows) - measured) / measured
    matmul, memory, flash = (1.0 / x).tolist()
    return EfficiencyFit(matmul, memory, flash, tuple(p for p, used in zip(PARAMETERS, informative, strict=True)
                                                      if used),
                         len(rows), float(np.sqrt(np.mean(residual**2))))


def fit_problems(fit: EfficiencyFit) -> tuple[str, ...]:
    """Every stated bound the fit breaks, one line each: a fitted efficiency outside EFFICIENCY_RANGE,
    an rms relative error above MAX_RMS_RELATIVE_ERROR."""
    problems = [f"{problem} (a forced write clips it to {_plausible(getattr(fit, name)):g})" for name in fit.fitted
                if (problem := check_efficiency(name, getattr(fit, name)))]
    if fit.rms_relative_error > MAX_RMS_RELATIVE_ERROR:
        problems.append(f"rms relative error {100 * fit.rms_relative_error:.1f} % of the fit exceeds "
                        f"{100 * MAX_RMS_RELATIVE_ERROR:.0f} %: the model does not describe these measurements")
    return tuple(problems)


def _plausible(efficiency: float) -> float:
    """The efficiency clipped into EFFICIENCY_RANGE, so a forced fit still writes files that load."""
    low, high = EFFICIENCY_RANGE
    return min(max(efficiency, low), high)


def _with_warnings(document: dict[str, Any], warnings: tuple[str, ...]) -> dict[str, Any]:
    """`document` with a `warnings` list when there are any, so a forced file says what it breaks."""
    return {**document, "warnings": list(warnings)} if warnings else document


def gpu_profile_document(gpu: GPUSpec, name: str, fit: EfficiencyFit, origin: str,
                         warnings: tuple[str, ...] = ()) -> dict[str, Any]:
    """A gpus.yaml-style document with one entry: `gpu` as the catalog has it (`catalog_entry`: its peaks, links,
    power, attention kernels' shares, FP8 layout) with the fitted matmul efficiency (clipped into EFFICIENCY_RANGE)
    and the `warnings` a forced fit was written with."""
    entry = catalog_entry(gpu) | {
        "matmul_efficiency": _plausible(fit.matmul_efficiency),
        "efficiency_source": f"planner calibrate {origin}: {fit.observations} measurements, "
                             f"rms relative error {100 * fit.rms_relative_error:.1f} %",
        "source": f"{gpu.name} catalog entry with matmul_efficiency fitted to {origin}",
    }
    return {"gpus": {name: _with_warnings(entry, warnings)}}


def calibration_document(calibration: Calibration, fit: EfficiencyFit, origin: str,
                         warnings: tuple[str, ...] = ()) -> dict[str, Any]:
    """A calibration.yaml-style document: every constant, the fitted ones replaced (clipped into
    EFFICIENCY_RANGE) and attributed, and the `warnings` a forced fit was written with."""
    constants = {}
    for key, value in calibration.__dict__.items():
        if key in fit.fitted and key != "matmul_efficiency":
            constants[key] = {"value": _plausible(getattr(fit, key)),
                              "source": f"planner calibrate {origin} ({fit.observations} measurements)"}
        else:
            constants[key] = {"value": value, "source": "unchanged from the calibration in use"}
    return _with_warnings({"schema_version": 1, "constants": constants}, warnings)
