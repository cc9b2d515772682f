"""Link-aware placement on a 16-node cluster with Pipette-like measured link variation.

Pipette (Yim et al., 2023) measured per-node-pair bandwidth on production clusters and found it
far from uniform. Here every inter-node pair of a 16 × 8 × H100-80GB cluster gets a bandwidth drawn
uniformly from 25–100 % of nominal (seeded), and for several configurations the library's planning
entry point (`planner.search.planning.plan`, what `planner plan` prints) is run with every dimension
fixed: its rank-order time (what torchrun does with hosts in cluster order) is compared with its
placed and re-split plan. Reports both times, the gain, and the plan's wall time and placement
evaluations; a configuration that does not fit in memory is reported as such, with no gain.
A report, not a pass/fail timer.

    python benchmarks/heterogeneous.py [--seeds 3] [--evaluations 300]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from typing import Any

from planner.cluster import Cluster, Link, parse_shorthand
from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError
from planner.model import ModelSpec, load_model
from planner.search.placement import pinned_options
from planner.search.planning import PLACEMENT_EVALUATIONS, plan

LOW, HIGH = 0.25, 1.0  # measured pair bandwidth as a fraction of nominal (Pipette-like spread)
MODEL = "llama3-70b"
SHORTHAND = "16x8xH100-80GB"
TRAINING = Training(global_batch=512, seq_len=4096)
CONFIGS = (
    ParallelConfig(dp=16, tp=8, pp=1, recompute="full", sequence_parallel=True, distributed_optimizer=True),
    ParallelConfig(dp=8, tp=8, pp=2, recompute="selective", sequence_parallel=True, distributed_optimizer=True),
    ParallelConfig(dp=4, tp=8, pp=4, sequence_parallel=True, distributed_optimizer=True),
    ParallelConfig(dp=2, tp=8, pp=8, sequence_parallel=True, distributed_optimizer=True),
    ParallelConfig(dp=8, tp=4, pp=4, sequence_parallel=True, distributed_optimizer=True),
)
HEADER = ("| configuration | uniform links (s) | rank order (s) | planner placement (s) | gain | plan time (s) "
          "| placement evaluations |\n|---|---|---|---|---|---|---|")


def varied_cluster(seed: int) -> Cluster:
    """16 × 8 × H100 with every node pair at a seeded uniform 25–100 % of the nominal NIC bandwidth."""
    cluster = parse_shorthand(SHORTHAND)
    rng = random.Random(seed)
    nominal = cluster.link(0, 1)
    return cluster.with_pair_links({
        (a, b): Link(nominal.bandwidth_bytes_per_s * rng.uniform(LOW, HIGH), nominal.latency_s)
        for a, b in itertools.combinations(range(cluster.num_nodes), 2)
    })


def row(model: ModelSpec, config: ParallelConfig, seeds: int, evaluations: int) -> str:
    """One table row: `config` planned on uniform links and on each seed's varied links, or why it does not fit;
    labelled as planned (a full recompute runs as the block recompute `plan` refines it to)."""
    fixed = pinned_options(config)
    try:
        best = plan(model, parse_shorthand(SHORTHAND), TRAINING, fixed, top_k=1).best
    except InfeasibleError as error:
        return f"| {config.describe()} | does not fit: {error} | – | – | – | – | – |"
    ideal, config = best.estimate.iteration_time_s, best.config
    records: list[dict[str, Any]] = []
    seconds = []
    for seed in range(seeds):
        started = time.perf_counter()
        planned = plan(model, varied_cluster(seed), TRAINING, fixed, top_k=1, placement_evaluations=evaluations)
        seconds.append(time.perf_counter() - started)
        assert planned.heterogeneity is not None  # measured pair links always call for placement
        records.append(planned.heterogeneity)
    gains = [100 * r["placement_gain"] for r in records]
    return (f"| {config.describe()} | {ideal:.3f} | {statistics.mean(r['rank_order_time_s'] for r in records):.3f} "
            f"| {statistics.mean(r['placed_time_s'] for r in records):.3f} "
            f"| {statistics.mean(gains):.1f} % ({min(gains):.1f}–{max(gains):.1f}) | {statistics.mean(seconds):.1f} "
            f"| {statistics.mean(r['placement_evaluations'] for r in records):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="link-variation draws per configuration")
    parser.add_argument("--evaluations", type=int, default=PLACEMENT_EVALUATIONS,
                        help="annealing budget per placement search (cost-model calls)")
    args = parser.parse_args()
    model = load_model(MODEL)
    print(f"{MODEL}, global batch {TRAINING.global_batch}, seq {TRAINING.seq_len}; {SHORTHAND}, "
          f"pair bandwidth U({LOW:.0%}, {HIGH:.0%}) of nominal; {args.seeds} seeds, "
          f"{args.evaluations} evaluations\n")
    print(HEADER)
    for config in CONFIGS:
        print(row(model, config, args.seeds, args.evaluations), flush=True)


if __name__ == "__main__":
    main()
