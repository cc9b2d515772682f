"""The calibrated constants of the analytic cost model (``profiles/calibration.yaml``)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from functools import cache
from pathlib import Path

from planner.errors import PlannerError
from planner.resources import load_structured_file, profiles_dir

__all__ = ["Calibration", "default_calibration", "load_calibration"]


@dataclass(frozen=True)
class Calibration:
    """Efficiencies (fractions of a peak), latencies (s) and overheads; see the YAML for each source."""

    memory_bound_efficiency: float
    gemm_tile: int
    kernel_launch_s: float
    flash_attention_efficiency: float
    collective_efficiency_intra: float
    collective_efficiency_inter: float
    p2p_efficiency_intra: float
    p2p_efficiency_inter: float
    iteration_overhead_s: float
    memory_overhead_bytes: float
    memory_fragmentation: float
    # Added with benchmarks/calibrate.py; files written before them keep these neutral defaults.
    gemm_efficiency: float = 1.0  # fraction of the GPU's max achievable matmul rate reached inside training
    fp8_gemm_efficiency_ratio: float = 1.0  # FP8 GEMM efficiency (of the FP8 peak) relative to BF16's
    tp_backward_overlap: float = 0.0  # share of backward TP collectives hidden behind weight-gradient GEMMs
    # GEMM efficiency, relative to an aligned GEMM, when a leading dimension (k or n) of a 16-bit / FP8
    # operand is not a multiple of 16 bytes: tensor-core kernels with 16-byte vector loads cannot run
    misaligned_gemm_efficiency: float = 1.0

    def collective_efficiency(self, kind: str) -> float:
        return self.collective_efficiency_intra if kind == "intra" else self.collective_efficiency_inter

    def p2p_efficiency(self, kind: str) -> float:
        return self.p2p_efficiency_intra if kind == "intra" else self.p2p_efficiency_inter

    def updated(self, **values: float) -> Calibration:
        return replace(self, **values)


def load_calibration(path: Path) -> Calibration:
    """Read a calibration file; every constant must be present and numeric."""
    document = load_structured_file(path)
    constants = document.get("constants") if isinstance(document, dict) else None
    if not isinstance(constants, dict):
        raise PlannerError(f"{path}: expected a 'constants' mapping")
    values = {}
    for item in fields(Calibration):
        if item.name not in constants and item.default is not MISSING:
            continue
        entry = constants.get(item.name)
        value = entry.get("value") if isinstance(entry, dict) else entry
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PlannerError(f"{path}: constant {item.name!r} must be a number, got {value!r}")
        values[item.name] = int(value) if item.type == "int" else float(value)
    return Calibration(**values)


@cache
def default_calibration() -> Calibration:
    return load_calibration(profiles_dir() / "calibration.yaml")
