"""Fit one catalog GPU's matmul efficiency on the validation runs of that GPU where no matmul benchmark exists.

`matmul_efficiency` is a GPU's maximum achievable matmul rate over its datasheet peak, from
../shared/validation/max_achievable_matmul_bf16.csv where the GPU has a row. GPUs without a row borrow a sibling's
(GB300 took B200's 0.776); where the validation files hold runs on such a GPU that leave nothing else unsettled
(dense models, no MoE router), this script fits the value on them instead: a golden-section search of the time
MAPE over [0.5, 1], the rest of the cost model as shipped. The fitted value and the runs go into
profiles/gpus.yaml's `efficiency_source` for that GPU.

    PYTHONPATH=. python -m benchmarks.fit_gpu_efficiency GB300
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from benchmarks.accuracy import held_out_line, outcomes, score
from benchmarks.calibrate import golden_section
from benchmarks.validation_runs import Run, long_context_runs
from planner.cluster import Cluster
from planner.gpu import lookup_gpu
from planner.profile.calibration import default_calibration

__all__ = ["fitting_runs", "run_errors", "with_efficiency"]


def fitting_runs(gpu: str) -> tuple[Run, ...]:
    """The long-context file's dense runs on `gpu` (the only validation file with dense runs on Blackwell Ultra)."""
    return tuple(run for run in long_context_runs()[0] if run.cluster.gpu.name == gpu)


def with_efficiency(cluster: Cluster, efficiency: float) -> Cluster:
    """`cluster` with every node's GPU at matmul efficiency `efficiency`."""
    return cluster.with_nodes(replace(node, gpu=replace(node.gpu, matmul_efficiency=efficiency))
                              for node in cluster.nodes)


def run_errors(runs: Sequence[Run], efficiency: float) -> list[float]:
    """Predicted over published iteration time − 1 of each run with its GPU at `efficiency`."""
    changed = [replace(run, cluster=with_efficiency(run.cluster, efficiency)) for run in runs]
    return [outcome.time_error for outcome in outcomes(changed, default_calibration())]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu", help="catalog GPU name, e.g. GB300")
    args = parser.parse_args(argv)
    runs = fitting_runs(args.gpu)
    if not runs:
        parser.error(f"the validation files hold no dense runs on {args.gpu!r} to fit its matmul efficiency on")
    shipped = lookup_gpu(args.gpu).matmul_efficiency

    def mape(efficiency: float) -> float:
        return score(run_errors(runs, efficiency)).mape

    fitted = golden_section(mape, 0.5, 1.0, shipped, steps=16)
    print(held_out_line(f"shipped {shipped:.3f}:", run_errors(runs, shipped)))
    errors = run_errors(runs, fitted)
    print(held_out_line(f"fitted  {fitted:.3f}:", errors))
    for run, error in zip(runs, errors, strict=True):
        print(f"  {run.label[:100]}  {100 * error:+.1f} %")


if __name__ == "__main__":
    main()
