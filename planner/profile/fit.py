"""`planner calibrate`: fit the analytic model's efficiencies for one GPU to a measured profile.

The analytic unit time is piecewise linear in the inverse efficiencies x = (1/matmul, 1/memory-bound,
1/flash-attention): each GEMM is compute- or memory-bound (a max of two linear terms), everything
else is a sum. Gauss–Newton on relative residuals (every measurement counts alike, from a 50 µs
embedding to a 50 ms block) therefore converges in a few steps once each GEMM's bound settles.
An efficiency the profile cannot inform (flash attention in an unfused profile) keeps its default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.gpu import GIB, GPUSpec
from planner.model import UnitKind
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import Calibration
from planner.profile.measured import MeasuredProfile

__all__ = ["PARAMETERS", "EfficiencyFit", "calibration_document", "fit_efficiencies", "gpu_profile_document"]

PARAMETERS = ("matmul_efficiency", "memory_bound_efficiency", "flash_attention_efficiency")
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
    device = replace(gpu, matmul_efficiency=matmul)
    return np.array([getattr(analytic.times(kind, setting, device), name) for kind, setting, name, _ in rows])


def fit_efficiencies(profile: MeasuredProfile, gpu: GPUSpec, calibration: Calibration) -> EfficiencyFit:
    """Least-squares efficiencies of `gpu` (its peaks and HBM bandwidth) that reproduce the profile."""
    if not gpu.supports(profile.dtype):
        raise PlannerError(f"{profile.source} was measured in {profile.dtype}; {gpu.name} has no {profile.dtype} peak "
                           "to fit against (profile with --dtype bf16 or fp16)")
    rows = _observations(profile)
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


def gpu_profile_document(gpu: GPUSpec, name: str, fit: EfficiencyFit, origin: str) -> dict[str, Any]:
    """A gpus.yaml-style document with one entry: `gpu` with the fitted matmul efficiency."""
    entry = {
        "sm_count": gpu.sm_count,
        "peak_tflops": {dtype: value / 1e12 for dtype, value in gpu.peak_flops_per_s},
        "memory_gib": gpu.memory_bytes / GIB,
        "hbm_gbps": gpu.hbm_bandwidth_bytes_per_s / 1e9,
        "matmul_efficiency": min(fit.matmul_efficiency, 1.0),
        "efficiency_source": f"planner calibrate {origin}: {fit.observations} measurements, "
                             f"rms relative error {100 * fit.rms_relative_error:.1f} %",
        "intra_node": {"link": gpu.intra_node_link, "gbps": gpu.intra_node_bandwidth_bytes_per_s / 1e9},
        "gpus_per_node": gpu.gpus_per_node,
        "nic_gbps": gpu.nic_bandwidth_bytes_per_s / 1e9,
        "source": f"{gpu.name} catalog entry with matmul_efficiency fitted to {origin}",
    }
    return {"gpus": {name: entry}}


def calibration_document(calibration: Calibration, fit: EfficiencyFit, origin: str) -> dict[str, Any]:
    """A calibration.yaml-style document: every constant, the fitted ones replaced and attributed."""
    constants = {}
    for key, value in calibration.__dict__.items():
        if key in fit.fitted and key != "matmul_efficiency":
            constants[key] = {"value": getattr(fit, key),
                              "source": f"planner calibrate {origin} ({fit.observations} measurements)"}
        else:
            constants[key] = {"value": value, "source": "unchanged from the calibration in use"}
    return {"schema_version": 1, "constants": constants}
