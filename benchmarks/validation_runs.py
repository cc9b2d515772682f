"""Published training runs as planner inputs: the shared loader behind benchmarks/calibrate.py,
benchmarks/accuracy.py and tests/test_accuracy_regression.py.

The CSVs in benchmarks/data/ are verbatim copies of ../shared/validation files (each row keeps its
`source` / `source_line` column); Korthikanti Table 4 is read from tests/data/. Every setting a
row does not state is a documented fact about the framework or the run family, written here once:

* BLOOM topology sweep (bigscience tr11 chronicles, Megatron-DeepSpeed on Jean Zay A100-80GB):
  seq 2048, vocab 250880, ALiBi, tied embeddings, no dropout, a LayerNorm after the word embedding
  (bigscience/bloom config.json; tr11's `--embed-layernorm`, applied in VocabParallelEmbedding on the first stage), full
  activation checkpointing (`--checkpoint-activations`; the logged TFLOPs use the 4·2 hardware
  factor), unfused attention, ZeRO-1 unless the `zs` column says 0, and DeepSpeed's pipeline
  engine: 1F1B order, each TP rank sending its 1/tp slice of a stage's activation and gradient, gathered on the
  receiver (`PipelineEngine.is_pipe_partitioned`), gradients reduced after the pipeline flush (no overlap with
  backward), and TP all-reduces in backward that wait for completion (the bigscience fork's
  ColumnParallelLinear predates Megatron-LM's asynchronous all-reduce behind the weight-gradient GEMM).
  fp16 rows (the pre-BF16Optimizer majority) keep 16-bit gradients and run ZeRO's FP16_DeepSpeedZeroOptimizer;
  bf16 rows run DeepSpeed's BF16_Optimizer (`deepspeed_optimizer` "bf16", its own ZeRO-1 sharding at zero
  stage 0: tr11-176B-ml.slurm), which accumulates in fp32 and keeps the bf16 gradients besides.
  Rows whose `pcie_numa_fix_applied` column says "no" ran before Jean Zay's PCIe/NUMA fix, when the
  GPU-to-NIC path was slower: they run on the same cluster with its inter-node bandwidth scaled by
  one fitted cluster-state ratio; every row's pipeline transfers run at a second one, Jean Zay's Omni-Path
  send/receive rate relative to the p2p_efficiency_inter other fabrics are costed at (`cluster_states` in
  profiles/calibration.yaml, both fitted by benchmarks/calibrate.py on fit-half rows only).
  "Fully known" rows state hidden size, layers, heads, tp, pp, micro-batch, global batch and sec/it
  (dp from the GPU count where blank), and their `dims_note` records no conflict between the
  table and the text. The `mem` column is nvidia-smi's reading on the first (last) nodes, those with the
  word embeddings ("Mem = max memory used by the first (last) nodes with the word embedding matrix",
  chronicles-prequel.md): the whole device, including the CUDA context as the chronicles measured it on that
  stack (`JEAN_ZAY_CUDA_CONTEXT_BYTES`).
* NeMo 24.07 / Megatron-Bridge 25.11 H100 FP8 runs: FlashAttention (cuDNN fused attention), the
  distributed optimizer with overlapped gradient reduce and parameter gather, sequence parallelism
  whenever tp > 1, no activation recompute but where the release's preset sets one (`bridge_preset`),
  interleaved 1F1B when vp > 1. Iteration time =
  gbs · seq / (tokens/s/GPU · GPUs). Rows with cp > 1 (not modelled) or model architectures
  planner cannot express (Nemotron's squared-ReLU MLP) are reported as skipped.
* Narayanan et al. 2021 Table 2, "ZeRO-3 without model parallelism" rows (DeepSpeed ZeRO-3 on
  Selene, DGX A100 80GB with 8× HDR 200 Gb/s per node): GPT-3 175B (Table 1's 96 layers, h 12288,
  96 heads) and 530B (105 layers, h 20480, 128 heads), seq 2048, vocab 51200, fp16, unfused
  attention, full activation recompute (the paper's runs all checkpoint activations), dp = GPUs.
  Iteration time = eq. 3's FLOPs per iteration (they count the recompute) / (TFLOP/s × GPUs).
* llm-foundry MPT FSDP runs (mosaicml/llm-foundry scripts/train/benchmarking, Composer + PyTorch
  FSDP1 FULL_SHARD over all GPUs): MPT is MHA, FFN 4h, GELU, LayerNorm and linears without bias,
  ALiBi, tied embeddings, vocab 50368, no dropout, FlashAttention-2-class kernels (`flash2`: triton or
  flash-attn 2; on A100 as fast as the native kernel); activation
  checkpointing = full recompute; nodes of 8 A100 with 8× 200 Gb/s RoCE (the "1600 Gbps" of the
  table headings). mp_mode PURE reduces gradients in bf16, DEFAULT (amp_bf16) in fp32 (Composer's
  FSDP mixed-precision presets). The benchmark script (scripts/train/benchmarking/submit_benchmarks.py) sets no
  backward_prefetch, so Composer's FSDPConfig default runs: BACKWARD_POST (`fsdp_backward_prefetch` "post").
  Iteration time = global-batch tokens / (tokens/s/GPU × GPUs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pandas as pd

from benchmarks.bridge_systems import (
    BRIDGE_DTYPES,
    BridgePreset,
    bridge_cluster,
    bridge_config,
    bridge_gpu,
    bridge_precision,
    bridge_preset,
    with_recipe_fp8_params,
)
from planner.cluster import Cluster, load_cluster
from planner.config import (
    ParallelConfig,
    Recompute,
    Schedule,
    Training,
    deepspeed_legacy_pipeline,
    deepspeed_zero3_collectives,
)
from planner.cost.estimate import Estimate, estimate, model_flops_per_iteration
from planner.cost.memory import STACK_BYTES_PER_SM
from planner.cost.time import unit_costs
from planner.frameworks import FRAMEWORKS
from planner.gpu import GIB
from planner.model import ModelSpec, UnitKind, load_model
from planner.placement import GroupLinks, default_placement
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import Calibration
from planner.resources import load_structured_file, profiles_dir

__all__ = [
    "BLOOM_FILE",
    "BRIDGE_PERF_GRAD_BYTES",
    "JEAN_ZAY_BEFORE_FIX",
    "JEAN_ZAY_CUDA_CONTEXT_BYTES",
    "JEAN_ZAY_PIPELINE",
    "LayerRow",
    "Run",
    "Skipped",
    "bloom_runs",
    "bloom_skipped",
    "h100_runs",
    "korthikanti_layer_rows",
    "llmfoundry_config",
    "llmfoundry_model",
    "llmfoundry_runs",
    "long_context_runs",
    "narayanan_ptdp_skipped",
    "narayanan_zero3_ooms",
    "narayanan_zero3_runs",
    "predict",
    "predict_layer",
    "shipped_before_fix_nic_ratio",
    "shipped_jean_zay_p2p_ratio",
    "split_fit_hold",
]

DATA = Path(__file__).resolve().parent / "data"
TESTS_DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
BLOOM_FILE = "bloom176b_topology_sweep_chronicles.csv"
NEMO_FILE = "nemo_2407_h100_fp8_pretraining.csv"
# Megatron-Bridge's performance recipes (the 25.11 performance summary's dense and MoE rows) keep 16-bit gradient
# buffers: `_benchmark_common` sets ddp.grad_reduce_in_fp32 = False (src/megatron/bridge/perf_recipes/_common.py).
BRIDGE_PERF_GRAD_BYTES = 2
BRIDGE_FILE = "megatron_bridge_2511_h100_dense.csv"
TABLE4_FILE = "korthikanti2022_table4_layer_time_22b.csv"
NARAYANAN_FILE = "narayanan2021_table2_zero3_vs_ptdp.csv"
LLMFOUNDRY_FILE = "llmfoundry_mpt_fsdp_a100.csv"
LONG_CONTEXT_FILE = "long_context_cp_throughput.csv"

BLOOM_SEQ_LEN = 2048
# cluster state of the BLOOM rows logged before Jean Zay's PCIe/NUMA fix (key in calibration.yaml)
JEAN_ZAY_BEFORE_FIX = "jean-zay-a100-48 before the PCIe/NUMA fix"
# cluster state of every BLOOM row: the pipeline send/receive rate of Jean Zay's Omni-Path fabric
JEAN_ZAY_PIPELINE = "jean-zay-a100-48 pipeline transfers"
BLOOM_VOCAB = 250880
JEAN_ZAY_CUDA_CONTEXT_BYTES = 1573 * 2**20
"""The CUDA context on Jean Zay's A100s under the BLOOM runs' software, as the chronicles measured it
(bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md: `torch.ones(1).cuda()`, then nvidia-smi:
"40GB A100 takes 1573MiB for cuda kernels"): PyTorch 1.x on CUDA 11 loaded every kernel image when the context was
created, before CUDA 11.7's lazy module loading (CUDA_MODULE_LOADING=LAZY, PyTorch's default since 2.x) that the
calibration's cuda_context_bytes assumes. The figure includes the thread-stack reserve."""
# The sweep's rows date from January to March 2022, on the BigScience branch of DeepSpeed of that time (v0.5.x-0.6.x,
# whose BF16_Optimizer the bf16 rows run): its pipeline engine is the legacy one (deepspeed_legacy_pipeline).
BLOOM_DEEPSPEED = "0.6"


@dataclass(frozen=True)
class Run:
    """One published run: planner inputs plus the published iteration time and memory. `memory_in_allocator`: the
    published memory is PyTorch's caching allocator's peak (max_memory_reserved or max_memory_allocated), which leaves
    out the CUDA context and NCCL buffers; otherwise it is the device's (nvidia-smi), which counts them. Both are
    high-water marks, so both count the segments the optimizer step maps after the peak (`step_segment_bytes`)."""

    file: str
    label: str
    model: ModelSpec
    cluster: Cluster
    training: Training
    config: ParallelConfig
    iteration_s: float
    memory_bytes: float | None
    source: str
    memory_in_allocator: bool = False
    cuda_context_bytes: float | None = None  # the CUDA context measured on the run's stack (stack reserve included)
    p2p_bandwidth_ratio: float = 1.0  # its cluster's pipeline-transfer rate relative to p2p_efficiency_inter's

    def memory_error(self, result: Estimate) -> float | None:
        """Predicted over published peak memory − 1, the prediction counted as the publication counts (None: the
        run publishes none)."""
        if not self.memory_bytes:
            return None
        predicted = result.peak_reserved_bytes if self.memory_in_allocator else result.peak_device_bytes
        return predicted / self.memory_bytes - 1


@dataclass(frozen=True)
class Skipped:
    """A published row planner does not estimate, and why (a missing feature or missing inputs)."""

    file: str
    row: str
    reason: str


@dataclass(frozen=True)
class LayerRow:
    """One row of Korthikanti et al. 2022 Table 4: one 22B layer, TP=8, s=2048, b=4 on A100."""

    experiment: str
    recompute: Recompute
    sequence_parallel: bool
    forward_s: float
    backward_s: float
    source: str


def _number(value: object) -> float | None:
    """A finite number from a CSV cell, or None for blanks and markers such as 'x' or 'OOM'."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _memory_bytes(cell: object) -> float | None:
    """'37GB' → bytes. The chronicles copy nvidia-smi's MiB-based figure, so GB here means GiB."""
    text = str(cell).strip()
    if not text.endswith("GB") or _number(text[:-2]) is None:
        return None
    return float(text[:-2]) * GIB


def bloom_model(hidden: int, layers: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=f"bloom-h{hidden}-l{layers}-a{heads}", num_layers=layers, hidden_size=hidden,
        num_attention_heads=heads, ffn_hidden_size=4 * hidden, vocab_size=BLOOM_VOCAB,
        max_position_embeddings=BLOOM_SEQ_LEN, activation="gelu", normalization="layernorm",
        position_embedding="alibi", tie_embeddings=True, linear_bias=True, dropout=False, embedding_norm=True,
        source="bigscience/bloom config.json with the sweep row's dimensions",
    )


def _shipped_cluster_state(state: str, key: str) -> float:
    """One ratio of a cluster state as profiles/calibration.yaml ships it (1 if absent)."""
    document = load_structured_file(profiles_dir() / "calibration.yaml")
    return float(((document.get("cluster_states") or {}).get(state) or {}).get(key, 1.0))


def shipped_before_fix_nic_ratio() -> float:
    """Inter-node bandwidth before Jean Zay's PCIe/NUMA fix relative to after it, as shipped (1 if absent)."""
    return _shipped_cluster_state(JEAN_ZAY_BEFORE_FIX, "nic_bandwidth_ratio")


def shipped_jean_zay_p2p_ratio() -> float:
    """Jean Zay's pipeline send/receive bandwidth relative to p2p_efficiency_inter's, as shipped (1 if absent)."""
    return _shipped_cluster_state(JEAN_ZAY_PIPELINE, "p2p_bandwidth_ratio")


def _with_nic_ratio(cluster: Cluster, ratio: float) -> Cluster:
    return cluster.with_nodes(replace(node, nic_bandwidth_bytes_per_s=node.nic_bandwidth_bytes_per_s * ratio)
                              for node in cluster.nodes)


def _bloom_oom(row: pd.Series) -> bool:
    """Whether the row documents a run that ran out of memory (its `mem` cell says "OOM")."""
    return str(row["mem"]).strip() == "OOM"


def _bloom_row(row: pd.Series, cluster: Cluster, p2p_ratio: float) -> Run | None:
    """The row as a run: a documented OOM states no time (NaN, never scored for time)."""
    values = {k: _number(row[k]) for k in ("nhidden", "nlayers", "nheads", "tp", "pp", "mbs", "gbs", "sec/it",
                                           "gpus", "dp", "zs")}
    if _bloom_oom(row):
        values["sec/it"] = math.nan
    required = ("nhidden", "nlayers", "nheads", "tp", "pp", "mbs", "gbs", "sec/it", "gpus")
    if any(values[k] is None for k in required) or "context line says" in str(row["dims_note"]):
        return None
    tp, pp, gpus = int(values["tp"]), int(values["pp"]), int(values["gpus"])
    dp = int(values["dp"]) if values["dp"] is not None else gpus // (tp * pp)
    if dp * tp * pp != gpus or int(values["gbs"]) % (dp * int(values["mbs"])):
        return None
    bf16 = str(row["precision_regime"]).startswith("bf16")
    training = Training(global_batch=int(values["gbs"]), seq_len=BLOOM_SEQ_LEN, dtype="bf16" if bf16 else "fp16",
                        attention="unfused", grad_bytes=4 if bf16 else 2)
    zero = 1 if values["zs"] is None else int(values["zs"])
    config = FRAMEWORKS["deepspeed"].runs(ParallelConfig(
        dp=dp, tp=tp, pp=pp, micro_batch=int(values["mbs"]), recompute=Recompute.FULL, zero_stage=zero,
        schedule=Schedule.ONE_F_ONE_B, deepspeed_optimizer="bf16" if bf16 and zero == 1 else "zero",
        legacy_pipeline_engine=deepspeed_legacy_pipeline(BLOOM_DEEPSPEED)))
    model = bloom_model(int(values["nhidden"]), int(values["nlayers"]), int(values["nheads"]))
    label = (f"L{row['source_line']} h{model.hidden_size} l{model.num_layers} a{model.num_attention_heads} "
             f"{config.describe()} gbs{training.global_batch}")
    return Run(BLOOM_FILE, label, model, cluster, training, config, float(values["sec/it"]),
               _memory_bytes(row["mem"]), f"{BLOOM_FILE} source_line {row['source_line']}",
               cuda_context_bytes=JEAN_ZAY_CUDA_CONTEXT_BYTES, p2p_bandwidth_ratio=p2p_ratio)


@cache
def bloom_runs(before_fix_nic_ratio: float | None = None, p2p_ratio: float | None = None,
               ooms: bool = False) -> tuple[Run, ...]:
    """BLOOM sweep rows with fully known configuration, one per distinct (config, result); rows logged
    before the PCIe/NUMA fix run with the given (default: shipped) inter-node bandwidth ratio, every row's pipeline
    transfers with the given (default: shipped) Jean Zay p2p ratio. `ooms`: the rows documented as out of memory
    instead (no time)."""
    ratio = shipped_before_fix_nic_ratio() if before_fix_nic_ratio is None else before_fix_nic_ratio
    p2p_ratio = shipped_jean_zay_p2p_ratio() if p2p_ratio is None else p2p_ratio
    after = load_cluster("jean-zay-a100-48")
    before = _with_nic_ratio(after, ratio)
    frame = pd.read_csv(DATA / BLOOM_FILE)
    runs, seen = [], set()
    for _, row in frame.iterrows():
        run = None if _bloom_oom(row) != ooms else _bloom_row(
            row, before if str(row["pcie_numa_fix_applied"]).strip() == "no" else after, p2p_ratio)
        if run is None:
            continue
        key = (run.model, run.training, run.config, None if ooms else run.iteration_s)
        if key not in seen:
            seen.add(key)
            runs.append(run)
    return tuple(runs)


def bloom_skipped() -> tuple[Skipped, ...]:
    """BLOOM rows outside `bloom_runs` and its documented OOMs: incomplete or conflicting configurations and repeats
    of a run."""
    used = {run.source.split()[-1] for run in (*bloom_runs(), *bloom_runs(ooms=True))}
    lines = pd.read_csv(DATA / BLOOM_FILE)["source_line"].astype(str)
    return tuple(Skipped(BLOOM_FILE, f"source_line {line}", "configuration incomplete or conflicting, or a repeat")
                 for line in lines if line not in used)


def split_fit_hold(runs: tuple[Run, ...]) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """Deterministic half split: alternate rows in file order (fit, hold, fit, hold …)."""
    return runs[0::2], runs[1::2]


# ---- H100 runs -------------------------------------------------------------------------------
_NEMO_GPT3 = {
    # NeMo examples/nlp/language_modeling/conf gpt3 5b / 20b (Megatron GPT-3 shapes, 51200 padded vocab)
    "GPT3-5B": dict(num_layers=24, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=16384),
    "GPT3-20B": dict(num_layers=44, hidden_size=6144, num_attention_heads=48, ffn_hidden_size=24576),
}
# NeMo 2.0 nemo/collections/llm/gpt/model/nemotron.py (Nemotron3Config8B / 22B, Nemotron4Config340B): squared-ReLU
# MLP without a gate, LayerNorm (zero-centred gamma), RoPE on half of each head, no biases, untied embeddings,
# the Nemotron tokenizer's 256,000 tokens (Nemotron-4 340B report, arXiv:2406.11704, §2)
_NEMO_NEMOTRON = {
    "Nemotron-8B": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=16384),
    "Nemotron-22B": dict(num_layers=40, hidden_size=6144, num_attention_heads=48, ffn_hidden_size=24576),
    "Nemotron-340B": dict(num_layers=96, hidden_size=18432, num_attention_heads=96, num_key_value_heads=8,
                          ffn_hidden_size=73728),
}
NEMOTRON_VOCAB = 256000
# NeMo-Framework-Launcher's Nemotron-4 340B recipe (launcher_scripts/conf/training/nemotron/nemotron_340b.yaml) runs
# Megatron-Core's distributed optimizer with `grad_sync_dtype: bf16`: 16-bit gradient buffers; the recipes of the
# file's other models keep the default fp32 ones
_NEMO_GRAD_BYTES = {"Nemotron-340B": 2}
_CATALOG = {"GPT3-175B": "gpt3-175b", "LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b",
            "LLAMA2-70B": "llama2-70b", "LLAMA3-8B": "llama3-8b", "LLAMA3-70B": "llama3-70b",
            "LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b"}


def _h100_model(name: str) -> ModelSpec | None:
    if name in _NEMO_GPT3:
        return ModelSpec(name=name.lower(), vocab_size=51200, activation="gelu", normalization="layernorm",
                         position_embedding="learned", tie_embeddings=True, linear_bias=True,
                         source="NeMo gpt3 config", **_NEMO_GPT3[name])
    if name in _NEMO_NEMOTRON:
        return ModelSpec(name=name.lower(), vocab_size=NEMOTRON_VOCAB, activation="relu2", normalization="layernorm",
                         source="NeMo nemotron config", **_NEMO_NEMOTRON[name])
    return load_model(_CATALOG[name]) if name in _CATALOG else None


def _h100_rows() -> Iterator[tuple[str, pd.Series]]:
    for file in (NEMO_FILE, BRIDGE_FILE):
        for _, row in pd.read_csv(DATA / file).iterrows():
            yield file, row


def h100_runs() -> tuple[tuple[Run, ...], tuple[Skipped, ...]]:
    """H100 FP8 runs planner can express, and the rows it cannot (with why)."""
    runs, skipped = [], []
    for file, row in _h100_rows():
        name, gpus = str(row["model"]), int(row["num_gpus"])
        tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"])
        vp = int(_number(row["vp"]) or 1)
        model = _h100_model(name)
        if model is None:
            skipped.append(Skipped(file, name, "architecture not expressible"))
            continue
        dp = gpus // (tp * pp * cp)
        fsdp = str(row.get("fsdp", "0")).startswith("1")
        preset = bridge_preset(name, "H100-80GB", "FP8-CS") if file == BRIDGE_FILE else BridgePreset()
        config = bridge_config(dp, tp, pp, cp, vp, int(row["mbs"]), fsdp, preset)
        grad_bytes = BRIDGE_PERF_GRAD_BYTES if file == BRIDGE_FILE else _NEMO_GRAD_BYTES.get(name)
        # NeMo 24.07's recipes scale FP8 from the amax history (Transformer Engine's DelayedScaling, NeMo's
        # default); Megatron-Bridge's rows say FP8-CS, current scaling
        recipe = "tensorwise" if file == BRIDGE_FILE else "delayed"
        training = Training(global_batch=int(row["gbs"]), seq_len=int(row["seq_len"]), dtype="fp8",
                            fp8_recipe=recipe, attention="flash", grad_bytes=grad_bytes)
        config = with_recipe_fp8_params(config, recipe)
        iteration = training.tokens_per_iteration / (float(row["tokens_per_sec_per_gpu"]) * gpus)
        nodes = math.ceil(gpus / 8)
        label = f"{name} {gpus}xH100 {config.describe()}"
        runs.append(Run(file, label, model, load_cluster(f"{nodes}x8xH100-80GB"), training, config, iteration,
                        None, f"{file}: {name} ({row['source'][:60]}…)"))
    return tuple(runs), tuple(skipped)


# ---- long-context runs with context parallelism -------------------------------------------------
_LONG_CONTEXT_MODELS = {"Llama-2-7B": "llama2-7b", "Llama-3-8B": "llama3-8b", "Llama-3.1-405B": "llama3-405b"}


def _long_context_why(row: pd.Series) -> str | None:
    """Why a long_context_cp_throughput.csv row is not estimated here, or None."""
    if str(row["status"]) != "current":
        return "superseded by a later row of the same run"
    if str(row["is_moe"]) == "yes":
        return "MoE: scored with moe_ep_throughput.csv"
    if str(row["row_id"]).startswith("TT-"):
        return "same run as a torchtitan_benchmarks_llama3_h100_202412.csv row (scored there)"
    hardware = str(row["hardware"])
    if bridge_gpu(hardware) is None or not hardware.startswith(("H100 SXM", "B200", "GB200", "GB300")):
        return f"hardware {hardware[:40]!r} not a DGX/NVL72 system of the catalog"
    if not hardware.startswith("H100") and str(row["precision"]) not in BRIDGE_DTYPES:
        return f"precision {str(row['precision'])[:30]!r} not modelled (planner runs bf16, fp16 or fp8)"
    if str(row["model"]) not in _LONG_CONTEXT_MODELS or pd.isna(row["tp"]):
        return "parallel layout not stated (the source's best non-CP baseline)"
    return None


def _long_context_precision(row: pd.Series, bridge: bool) -> dict[str, str | None]:
    """Training's dtype and FP8 recipe of a long-context row: NeMo's tables ran FP8 with delayed scaling (NeMo's
    default recipe), Megatron-Bridge's as labelled; its H100 rows the 25.09 table leaves unlabelled as its H100
    FP8, current scaling."""
    label = str(row["precision"])
    if not bridge:
        return {"dtype": "fp8", "fp8_recipe": "delayed"}
    return bridge_precision(label if label in BRIDGE_DTYPES else "FP8-CS")


def long_context_runs() -> tuple[tuple[Run, ...], tuple[Skipped, ...]]:
    """NeMo long-sequence and Megatron-Bridge CP runs on H100, B200 and GB200/GB300 NVL72 racks (FP8 — the H100
    rows' table is FP8 throughout, the Blackwell rows say which recipe —, Megatron-LM's ring CP, TE userbuffer TP
    overlap as in NeMo's performance recipes; racks in the NVLink domains Megatron-Bridge's launcher asks for):
    iteration time from tokens/s/GPU, or from model TFLOP/s/GPU (NeMo's long-sequence table states only that;
    its FLOP count is planner's, no causal halving)."""
    runs, skipped = [], []
    for _, row in pd.read_csv(DATA / LONG_CONTEXT_FILE).iterrows():
        why = _long_context_why(row)
        if why:
            skipped.append(Skipped(LONG_CONTEXT_FILE, f"row_id {row['row_id']}", why))
            continue
        model = load_model(_LONG_CONTEXT_MODELS[str(row["model"])])
        gpus, tp, pp, cp = int(row["num_gpus"]), int(row["tp"]), int(row["pp"]), int(row["cp"])
        vpp = int(_number(row["vpp"]) or 1)
        dp = gpus // (tp * pp * cp)
        config = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch=int(_number(row["micro_batch"]) or 1),
                                sequence_parallel=tp > 1, tp_comm_overlap=tp > 1, distributed_optimizer=dp * cp > 1,
                                overlap_param_gather=True,
                                schedule=Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B)
        gpu = bridge_gpu(str(row["hardware"])) or ""
        bridge = str(row["row_id"]).startswith("MB-")  # Megatron-Bridge's performance summary (NLS-: NeMo's)
        training = Training(global_batch=int(row["global_batch"]), seq_len=int(row["seq_len"]),
                            **_long_context_precision(row, bridge), attention="flash",
                            grad_bytes=BRIDGE_PERF_GRAD_BYTES if bridge else None)
        config = with_recipe_fp8_params(config, training.fp8_recipe)
        tokens_per_s = _number(row["tokens_per_sec_per_gpu"])
        if tokens_per_s:
            iteration = training.tokens_per_iteration / (tokens_per_s * gpus)
        else:
            flops = model_flops_per_iteration(model, training)
            iteration = flops / (float(row["model_tflops_per_gpu"]) * 1e12 * gpus)
        runs.append(Run(LONG_CONTEXT_FILE, f"{row['row_id']} {row['model']} s{row['seq_len']} {gpus}x{gpu} "
                        f"{config.describe()}", model, bridge_cluster(gpus, gpu), training, config, iteration, None,
                        f"{LONG_CONTEXT_FILE} row_id {row['row_id']}"))
    return tuple(runs), tuple(skipped)


def is_nemo_long_sequence_h100(run: Run) -> bool:
    """Whether `run` is a row of NeMo's long-sequence table on H100 (long_context_cp_throughput.csv's NLS- rows)."""
    return run.label.startswith("NLS-") and run.cluster.gpu.name.startswith("H100")


def nemo_long_sequence_h100_runs() -> tuple[Run, ...]:
    """NeMo's long-sequence table on H100 (Llama 2 7B, FP8, 4K to 1M tokens): the calibration's evidence for the
    fused attention rate and FP8 GEMMs, where attention goes from a fifth to nearly all of the time."""
    return tuple(run for run in long_context_runs()[0] if is_nemo_long_sequence_h100(run))


# ---- ZeRO-3 / FSDP runs -------------------------------------------------------------------------
_NARAYANAN_MODELS = {174.6: (96, 12288, 96), 529.6: (105, 20480, 128)}  # Narayanan et al. 2021 Table 1
NARAYANAN_SEQ_LEN, NARAYANAN_VOCAB = 2048, 51200
# ZeRO-3 was released in DeepSpeed v0.3.12 (PR #834, 2021-03-08) and the paper posted on 2021-04-09 (arXiv v1):
# a v0.3 release.
NARAYANAN_DEEPSPEED = "0.3"


def narayanan_eq3_flops(model: ModelSpec, batch: int, seq_len: int) -> float:
    """FLOPs per iteration with activation recompute, Narayanan et al. 2021 eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    layers, h = model.num_layers, model.hidden_size
    return 96 * batch * seq_len * layers * h**2 * (1 + seq_len / (6 * h) + model.vocab_size / (16 * layers * h))


def narayanan_ptdp_skipped() -> tuple[Skipped, ...]:
    """Narayanan et al. 2021 Table 2 rows with model parallelism: their TP/PP split is not stated."""
    frame = pd.read_csv(DATA / NARAYANAN_FILE)
    return tuple(Skipped(NARAYANAN_FILE, f"{row['params_billion']}B on {row['num_gpus']} GPUs",
                         "TP/PP split of the model-parallel size not stated")
                 for _, row in frame.iterrows() if not str(row["scheme"]).startswith("ZeRO-3"))


def _narayanan_zero3_run(row: pd.Series, gpus: int, micro_batch: int, tflops: float | None) -> Run:
    """A ZeRO-3 row of Narayanan et al. 2021 Table 2 on `gpus` GPUs at `micro_batch`: every row runs one micro-batch
    per GPU (batch = GPUs × micro-batch); `tflops` per GPU gives the time (None: a run that did not fit, NaN)."""
    layers, hidden, heads = _NARAYANAN_MODELS[float(row["params_billion"])]
    model = ModelSpec(name=f"gpt-{row['params_billion']}b", num_layers=layers, hidden_size=hidden,
                      num_attention_heads=heads, ffn_hidden_size=4 * hidden, vocab_size=NARAYANAN_VOCAB,
                      activation="gelu", normalization="layernorm", position_embedding="learned",
                      tie_embeddings=True, linear_bias=True, dropout=True, source="Narayanan et al. 2021 Table 1")
    batch = gpus * micro_batch
    training = Training(global_batch=batch, seq_len=NARAYANAN_SEQ_LEN, dtype="fp16", attention="unfused")
    config = ParallelConfig(dp=gpus, tp=1, pp=1, micro_batch=micro_batch, zero_stage=3, recompute=Recompute.FULL,
                            zero3_collectives=deepspeed_zero3_collectives(NARAYANAN_DEEPSPEED))
    iteration = (math.nan if tflops is None
                 else narayanan_eq3_flops(model, batch, NARAYANAN_SEQ_LEN) / (tflops * 1e12 * gpus))
    return Run(NARAYANAN_FILE, f"{model.name} {gpus}xA100 {config.describe()}", model,
               load_cluster(f"{gpus // 8}x8xA100-80GB"), training, config, iteration, None,
               f"{NARAYANAN_FILE}: {row['source'][:40]}…")


def _narayanan_zero3_rows() -> list[pd.Series]:
    return [row for _, row in pd.read_csv(DATA / NARAYANAN_FILE).iterrows() if str(row["scheme"]).startswith("ZeRO-3")]


def narayanan_zero3_runs() -> tuple[Run, ...]:
    """Narayanan et al. 2021 Table 2, ZeRO-3 rows: DeepSpeed ZeRO-3 data parallelism over every GPU."""
    return tuple(_narayanan_zero3_run(row, int(row["num_gpus"]), int(row["microbatch_size"]),
                                      float(row["achieved_tflops_per_gpu"])) for row in _narayanan_zero3_rows())


_NARAYANAN_DID_NOT_FIT = re.compile(r"did not fit on (\d+) GPUs with microbatch (\d+)")


def narayanan_zero3_ooms() -> tuple[Run, ...]:
    """The ZeRO-3 configurations Table 2's notes document as not fitting: the 529.6B row's "* did not fit on 560 GPUs
    with microbatch 4; GPUs raised to 640 and batch to 2560" is that model on 560 GPUs at micro-batch 4."""
    return tuple(_narayanan_zero3_run(row, int(found[1]), int(found[2]), None) for row in _narayanan_zero3_rows()
                 if (found := _NARAYANAN_DID_NOT_FIT.search(str(row["note"]))))


LLMFOUNDRY_VOCAB = 50368
LLMFOUNDRY_GPUS_PER_NODE = 8
LLMFOUNDRY_BACKWARD_PREFETCH = "post"
"""MosaicML Composer's FSDPConfig default backward_prefetch ('BACKWARD_POST', composer/utils/parallelism.py), which
llm-foundry's benchmark runs keep: each block's backward all-gather waits until the block after it has computed its
gradients (ParallelConfig.fsdp_backward_prefetch)."""


def llmfoundry_model(shape: pd.Series, seq_len: int) -> ModelSpec:
    """The MPT model of an llmfoundry_mpt_fsdp_a100.csv row's shape (model, layers, hidden, heads, ffn_hidden)."""
    return ModelSpec(name=str(shape["model"]).lower(), num_layers=int(shape["layers"]),
                     hidden_size=int(shape["hidden"]), num_attention_heads=int(shape["heads"]),
                     ffn_hidden_size=int(shape["ffn_hidden"]), vocab_size=LLMFOUNDRY_VOCAB,
                     max_position_embeddings=seq_len, activation="gelu", normalization="layernorm",
                     position_embedding="alibi", tie_embeddings=True,
                     source=f"mosaicml/llm-foundry yamls ({shape['model']})")


def llmfoundry_config(gpus: int, micro_batch: int, checkpointing: bool) -> ParallelConfig:
    """Composer's FSDP FULL_SHARD over all `gpus`, its default backward prefetch, full recompute when checkpointing."""
    return ParallelConfig(dp=gpus, tp=1, pp=1, micro_batch=micro_batch, zero_stage=3,
                          recompute=Recompute.FULL if checkpointing else Recompute.NONE,
                          fsdp_backward_prefetch=LLMFOUNDRY_BACKWARD_PREFETCH)


def llmfoundry_runs() -> tuple[Run, ...]:
    """llm-foundry MPT runs with PyTorch FSDP FULL_SHARD (ZeRO-3) over all GPUs of 8-GPU A100 nodes."""
    runs = []
    for _, row in pd.read_csv(DATA / LLMFOUNDRY_FILE).iterrows():
        gpus = int(row["num_gpus"])
        model = llmfoundry_model(row, int(row["seq_len"]))
        training = Training(global_batch=int(row["global_batch_seqs"]), seq_len=int(row["seq_len"]), dtype="bf16",
                            attention="flash2", grad_bytes=2 if "mp_mode=PURE" in str(row["other_flags"]) else 4)
        config = llmfoundry_config(gpus, int(row["micro_batch"]),
                                   str(row["activation_checkpointing"]).startswith("yes"))
        iteration = float(row["global_batch_tokens"]) / (float(row["tokens_per_sec_per_gpu"]) * gpus)
        gpu = "A100-80GB" if str(row["gpu_memory"]) == "80GB" else "A100-40GB"
        cluster = load_cluster(f"{max(gpus // LLMFOUNDRY_GPUS_PER_NODE, 1)}x{LLMFOUNDRY_GPUS_PER_NODE}x{gpu}")
        runs.append(Run(LLMFOUNDRY_FILE, f"row{row['row_id']} {row['model']} s{training.seq_len} {gpus}x{gpu} "
                        f"{config.describe()}", model, cluster, training, config, iteration, None,
                        f"{LLMFOUNDRY_FILE} row_id {row['row_id']}"))
    return tuple(runs)


# ---- Korthikanti Table 4 -----------------------------------------------------------------------
GPT_22B = ModelSpec(
    name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64, ffn_hidden_size=4 * 6144,
    vocab_size=51200, activation="gelu", normalization="layernorm", position_embedding="learned",
    tie_embeddings=True, linear_bias=True, dropout=True, source="Korthikanti et al. 2022 Table 3 (22B)",
)
_TABLE4_SETTINGS = {
    "Baseline no recompute": (Recompute.NONE, False),
    "Sequence Parallelism": (Recompute.NONE, True),
    "Baseline with recompute": (Recompute.FULL, False),
    "Selective Recompute": (Recompute.SELECTIVE, False),
    "Selective + Sequence": (Recompute.SELECTIVE, True),
}


def korthikanti_layer_rows() -> tuple[LayerRow, ...]:
    frame = pd.read_csv(TESTS_DATA / TABLE4_FILE)
    rows = []
    for _, row in frame.iterrows():
        recompute, sp = _TABLE4_SETTINGS[row["experiment"]]
        rows.append(LayerRow(row["experiment"], recompute, sp, row["forward_ms"] / 1e3, row["backward_ms"] / 1e3,
                             f"{TABLE4_FILE}: {row['source']}"))
    return tuple(rows)


# ---- predictions: the code path a user's `planner estimate` takes ---------------------------------
def predict(run: Run, calibration: Calibration) -> Estimate:
    """`estimate` of the run, with its own measured CUDA context where it has one (a calibration file's
    cuda_context_bytes is what a user would set: the context less the GPU's thread-stack reserve) and its
    cluster's pipeline-transfer rate."""
    if run.cuda_context_bytes is not None:
        stack = run.cluster.nodes[0].gpu.sm_count * STACK_BYTES_PER_SM
        calibration = calibration.updated(cuda_context_bytes=run.cuda_context_bytes - stack)
    if run.p2p_bandwidth_ratio != 1.0:
        calibration = calibration.updated(
            p2p_efficiency_inter=calibration.p2p_efficiency_inter * run.p2p_bandwidth_ratio)
    return estimate(run.model, run.cluster, run.training, run.config, calibration=calibration)


def predict_layer(row: LayerRow, calibration: Calibration) -> tuple[float, float]:
    """(forward, backward) seconds of one 22B block incl. TP communication and recompute, as
    `estimate` charges them per micro-batch (Megatron-LM on a DGX A100, Korthikanti's setup)."""
    cluster = load_cluster("dgx-a100")
    training = Training(global_batch=4, seq_len=2048, dtype="bf16", attention="unfused")
    config = ParallelConfig(dp=1, tp=8, pp=1, micro_batch=4, sequence_parallel=row.sequence_parallel,
                            recompute=row.recompute)
    links = GroupLinks.from_placement(cluster, config, default_placement(cluster, config))
    costs = unit_costs(GPT_22B, training, config, links.gpu[0], links.tp[0], AnalyticProfile(GPT_22B, calibration),
                       calibration)
    block = costs[UnitKind.BLOCK]
    return block.forward_s + block.tp_forward_s, block.backward_s + block.recompute_s + block.tp_backward_s
