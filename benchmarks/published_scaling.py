"""Held-out check: the most cited large training runs, never fitted: Megatron-LM's 2021 weak scaling and 2022
recompute study and Megatron-Turing NLG 530B on A100, and Llama 3 405B on up to 16,384 H100.

* **Narayanan et al. 2021, Table 1** (arXiv:2104.04473, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM"): ten GPT models from 1.7B to 1T parameters on 32 to 3,072 A100 80GB GPUs of Selene
  (DGX A100, 8 × 200 Gb/s HDR InfiniBand per node): heads, hidden size, layers, tensor and pipeline-parallel
  sizes, GPUs, batch, teraFLOP/s per GPU and the aggregate petaFLOP/s. The paper states the rest: sequence 2,048,
  vocabulary 51,200, mixed precision (FP16), every layer's activations recomputed (its eq. 3 counts the recomputed
  forward, and its teraFLOP/s are eq. 3's FLOPs over the measured time, so a row's seconds per iteration are eq. 3
  over rate × GPUs). The shapes reproduce each row's parameter count and the rates its aggregate column
  (tests/test_published_scaling.py), which checks the transcription.
* **Korthikanti et al. 2022, Tables 3 and 5** (arXiv:2205.05198, "Reducing Activation Recomputation in Large
  Transformer Models"): 22B, 175B, 530B and 1T GPTs on 8 to 512 A100 of the same cluster, tensor parallel 8, no
  data parallelism, the same vocabulary and sequence, each timed end to end (seconds per iteration) with every
  layer recomputed and with sequence parallelism and selective recompute; the table's throughput increase and MFU
  check the transcription. The 22B model's layers are in the calibration set (Table 4, one layer's times); its
  iterations are not.
* **Megatron-Turing NLG 530B** (Smith et al. 2022, arXiv:2201.11990, its system-performance table): the 529.6B
  GPT above, trained with Megatron-DeepSpeed (DeepSpeed's pipeline engine, 1F1B) at tensor parallel 8 and pipeline
  35 on 280, 350 and 420 DGX A100 nodes of Selene, 1,920 sequences of 2,048 tokens per iteration, BF16, every
  layer recomputed: seconds per iteration and teraFLOP/s per GPU (eq. 3's FLOPs over the one and the GPUs give the
  other, which checks the transcription). On the same model and cluster, the Megatron-LM of the other two papers
  ran 280 micro-batches per replica in 49.05 s (Korthikanti's 530B run) where DeepSpeed's engine took 60.1 s for
  240: about 15 ms more per layer and micro-batch, what BLOOM's sweep shows on the same engine on Jean Zay.
  Planner charges it as DeepSpeed's legacy pipeline engine (`deepspeed_legacy_pipeline`, its constant fitted on
  BLOOM alone, docs/accuracy.md), so these runs hold that constant out; without it planner's fastest layout
  here is 18-21 % too fast.
* **Llama 3 405B** (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4; the same figures on the SC'24
  slides): 8,192 and 16,384 H100 (80 GB, 400 Gb/s per GPU), tensor parallel 8, pipeline 16, context parallel 1 or
  16 (data parallel the rest), 16M tokens per batch of 8K or 128K-token sequences, BF16, teraFLOP/s per GPU (the
  product of the degrees is the GPUs, and 16M tokens the replicas' sequences). The paper does not define its
  FLOPs: they are taken in planner's convention, PaLM's (6·parameters + 12·layers·hidden·sequence per token,
  every attention score counted, causal or not). In torchtitan's (Meta's own trainer: half that attention term)
  the 8K rows' seconds would be 3.9 % fewer and the 128K row's 28.6 % fewer, planner 38 % slow on it; that row's
  error rests on the convention.

No table states the micro-batch or the interleaving (nor Meta's recompute or optimizer sharding): planner searches
them at each run's published degrees and its fastest plan is compared with the published run, as
benchmarks/mcore_scaling.py does for Megatron-LM's 2024 H100 table. Megatron-LM as of the 2021 paper
(NVIDIA/Megatron-LM a8d172b, 2021-04-28) had no sequence parallelism, distributed optimizer or TP communication
overlap, all-reduced the gradients after the whole backward (`train_step` under `--DDP-impl local`, its default;
overlapping them would make planner 3 points faster on Table 1 on average) and asked the interleaved schedule for a
micro-batch count divisible by the pipeline size; the search over both papers' runs is held to that, with each
run's recompute and sequence parallelism (the 2022 runs have no data parallelism to overlap). Llama 3's rows are
planned as Megatron-LM runs them today. A negative error is planner's optimism, or a faster layout than the one
the authors ran. MT-NLG's runs are planned as DeepSpeed's engine runs them (framework "deepspeed", its legacy
release of 2021), without sequence parallelism.

    PYTHONPATH=. python -m benchmarks.published_scaling [--runs]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from benchmarks.accuracy import held_out_line
from benchmarks.mcore_scaling import GPUS_PER_NODE, GptLayout, ScalingRow, eight_gpu_nodes, fastest_megatron_plan
from benchmarks.validation_runs import narayanan_eq3_flops
from planner.cluster import Cluster
from planner.config import ParallelConfig, Recompute, Training, deepspeed_legacy_pipeline
from planner.cost.estimate import Estimate, estimate, model_flops_per_iteration
from planner.errors import PlannerError
from planner.model import ModelSpec, load_model
from planner.profile.calibration import default_calibration
from planner.search.space import FixedOptions, enumerate_configs

__all__ = ["KORTHIKANTI_ROWS", "LLAMA3_ROWS", "LLAMA3_TOKENS_PER_BATCH", "MEGATRON_2021_ROWS",
           "MEGATRON_2021_SEQ_LEN", "MEGATRON_2021_VOCAB", "MT_NLG", "MT_NLG_GLOBAL_BATCH", "MT_NLG_ROWS",
           "EarlyMegatronRun", "Llama3Row", "MtNlgRow", "PublishedRun", "RecomputeRow", "early_megatron_fastest",
           "early_megatron_gpt", "early_megatron_layouts", "fastest_fitting", "korthikanti_published_runs",
           "korthikanti_runs", "llama3_published_s", "llama3_runs", "llama3_training", "megatron_2021_model",
           "megatron_2021_published_s", "megatron_2021_run", "megatron_2021_runs", "megatron_2021_training",
           "mt_nlg_layouts", "mt_nlg_model", "mt_nlg_runs", "mt_nlg_training"]


MEGATRON_2021_SEQ_LEN = 2048
MEGATRON_2021_VOCAB = 51200
MEGATRON_2021_ROWS = (  # Table 1 as printed; dp = GPUs / (tp · pp)
    ScalingRow("1.7B", 24, 2304, 24, 1, 1, 32, 32, 512, 137, 4.4),
    ScalingRow("3.6B", 32, 3072, 30, 2, 1, 32, 64, 512, 138, 8.8),
    ScalingRow("7.5B", 32, 4096, 36, 4, 1, 32, 128, 512, 142, 18.2),
    ScalingRow("18.4B", 48, 6144, 40, 8, 1, 32, 256, 1024, 135, 34.6),
    ScalingRow("39.1B", 64, 8192, 48, 8, 2, 32, 512, 1536, 138, 70.8),
    ScalingRow("76.1B", 80, 10240, 60, 8, 4, 32, 1024, 1792, 140, 143.8),
    ScalingRow("145.6B", 96, 12288, 80, 8, 8, 24, 1536, 2304, 148, 227.1),
    ScalingRow("310.1B", 128, 16384, 96, 8, 16, 15, 1920, 2160, 155, 297.4),
    ScalingRow("529.6B", 128, 20480, 105, 8, 35, 9, 2520, 2520, 163, 410.2),
    ScalingRow("1008.0B", 160, 25600, 128, 8, 64, 6, 3072, 3072, 163, 502.0),
)


@dataclass(frozen=True)
class Llama3Row:
    """One row of the Llama 3 paper's Table 4: its GPUs, degrees, sequence, sequences per replica and rate."""

    gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    seq_len: int
    sequences_per_replica: int
    tflops_per_gpu: float


LLAMA3_TOKENS_PER_BATCH = 16 * 2**20  # the table's "16M"
LLAMA3_ROWS = (
    Llama3Row(8192, 8, 1, 16, 64, 8192, 32, 430),
    Llama3Row(16384, 8, 1, 16, 128, 8192, 16, 400),
    Llama3Row(16384, 8, 16, 16, 8, 131072, 16, 380),
)


@dataclass(frozen=True)
class RecomputeRow(GptLayout):
    """One model of Korthikanti et al. 2022: Table 3's configuration and Table 5's seconds per iteration with every
    layer recomputed and with sequence parallelism and selective recompute, and that table's throughput increase and
    MFU (the last two check the transcription)."""

    gpus: int
    global_batch: int
    full_recompute_s: float
    selective_s: float
    throughput_increase_percent: float
    mfu_percent: float


KORTHIKANTI_ROWS = (
    RecomputeRow("22B", 64, 6144, 48, 8, 1, 8, 4, 1.42, 1.10, 29.0, 41.5),
    RecomputeRow("175B", 96, 12288, 96, 8, 8, 64, 64, 18.13, 13.75, 31.8, 51.4),
    RecomputeRow("530B", 128, 20480, 105, 8, 35, 280, 280, 49.05, 37.83, 29.7, 56.0),
    RecomputeRow("1T", 160, 25600, 128, 8, 64, 512, 512, 94.42, 71.49, 32.1, 56.3),
)


@dataclass(frozen=True)
class MtNlgRow:
    """One column of the MT-NLG paper's system-performance table: nodes of 8 A100, seconds per iteration, and the
    teraFLOP/s per GPU (which, with eq. 3's FLOPs of a 1,920-sequence batch, checks the transcription)."""

    nodes: int
    iteration_s: float
    tflops_per_gpu: float


MT_NLG_GLOBAL_BATCH = 1920
MT_NLG_DEEPSPEED = "0.5"  # trained in the second half of 2021: DeepSpeed v0.5 (2021-08) was that period's release
MT_NLG = GptLayout("530B", 128, 20480, 105, 8, 35)  # the paper's model and its tensor and pipeline sizes
MT_NLG_ROWS = (MtNlgRow(280, 60.1, 126), MtNlgRow(350, 50.2, 121), MtNlgRow(420, 44.4, 113))


@dataclass(frozen=True)
class PublishedRun:
    """A published run against planner's fastest plan at its degrees."""

    label: str
    published_s: float
    planned: ParallelConfig
    predicted: Estimate

    @property
    def error(self) -> float:
        return self.predicted.iteration_time_s / self.published_s - 1


def early_megatron_gpt(layout: GptLayout, source: str) -> ModelSpec:
    """A GPT as Megatron-LM built it in 2021-22: GPT-3's block (4h GeLU MLP, LayerNorm, biases, learned positions,
    dropout), tied 51,200-token embeddings, 2,048 positions."""
    return ModelSpec(name=f"gpt-{layout.size.lower()}", num_layers=layout.layers, hidden_size=layout.hidden,
                     num_attention_heads=layout.heads, ffn_hidden_size=4 * layout.hidden,
                     vocab_size=MEGATRON_2021_VOCAB, max_position_embeddings=MEGATRON_2021_SEQ_LEN,
                     activation="gelu", normalization="layernorm", position_embedding="learned",
                     tie_embeddings=True, linear_bias=True, dropout=True, source=source)


def megatron_2021_model(row: ScalingRow) -> ModelSpec:
    return early_megatron_gpt(row, "Narayanan et al. 2021 Table 1")


def megatron_2021_training(row: ScalingRow) -> Training:
    """The row's batch in FP16 on Megatron-LM's fused softmax (no fused attention kernel in 2021)."""
    return Training(global_batch=row.global_batch, seq_len=MEGATRON_2021_SEQ_LEN, dtype="fp16", attention="unfused")


def megatron_2021_published_s(row: ScalingRow) -> float:
    """Seconds per iteration the row's teraFLOP/s imply: eq. 3's FLOPs (recompute counted) over rate × GPUs."""
    flops = narayanan_eq3_flops(megatron_2021_model(row), row.global_batch, MEGATRON_2021_SEQ_LEN)
    return flops / (row.tflops_per_gpu * 1e12 * row.gpus)


@dataclass(frozen=True)
class EarlyMegatronRun:
    """A run of the Megatron-LM of 2021-22 as its paper gives it: model, A100 GPUs, batch, the tensor, pipeline and
    data-parallel sizes, and the recompute and sequence parallelism it ran."""

    model: ModelSpec
    training: Training
    gpus: int
    tp: int
    pp: int
    dp: int
    recompute: Recompute
    sequence_parallel: bool = False

    @property
    def cluster(self) -> Cluster:
        return eight_gpu_nodes(self.gpus, "A100-80GB")


def early_megatron_layouts(run: EarlyMegatronRun) -> Iterator[ParallelConfig]:
    """Every micro-batch and interleaving Megatron-LM runs at the run's degrees, recompute and sequence parallelism,
    as the Megatron-LM of 2021-22 ran them: no distributed optimizer or TP overlap, gradients all-reduced after the
    backward, interleaving only over a multiple of pp micro-batches."""
    fixed = FixedOptions(tp=run.tp, pp=run.pp, dp=run.dp, recompute=run.recompute,
                         sequence_parallel=run.sequence_parallel, distributed_optimizer=False, zero_stage=0,
                         tp_comm_overlap=False, framework="megatron")
    for config in enumerate_configs(run.model, run.cluster, run.training, fixed):
        micro_batches = run.training.global_batch // (run.dp * config.micro_batch)
        if config.vpp == 1 or micro_batches % run.pp == 0:
            yield replace(config, overlap_grad_reduce=False)


def fastest_fitting(model: ModelSpec, cluster: Cluster, training: Training,
                    layouts: Iterable[ParallelConfig]) -> tuple[ParallelConfig, Estimate]:
    """The layout of `layouts` planner estimates fastest among those that fit, with its estimate."""
    calibration = default_calibration()
    estimated = [(config, estimate(model, cluster, training, config, calibration=calibration)) for config in layouts]
    fitting = [(config, result) for config, result in estimated if result.fits]
    if not fitting:
        raise PlannerError(f"{model.name}: none of the {len(estimated)} layouts searched fits {cluster.num_gpus} GPUs")
    return min(fitting, key=lambda pair: pair[1].iteration_time_s)


def early_megatron_fastest(run: EarlyMegatronRun) -> tuple[ParallelConfig, Estimate]:
    """Planner's fastest layout that fits among `early_megatron_layouts`."""
    return fastest_fitting(run.model, run.cluster, run.training, early_megatron_layouts(run))


def megatron_2021_run(row: ScalingRow) -> EarlyMegatronRun:
    """The row as it ran: every layer recomputed, no sequence parallelism (it did not exist yet)."""
    return EarlyMegatronRun(megatron_2021_model(row), megatron_2021_training(row), row.gpus, row.tp, row.pp, row.dp,
                            Recompute.FULL)


def megatron_2021_runs() -> tuple[PublishedRun, ...]:
    """Each Table 1 row against planner's fastest layout of it."""
    runs = []
    for row in MEGATRON_2021_ROWS:
        config, best = early_megatron_fastest(megatron_2021_run(row))
        runs.append(PublishedRun(f"{row.size:7s} {row.gpus:5d} A100  tp={row.tp} pp={row.pp} dp={row.dp}",
                                 megatron_2021_published_s(row), config, best))
    return tuple(runs)


def korthikanti_runs(row: RecomputeRow) -> tuple[EarlyMegatronRun, EarlyMegatronRun]:
    """The row's two runs: every layer recomputed without sequence parallelism, and sequence parallelism with
    selective recompute (the attention core's)."""
    model = early_megatron_gpt(row, "Korthikanti et al. 2022 Table 3")
    training = Training(global_batch=row.global_batch, seq_len=MEGATRON_2021_SEQ_LEN, dtype="bf16",
                        attention="unfused")
    dp = row.gpus // (row.tp * row.pp)
    return (EarlyMegatronRun(model, training, row.gpus, row.tp, row.pp, dp, Recompute.FULL),
            EarlyMegatronRun(model, training, row.gpus, row.tp, row.pp, dp, Recompute.SELECTIVE, True))


def korthikanti_published_runs() -> tuple[PublishedRun, ...]:
    """Each Table 5 run against planner's fastest layout of it."""
    runs = []
    for row in KORTHIKANTI_ROWS:
        for run, published in zip(korthikanti_runs(row), (row.full_recompute_s, row.selective_s), strict=True):
            config, best = early_megatron_fastest(run)
            what = "sp, selective" if run.sequence_parallel else "full recompute"
            runs.append(PublishedRun(f"{row.size:5s} {row.gpus:4d} A100  tp={row.tp} pp={row.pp} {what:14s}",
                                     published, config, best))
    return tuple(runs)


def mt_nlg_model() -> ModelSpec:
    """Megatron-Turing NLG 530B: 105 layers, hidden 20,480, 128 heads, the GPT of Narayanan et al.'s 529.6B row."""
    return early_megatron_gpt(MT_NLG, "Smith et al. 2022 (MT-NLG)")


def mt_nlg_training() -> Training:
    """1,920 sequences of 2,048 tokens in BF16, Megatron-LM's fused softmax."""
    return Training(global_batch=MT_NLG_GLOBAL_BATCH, seq_len=MEGATRON_2021_SEQ_LEN, dtype="bf16",
                    attention="unfused")


def mt_nlg_layouts(row: MtNlgRow) -> Iterator[ParallelConfig]:
    """Every layout DeepSpeed's pipeline engine runs at tp 8, pp 35 and the nodes' data parallelism, every layer
    recomputed, without sequence parallelism (not yet in 2021), on the legacy engine of its 2021 release."""
    dp = row.nodes * GPUS_PER_NODE // (MT_NLG.tp * MT_NLG.pp)
    fixed = FixedOptions(tp=MT_NLG.tp, pp=MT_NLG.pp, dp=dp, recompute=Recompute.FULL, sequence_parallel=False,
                         framework="deepspeed")
    legacy = deepspeed_legacy_pipeline(MT_NLG_DEEPSPEED)
    for config in enumerate_configs(mt_nlg_model(), eight_gpu_nodes(row.nodes * GPUS_PER_NODE, "A100-80GB"),
                                    mt_nlg_training(), fixed):
        yield replace(config, legacy_pipeline_engine=legacy)


def mt_nlg_runs() -> tuple[PublishedRun, ...]:
    """Each column against planner's fastest of `mt_nlg_layouts`."""
    runs = []
    for row in MT_NLG_ROWS:
        gpus = row.nodes * GPUS_PER_NODE
        config, best = fastest_fitting(mt_nlg_model(), eight_gpu_nodes(gpus, "A100-80GB"), mt_nlg_training(),
                                       mt_nlg_layouts(row))
        runs.append(PublishedRun(f"530B {gpus:5d} A100  tp={config.tp} pp={config.pp} dp={config.dp}",
                                 row.iteration_s, config, best))
    return tuple(runs)


def llama3_training(row: Llama3Row) -> Training:
    """16M tokens per batch of the row's sequences, BF16 on cuDNN attention."""
    return Training(global_batch=row.dp * row.sequences_per_replica, seq_len=row.seq_len, dtype="bf16",
                    attention="flash")


def llama3_published_s(row: Llama3Row, model: ModelSpec) -> float:
    """Seconds per iteration the row's teraFLOP/s imply, in planner's (PaLM's) FLOP convention."""
    return model_flops_per_iteration(model, llama3_training(row)) / (row.tflops_per_gpu * 1e12 * row.gpus)


def llama3_runs() -> tuple[PublishedRun, ...]:
    """Each Table 4 row against planner's fastest plan at its degrees, as Megatron-LM runs it."""
    model, runs = load_model("llama3-405b"), []
    for row in LLAMA3_ROWS:
        best = fastest_megatron_plan(model, row.gpus, "H100-80GB", llama3_training(row), row.tp, row.pp, row.dp,
                                     row.cp)
        label = f"405B {row.gpus:5d} H100  tp={row.tp} pp={row.pp} cp={row.cp} dp={row.dp} seq {row.seq_len}"
        runs.append(PublishedRun(label, llama3_published_s(row, model), best.config, best.estimate))
    return tuple(runs)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", action="store_true", help="print every row's comparison, not only the summaries")
    args = parser.parse_args(argv)
    tables = (("Narayanan 2021 Table 1 weak scaling (A100, Megatron-LM), planner's fastest plan", megatron_2021_runs()),
              ("Korthikanti 2022 Table 5, full vs selective recompute (A100), planner's fastest plan",
               korthikanti_published_runs()),
              ("MT-NLG 530B (A100, DeepSpeed pipeline engine), planner's fastest plan", mt_nlg_runs()),
              ("Llama 3 405B Table 4 (H100, 8K-16K GPUs), planner's fastest plan", llama3_runs()))
    width = max(len(title) for title, _ in tables)
    for title, runs in tables:
        if args.runs:
            for run in runs:
                print(f"{run.label}  published {run.published_s:7.3f} s  planner's fastest "
                      f"{run.predicted.iteration_time_s:7.3f} s ({run.planned.describe()})  {100 * run.error:+6.1f} %")
        print(held_out_line(title.ljust(width), [run.error for run in runs]))


if __name__ == "__main__":
    main()
