"""Link-aware placement on a 16-node cluster with Pipette-like measured link variation.

Pipette (Yim et al., 2023) measured per-node-pair bandwidth on production clusters and found it
far from uniform. Here every inter-node pair of a 16 × 8 × H100-80GB cluster gets a bandwidth drawn
uniformly from 25–100 % of nominal (seeded), and for several configurations the naive rank order
(`default_placement`, what torchrun does with hosts in cluster order) is compared with the
placement `planner.search.placement.search_placement` finds. Reports iteration time of both, the
gain, and the search's wall time and evaluations. A report, not a pass/fail timer.

    python benchmarks/heterogeneous.py [--seeds 3] [--evaluations 1500]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics

from planner.cluster import Cluster, Link, parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.model import load_model
from planner.search.placement import placement_objective, search_placement

LOW, HIGH = 0.25, 1.0  # measured pair bandwidth as a fraction of nominal (Pipette-like spread)
MODEL = "llama3-70b"
TRAINING = Training(global_batch=512, seq_len=4096)
CONFIGS = (
    ParallelConfig(dp=16, tp=8, pp=1, recompute="full", distributed_optimizer=True),
    ParallelConfig(dp=8, tp=8, pp=2, recompute="selective", distributed_optimizer=True),
    ParallelConfig(dp=4, tp=8, pp=4, micro_batch=1, distributed_optimizer=True),
    ParallelConfig(dp=2, tp=8, pp=8, micro_batch=1, distributed_optimizer=True),
    ParallelConfig(dp=8, tp=4, pp=4, micro_batch=1, sequence_parallel=True, distributed_optimizer=True),
)


def varied_cluster(seed: int) -> Cluster:
    """16 × 8 × H100 with every node pair at a seeded uniform 25–100 % of the nominal NIC bandwidth."""
    cluster = parse_shorthand("16x8xH100-80GB")
    rng = random.Random(seed)
    nominal = cluster.link(0, 1)
    return cluster.with_pair_links({
        (a, b): Link(nominal.bandwidth_bytes_per_s * rng.uniform(LOW, HIGH), nominal.latency_s)
        for a, b in itertools.combinations(range(cluster.num_nodes), 2)
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="link-variation draws per configuration")
    parser.add_argument("--evaluations", type=int, default=1500, help="annealing budget (cost-model calls)")
    args = parser.parse_args()
    model = load_model(MODEL)
    uniform = parse_shorthand("16x8xH100-80GB")
    print(f"{MODEL}, global batch {TRAINING.global_batch}, seq {TRAINING.seq_len}; 16 x 8 x H100-80GB, "
          f"pair bandwidth U({LOW:.0%}, {HIGH:.0%}) of nominal; {args.seeds} seeds, "
          f"{args.evaluations} evaluations\n")
    print("| configuration | uniform links (s) | naive order (s) | planner placement (s) | gain | "
          "search time (s) | evaluations |")
    print("|---|---|---|---|---|---|---|")
    for config in CONFIGS:
        ideal = estimate(model, uniform, TRAINING, config).iteration_time_s
        naive, placed, gains, seconds, evaluations = [], [], [], [], []
        for seed in range(args.seeds):
            cluster = varied_cluster(seed)
            objective = placement_objective(model, cluster, TRAINING, config)
            result = search_placement(cluster, config, objective, seed=seed, max_evaluations=args.evaluations,
                                      time_limit_s=300.0)
            naive.append(result.naive_time_s)
            placed.append(result.iteration_time_s)
            gains.append(result.gain)
            seconds.append(result.search_time_s)
            evaluations.append(result.evaluations)
        print(f"| {config.describe()} | {ideal:.3f} | {statistics.mean(naive):.3f} | {statistics.mean(placed):.3f} "
              f"| {100 * statistics.mean(gains):.1f} % (min {100 * min(gains):.1f}, max {100 * max(gains):.1f}) "
              f"| {statistics.mean(seconds):.1f} | {statistics.mean(evaluations):.0f} |")


if __name__ == "__main__":
    main()
