"""MoE runs with expert parallelism (moe_ep_throughput.csv, verbatim in benchmarks/data/) as planner inputs.

Rows are Megatron-Bridge performance-summary runs (force-balanced routers, dropless), its measured
skill runs and Megatron-LM MoE model-zoo runs. Settings a row does not state are those of
Megatron-Bridge's MoE performance recipes, written here once: the distributed optimizer with overlapped
gradient reduce and parameter gather, sequence parallelism whenever tp > 1 (Megatron-Core requires it
with EP), expert tensor parallelism 1 (the file's "ETP assumed 1"), FlashAttention (cuDNN fused
attention), interleaved 1F1B when vpp > 1, and 16-bit gradients: the recipes' `_benchmark_common` sets
`ddp.grad_reduce_in_fp32 = False` (Megatron-Bridge src/megatron/bridge/perf_recipes/_common.py, as its
scripts/performance have since they appeared in 2025-08), so Megatron-Core's gradient buffer, and the
reduce-scatter over it, holds the parameters' BF16, not fp32.

Precision: FP8 (H100 current scaling or 128-blockwise), MXFP8 and "FP8-MX" all run the blocks' linear
layers in 8-bit floats with higher-precision accumulation: planner's "fp8". Recompute: "full" is full; the
modules a row names ("selective: mlp, moe_act", "selective [layernorm, moe_act]", the Megatron-MoE model zoo's
"norm, act") are Megatron-LM's selective recompute of those modules (`ParallelConfig.recompute_modules`); a row
that states nothing runs its preset's modules where `PRESETS` knows them, else none; "none" and
"selective []" recompute nothing.
CUDA graphs: full-iteration graphs (`Training.cuda_graphs`) where the preset that ran the row's layout captures them
(`Preset.full_iteration_graphs`), and the per-layer Transformer Engine graphs of attention, router and dispatcher
preprocessing other presets capture (`Preset.graphed_modules`, `Training.cuda_graph_modules`; the rest of each MoE
layer stays eager and its dispatch still syncs; Mamba layers' graphs are listed as the presets set them and change
nothing in the estimate, which counts no launches in a Mamba mixer).
Dispatcher and EP overlap: the first dispatcher the row's dispatcher_routing names ("flex", "HybridEP" or
"DeepEP": flex; "alltoall", "A2A": alltoall; the H100 rows quote the HEAD perf recipe there), else the flex
backend of the preset that ran the row's layout in its release (`PRESETS`), else its model's presets' dispatcher
(on its GPU) when they agree (`MODEL_DISPATCHERS`: DeepSeek-V3, Nemotron-3-Nano, Qwen3 on GB300 / GB200: flex), else
alltoall (Megatron-Bridge's scripts/performance/utils/overrides.py sets alltoall unless a flex backend is given); EP
communication overlap where dispatcher_routing or notes say "EP overlap on", where the HEAD recipe a row
quotes for its settings sets it (`EP_OVERLAP_RECIPES`), or where the preset that ran the row's layout does
(`PRESETS`).
Rows the source footnotes as a known performance regression (GPT-OSS-120B in the 26.06.01 container, a cuDNN bug) are
skipped. Time is scored only on force-balanced, dropless rows (`Training.moe_load_imbalance` = 1): the others
depend on a router imbalance or capacity factor the rows do not state. Rows documented as out of memory (their
notes say OOM; they state no time) are estimated whatever their router, under a balanced one, and scored only on
whether they are predicted not to fit.
Iteration time = the stated step time, else global-batch tokens / (tokens/s/GPU × GPUs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

import pandas as pd

from benchmarks.bridge_systems import (
    BRIDGE_DTYPES,
    bridge_cluster,
    bridge_gpu,
    bridge_precision,
    with_recipe_fp8_params,
)
from benchmarks.validation_runs import BRIDGE_PERF_GRAD_BYTES, DATA, Run, Skipped
from planner.config import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES, ParallelConfig, Recompute, Schedule, Training
from planner.cost.estimate import estimate
from planner.gpu import GIB
from planner.model import load_model

__all__ = ["MOE_FILE", "PRESETS", "MoeRuns", "Preset", "hot_rank_load", "moe_runs"]

MOE_FILE = "moe_ep_throughput.csv"
_CATALOG = {"DeepSeek-V3": "deepseek-v3", "Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b",
            "GPT-OSS-120B": "gpt-oss-120b", "Mixtral-8x7B": "mixtral-8x7b", "Mixtral-8x22B": "mixtral-8x22b",
            "Nemotron-3-Nano": "nemotron-3-nano-30b-a3b", "Moonlight-16B": "moonlight-16b-a3b"}
_RACK_SCALE = ("B300", "GB200", "GB300")  # scored apart: the target covers H100 and B200
# Models whose Megatron-Bridge performance presets all name a flex backend, so a row that names no dispatcher ran it:
# every DeepSeek-V3 preset sets moe_flex_dispatcher_backend "hybridep" (GB200, GB300, B300 since the presets'
# first version, 2025-12-03; B200 since 2026-02-03, before the 26.02 container) or "deepep" (H100)
# (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py until 2026-07, then
# src/megatron/bridge/perf_recipes/deepseek/*/deepseek_v3.py). Qwen3 and GPT-OSS presets differ by GPU and layout:
# alltoall unless `PRESETS` names HybridEP for the row's layout.
# Every Nemotron-3-Nano preset sets moe_flex_dispatcher_backend "hybridep" (BASE_NEMOTRON_3_NANO_CONFIG in
# scripts/performance/configs/nemotronh/nemotron_3_nano_workload_base_configs.py at v0.3.1, nemotron_3_workload_base_
# configs.py at v0.4.0 through v0.5.1; HEAD's src/megatron/bridge/perf_recipes/nemotronh/<gpu>/nemotronh.py).
# Every Qwen3 preset on GB300 and GB200 names HybridEP too, in every release (QWEN3_*_GB300/GB200_*_BASE_CONFIG in
# scripts/performance/configs/qwen3/workload_base_configs.py at v0.2.0; ..._PRETRAIN_CONFIG_GB300/GB200_*_V1/V2, which
# inherit it, in configs/qwen/qwen3_workload_base_configs.py from v0.3.0; HEAD's perf_recipes/qwen/gb300|gb200), so a
# rack-scale Qwen3 row whose layout no preset ran (Qwen3-235B-A22B BF16 on 256 GB300 / GB200 in 25.11) ran it too.
MODEL_DISPATCHERS: dict[str | tuple[str, str], str] = {
    "DeepSeek-V3": "flex", "Nemotron-3-Nano": "flex",
    **{(model, gpu): "flex" for model in ("Qwen3-30B-A3B", "Qwen3-235B-A22B") for gpu in ("GB300", "GB200")}}
# Megatron-Bridge HEAD (@067f987df0) performance recipes, quoted by name in a row's recompute or notes column as the
# source of its unstated settings, that set CommOverlapConfig(overlap_moe_expert_parallel_comm=True)
# (src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py; the legacy H100 Qwen3-235B presets had moe_a2a_overlap
# on too). The other recipes rows quote (Qwen3-30B-A3B FP8 on 16 H100, GPT-OSS-120B BF16 on 64 H100) leave it off.
EP_OVERLAP_RECIPES = frozenset({"qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config",
                                "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config"})


@dataclass(frozen=True)
class Preset:
    """What a Megatron-Bridge performance preset sets that its rows do not state: recompute modules (empty: none),
    Megatron-Core's EP communication overlap (`overlap_moe_expert_parallel_comm`, the presets' `moe_a2a_overlap`) and
    the token dispatcher (None: the rule of `_dispatch`), whether it runs full-iteration CUDA graphs
    (cuda_graph_impl "full_iteration": `Training.cuda_graphs`) or per-layer Transformer Engine graphs of some parts
    (`graphed_modules`: `Training.cuda_graph_modules`), its micro-batch where the row's own is contradicted (None: the
    row's); `since`, the first NeMo container release whose presets set them ((): every release)."""

    recompute_modules: tuple[str, ...] = ()
    ep_overlap: bool = False
    dispatcher: str | None = None
    since: tuple[int, ...] = ()
    full_iteration_graphs: bool = False
    micro_batch: int | None = None  # the preset's, where the row's stated one contradicts the row (`PRESETS`)
    graphed_modules: tuple[str, ...] = ()


# Megatron-Bridge performance presets, for rows that state no recompute, EP overlap or dispatcher but run the
# preset's model, GPU, precision and layout (tp, pp, vpp, ep, micro-batch) in a release whose presets ran that layout;
# per layout the presets in release order (`Preset.since`), the row taking the last one its release has reached.
# Releases: Megatron-Bridge 0.2.0, 0.3.0, 0.4.0 and 0.5.0 are the NeMo 25.11, 26.02, 26.04 and 26.06 containers'
# (docs/releases/software-versions.md), 0.3.1 the 26.02.01 one's (docs/releases/known-issues.md); presets in
# scripts/performance/configs/<model>/*_workload_base_configs.py at those tags (commits named where no tag decides),
# HEAD's (@067f987df0, the 26.08 rows) in src/megatron/bridge/perf_recipes/<model>/<gpu>/*.py.
# * DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1 (= ..._GB300_V1), micro-batch 2: recompute ["mla_up_proj"], overlap
#   off, from 941c0b23a (2026-02-09, before the 26.02 container) through 8af195c0a (2026-06-06, after 26.04.01).
# * the same preset at micro-batch 1, from 8af195c0a (2026-06-06) through HEAD's deepseek_v3_pretrain_256gpu_gb300_fp8mx
#   config (26.06, 26.08 rows): moe_a2a_overlap True and full-iteration CUDA graphs (v0.5.0's ..._GB300_FP8_MX_V1:
#   cuda_graph_impl "full_iteration"; HEAD: _enable_deepseek_full_iteration_mxfp8), recompute [].
# * DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2, pp 8 × vpp 2, EP 32, from 5acef9309 (2026-04-18, the 26.04.01 row)
#   through HEAD's deepseek_v3_pretrain_256gpu_b200_fp8mx_config: DeepEP, moe_a2a_overlap True, recompute
#   ["mla_up_proj", "mlp"].
# * GPT-OSS-120B BF16 on B200 and GB200 (GPT_OSS_120B_B200/GB200_BF16_BASE_CONFIG at v0.2.0, then ..._BF16_V1/V2;
#   HEAD gpt_oss_120b_pretrain_64gpu_b200_bf16_config): recompute ["layernorm", "moe_act"] in every release. v0.4.0
#   and v0.4.1 (26.04, 26.04.01; no later BF16 rows) run B200 and B300 at EP 8 with HybridEP (flex), GB200 at EP 64
#   with HybridEP and moe_a2a_overlap; v0.3.x ran EP 64 on B200 and B300 and alltoall without overlap on GB200.
# * QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG (v0.2.0, the 25.11 row; later ..._H100_FP8_CS_V1 and HEAD's
#   qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config, `EP_OVERLAP_RECIPES`), tp 2 × pp 8 × vpp 4, EP 32:
#   moe_a2a_overlap.
# * QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG / ..._PRETRAIN_CONFIG_H100_FP8_CS_V1, pp 2 × vpp 12, EP 8
#   (BASE_QWEN3_30B_A3B), from v0.2.0 until acc52e249 (2026-03-14) moved H100 to EP 16 without overlap:
#   moe_a2a_overlap.
# * v0.5.0 (26.06) turned the MXFP8 presets on GB200 / GB300 / B300 into full-iteration CUDA graphs (planner's
#   Training.cuda_graphs "full_iteration": no host launch time, no dispatcher sync) with
#   moe_a2a_overlap True: Qwen3-30B-A3B's and Qwen3-235B-A22B's ..._FP8_MX_V1/V2, DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_
#   FP8_MX_V1/V2 (with recompute ["mla_up_proj"]), GPT_OSS_120B_PRETRAIN_CONFIG_GB200/GB300_FP8_MX_V2; v0.5.1 and
#   HEAD's recipes (_enable_hybridep_full_iteration_mxfp8, _apply_gpt_oss_120b_full_iter_fp8mx_configs: the 26.06.01
#   and 26.08 rows) keep it; v0.4.1 (26.04.01) and earlier ran the same layouts without it. All of them run HybridEP
#   (flex): their base presets set moe_flex_dispatcher_backend "hybridep", which the model scripts apply
#   (apply_flex_dispatcher_backend, or moe_token_dispatcher_type "flex" in scripts/performance/configs/qwen/
#   qwen3_llm_pretrain.py from v0.4.0), as HEAD's recipes do (src/megatron/bridge/perf_recipes/qwen/gb300/qwen3_moe.py).
# * Qwen3-30B-A3B MXFP8 on B300 (micro-batch 8) from v0.3.0 and on B200 (4) from v0.4.0 run HybridEP
#   (QWEN3_30B_A3B_PRETRAIN_CONFIG_B300/B200_FP8_MX_V1 in configs/qwen/qwen3_workload_base_configs.py; on GB300 /
#   GB200 every release's Qwen3 presets do: `MODEL_DISPATCHERS`).
# * GPT_OSS_120B_H100_BF16_BASE_CONFIG (v0.2.0, the 25.11 row MB-177, the release's only H100 GPT-OSS preset): pp 4,
#   EP 8, micro-batch 1 (BASE_GPT_OSS_120B_CONFIG), recompute ["layernorm", "moe_act"]. The row states micro-batch 4
#   and gradient accumulation 2 with global batch 512: the B200 row's figures (MB-174: pp 1, dp 64, 512 / (64 x 4) =
#   2), which at pp 4 (dp 16) would need accumulation 8; at micro-batch 4 the model would not fit an 80 GB H100 even
#   with that recompute (97.5 GiB), and its 5,630 tokens/s per GPU is what the later releases' micro-batch-1 runs of
#   the same layout reach (5,810-5,993, MB-065/098/129/152). It runs as its preset: micro-batch 1.
# * NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1, 16 GPUs, EP 8, micro-batch 1, from v0.3.1 (26.02.01, the
#   presets' first release) through v0.5.1: recompute ["moe", "layernorm", "core_attn", "moe_act"], HybridEP, no
#   moe_a2a_overlap (HEAD's nemotron_3_nano_pretrain_16gpu_h100_fp8cs_config moved to EP 16, recompute ["layernorm"]).
# Per-layer Transformer Engine CUDA graphs (cuda_graph_impl "transformer_engine", cuda_graph_scope; Megatron-Bridge's
# scripts/performance applies each preset's and nothing else: no release turns them off by layout, GPU or precision),
# per preset at v0.2.0-v0.5.1 (configs/<model>/*_workload_base_configs.py) and HEAD (perf_recipes/):
# * [moe_router, moe_preprocess] (`_ROUTER_GRAPHS`): Qwen3-30B-A3B MXFP8 (FP8-MX) on GB300 (micro-batch 8), GB200 (4),
#   B300 (8) in every release before their full-iteration graphs (v0.5.0), on B200 at micro-batch 1 (v0.2.0, v0.3.0);
# * [attn, moe_router, moe_preprocess] (`_ATTENTION_ROUTER_GRAPHS`): Qwen3-30B-A3B MXFP8 on B200 at micro-batch 4 from
#   v0.3.1; Qwen3-235B-A22B MXFP8 on GB300 (pp 4, EP 32, micro-batch 2) and GB200 (pp 8, EP 32) and DeepSeek-V3 MXFP8 on
#   GB200 (pp 4 × vpp 4, EP 64) from v0.3.0 until v0.5.0's full-iteration graphs; DeepSeek-V3 and GPT-OSS-120B MXFP8 on
#   B300 at v0.5.0 (DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V2, GPT_OSS_120B_PRETRAIN_CONFIG_B300_FP8_MX_V2);
#   GPT-OSS-120B BF16 on GB300 (EP 64) and B300 (EP 64 at v0.3.0, EP 8 from v0.4.0) from v0.3.0;
# * [attn, mamba, moe_router, moe_preprocess]: Nemotron-3-Nano MXFP8 on GB300, GB200, B300 and B200 in every release
#   ([mamba] on H100); its Mamba and attention-only blocks are costed at their GPU time, so only its MoE layers'
#   routers change.
# DeepSeek-V3 on GB300 before v0.5.0 sets a scope but no implementation (no graphs); H100 presets and the B200 / B300
# DeepSeek-V3 and Qwen3-235B-A22B ones before v0.5.0 capture none.
_ROUTER_GRAPHS = ("moe_router", "moe_preprocess")
_ATTENTION_ROUTER_GRAPHS = ("attn", "moe_router", "moe_preprocess")
_HYBRIDEP = Preset(dispatcher="flex")
_FULL_ITERATION = (Preset(ep_overlap=True, dispatcher="flex", since=(26, 6), full_iteration_graphs=True),)
_GPT_OSS_RECOMPUTE = ("layernorm", "moe_act")
_ROUTER_PRESETS = (Preset(graphed_modules=_ROUTER_GRAPHS), *_FULL_ITERATION)
_ATTENTION_ROUTER_PRESETS = (Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS), *_FULL_ITERATION)
_NEMOTRON_GRAPHS = (Preset(graphed_modules=(*_ATTENTION_ROUTER_GRAPHS, "mamba")),)
PRESETS: dict[tuple[str, str, str, tuple[int, ...]], tuple[Preset, ...]] = {
    ("DeepSeek-V3", "GB300", "MXFP8", (1, 2, 8, 32, 2)): (Preset(("mla_up_proj",)),),
    ("DeepSeek-V3", "GB300", "MXFP8", (1, 2, 8, 32, 1)): (Preset(ep_overlap=True, full_iteration_graphs=True),),
    ("DeepSeek-V3", "B200", "MXFP8", (1, 8, 2, 32, 1)): (Preset(("mla_up_proj", "mlp"), ep_overlap=True),),
    ("DeepSeek-V3", "GB200", "MXFP8", (1, 4, 4, 64, 1)): (
        Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS),
        Preset(("mla_up_proj",), ep_overlap=True, since=(26, 6), full_iteration_graphs=True)),
    ("DeepSeek-V3", "B300", "MXFP8", (1, 8, 1, 8, 2)): (
        Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS, since=(26, 6)),),
    ("GPT-OSS-120B", "B200", "BF16", (1, 1, 1, 8, 4)): (
        Preset(_GPT_OSS_RECOMPUTE), Preset(_GPT_OSS_RECOMPUTE, dispatcher="flex", since=(26, 4))),
    ("GPT-OSS-120B", "B200", "BF16", (1, 1, 1, 64, 4)): (Preset(_GPT_OSS_RECOMPUTE),),
    ("GPT-OSS-120B", "GB200", "BF16", (1, 1, 1, 64, 4)): (
        Preset(_GPT_OSS_RECOMPUTE), Preset(_GPT_OSS_RECOMPUTE, ep_overlap=True, dispatcher="flex", since=(26, 4))),
    ("GPT-OSS-120B", "GB300", "BF16", (1, 1, 1, 64, 4)): (
        Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS, since=(26, 2)),),
    ("GPT-OSS-120B", "B300", "BF16", (1, 1, 1, 64, 4)): (
        Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS, since=(26, 2)),),
    ("GPT-OSS-120B", "B300", "BF16", (1, 1, 1, 8, 4)): (
        Preset(dispatcher="flex", since=(26, 4), graphed_modules=_ATTENTION_ROUTER_GRAPHS),),
    ("GPT-OSS-120B", "B300", "MXFP8", (1, 1, 1, 8, 4)): (
        Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS, since=(26, 6)),),
    ("GPT-OSS-120B", "H100", "BF16", (1, 4, 1, 8, 4)): (Preset(_GPT_OSS_RECOMPUTE, micro_batch=1),),
    ("GPT-OSS-120B", "GB300", "MXFP8", (1, 1, 1, 16, 4)): _FULL_ITERATION,
    ("GPT-OSS-120B", "GB200", "MXFP8", (1, 1, 1, 64, 4)): _FULL_ITERATION,
    ("Nemotron-3-Nano", "H100", "FP8", (1, 1, 1, 8, 1)): (
        Preset(("core_attn", "moe_act", "layernorm", "moe"), graphed_modules=("mamba",)),),
    **{("Nemotron-3-Nano", gpu, "MXFP8", (1, 1, 1, 8, micro_batch)): _NEMOTRON_GRAPHS
       for gpu, micro_batch in (("GB300", 4), ("GB200", 2), ("B300", 4), ("B200", 2))},
    ("Qwen3-235B-A22B", "H100", "FP8-CS", (2, 8, 4, 32, 1)): (Preset(ep_overlap=True),),
    ("Qwen3-30B-A3B", "H100", "FP8", (1, 2, 12, 8, 1)): (Preset(ep_overlap=True),),
    ("Qwen3-30B-A3B", "GB300", "MXFP8", (1, 1, 1, 8, 8)): _ROUTER_PRESETS,
    ("Qwen3-30B-A3B", "GB200", "MXFP8", (1, 1, 1, 8, 4)): _ROUTER_PRESETS,
    ("Qwen3-30B-A3B", "GB200", "FP8-MX", (1, 1, 1, 8, 4)): _ROUTER_PRESETS,
    ("Qwen3-30B-A3B", "B300", "MXFP8", (1, 1, 1, 8, 8)): (
        replace(_HYBRIDEP, since=(26, 2), graphed_modules=_ROUTER_GRAPHS), *_FULL_ITERATION),
    ("Qwen3-30B-A3B", "B200", "MXFP8", (1, 1, 1, 8, 4)): (
        Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS),
        replace(_HYBRIDEP, since=(26, 4), graphed_modules=_ATTENTION_ROUTER_GRAPHS)),
    **{("Qwen3-30B-A3B", "B200", precision, (1, 1, 1, 8, 1)): (Preset(graphed_modules=_ROUTER_GRAPHS),)
       for precision in ("MXFP8", "FP8-MX")},
    ("Qwen3-235B-A22B", "GB300", "MXFP8", (1, 4, 12, 32, 2)): _ATTENTION_ROUTER_PRESETS,
    ("Qwen3-235B-A22B", "GB200", "MXFP8", (1, 8, 3, 32, 1)): _ATTENTION_ROUTER_PRESETS,
    ("Qwen3-235B-A22B", "GB300", "MXFP8", (1, 4, 1, 32, 2)): (Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS),),
    ("Qwen3-235B-A22B", "GB200", "MXFP8", (1, 8, 1, 32, 1)): (Preset(graphed_modules=_ATTENTION_ROUTER_GRAPHS),),
}
_RELEASE = re.compile(r"NeMo (\d+)\.(\d+)(?:\.(\d+))? container")
_RECIPE_NAME = re.compile(r"\b\w+_pretrain_\w+_config\b")
_DISPATCHER_WORDS = re.compile(r"flex|hybridep|deepep|alltoall|a2a", re.IGNORECASE)


def _release(row: pd.Series) -> tuple[int, ...]:
    """The NeMo container release a row ran, e.g. (26, 4, 1) for "NeMo 26.04.01 container"; () when not stated."""
    stated = _RELEASE.search(str(row["framework_version"]))
    return tuple(int(part) for part in stated.groups() if part) if stated else ()


def _preset(row: pd.Series) -> Preset | None:
    """The performance preset that ran the row's model, GPU, precision and layout (`PRESETS`) in the row's release:
    the last whose `since` it has reached (a row stating no release reaches only ()), or None."""
    layout = tuple(_int(row, key) for key in ("tp", "pp", "vpp", "ep", "micro_batch"))
    presets = PRESETS.get((str(row["model"]), str(row["hardware"]).split()[0], str(row["precision"]), layout), ())
    release = _release(row)
    return next((preset for preset in reversed(presets) if release >= preset.since), None)


def _dispatch(row: pd.Series) -> tuple[str, bool]:
    """(dispatcher, EP overlap) a row states: its first-named dispatcher, else its release's preset's for its layout
    (`PRESETS`), else its model's on its GPU, else its model's (`MODEL_DISPATCHERS`), else alltoall; overlap if "EP
    overlap on", the HEAD recipe the row quotes for its settings turns it on (`EP_OVERLAP_RECIPES`) or the preset
    does."""
    routing = str(row["dispatcher_routing"])
    named = _DISPATCHER_WORDS.search(routing)
    preset = _preset(row)
    if named is not None:
        dispatcher = "alltoall" if named.group(0).lower() in ("alltoall", "a2a") else "flex"
    elif preset is not None and preset.dispatcher is not None:
        dispatcher = preset.dispatcher
    else:
        model, gpu = str(row["model"]), str(row["hardware"]).split()[0]
        dispatcher = MODEL_DISPATCHERS.get((model, gpu), MODEL_DISPATCHERS.get(model, "alltoall"))
    quoted = set(_RECIPE_NAME.findall(f"{row['recompute']} {row['notes']}"))
    return dispatcher, ("ep overlap on" in f"{routing} {row['notes']}".lower() or bool(quoted & EP_OVERLAP_RECIPES)
                        or (preset is not None and preset.ep_overlap))


def _number(value: object) -> float | None:
    try:
        number = float(str(value).split()[0])
    except (TypeError, ValueError, IndexError):
        return None
    return number if math.isfinite(number) else None


def _routing_why(row: pd.Series) -> str | None:
    """Why a row's routing is not the force-balanced dropless one time is scored on, or None."""
    routing = str(row["dispatcher_routing"]).lower()
    if "dropless" not in routing and ("tokendrop" in routing or "token-drop" in routing):
        return "token-dropping run: its capacity factor is not stated"
    if "balanc" not in routing:
        return "router not force-balanced: its load imbalance is not stated"
    return None


def _model_why(row: pd.Series) -> str | None:
    """Why a row's model is not planner's (superseded row, model not in the catalog, MTP layer), or None."""
    if str(row["status"]) != "current":
        return f"{row['status']} row (a later row of the same run is current)"
    if str(row["model"]) not in _CATALOG:
        return "model not in the catalog (Nemotron-3 Super/Ultra/3.5-Lightning, Kimi-K2, DeepSeek-V4, Qwen3-Next)"
    if "MTP" in str(row["notes"]):
        return "DeepSeek-V3 with its multi-token-prediction layer (not in the catalog model)"
    return None


def _setup_why(row: pd.Series) -> str | None:
    """Why planner cannot express a row's precision, GPU or layout, or None."""
    hardware = str(row["hardware"])
    if str(row["precision"]) not in BRIDGE_DTYPES:
        return f"precision {str(row['precision'])[:30]!r} not modelled (planner runs bf16, fp16 or fp8)"
    if bridge_gpu(hardware) is None:
        return f"GPU {hardware.split()[0]} not in the catalog"
    if any(_number(row[key]) is None for key in ("tp", "pp", "ep", "micro_batch", "global_batch")):
        return "parallel layout or batch not stated"
    return None


def _inexpressible(row: pd.Series) -> str | None:
    """Why planner cannot express a row's run at all (model, precision, GPU, layout), or None."""
    return _model_why(row) or _setup_why(row)


def _regression_why(row: pd.Series) -> str | None:
    """Why a row's time is not the kernels planner models, or None: the performance summary footnotes GPT-OSS-120B's
    26.06.01 rows as a known regression (cudnn-frontend issue 256, "resolved with the next container release"; the
    26.08 rows of the same layouts run 1.6 s faster), which the file's notes carry."""
    if "known perf regression" in str(row["notes"]):
        return "a known performance regression the source footnotes (cudnn-frontend issue 256)"
    return None


def _why(row: pd.Series) -> str | None:
    """Why planner does not time a row, or None: not expressible, routing not force-balanced, a footnoted
    performance regression, no time stated."""
    why = _model_why(row) or _routing_why(row) or _setup_why(row) or _regression_why(row)
    if why is None and _number(row["step_time_s"]) is None and _number(row["tokens_per_sec_per_gpu"]) is None:
        return "no step time or tokens/s stated"
    return why


def _documented_oom(row: pd.Series) -> bool:
    """Whether the row documents a run that ran out of memory (its notes say "OOM")."""
    return "OOM" in str(row["notes"])


# the short names rows use for Megatron-LM's recompute modules: the model zoo's RC column ("norm, act",
# "shared_expert"), the DeepSeek-V3 guide's "up_proj (MLA)"
_MODULE_ALIASES = {"norm": "layernorm", "act": "moe_act", "shared_expert": "shared_experts", "up_proj": "mla_up_proj"}
_MODULE_WORDS = re.compile(r"\b(" + "|".join((*RECOMPUTE_MODULES, *_MODULE_ALIASES)) + r")\b")


def _recompute(row: pd.Series) -> tuple[Recompute, tuple[str, ...]]:
    """(recompute, recompute_modules) a row states: 'full' → full; the Megatron-LM modules it names (or their short
    names) → selective recompute of those; nothing stated → its preset's modules (`PRESETS`), else none; anything
    else (none, 'selective []') → none."""
    text = str(row["recompute"]).strip().lower()
    preset = _preset(row)
    if text in ("", "nan") and preset is not None and preset.recompute_modules:
        return Recompute.SELECTIVE, preset.recompute_modules
    if text.startswith("full"):
        return Recompute.FULL, DEFAULT_RECOMPUTE_MODULES
    named = {_MODULE_ALIASES.get(word, word) for word in _MODULE_WORDS.findall(text)}
    if not named or text.startswith("none"):
        return Recompute.NONE, DEFAULT_RECOMPUTE_MODULES
    return Recompute.SELECTIVE, tuple(name for name in RECOMPUTE_MODULES if name in named)


def _int(row: pd.Series, key: str, default: int = 1) -> int:
    value = _number(row[key])
    return default if value is None else int(value)


def _run(row: pd.Series) -> Run:
    gpus, tp, pp, cp, ep = (_int(row, key) for key in ("num_gpus", "tp", "pp", "cp", "ep"))
    vpp = _int(row, "vpp")
    dp = gpus // (tp * pp * cp)
    dispatcher, ep_overlap = _dispatch(row)
    recompute, modules = _recompute(row)
    preset = _preset(row)
    micro_batch = preset.micro_batch if preset is not None and preset.micro_batch else _int(row, "micro_batch")
    config = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=_int(row, "etp"), vpp=vpp,
                            moe_dispatcher=dispatcher, moe_ep_overlap=ep_overlap,
                            micro_batch=micro_batch, sequence_parallel=tp > 1,
                            distributed_optimizer=dp * cp > 1, overlap_param_gather=True,
                            recompute=recompute, recompute_modules=modules,
                            schedule=Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B)
    graphs = "full_iteration" if preset is not None and preset.full_iteration_graphs else "none"
    training = Training(global_batch=_int(row, "global_batch"), seq_len=int(row["seq_len"]),
                        **bridge_precision(str(row["precision"])), attention="flash",
                        grad_bytes=BRIDGE_PERF_GRAD_BYTES, cuda_graphs=graphs,
                        cuda_graph_modules=preset.graphed_modules if preset is not None else ())
    config = with_recipe_fp8_params(config, training.fp8_recipe)
    step, throughput = _number(row["step_time_s"]), _number(row["tokens_per_sec_per_gpu"])
    # a documented OOM states no time: NaN, never scored for time
    iteration = step or (training.tokens_per_iteration / (throughput * gpus) if throughput else math.nan)
    gpu = bridge_gpu(str(row["hardware"])) or ""
    memory = _published_bytes(str(row["peak_memory"]))
    model = load_model(_CATALOG[str(row["model"])])
    label = f"{row['row_id']} {row['model']} {row['precision']} {gpus}x{gpu} {config.describe()}"
    # "peak allocated" rows publish torch.cuda.max_memory_allocated: the allocator's figure (Run.memory_in_allocator)
    return Run(MOE_FILE, label, model, bridge_cluster(gpus, gpu), training, config, iteration,
               memory, f"{MOE_FILE} row_id {row['row_id']}",
               memory_in_allocator="allocated" in str(row["peak_memory"]))


def _published_bytes(text: str) -> float | None:
    """'66.297 GB after iteration 1' → bytes (GB decimal, GiB binary); None when no figure leads the text."""
    number = _number(text)
    return None if number is None else number * (GIB if "GiB" in text.split()[1:2] else 1e9)


# The recompute study's Nemotron-3-Nano sweep ran its model's own router (not force-balanced) and says how much more
# its hottest ranks held than rank 0: "hot ranks had about 72.9 GiB allocated" (MBS-012, rank 0: 66.297 GB).
_HOT_RANK_READING = re.compile(r"hot ranks had about ([\d.]+) GiB allocated")


def _sweep(row: pd.Series) -> tuple[str, ...]:
    """What the runs of one published sweep share: model, GPUs, precision and layout (only recompute differs)."""
    return tuple(str(row[key]) for key in ("dataset", "model", "hardware", "num_gpus", "precision", "tp", "pp", "ep",
                                           "micro_batch", "seq_len"))


def hot_rank_load(row: pd.Series) -> float | None:
    """The busiest expert-parallel rank's routed tokens over the mean (`Training.moe_load_imbalance`) that a row's
    published hot-rank reading implies, or None where it publishes none: rank 0 taken at the mean load, the
    difference between the hot ranks' allocation and rank 0's peak is what the busiest rank's extra routed tokens
    hold, and planner's memory grows by `d` per unit of load (its routed activations), so the load is 1 + gap / d."""
    reading = _HOT_RANK_READING.search(f"{row['verification']} {row['notes']}")
    rank0 = _published_bytes(str(row["peak_memory"]))
    if reading is None or rank0 is None:
        return None
    run = _run(row)
    peaks = [estimate(run.model, run.cluster, replace(run.training, moe_load_imbalance=load), run.config)
             .peak_memory_bytes for load in (1.0, 2.0)]
    return 1.0 + (float(reading.group(1)) * GIB - rank0) / (peaks[1] - peaks[0])


def _documented_completion(row: pd.Series) -> bool:
    """Whether the row documents a run that completed (its notes say "outcome: completed")."""
    return "outcome: completed" in str(row["notes"])


class MoeRuns(NamedTuple):
    """The MoE file's rows as planner inputs: time-scored runs, skipped rows (with why), and the documented outcomes
    of runs whose time is not scored: out of memory (scored on being predicted not to fit) and completed (on being
    predicted to fit)."""

    runs: tuple[Run, ...]
    skipped: tuple[Skipped, ...]
    ooms: tuple[Run, ...]
    completions: tuple[Run, ...]


def moe_runs(rack_scale: bool = False) -> MoeRuns:
    """Force-balanced MoE runs on catalog models and GPUs, every other row with why it is skipped, and the documented
    outcomes planner can express whatever their router, as no time is scored: the runs that went out of memory, and
    the runs of a sweep that publishes its hot ranks' memory (`hot_rank_load`) that completed. A sweep that
    publishes that reading is estimated at the load it implies (its busiest rank is the one that runs out of
    memory); other documented OOMs under a balanced router. The H100 / H800 / B200 rows (issue 11's target), or
    with `rack_scale` the B300 / GB200 / GB300 ones."""
    frame = pd.read_csv(DATA / MOE_FILE)
    loads = {_sweep(row): load for _, row in frame.iterrows() if (load := hot_rank_load(row)) is not None}
    runs, skipped, ooms, completions = [], [], [], []
    for _, row in frame.iterrows():
        if str(row["hardware"]).startswith(_RACK_SCALE) != rack_scale:
            continue
        oom, load = _documented_oom(row), loads.get(_sweep(row))
        completed = load is not None and _documented_completion(row)
        why = _inexpressible(row) if oom or completed else _why(row)
        if why:
            skipped.append(Skipped(MOE_FILE, f"row_id {row['row_id']}", ("documented OOM; " if oom else "") + why))
            continue
        run = _run(row)
        if load is not None and (oom or completed):
            run = replace(run, training=replace(run.training, moe_load_imbalance=load))
        (ooms if oom else completions if completed else runs).append(run)
    return MoeRuns(tuple(runs), tuple(skipped), tuple(ooms), tuple(completions))
