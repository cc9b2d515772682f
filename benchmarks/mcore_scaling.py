"""Held-out check: Megatron-LM's H100 weak-scaling table (Megatron-Core r0.8.0), never fitted.

NVIDIA/Megatron-LM's README, "Weak Scaling Results" (commit f2e5db402c, 2024-07-15, images/model_table.png), lists
nine GPT models from 1.7B to 462B parameters trained on 48 to 6,144 H100 GPUs: heads, hidden size, layers, tensor,
pipeline and data-parallel sizes, global batch, per-GPU teraFLOP/s and the aggregate petaFLOP/s. The README states
the rest: vocabulary 131,072, sequence 4,096, data-parallel, tensor-parallel and pipeline communication overlapped
(`--overlap-grad-reduce`, `--overlap-param-gather`, `--tp-comm-overlap`), throughput end to end. The table is an
image, so its rows are transcribed here; the aggregate column (per-GPU rate × GPUs) checks the transcription
(tests/test_mcore_scaling.py). Its teraFLOP/s are Megatron-LM's `num_floating_point_operations`, which for these
GPT shapes equals planner's model FLOPs (`model_flops_per_iteration`, tested), so a row's seconds per iteration are
those FLOPs over the per-GPU rate times the GPUs.

The models are GPT-3's shape (4h GeLU MLP, LayerNorm, biases, learned positions; the table's parameter counts need
untied embeddings) with Megatron-LM's default dropout, in BF16 (the table's MFU is the BF16 peak's share) on cuDNN
attention. The table does not state the micro-batch, interleaving or recompute, NVIDIA's tuned choices: planner
searches them at the table's tensor, pipeline and data-parallel sizes, as Megatron-LM runs them, and its fastest
plan is compared with the published run. A cost model right about every layout finds the published time, or less
where NVIDIA's choice was not the fastest; a negative error is that much optimism or a faster layout than NVIDIA's.

    PYTHONPATH=. python -m benchmarks.mcore_scaling [--runs]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.accuracy import held_out_line
from planner.cluster import Cluster, parse_shorthand
from planner.config import Training
from planner.cost.estimate import model_flops_per_iteration
from planner.model import ModelSpec
from planner.profile.calibration import default_calibration
from planner.search.planning import plan
from planner.search.search import RankedPlan
from planner.search.space import FixedOptions

__all__ = ["GPUS_PER_NODE", "ROWS", "SEQ_LEN", "VOCAB", "GptLayout", "ScalingRow", "eight_gpu_nodes",
           "fastest_megatron_plan", "fastest_plan", "published_iteration_s", "row_model", "row_training"]

SEQ_LEN = 4096
VOCAB = 131072
GPUS_PER_NODE = 8  # DGX A100 and H100, Meta's Grand Teton


@dataclass(frozen=True)
class GptLayout:
    """A published GPT run's model (its size label, heads, hidden size, layers) and tensor and pipeline sizes."""

    size: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int


@dataclass(frozen=True)
class ScalingRow(GptLayout):
    """One row of the table, as printed."""

    dp: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float
    aggregate_pflops: float


ROWS = (
    ScalingRow("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 19.6),
    ScalingRow("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 44.7),
    ScalingRow("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 93.9),
    ScalingRow("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 176.5),
    ScalingRow("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 322.3),
    ScalingRow("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 645.9),
    ScalingRow("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 997.2),
    ScalingRow("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 1457.4),
    ScalingRow("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 2825.6),
)


def row_model(row: ScalingRow) -> ModelSpec:
    """The row's GPT: GPT-3's block at the row's width and depth, untied 131,072-token embeddings."""
    return ModelSpec(name=f"gpt-{row.size.lower()}", num_layers=row.layers, hidden_size=row.hidden,
                     num_attention_heads=row.heads, ffn_hidden_size=4 * row.hidden, vocab_size=VOCAB,
                     max_position_embeddings=SEQ_LEN, activation="gelu", normalization="layernorm",
                     position_embedding="learned", tie_embeddings=False, linear_bias=True, dropout=True,
                     source="Megatron-LM README weak-scaling table (Megatron-Core r0.8.0)")


def row_training(row: ScalingRow) -> Training:
    """The row's batch at the README's sequence, in BF16 on cuDNN attention."""
    return Training(global_batch=row.global_batch, seq_len=SEQ_LEN, dtype="bf16", attention="flash")


def published_iteration_s(row: ScalingRow) -> float:
    """Seconds per iteration the row's per-GPU teraFLOP/s imply: its model FLOPs over rate × GPUs."""
    return model_flops_per_iteration(row_model(row), row_training(row)) / (row.tflops_per_gpu * 1e12 * row.gpus)


def eight_gpu_nodes(gpus: int, gpu: str) -> Cluster:
    """`gpus` GPUs of type `gpu` in nodes of GPUS_PER_NODE (DGX A100 / H100, Grand Teton), at least one node."""
    return parse_shorthand(f"{max(1, gpus // GPUS_PER_NODE)}x{GPUS_PER_NODE}x{gpu}")


def fastest_megatron_plan(model: ModelSpec, gpus: int, gpu: str, training: Training, tp: int, pp: int, dp: int,
                          cp: int = 1) -> RankedPlan:
    """Planner's fastest plan of `model` on `gpus` GPUs of type `gpu` (nodes of GPUS_PER_NODE) at the given tensor,
    pipeline, data- and context-parallel sizes, as Megatron-LM runs them: what a published run's degrees leave open
    (micro-batch, interleaving, recompute, sharding) searched."""
    fixed = FixedOptions(tp=tp, pp=pp, dp=dp, cp=cp, framework="megatron")
    return plan(model, eight_gpu_nodes(gpus, gpu), training, fixed, top_k=1, calibration=default_calibration()).plans[0]


def fastest_plan(row: ScalingRow) -> RankedPlan:
    """Planner's fastest plan at the row's tensor, pipeline and data-parallel sizes, as Megatron-LM runs them."""
    return fastest_megatron_plan(row_model(row), row.gpus, "H100-80GB", row_training(row), row.tp, row.pp, row.dp)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", action="store_true", help="print every row's comparison, not only the summary")
    args = parser.parse_args(argv)
    errors = []
    for row in ROWS:
        best = fastest_plan(row)
        published = published_iteration_s(row)
        error = best.estimate.iteration_time_s / published - 1
        errors.append(error)
        if args.runs:
            config = best.config
            print(f"{row.size:5s} {row.gpus:5d} H100  tp={row.tp} pp={row.pp} dp={row.dp}  published {published:7.3f} s"
                  f"  planner's fastest {best.estimate.iteration_time_s:7.3f} s ({config.describe()})"
                  f"  {100 * error:+6.1f} %")
    print(held_out_line("Megatron-Core r0.8.0 weak scaling (H100), planner's fastest plan", errors))


if __name__ == "__main__":
    main()
