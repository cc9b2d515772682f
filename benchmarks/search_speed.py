"""Wall time of the search behind `planner plan`, from 8 to 8,192 GPUs and 8B to 1T parameters.

Each case runs `planner.search.search.search` in-process (as `planner plan` does, without the
printing) three times and reports the median wall time with what the search did: configurations
in the space, pruned by the memory bound and by the time bound, cheap bounds tightened, partitions
proven optimal by the rank-load bound, ILPs solved, cache hits and time-limit hits. A report for
the README, not a pass/fail timer; targets on a 2-core machine: GPT-3 175B on 1,024 A100 ≤ 2 s,
Llama-3-405B on 3,072 H100 ≤ 5 s, growth with GPU count clearly sub-linear. The development machine's own speed
varies about twofold over a day, so before each case it also times a fixed reference workload that no planner
change touches (`reference_s`) and reports the wall over it: that ratio compares runs of different days.

    PYTHONPATH=. python benchmarks/search_speed.py [--runs 3] [--only NAME]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np

from planner.cluster import load_cluster
from planner.config import Training
from planner.model import load_model
from planner.search.search import SearchResult, search


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    global_batch: int
    seq_len: int
    runs: int | None = None  # searches to take the median of; None: --runs (one for cases that take minutes)


CASES = (
    Case("llama3-8b", "1x8xH100-80GB", 256, 4096),
    Case("llama3-70b", "8x8xH100-80GB", 512, 8192),
    Case("gpt3-175b", "128x8xA100-80GB", 1536, 2048),
    Case("llama3-405b", "384x8xH100-80GB", 1024, 8192),
    Case("megatron-gpt-1t", "384x8xA100-80GB", 3072, 2048),
    Case("llama3-405b", "1024x8xH100-80GB", 4096, 8192),
    # issue 11: Llama 3's own scale (16,384 H100; 16M-token batches at 8K and at 128K, where CP is needed)
    Case("llama3-405b", "2048x8xH100-80GB", 2048, 8192),
    Case("llama3-405b", "2048x8xH100-80GB", 128, 131072),
    # issue 11: DeepSeek-V3 (MoE, MLA, dense-then-MoE layers and MTP) on 2,048 H800, its own batch and sequence
    Case("deepseek-v3", "deepseek-v3-h800", 15360, 4096, runs=1),
)


REFERENCE_ROUNDS = 80  # about 0.1 s of reference work on the development machine


def _reference_work() -> float:
    """A fixed CPU workload of the search's kind: Python objects built, sorted and summed, small numpy operations."""
    rng, total = random.Random(0), 0.0
    for _ in range(REFERENCE_ROUNDS):
        items = sorted((rng.random(), i, {"index": i, "value": float(i)}) for i in range(2000))
        total += sum(item[0] for item in items[:100])
        values = np.arange(256, dtype=float)
        total += float(np.maximum(values * 1.5, 3.0).sum())
    return total


def reference_s() -> float:
    """Median seconds of three runs of the reference workload: how fast the machine is right now."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        _reference_work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(case: Case, runs: int) -> tuple[float, SearchResult]:
    """Median wall time of `runs` searches, and the last result (searches are deterministic)."""
    model, cluster = load_model(case.model), load_cluster(case.cluster)
    training = Training(global_batch=case.global_batch, seq_len=case.seq_len)
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = search(model, cluster, training)
        times.append(time.perf_counter() - started)
    assert result is not None
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="searches per case (the median is reported)")
    parser.add_argument("--only", help="run only cases whose model or cluster contains this text")
    args = parser.parse_args()
    print("| model | GPUs | global batch × seq | wall (s) | reference (s) | wall / reference | configs "
          "| pruned: memory | pruned: time | tightened | proven by bound | ILPs | cache hits | time-limited "
          "| best plan | time/iter (s) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for case in CASES:
        if args.only and args.only not in case.model and args.only not in case.cluster:
            continue
        reference = reference_s()
        wall_s, result = run(case, case.runs or args.runs)
        s, best = result.stats, result.plans[0]
        gpus = load_cluster(case.cluster).num_gpus
        print(f"| {case.model} | {gpus:,} | {case.global_batch} × {case.seq_len} | {wall_s:.2f} "
              f"| {reference:.3f} | {wall_s / reference:.1f} "
              f"| {s.configurations:,} | {s.pruned_memory:,} | {s.pruned_time:,} | {s.bounds_tightened} "
              f"| {s.proven_by_bound} | {s.ilps_solved} | {s.cache_hits} | {s.time_limited} "
              f"| {best.config.describe()} | {best.estimate.iteration_time_s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
