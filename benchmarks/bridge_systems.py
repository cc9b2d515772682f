"""The GPUs, precisions and job shapes of Megatron-Bridge's published runs: one reading shared by the MoE file
(benchmarks/moe_runs.py) and the long-context file (benchmarks/validation_runs.py), whose rows name hardware and
precision the same way."""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.cluster import Cluster, load_cluster
from planner.config import ParallelConfig, Recompute, Schedule
from planner.errors import PlannerError
from planner.gpu import lookup_gpu

__all__ = ["BRIDGE_DTYPES", "BridgePreset", "bridge_cluster", "bridge_config", "bridge_gpu", "bridge_precision",
           "bridge_preset", "rack_segment_gpus", "with_recipe_fp8_params"]

# the files' hardware label (its first word) → catalog GPU; GPUs missing from profiles/gpus.yaml are skipped
_GPUS = {"H100": "H100-80GB", "H800": "H800", "B200": "B200", "B300": "B300", "GB200": "GB200", "GB300": "GB300"}
_FP8 = ("FP8", "MXFP8", "FP8-MX", "FP8-CS")
# the files' precision labels planner runs
BRIDGE_DTYPES = {**{name: "fp8" for name in _FP8}, "BF16": "bf16"}
# their FP8 recipes (Training.fp8_recipe): Megatron-Bridge's performance scripts run FP8 as current scaling on
# Hopper and MXFP8 on Blackwell (`-c fp8_cs` / `fp8_mx`, scripts/performance/dump_perf_configs.py: h100 fp8_cs)
_BRIDGE_FP8_RECIPES = {"FP8": "tensorwise", "FP8-CS": "tensorwise", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}


# the FP8 recipes whose NVIDIA presets store the weights in FP8, gathered in FP8 (Megatron-LM --fp8-param-gather):
# NeMo 2.0's bf16_with_fp8_mixed sets fp8_params (nemo/collections/llm/recipes/precision/mixed_precision.py, delayed
# scaling), Megatron-Bridge's delayed, current-scaling and MXFP8 presets fp8_param_gather
# (src/megatron/bridge/training/mixed_precision.py at v0.2.0; its blockwise "subchannel" preset leaves it off). The
# runs need it: with 16-bit weights beside their cached FP8 copies (memory.fp8_weight_copy_bytes) NeMo 24.07's
# GPT3-20B row (tp 2, 10 B parameters per GPU) would need 94.7 GiB of an H100's 79.2.
_FP8_PARAM_RECIPES = ("delayed", "tensorwise", "mxfp8")


def with_recipe_fp8_params(config: ParallelConfig, fp8_recipe: str | None) -> ParallelConfig:
    """`config` as an NVIDIA FP8 preset of `fp8_recipe` runs it: FP8 weights wherever the weights are sharded."""
    fp8_params = fp8_recipe in _FP8_PARAM_RECIPES and config.optimizer_sharding > 0
    return replace(config, fp8_param_gather=fp8_params)


def bridge_precision(label: str) -> dict[str, str | None]:
    """Training's dtype and fp8_recipe for a Megatron-Bridge precision label (one of BRIDGE_DTYPES)."""
    return {"dtype": BRIDGE_DTYPES[label], "fp8_recipe": _BRIDGE_FP8_RECIPES.get(label)}


def bridge_gpu(hardware: str) -> str | None:
    """The catalog GPU of a hardware label, or None when the catalog lacks it."""
    name = _GPUS.get(hardware.split()[0])
    try:
        return lookup_gpu(name).name if name else None
    except PlannerError:
        return None


def rack_segment_gpus(gpus: int, gpu: str) -> int:
    """GPUs of a rack-scale job that share one NVLink domain as Megatron-Bridge launches it: its Slurm executor
    (scripts/performance/utils/executors.py, 4-GPU nodes) asks for `--segment` = the job's trays when they fit one
    rack, else their largest divisor that does (a GB200/GB300 NVL72 rack holds 18 trays of 4), so each segment
    runs inside one rack's NVLink switch domain; its HybridEP topology (utils.py,
    apply_target_topology_environment) puts all EP ranks, up to 72, in that domain. The Megatron-LM DeepSeek-V3
    GB200 guide the file's notes quote ("every 32 GB200 GPUs (8 nodes) are in the same NVL domain") states
    what its EP 32 needs, not the domain's size."""
    spec = lookup_gpu(gpu)
    host = spec.gpus_per_host or spec.gpus_per_node
    trays, rack = gpus // host, spec.gpus_per_node // host
    return host * next(s for s in range(min(trays, rack), 0, -1) if trays % s == 0)


def bridge_cluster(gpus: int, gpu: str) -> Cluster:
    """Nodes of 8 (DGX H100/B200/B300); rack-scale GB200/GB300: trays of 4 in NVLink domains of
    `rack_segment_gpus`."""
    spec = lookup_gpu(gpu)
    host = spec.gpus_per_host
    if host is None:
        per_node = min(gpus, spec.gpus_per_node)
        return load_cluster(f"{gpus // per_node}x{per_node}x{gpu}")
    return load_cluster(f"{gpus // host}x{host}x{gpu}:nvl{rack_segment_gpus(gpus, gpu)}")


@dataclass(frozen=True)
class BridgePreset:
    """What a Megatron-Bridge performance preset sets for activations that its summary's rows do not state."""

    recompute_blocks: int | None = None  # recompute_num_layers: full recompute of each chunk's first N blocks
    cpu_offload_layers: int = 0  # cpu_offloading_num_layers: the first N blocks' activations in host memory


# The presets (scripts/performance/configs/llama3/workload_base_configs.py at v0.2.0, the 25.11 container's release;
# configs/llama/llama3_workload_base_configs.py from v0.3.0, the same values through v0.5.0) by (model, catalog GPU,
# FP8 label): LLAMA3_8B_H100_FP8_CS sets recompute_num_layers=5 (utils/helpers.py `set_recompute_overrides`: full,
# method block); LLAMA3_70B_GB200_FP8_CS and _GB300_FP8_CS run Megatron-FSDP at micro-batch 2 with
# cpu_offloading_num_layers 40 and 20. FP8 without a suffix is current scaling (FP8-CS) on every page.
_PRESETS = {("LLAMA3_8B", "H100-80GB", "FP8-CS"): BridgePreset(recompute_blocks=5),
            ("LLAMA3_70B", "GB200", "FP8-CS"): BridgePreset(cpu_offload_layers=40),
            ("LLAMA3_70B", "GB300", "FP8-CS"): BridgePreset(cpu_offload_layers=20)}


def bridge_preset(model: str, gpu: str, precision: str) -> BridgePreset:
    """The activation settings of the preset a row of `model` on catalog GPU `gpu` at `precision` ran (none
    unless `_PRESETS` names them)."""
    return _PRESETS.get((model, gpu, "FP8-CS" if precision == "FP8" else precision), BridgePreset())


def bridge_config(dp: int, tp: int, pp: int, cp: int, vp: int, micro_batch: int, fsdp: bool,
                  preset: BridgePreset = BridgePreset()) -> ParallelConfig:
    """The layout a NeMo / Megatron-Bridge performance recipe runs for a dense row: sequence parallelism and Transformer
    Engine's userbuffer TP overlap whenever tp > 1 (NeMo's H100 recipes set ub_tp_comm_overlap: True,
    gpt3/175b_fp8_performance.yaml, 20b_fp8_performance.yaml; assumed for every TP row, whose tables do not state it),
    Megatron-FSDP (ZeRO-3) or the distributed optimizer with overlapped parameter gathers, interleaved 1F1B when
    vp > 1, and the preset's activation settings (`bridge_preset`)."""
    return ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vp, micro_batch=micro_batch, sequence_parallel=tp > 1,
                          tp_comm_overlap=tp > 1, zero_stage=3 if fsdp else 0, distributed_optimizer=not fsdp,
                          overlap_param_gather=True, schedule=Schedule.INTERLEAVED if vp > 1 else Schedule.ONE_F_ONE_B,
                          recompute=Recompute.FULL if preset.recompute_blocks else Recompute.NONE,
                          recompute_num_layers=preset.recompute_blocks, cpu_offload_layers=preset.cpu_offload_layers)
