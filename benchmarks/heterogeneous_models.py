"""Stage splits of heterogeneous models: the planner's (ILP) against Megatron's uniform and a parameter-balanced split.

For a vision-language model (LLaVA-1.5-7B: a CLIP ViT-L/14 tower of 577 tokens, a projector, a Llama-2-7B decoder)
on 64 H100, DeepSeek-V3 (3 dense then 58 MoE blocks) on 2,048 H800 and Gemma-3-27B (5 sliding-window blocks to
each global one) on 32 H100, the planner's best pipelined configuration is fixed (`planner.search.search.search`,
what `planner plan` runs) and three splits of it are estimated: the planner's own (its ILP partition, costed block
type by block type), Megatron-LM's uniform split (`Partition.uniform`: blocks spread evenly, embedding and head on
the end stages) and a parameter-balanced split (DeepSpeed's partition_method="parameters" idea: the contiguous
split with the least parameters on its largest stage). Each row gives the time per iteration, the pipeline bubble
and the largest per-stage memory; a split that does not fit in memory cannot run, and its gain is not counted.

LLaVA and Gemma at these sizes are fastest without pipelining (the unconstrained best is shown for reference), so
their pipeline is fixed at 4 stages of 1F1B and the search picks everything else (with interleaving allowed, mixed
blocks leave many candidates whose ILP runs to its time limit: the search's lower bounds charge every block the
cheapest type's time, which for LLaVA's stem and projector is next to nothing). DeepSeek-V3 on 2,048 GPUs uses its
published degrees (PP16, EP64, TP1, DP128 with ZeRO-1; DeepSeek-V3 technical report, arXiv:2412.19437 §3.2) with
the rest searched: the planner's schedules are 1F1B and interleaved, not DualPipe. A report, not a pass/fail timer.

    python -m benchmarks.heterogeneous_models [--only NAME]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cluster import load_cluster
from planner.config import Partition, Schedule, Training
from planner.cost.estimate import Estimate, estimate
from planner.gpu import GIB
from planner.model import load_model
from planner.search.search import RankedPlan, search
from planner.search.space import FixedOptions


@dataclass(frozen=True)
class Case:
    """One model on one cluster at a training shape, with the options fixed for its pipelined plan."""

    model: str
    cluster: str
    training: Training
    fixed: FixedOptions
    unconstrained: bool  # also search without `fixed`, for reference


PIPELINED = FixedOptions(pp=4, schedule=Schedule.ONE_F_ONE_B)
CASES = (
    # LLaVA-1.5 pre-training: global batch 256 at 2,048 tokens (Liu et al. 2023, "Improved Baselines", Table 7)
    Case("llava-1.5-7b", "8x8xH100-80GB", Training(global_batch=256, seq_len=2048), PIPELINED, True),
    # DeepSeek-V3 pre-training: 4,096 tokens, batch ramped to 15,360 sequences (arXiv:2412.19437 §4.2)
    Case("deepseek-v3", "deepseek-v3-h800", Training(global_batch=15360, seq_len=4096),
         FixedOptions(tp=1, pp=16, ep=64, dp=128, distributed_optimizer=True), False),
    # Gemma 3: 8,192-token sequences (its pre-training length before long-context extension, Gemma 3 report §2.3)
    Case("gemma3-27b", "4x8xH100-80GB", Training(global_batch=256, seq_len=8192), PIPELINED, True),
)


def parameter_balanced(weights: Sequence[int], stages: int) -> Partition:
    """The contiguous split of units with `weights` into `stages` non-empty stages whose heaviest stage is the
    lightest possible (exact dynamic programme; ties keep stages as early as they can)."""
    n = len(weights)
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    # best[k][j]: least heaviest stage of units 0..j−1 in k stages; cut[k][j]: where its last stage starts
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    counts, end = [], n
    for k in range(stages, 0, -1):
        counts.append(end - cut[k][end])
        end = cut[k][end]
    return Partition(tuple(reversed(counts)))


def _row(label: str, split: str, result: Estimate, partition: Partition) -> str:
    blocks = partition.blocks_per_stage()
    memory = result.peak_memory_bytes / GIB
    return (f"| {label} | {split} | {' '.join(map(str, blocks))} | {result.iteration_time_s:.3f} "
            f"| {result.breakdown_s['bubble']:.3f} | {memory:.1f}{'' if result.fits else ' (does not fit)'} |")


def _gain(planner: Estimate, other: Estimate) -> str:
    """How much slower another split is than the planner's, or that it cannot run."""
    return f"{other.iteration_time_s / planner.iteration_time_s - 1:.1%} slower" if other.fits else "does not fit"


def run(case: Case) -> tuple[list[str], str]:
    """The table rows of one case and its summary line."""
    started = time.perf_counter()
    model, cluster = load_model(case.model), load_cluster(case.cluster)
    found = search(model, cluster, case.training, case.fixed, top_k=1)
    best: RankedPlan = found.plans[0]
    config = best.config
    stages = config.num_virtual_stages
    splits = {
        "planner (ILP)": best.partition,
        "uniform (Megatron)": Partition.uniform(model.num_layers, stages),
        "parameter-balanced": parameter_balanced([unit.num_parameters for unit in model.units()], stages),
    }
    results = {name: estimate(model, cluster, case.training, config, split, best.placement)
               for name, split in splits.items()}
    label = f"{case.model}, {cluster.num_gpus:,} × {cluster.gpu_label}, {config.describe()}"
    rows = [_row(label, name, results[name], split) for name, split in splits.items()]
    planner = results["planner (ILP)"]
    reference = ""
    if case.unconstrained:
        free = search(model, cluster, case.training, top_k=1).plans[0]
        reference = (f"; unconstrained best {free.config.describe()}: "
                     f"{free.estimate.iteration_time_s:.3f} s")
    summary = (f"{case.model}: against the planner's split, uniform {_gain(planner, results['uniform (Megatron)'])}, "
               f"parameter-balanced {_gain(planner, results['parameter-balanced'])} "
               f"(ILPs solved {found.stats.ilps_solved}, {time.perf_counter() - started:.0f} s){reference}")
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only cases whose model contains this text")
    args = parser.parse_args()
    print("| model, GPUs, configuration | split | blocks per stage | time/iter (s) | bubble (s) "
          "| max stage memory (GiB) |")
    print("|---|---|---|---:|---:|---:|", flush=True)
    summaries = []
    for case in CASES:
        if args.only and args.only not in case.model:
            continue
        rows, summary = run(case)
        print("\n".join(rows), flush=True)
        summaries.append(summary)
    print()
    print("\n".join(f"- {summary}" for summary in summaries))


if __name__ == "__main__":
    main()
