"""GPU types (`GPUSpec`) and the shipped GPU catalog (``profiles/gpus.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from planner.errors import PlannerError
from planner.limits import MAX_GPUS, MAX_PER_GPU_QUANTITY, MIN_POWER_SHARE, bandwidth_problem, finite_number
from planner.profile.calibration import check_efficiency
from planner.resources import load_structured_file, profiles_dir

__all__ = ["GIB", "PCIE4_HOST_LINK_BYTES_PER_S", "GPUSpec", "catalog_entry", "catalog_gpu_names", "gpu_from_dict",
           "lookup_gpu", "sustained_clock_ratio"]

GIB = 1024**3
_GB = 1e9

PCIE4_HOST_LINK_BYTES_PER_S = 25e9
"""GPU ↔ host bandwidth one GPU reaches over PCIe 4.0 x16 (A100 SXM hosts: 32 GB/s per direction on the wire,
~25 GB/s in pinned-memory cudaMemcpy, NVIDIA's bandwidthTest on DGX A100): `GPUSpec.host_link_bytes_per_s` where
the catalog states none (`host_link_gbps` in profiles/gpus.yaml)."""


def _positive_finite(value: object) -> bool:
    """Whether `value` is a real number in (0, MAX_PER_GPU_QUANTITY) (not a bool)."""
    return finite_number(value) and 0 < value < MAX_PER_GPU_QUANTITY


def sustained_clock_ratio(watts: float, rated_watts: float) -> float:
    """The clock a tensor-core-bound GPU sustains at board power `watts` relative to `rated_watts`: dynamic power
    grows as f·V² with the voltage following the clock, about f³, so the clock goes as the cube root of the power."""
    return (watts / rated_watts) ** (1 / 3)


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type. Bandwidths are per direction; FLOP/s are dense tensor-core peaks."""

    name: str
    peak_flops_per_s: tuple[tuple[str, float], ...]
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    matmul_efficiency: float
    intra_node_link: str
    intra_node_bandwidth_bytes_per_s: float
    gpus_per_node: int
    nic_bandwidth_bytes_per_s: float
    sm_count: int = 108
    source: str = ""
    tdp_w: float | None = None  # thermal design power (board power limit), for energy; None: not catalogued
    # GPUs per host (compute tray) where the usual NVLink domain spans several hosts (GB200 NVL72: 4 of 72);
    # None: the usual node is one host.
    gpus_per_host: int | None = None
    # FlashAttention-2's attention rate over the architecture's native fused attention kernel (cuDNN, FA3): FA2's
    # Ampere-era mma.sync kernels use neither Hopper's wgmma/TMA nor Blackwell's tcgen05; 1.0 where FA2 is native
    flash_attention_2_share: float = 1.0
    # its native fused attention kernel's rate as a share of its BF16 peak, relative to Hopper's (FlashAttention-3 /
    # cuDNN on H100), on which the calibration's flash_attention_efficiency holds; from kernel benchmarks. 1.0 where
    # the native kernel reaches about Hopper's share of peak (NVIDIA: FA2 on A100, FA4 / cuDNN on B200); AMD's
    # Composable Kernel attention reaches about a third of it
    fused_attention_share: float = 1.0
    # the flash-attn package's build for this GPU is its native attention kernel (ROCm: Composable Kernel), so a stack
    # that calls flash-attn rather than PyTorch SDPA (Megatron-DeepSpeed's --use-flash-attn-v2) runs the native rate;
    # `flash_attention_2_share` is then SDPA's flash backend's (ROCm: AOTriton)
    flash_attn_native: bool = False
    # the board power its datasheet peaks and measured matmul efficiency hold at, where it runs under a lower limit
    # (`tdp_w`); None: at its limit
    rated_power_w: float | None = None
    # what one GPU moves to or from host memory per direction (ZeRO-Offload's states, offloaded activations): PCIe,
    # or NVLink-C2C to a Grace CPU
    host_link_bytes_per_s: float = PCIE4_HOST_LINK_BYTES_PER_S
    # its FP8 tensor-core GEMMs take only the TN layout (Hopper, Ada: compute capability 8.9-9.x), so an FP8 tensor a
    # backward GEMM reads transposed is kept transposed too (Transformer Engine's quantizers, when columnwise usage is
    # asked for and non-TN FP8 GEMMs are not supported: is_non_tn_fp8_gemm_supported is true from 10.0 on)
    fp8_gemm_tn_only: bool = False

    def __post_init__(self) -> None:
        """Every value a cost needs physical: peaks, memory and bandwidths positive and finite, efficiencies and
        shares fractions in (0, 1], flags booleans; a one-line PlannerError names the field (a catalog entry, a
        GPU profile and a plan file's GPU are all built here)."""
        peaks = self.peak_flops_per_s
        if not peaks or any(not _positive_finite(value) for _, value in peaks):
            raise PlannerError(f"GPU {self.name!r} peak_flops_per_s must give each dtype a positive FLOP/s below "
                               f"{MAX_PER_GPU_QUANTITY:g}, got {dict(peaks)!r:.120}")
        for name in ("memory_bytes", "tdp_w", "rated_power_w"):
            value = getattr(self, name)
            if not (value is None and name in ("tdp_w", "rated_power_w")) and not _positive_finite(value):
                raise PlannerError(f"GPU {self.name!r} {name} must be a positive number below "
                                   f"{MAX_PER_GPU_QUANTITY:g}, got {value!r}")
        for name in ("hbm_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s", "nic_bandwidth_bytes_per_s",
                     "host_link_bytes_per_s"):
            if problem := bandwidth_problem(name, getattr(self, name)):
                raise PlannerError(f"GPU {self.name!r} {problem}")
        if not _positive_finite(self.matmul_efficiency):  # a fit explores any positive value (`checked`: files)
            raise PlannerError(f"GPU {self.name!r} matmul_efficiency must be positive, got {self.matmul_efficiency!r}")
        for name in ("flash_attention_2_share", "fused_attention_share"):
            value = getattr(self, name)
            if not _positive_finite(value) or value > 1:
                raise PlannerError(f"GPU {self.name!r} {name} must be in (0, 1], got {value!r}")
        for name in ("sm_count", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
                raise PlannerError(f"GPU {self.name!r} {name} must be an integer in [1, {MAX_GPUS}], got {value!r}")
        for name in ("fp8_gemm_tn_only", "flash_attn_native"):
            if not isinstance(getattr(self, name), bool):
                raise PlannerError(f"GPU {self.name!r} {name} must be true or false, got {getattr(self, name)!r}")
        host = self.gpus_per_host
        if host is not None and (isinstance(host, bool) or not isinstance(host, int)
                                 or not 1 <= host <= self.gpus_per_node or self.gpus_per_node % host):
            raise PlannerError(f"GPU {self.name!r} gpus_per_host must divide gpus_per_node ({self.gpus_per_node}), "
                               f"got {host!r}")

    def checked(self) -> GPUSpec:
        """This GPU as a file may give it: its matmul efficiency a plausible fraction of its peak (EFFICIENCY_RANGE),
        which a fit in progress need not be."""
        if (problem := check_efficiency("matmul_efficiency", self.matmul_efficiency)) is not None:
            raise PlannerError(f"GPU {self.name!r} {problem}")
        return self

    @property
    def gemm_clock_ratio(self) -> float:
        """The share of its rated GEMM rate a GPU capped below `rated_power_w` keeps: a tensor-core-bound GEMM draws
        the rated power at full clock, so under the cap it runs at `sustained_clock_ratio` of it; 1 at or above the
        rated power."""
        if self.rated_power_w is None or self.tdp_w is None or self.tdp_w >= self.rated_power_w:
            return 1.0
        return sustained_clock_ratio(self.tdp_w, self.rated_power_w)

    def power_limited(self, watts: float) -> GPUSpec:
        """The same GPU run under a board power limit of `watts` (a site's cap, `nvidia-smi -pl`): its GEMMs slow by
        `gemm_clock_ratio` against the power the catalog's rates hold at; up to that power, not beyond."""
        rated = self.rated_power_w or self.tdp_w
        if rated is None:
            raise PlannerError(f"GPU {self.name} has no catalogued board power (tdp_w) to limit")
        lowest = MIN_POWER_SHARE * rated
        if isinstance(watts, bool) or not isinstance(watts, (int, float)) or not lowest <= watts <= rated:
            raise PlannerError(f"power limit {watts!r} W for {self.name} must be a number of watts in [{lowest:g}, "
                               f"{rated:g}]: at most the power its catalogued rates hold at, at least a tenth of it")
        return replace(self, name=f"{self.name}@{watts:g}W", tdp_w=float(watts), rated_power_w=rated)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for a training dtype; fp16 stands in for bf16 on GPUs without bf16 (V100)."""
        peaks = dict(self.peak_flops_per_s)
        if dtype in peaks:
            return peaks[dtype]
        raise PlannerError(f"GPU {self.name} has no {dtype} tensor-core peak; it supports {', '.join(peaks)}")

    def supports(self, dtype: str) -> bool:
        return dtype in dict(self.peak_flops_per_s)

    def scaled(self, speed_factor: float) -> GPUSpec:
        """The same GPU running `speed_factor` times as fast (below 1: a straggler)."""
        peaks = tuple((dtype, value * speed_factor) for dtype, value in self.peak_flops_per_s)
        return replace(
            self,
            name=f"{self.name}@{speed_factor:g}x",
            peak_flops_per_s=peaks,
            hbm_bandwidth_bytes_per_s=self.hbm_bandwidth_bytes_per_s * speed_factor,
        )


def catalog_entry(gpu: GPUSpec) -> dict[str, Any]:
    """`gpu` as a profiles/gpus.yaml entry (its units), every field `gpu_from_dict` reads: what a written GPU profile
    (`planner calibrate`) keeps of the part besides what it fits."""
    entry: dict[str, Any] = {
        "sm_count": gpu.sm_count,
        "peak_tflops": {dtype: value / 1e12 for dtype, value in gpu.peak_flops_per_s},
        "memory_gib": gpu.memory_bytes / GIB,
        "hbm_gbps": gpu.hbm_bandwidth_bytes_per_s / _GB,
        "matmul_efficiency": gpu.matmul_efficiency,
        "intra_node": {"link": gpu.intra_node_link, "gbps": gpu.intra_node_bandwidth_bytes_per_s / _GB},
        "gpus_per_node": gpu.gpus_per_node,
        "nic_gbps": gpu.nic_bandwidth_bytes_per_s / _GB,
        "host_link_gbps": gpu.host_link_bytes_per_s / _GB,
        "flash_attention_2_share": gpu.flash_attention_2_share,
        "fused_attention_share": gpu.fused_attention_share,
        "flash_attn_native": gpu.flash_attn_native,
        "fp8_gemm_tn_only": gpu.fp8_gemm_tn_only,
        "source": gpu.source,
    }
    optional = {"tdp_w": gpu.tdp_w, "rated_power_w": gpu.rated_power_w, "gpus_per_host": gpu.gpus_per_host}
    return entry | {key: value for key, value in optional.items() if value is not None}


def _read(value: Any, integer: bool = False) -> float:
    """A number from a GPU entry as written: true is not 1 and 1.5 GPUs are not 1 (TypeError/ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    if integer and value != int(value):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value) if integer else float(value)


def gpu_from_dict(name: str, data: dict[str, Any], origin: str) -> GPUSpec:
    """Build a GPUSpec from a catalog-style mapping (GB/s, TFLOP/s, GiB as in profiles/gpus.yaml)."""
    try:
        optional = {key: None if data.get(key) is None else _read(data[key], key == "gpus_per_host")
                    for key in ("tdp_w", "gpus_per_host", "rated_power_w")}
        spec = GPUSpec(
            name=name,
            peak_flops_per_s=tuple((k, _read(v) * 1e12) for k, v in data["peak_tflops"].items()),
            memory_bytes=int(_read(data["memory_gib"]) * GIB),
            hbm_bandwidth_bytes_per_s=_read(data["hbm_gbps"]) * _GB,
            matmul_efficiency=_read(data["matmul_efficiency"]),
            intra_node_link=str(data["intra_node"]["link"]),
            intra_node_bandwidth_bytes_per_s=_read(data["intra_node"]["gbps"]) * _GB,
            gpus_per_node=_read(data["gpus_per_node"], integer=True),
            nic_bandwidth_bytes_per_s=_read(data["nic_gbps"]) * _GB,
            sm_count=_read(data["sm_count"], integer=True),
            source=str(data.get("source", origin)),
            tdp_w=optional["tdp_w"],
            gpus_per_host=optional["gpus_per_host"],
            flash_attention_2_share=_read(data.get("flash_attention_2_share", 1.0)),
            fused_attention_share=_read(data.get("fused_attention_share", 1.0)),
            rated_power_w=optional["rated_power_w"],
            host_link_bytes_per_s=_read(data.get("host_link_gbps", PCIE4_HOST_LINK_BYTES_PER_S / _GB)) * _GB,
            fp8_gemm_tn_only=data.get("fp8_gemm_tn_only", False),
            flash_attn_native=data.get("flash_attn_native", False),
        ).checked()
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise PlannerError(f"{origin}: GPU {name!r} is missing or has a bad field ({exc})") from None
    except PlannerError as exc:
        raise PlannerError(f"{origin}: {exc}") from None
    return spec


@cache
def _catalog() -> dict[str, GPUSpec]:
    path = profiles_dir() / "gpus.yaml"
    document = load_structured_file(path)
    return {name: gpu_from_dict(name, data, str(path)) for name, data in document["gpus"].items()}


def catalog_gpu_names() -> list[str]:
    return list(_catalog())


def lookup_gpu(name: str) -> GPUSpec:
    """A catalog GPU by name (case-insensitive)."""
    catalog = _catalog()
    for key, spec in catalog.items():
        if key.lower() == name.lower():
            return spec
    raise PlannerError(f"unknown GPU type {name!r}; known: {', '.join(catalog)}")
