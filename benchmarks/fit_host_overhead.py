"""Fit `host_kernel_s`, the host time eager PyTorch spends per kernel, on vTrain's host-bound layout sweep.

Small transformer layers run shorter on the GPU than the host takes to issue their kernels, so their time is the
host's: `host_kernel_s` per kernel of a pass (planner/profile/analytic.py `_host_bound`). vTrain's single-node sweep
(../shared/validation/sweeps/vtrain_singlenode_a100.csv: 1,440 Megatron-DeepSpeed runs of GPT models of hidden size
1024 and 2048 on one 8×A100 node, full recompute) is the one validation file with many such runs: at hidden 1024 a
layer's forward, recompute and backward take ~3.5 ms per micro-batch whatever the micro-batch up to 2 and the TP
degree up to 4 (the host's floor). This script fits the constant on that sweep alone (golden-section search of the
time MAPE over 20-120 µs, the rest of the cost model as shipped) and reports what it does to the ranking and to the
accuracy sources, as a check on data the fit did not use.

    PYTHONPATH=. python -m benchmarks.fit_host_overhead
"""

from __future__ import annotations

import pandas as pd

from benchmarks.accuracy import score_source
from benchmarks.calibrate import golden_section
from benchmarks.ranking import group_scores, predicted_times, study_summary
from benchmarks.sources import sources
from planner.profile.calibration import Calibration, default_calibration

__all__ = ["VTRAIN_STUDY", "sweep_mape"]

VTRAIN_STUDY = "vTrain single-node (A100)"
BOUNDS_S = (20e-6, 120e-6)  # 5 Python-level calls per kernel at 4-24 µs each (the 5-25 µs of an eager op)


def sweep_mape(calibration: Calibration, study: str = VTRAIN_STUDY) -> float:
    """Time MAPE of one layout sweep's runs under `calibration`."""
    return _study_mape(predicted_times(calibration), study)


def _study_mape(times: pd.DataFrame, study: str) -> float:
    """Time MAPE of `study`'s runs in `predicted_times`' table."""
    runs = times[times["study"] == study]
    return float((runs["predicted"] / runs["measured"] - 1).abs().mean())


def _report(label: str, calibration: Calibration) -> None:
    times = predicted_times(calibration)
    summary = study_summary(group_scores(times))
    print(f"{label}: host_kernel_s {1e6 * calibration.host_kernel_s:.1f} µs")
    for study, row in summary.iterrows():
        mape = _study_mape(times, study)
        print(f"  {study:34s} time MAPE {100 * mape:5.1f} %  median Spearman {row['median_spearman']:.2f}  "
              f"mean regret {row['mean_regret']:.3f}")
    print("  accuracy sources (time MAPE): " + ", ".join(
        f"{scored.source.name.split(' (')[0]} {100 * scored.time.mape:.1f} %"
        for scored in (score_source(source, calibration) for source in sources())))


def main() -> None:
    shipped = default_calibration()

    def loss(value: float) -> float:
        return sweep_mape(shipped.updated(host_kernel_s=value))

    fitted = golden_section(loss, *BOUNDS_S, shipped.host_kernel_s, steps=14)
    _report("shipped", shipped)
    _report("fitted ", shipped.updated(host_kernel_s=fitted))


if __name__ == "__main__":
    main()
