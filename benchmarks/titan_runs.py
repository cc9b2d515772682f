"""torchtitan / torchao runs (the shared validation's common FSDP schema) as planner inputs.

Files (verbatim copies in benchmarks/data/, each row with its `source`): torchtitan's Dec-2024 H100
benchmarks, torchtitan's 2024 docs (64 A100; 405B on 128 H100) and torchao's float8/MXFP8 runs.
Settings a row does not state are torchtitan's defaults at the commits the rows name: FSDP2
FULL_SHARD over `dp_shard_degree` (= ZeRO-3), bf16 parameters with fp32 gradient reduction,
SDPA attention (FlashAttention-2, `--attention flash2`: torchtitan called SDPA with PyTorch's default backend order,
flash first, until it put cuDNN first on B200 in May 2025, pytorch/torchtitan 3b85aa31f, and on every GPU in October
2025, 6a3a9da95; so the B200 rows, of August 2025, ran cuDNN, `flash`), TP with sequence parallelism,
eager element-wise kernels where the row says it ran without torch.compile (`--elementwise eager`: the Dec-2024
rows ran torchtitan's eager RMSNorm module, norm_type "rmsnorm" in llama3_8b.toml @9dec370), local batch =
`micro_batch` per DP rank with
no gradient accumulation, and any float8 / MXFP8 recipe = fp8 GEMMs. "selective" activation
checkpointing is torchtitan's per-op SAC (`selective_recompute` "op"). The Dec-2024 H100s, and torchao's
(`_GRAND_TETON_FILES`), are Grand Teton's 96 GB HBM2e parts at 500 W (`H100-96GB-HBM2e`: 95 GiB at 2.4 TB/s, GEMMs
at the power limit's clocks).
The loss runs as the row's torchtitan ran it (`_cross_entropy`), and the published memory is torchtitan's
"memory: X GiB", PyTorch's max_memory_reserved (the files' memory_kind column): the caching allocator's peak,
without CUDA context or NCCL buffers.
Iteration time = global-batch tokens / (tokens/s/GPU × GPUs) (torchtitan divides by cp·tp·pp too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from benchmarks.validation_runs import DATA, Run, Skipped
from planner.cluster import Cluster, load_cluster
from planner.config import ParallelConfig, Recompute, Schedule, Training
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS
from planner.gpu import GIB
from planner.model import load_model

TORCHTITAN = FRAMEWORKS["torchtitan"]

__all__ = ["TITAN_FILES", "common_schema_run", "titan_runs"]

TITAN_FILES = ("torchtitan_benchmarks_llama3_h100_202412.csv", "torchtitan_docs_performance_2024_a100_and_405b.csv",
               "torchao_float8_mxfp8_torchtitan_benchmarks.csv")
_CATALOG = {("Llama 3", "8B"): "llama3-8b", ("Llama 3", "70B"): "llama3-70b", ("Llama 3", "405B"): "llama3-405b",
            ("Llama 2", "13B"): "llama2-13b", ("Llama 2", "70B"): "llama2-70b"}
_GPUS = (("MI300X", "MI300X"), ("GB200", ""), ("B200", "B200"), ("A100", "A100-80GB"), ("H100", "H100-80GB"),
         ("H200", "H200"))


@dataclass(frozen=True)
class _Row:
    """The fields of one common-schema row that planner needs, already parsed."""

    model: str
    gpu: str
    gpus: int
    dp_shard: int
    dp_replicate: int
    tp: int
    pp: int
    cp: int
    ep: int
    micro_batch: int
    global_batch: int
    seq_len: int
    checkpointing: str
    fp8_recipe: str | None  # Training.fp8_recipe of a float8 / MXFP8 row; None: BF16
    fp8_gather: bool  # FSDP all-gathers the float8 weights (torchao's enable_fsdp_float8_all_gather)
    tokens_per_s_per_gpu: float
    memory_gib: float | None
    async_tp: bool  # torchtitan's async tensor parallelism (the row's async_tp column says "yes")
    interleaved: bool  # pp_schedule "Interleaved 1F1B" (torchtitan's default: 2 stages per rank)
    eager: bool  # the row says it ran without torch.compile ("no"; "not stated" and toml defaults count as unknown)


def _catalog_name(model: str) -> str | None:
    """'Llama 3.1 8B' → llama3-8b; None for models outside the catalog (Llama 4 MoE)."""
    family = "Llama 3" if model.startswith("Llama 3") else "Llama 2" if model.startswith("Llama 2") else ""
    return _CATALOG.get((family, model.split()[-1]))


def _gpu(hardware: str) -> str:
    return next((name for key, name in _GPUS if key in hardware), "")


def _int(value: object, default: int) -> int:
    return default if pd.isna(value) else int(float(str(value).split()[0]))


# How the rows say the FSDP all-gather runs in float8: torchao's table ("with float8 FSDP all-gather") and the
# torchtitan docs' 405B preset (llama3_405b.toml: enable_fsdp_float8_all_gather); a row that does not say gathers bf16
_FP8_GATHER_NOTES = ("float8 fsdp all-gather", "enable_fsdp_float8_all_gather")


def _fp8_recipe(recipe: str) -> str | None:
    """Training.fp8_recipe of a row's recipe text (lower case): torchao's rowwise, rowwise_with_gw_hp and MXFP8
    as named, any other float8 as torchao's default, tensorwise (the torchtitan docs' and 2024-12 rows')."""
    if "mxfp8" in recipe:
        return "mxfp8"
    if "rowwise_with_gw_hp" in recipe:
        return "rowwise_with_gw_hp"
    if "rowwise" in recipe:
        return "rowwise"
    return "tensorwise" if "float8" in recipe or "fp8" in recipe else None


def _parse(row: pd.Series) -> _Row:
    dp_shard, micro_batch = _int(row["dp_shard_degree"], 1), _int(row["micro_batch"], 1)
    recipe = f"{row['low_precision_recipe']} {row['precision']}".lower()
    return _Row(str(row["model"]), _gpu(str(row["hardware"])), int(row["num_gpus"]), dp_shard,
                _int(row["dp_replicate_degree"], 1), _int(row["tp"], 1), _int(row["pp"], 1), _int(row["cp"], 1),
                _int(row["ep"], 1), micro_batch, _int(row["global_batch_seqs"], micro_batch * dp_shard),
                int(row["seq_len"]), str(row["activation_checkpointing"]).lower(),
                _fp8_recipe(recipe), any(note in recipe for note in _FP8_GATHER_NOTES),
                float(row["tokens_per_sec_per_gpu"]),
                None if pd.isna(row["peak_memory_gib"]) else float(row["peak_memory_gib"]),
                str(row["async_tp"]).strip().lower() == "yes", "interleaved" in str(row["pp_schedule"]).lower(),
                str(row["compile"]).strip().lower() == "no")


def _unsupported(row: _Row) -> str | None:
    """Why planner cannot express a row, or None."""
    if _catalog_name(row.model) is None:
        return ("Llama 4 MoE rows: a 2-layer debug model, or a GB200 job whose GPU count (512 in the table, 256 in "
                "its config) and recompute (per-op SAC intended, off by a bug) the source leaves unsettled")
    reasons = {"torchtitan per-layer SAC (every k-th block recomputed) has no planner equivalent":
                   "selective layer" in row.checkpointing,
               "GPU not in the catalog": not row.gpu}
    return next((why for why, applies in reasons.items() if applies), None)


def _recompute(checkpointing: str) -> Recompute:
    if checkpointing.startswith("full"):
        return Recompute.FULL
    return Recompute.SELECTIVE if checkpointing.startswith("selective") else Recompute.NONE


# torchao's H100 rows say only "H100" ("variant not stated"); they are taken to be Meta's Grand Teton H100s, as
# torchtitan's benchmarks by the same PyTorch team name theirs. The evidence: the rows were added by a Meta author
# (pytorch/ao 8c81863ba, March 2025) running torchtitan on a PyTorch 2.7.0a0 main-branch build, and the same team's
# float8 microbenchmark of Llama-3-70B's tp-8 linears on "H100" (pytorch/ao#2185, May 2025) runs a BF16
# 16384 x 8192 x 7168 linear's three GEMMs (5.77 TFLOP) in 9.871 ms, 585 TFLOP/s: 74 % of the H100 SXM's
# 794.5 TFLOP/s MAMF, the rate planner gives Grand Teton's 500 W part (586) where a 700 W H100 SXM's is 656.
# The same bf16 step reads 6150 tokens/s per GPU at micro-batch 1 there against 6667 at micro-batch 2 on the
# Grand Teton machines of the Dec-2024 rows.
_GRAND_TETON_FILES = (TITAN_FILES[2],)


def _cluster(row: _Row, hardware: str, file: str) -> Cluster:
    """The row's GPUs in nodes of 8; Grand Teton's H100s (`H100-96GB-HBM2e`) where a Dec-2024 row says "HBM2e" or
    a torchao row says H100 (`_GRAND_TETON_FILES`)."""
    teton = "HBM2e" in hardware or file in _GRAND_TETON_FILES
    gpu = "H100-96GB-HBM2e" if row.gpu == "H100-80GB" and teton else row.gpu
    return load_cluster(f"{max(row.gpus // 8, 1)}x{min(row.gpus, 8)}x{gpu}")


# torchtitan before pytorch/torchtitan 5e2033c75 (2025-04-07) split the local batch into as many pipeline
# micro-batches as pipeline ranks (experimental.pipeline_parallel_microbatches defaulted to the PP degree); from
# then on into micro-batches of pipeline_parallel_microbatch_size = 1 sequence. The Dec-2024 benchmarks ran 9dec370.
_PP_DEGREE_MICROBATCH_FILES = (TITAN_FILES[0],)


def _micro_batch(file: str, row: _Row) -> int:
    """Sequences per micro-batch: the local batch without PP, else as the row's torchtitan split it."""
    if row.pp == 1:
        return row.micro_batch
    return row.micro_batch // row.pp if file in _PP_DEGREE_MICROBATCH_FILES else 1


# torchtitan commits the rows name that compile the loss when training.compile is set (torchtitan/components/loss.py
# `build_cross_entropy_loss`, since pytorch/torchtitan bbb1b616e of 2025-04-02): the torchao MI300X and B200 rows of
# August 2025. Earlier ones run it eagerly: 9dec370 (the Dec-2024 benchmarks) leaves `torch.compile(loss_fn)`
# commented out ("compiling loss function causes CUDA errors"), the 2024 docs predate it, and torchao's H100 rows ran
# torchtitan 0.0.2 on a PyTorch 2.7.0a0 nightly, a main-branch build from before the 2.7 branch cut (March 2025).
# With TP the loss runs under DTensor's loss_parallel: the same eager ops, each rank over its vocabulary shard.
# The held-out June-2025 pages (benchmarks/titan_heldout.py) ran 820504e and e7c0cae, both after bbb1b616e.
_COMPILED_LOSS_COMMITS = ("2c8b5947991239913d67e2f7d22a255c3e2a9694", "6fc499f6f5b32151a799188be2208cfb09faed30",
                          "820504e20d1149fbf0b98c567af24c4b0433b22d", "e7c0cae934df78d6e9c2835f42ff1f757dc3fddc")


def _cross_entropy(frame_row: pd.Series, row: _Row) -> str:
    """How the row's torchtitan ran its loss (Training.cross_entropy)."""
    version = str(frame_row["framework_version"])
    compiled = not row.eager and any(commit in version for commit in _COMPILED_LOSS_COMMITS)
    return "compiled" if compiled else "eager"


def _run(file: str, frame_row: pd.Series, row: _Row) -> Run:
    # B200 rows (torchtitan 6fc499f) ran cuDNN attention, which that torchtitan's per-op SAC save list does not name
    # (it added every SDPA backend in b39377f9f, 2025-12-01): the attention runs again in backward, output not kept
    cudnn = row.gpu == "B200"
    training = Training(global_batch=row.global_batch, seq_len=row.seq_len, dtype="fp8" if row.fp8_recipe else "bf16",
                        fp8_recipe=row.fp8_recipe, fp8_saved_input=TORCHTITAN.fp8_saved_input,
                        fp8_tp_gather=TORCHTITAN.gathers_tp_in_fp8(row.fp8_recipe),
                        attention="flash" if cudnn else "flash2", grad_bytes=4,
                        elementwise="eager" if row.eager else "fused", cross_entropy=_cross_entropy(frame_row, row))
    # torchtitan's execution semantics (planner.frameworks): its TP backward has no async all-reduce hidden behind
    # the wgrad GEMMs, and "selective" is its per-op SAC; async TP pipelines the sequence-parallel collectives.
    # With PP the row's micro_batch is torchtitan's local batch, split into pipeline micro-batches as the
    # row's torchtitan split it (_micro_batch). FSDP shards over dp_shard·cp (HSDP: the dp_replicate
    # groups all-reduce).
    dp = row.dp_shard * row.dp_replicate
    sharded = row.dp_shard * row.cp > 1
    if row.pp > 1:
        training = replace(training, global_batch=row.micro_batch * dp)
    config = TORCHTITAN.runs(ParallelConfig(
        dp=dp, tp=row.tp, pp=row.pp, cp=row.cp, cp_comm="all-gather",  # torchtitan's default
        micro_batch=_micro_batch(file, row), vpp=2 if row.interleaved else 1,
        schedule=Schedule.INTERLEAVED if row.interleaved else Schedule.ONE_F_ONE_B,
        hsdp_replicas=row.dp_replicate if sharded else 1, sequence_parallel=row.tp > 1,
        zero_stage=3 if sharded else 0, recompute=_recompute(row.checkpointing),
        fp8_param_gather=row.fp8_gather and sharded,
        tp_comm_overlap=row.async_tp and row.tp > 1, sac_keeps_attention=not cudnn))
    iteration = training.tokens_per_iteration / (row.tokens_per_s_per_gpu * row.gpus)
    memory = None if row.memory_gib is None else row.memory_gib * GIB
    cluster = _cluster(row, str(frame_row["hardware"]), file)
    label = f"row{frame_row['row_id']} {row.model} s{row.seq_len} {row.gpus}x{cluster.gpu.name} {config.describe()}"
    return Run(file, label, load_model(_catalog_name(row.model) or ""), cluster, training, config, iteration, memory,
               f"{file} row_id {frame_row['row_id']}", memory_in_allocator=True)


def common_schema_run(source: str, fields: dict[str, object]) -> Run:
    """One run stated in the common FSDP schema's columns (a validation file's row, or a held-out page's run
    written as one), as planner estimates it; `source` names where it came from."""
    frame_row = pd.Series(fields)
    row = _parse(frame_row)
    why = _unsupported(row)
    if why:
        raise PlannerError(f"{source} row {fields.get('row_id')}: {why}")
    return _run(source, frame_row, row)


def titan_runs(file: str) -> tuple[tuple[Run, ...], tuple[Skipped, ...]]:
    """Runs of one common-schema file planner can express, and the rows it cannot (with why)."""
    runs, skipped = [], []
    frame = pd.read_csv(DATA / file)
    # a recipe given as "(as above)" is the previous row's (the torchtitan docs' Float8 + Async TP row)
    recipe = frame["low_precision_recipe"]
    as_above = recipe.str.contains("as above", na=False)
    frame.loc[as_above, "low_precision_recipe"] = recipe.shift()[as_above]
    for _, frame_row in frame.iterrows():
        row = _parse(frame_row)
        why = _unsupported(row)
        if why:
            skipped.append(Skipped(file, f"row_id {frame_row['row_id']}", why))
        else:
            runs.append(_run(file, frame_row, row))
    return tuple(runs), tuple(skipped)
