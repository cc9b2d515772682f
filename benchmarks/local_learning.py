"""Local learning (the `local` schedule) in PPLL's 4-GPU ViT setting, against PPLL's published ratios (Guo et al.
2024, arXiv:2411.12780, abstract: on 4 GPUs PPLL trains ViT 162 % faster than sequential local learning and at 1.25x
the speed of traditional pipeline parallelism).

PPLL trained ViTs on CIFAR-10, SVHN and STL-10; its model size, batch and GPUs are not restated here, so this is a
stand-in, not a reproduction: ViT-B/16 at 224 px (197 tokens) on 4 A100-80GB, one stage per GPU, global batch 256,
the planner's uniform split, linear auxiliary heads, queue depth 2, at 4 to 32 micro-batches. Each row is the
planner's estimate of the same plan under `local`, `1f1b` and `gpipe`, and of sequential local learning: the same
stages with their auxiliary heads run one after another on one GPU, m·Σ(F + B) (no pipeline, no p2p).

    PYTHONPATH=. python -m benchmarks.local_learning
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Schedule, Training
from planner.cost.estimate import estimate
from planner.model import load_model

__all__ = ["PUBLISHED_OVER_PP", "PUBLISHED_OVER_SEQUENTIAL", "Row", "rows"]

PUBLISHED_OVER_SEQUENTIAL = 2.62  # "162 % faster" than sequential local learning
PUBLISHED_OVER_PP = 1.25  # "1.25x the speed of traditional pipeline parallelism"
GLOBAL_BATCH = 256


@dataclass(frozen=True)
class Row:
    """One micro-batch count: iteration times (seconds) and peak memory (bytes) of the plan under each schedule."""

    microbatches: int
    local_s: float
    one_f_one_b_s: float
    gpipe_s: float
    sequential_s: float
    local_peak_bytes: float
    one_f_one_b_peak_bytes: float


def rows() -> list[Row]:
    model, cluster = load_model("vit-b-16"), parse_shorthand("1x4xA100-80GB")
    training = Training(global_batch=GLOBAL_BATCH, seq_len=197)
    out = []
    for m in (4, 8, 16, 32):
        config = ParallelConfig(dp=1, tp=1, pp=4, micro_batch=GLOBAL_BATCH // m, schedule=Schedule.LOCAL)
        local = estimate(model, cluster, training, config)
        baselines = {s: estimate(model, cluster, training, replace(config, schedule=s))
                     for s in (Schedule.ONE_F_ONE_B, Schedule.GPIPE)}
        pipeline_s = local.breakdown_detail_s["pipeline_simulated"]
        sequential_s = local.iteration_time_s - pipeline_s + m * sum(s.forward_s + s.backward_s for s in local.stages)
        out.append(Row(m, local.iteration_time_s, baselines[Schedule.ONE_F_ONE_B].iteration_time_s,
                       baselines[Schedule.GPIPE].iteration_time_s, sequential_s, local.peak_memory_bytes,
                       baselines[Schedule.ONE_F_ONE_B].peak_memory_bytes))
    return out


def main() -> None:
    print("| micro-batches | local s/iter | local / sequential local | local / 1F1B | local / GPipe "
          "| peak GiB local / 1F1B |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows():
        print(f"| {r.microbatches} | {r.local_s:.4f} | {r.sequential_s / r.local_s:.2f}x | "
              f"{r.one_f_one_b_s / r.local_s:.2f}x | {r.gpipe_s / r.local_s:.2f}x | "
              f"{r.local_peak_bytes / 2**30:.1f} / {r.one_f_one_b_peak_bytes / 2**30:.1f} |")
    print(f"| PPLL published (ViT, 4 GPUs) | | {PUBLISHED_OVER_SEQUENTIAL:.2f}x | {PUBLISHED_OVER_PP:.2f}x "
          "(traditional PP) | | |")


if __name__ == "__main__":
    main()
