"""The calibrated constants of the analytic cost model (``profiles/calibration.yaml``)."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields, replace
from functools import cache
from pathlib import Path

from planner.errors import PlannerError
from planner.limits import MAX_PER_GPU_QUANTITY, MAX_SECONDS
from planner.resources import load_structured_file, profiles_dir

__all__ = ["EFFICIENCY_RANGE", "Calibration", "calibration_from_constants", "check_efficiency", "default_calibration",
           "load_calibration"]

CALIBRATION_SCHEMA_VERSION = 1
"""The calibration file format (profiles/calibration.yaml, `planner calibrate`'s output)."""
EFFICIENCY_RANGE = (0.01, 1.0)
"""Plausible efficiencies, as fractions of a peak. Above 1 the spec's peak is wrong, not the kernel
fast; below 1 % no real training kernel runs (cuBLAS on small shapes, NCCL on PCIe still reach
several %), so such a value means a broken measurement or fit, e.g. a CPU profile fitted against a
GPU's peaks gives 5e-5 to 2e-3, and planning with it would be fiction."""


@dataclass(frozen=True)
class Calibration:
    """Efficiencies (fractions of a peak), latencies (s) and overheads; see the YAML for each source.

    Every constant whose name contains ``efficiency`` is a fraction within `EFFICIENCY_RANGE` when
    loaded from a file; code that explores values (a fit) may construct others.
    """

    memory_bound_efficiency: float
    gemm_tile: int
    kernel_launch_s: float
    flash_attention_efficiency: float
    collective_efficiency_intra: float
    collective_efficiency_inter: float
    p2p_efficiency_intra: float
    p2p_efficiency_inter: float
    iteration_overhead_s: float
    cuda_context_bytes: float  # per GPU, outside the caching allocator: driver context, kernels, workspaces
    nccl_communicator_bytes: float  # per NCCL communicator that moves data: its channels' protocol buffers
    allocator_fragmentation: float  # share of transient allocations the caching allocator reserves but cannot reuse
    # Added with benchmarks/calibrate.py; files written before them keep these neutral defaults.
    gemm_efficiency: float = 1.0  # fraction of the GPU's max achievable matmul rate reached inside training
    fp8_gemm_efficiency_ratio: float = 1.0  # FP8 GEMM efficiency (of the FP8 peak) relative to BF16's
    # cap on the share of an overlapped backward TP collective its GEMM hides (it shows beyond the GEMM's length
    # either way); derived 1 in profiles/calibration.yaml, no longer fitted
    tp_backward_overlap: float = 1.0
    # GEMM efficiency, relative to an aligned GEMM, when a leading dimension (k or n) of a 16-bit / FP8
    # operand is not a multiple of 16 bytes: tensor-core kernels with 16-byte vector loads cannot run
    misaligned_gemm_efficiency: float = 1.0
    # host (CPU) time eager PyTorch spends per kernel it launches (Python, dispatcher, autograd, launch): a pass
    # whose kernels are shorter than this is host-bound
    host_kernel_s: float = 0.0
    # host time per GEMM (or FP8 input quantisation) Transformer Engine's GroupedLinear launches from its C++ loop
    # over the local experts, no Python in between
    grouped_gemm_host_s: float = 0.0
    # how far host launches and GPU work fail to overlap near the crossover: 0 → a pass takes the longer of the two,
    # 1 → their sum (planner/profile/analytic.py `overlapped_host_time`)
    host_overlap_softness: float = 0.0
    # share of the GEMM and HBM rates the Mamba-2 SSD scan's kernels (chunked scan, conv1d, gated norm) reach
    mamba_scan_efficiency: float = 1.0
    # seconds DeepSpeed's legacy pipeline engine adds per transformer layer and forward pass of a micro-batch
    # (ParallelConfig.legacy_pipeline_engine; twice in a backward)
    legacy_pipeline_layer_s: float = 0.0

    def collective_efficiency(self, kind: str) -> float:
        return self.collective_efficiency_intra if kind == "intra" else self.collective_efficiency_inter

    def p2p_efficiency(self, kind: str) -> float:
        return self.p2p_efficiency_intra if kind == "intra" else self.p2p_efficiency_inter

    def updated(self, **values: float) -> Calibration:
        return replace(self, **values)


def check_efficiency(name: str, value: float) -> str | None:
    """Why `value` is not a plausible efficiency called `name`, or None when it lies in EFFICIENCY_RANGE."""
    low, high = EFFICIENCY_RANGE
    if low <= value <= high:
        return None
    return f"{name} {value:.3g} is outside [{low:g}, {high:g}], the plausible range of an efficiency"


_SHARES = {"allocator_fragmentation": "the share of transient allocations left unusable",
           "tp_backward_overlap": "the share of a backward TP collective its GEMM hides",
           "host_overlap_softness": "0: full overlap of host and GPU, 1: none"}
_GEMM_TILE_RANGE = (1, 4096)


def _range_problem(name: str, value: float) -> str | None:
    """Why a constant that is not an efficiency is out of its range, or None: shares in [0, 1], the GEMM tile a
    whole number of elements, seconds up to MAX_SECONDS, bytes below MAX_PER_GPU_QUANTITY."""
    if name in _SHARES and value > 1:
        return f"{name} {value:.3g} is outside [0, 1] ({_SHARES[name]})"
    low, high = _GEMM_TILE_RANGE
    if name == "gemm_tile" and (value != int(value) or not low <= value <= high):
        return f"gemm_tile {value!r} must be a whole number of elements in [{low}, {high}]"
    if name.endswith("_s") and value > MAX_SECONDS:
        return f"{name} {value:.3g} s is above {MAX_SECONDS:g} s"
    if name.endswith("_bytes") and value >= MAX_PER_GPU_QUANTITY:
        return f"{name} {value:.3g} is not below {MAX_PER_GPU_QUANTITY:g} bytes"
    return None


def load_calibration(path: Path) -> Calibration:
    """Read a calibration file; every constant must be present, finite and non-negative, and every
    efficiency plausible (`EFFICIENCY_RANGE`)."""
    document = load_structured_file(path)
    constants = document.get("constants") if isinstance(document, dict) else None
    if isinstance(document, dict):
        version = document.get("schema_version", CALIBRATION_SCHEMA_VERSION)
        if isinstance(version, bool) or version != CALIBRATION_SCHEMA_VERSION:
            raise PlannerError(f"{path}: schema_version {version!r} is not supported (expected "
                               f"{CALIBRATION_SCHEMA_VERSION})")
    known = {item.name for item in fields(Calibration)}
    unknown = sorted(str(name) for name in constants if name not in known) if isinstance(constants, dict) else []
    if unknown:
        raise PlannerError(f"{path}: unknown constant(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return calibration_from_constants(constants, str(path))


def calibration_from_constants(constants: object, path: str) -> Calibration:
    """A Calibration from a 'constants' mapping (name → value or {value, source}), checked like a file's
    (also a plan file's `calibration.constants`); `path` names where it came from in errors."""
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
        if not math.isfinite(value) or value < 0:
            raise PlannerError(f"{path}: constant {item.name!r} must be a finite number >= 0, got {value!r}")
        problem = check_efficiency(item.name, value) if "efficiency" in item.name else _range_problem(item.name, value)
        if problem:
            raise PlannerError(f"{path}: {problem}")
        values[item.name] = int(value) if item.type == "int" else float(value)
    return Calibration(**values)


@cache
def default_calibration() -> Calibration:
    return load_calibration(profiles_dir() / "calibration.yaml")
