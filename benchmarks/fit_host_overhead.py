"""Fit `host_kernel_s`, the host time eager PyTorch spends per kernel, on vTrain's host-bound layout sweep.

Small transformer layers run shorter on the GPU than the host takes to issue their kernels, so their time is the
host's: `host_kernel_s` per kernel of a pass (planner/profile/analytic.py `_host_bound`). vTrain's single-node sweep
(../shared/validation/sweeps/vtrain_singlenode_a100.csv: 1,440 Megatron-DeepSpeed runs of GPT models of hidden size
1024 and 2048 on one 8×A100 node, full recompute) is the one validation file with many such runs: at hidden 1024 a
layer's forward, recompute and backward take ~3.5 ms per micro-batch whatever the micro-batch up to 2 and the TP
degree up to 4 (the host's floor). This script fits the constant on that sweep alone (golden-section search of the
time MAPE over 20-120 µs, the rest of the cost model as shipped) and reports what it does to the ranking and to the
accuracy sources, as a check on data the fit did not use.

With it `host_overlap_softness`, how far host and GPU fail to overlap near the crossover (`overlapped_host_time`):
layouts whose GPU and host times are about equal (h 2048 at tp 2, micro-batch 2) measure ~25 % slower than the
longer of the two at every depth. Each softness of `SOFTNESS_GRID` gets its own golden-section fit of the host time;
the pair with the lowest MAPE is the fit. As a check on data neither constant saw, the script also fits on one
hidden size's groups and scores the other's, with and without the softness.

    PYTHONPATH=. python -m benchmarks.fit_host_overhead
"""

from __future__ import annotations

import pandas as pd

from benchmarks.accuracy import score_source
from benchmarks.calibrate import golden_section
from benchmarks.ranking import group_scores, predicted_times, study_summary
from benchmarks.sources import sources
from planner.profile.calibration import Calibration, default_calibration

__all__ = ["SOFTNESS_GRID", "VTRAIN_STUDY", "fit_host_constants", "sweep_mape"]

VTRAIN_STUDY = "vTrain single-node (A100)"
BOUNDS_S = (20e-6, 120e-6)  # 5 Python-level calls per kernel at 4-24 µs each (the 5-25 µs of an eager op)
SOFTNESS_GRID = (0.0, 1 / 8, 1 / 6, 1 / 4, 1 / 3, 1 / 2)  # p-norms of p = ∞ (the longer one), 8, 6, 4, 3, 2
HIDDEN_SIZES = ("h1024", "h2048")  # vTrain's group names carry the model's hidden size


def sweep_mape(calibration: Calibration, study: str = VTRAIN_STUDY, groups: str = "") -> float:
    """Time MAPE of one layout sweep's runs under `calibration` (only groups whose name contains `groups`)."""
    return _study_mape(predicted_times(calibration), study, groups)


def _study_mape(times: pd.DataFrame, study: str, groups: str = "") -> float:
    """Time MAPE of `study`'s runs in `predicted_times`' table (only groups whose name contains `groups`)."""
    runs = times[(times["study"] == study) & times["group"].str.contains(groups, regex=False)]
    return float((runs["predicted"] / runs["measured"] - 1).abs().mean())


def fit_host_constants(start: Calibration, softness_grid: tuple[float, ...] = SOFTNESS_GRID,
                       groups: str = "") -> Calibration:
    """`start` with `host_kernel_s` and `host_overlap_softness` fitted on vTrain's groups whose name contains
    `groups`: a golden-section fit of the host time per softness of the grid, the pair with the lowest MAPE."""
    fits = []
    for softness in softness_grid:
        trial = start.updated(host_overlap_softness=softness)

        def loss(value: float, trial: Calibration = trial) -> float:
            return sweep_mape(trial.updated(host_kernel_s=value), groups=groups)

        host = golden_section(loss, *BOUNDS_S, start.host_kernel_s, steps=14)
        fits.append((loss(host), trial.updated(host_kernel_s=host)))
    return min(fits, key=lambda fit: fit[0])[1]


def _report(label: str, calibration: Calibration) -> None:
    times = predicted_times(calibration)
    summary = study_summary(group_scores(times))
    print(f"{label}: host_kernel_s {1e6 * calibration.host_kernel_s:.1f} µs, "
          f"host_overlap_softness {calibration.host_overlap_softness:.3f}")
    for study, row in summary.iterrows():
        mape = _study_mape(times, study)
        print(f"  {study:34s} time MAPE {100 * mape:5.1f} %  median Spearman {row['median_spearman']:.2f}  "
              f"mean regret {row['mean_regret']:.3f}")
    print("  accuracy sources (time MAPE): " + ", ".join(
        f"{scored.source.name.split(' (')[0]} {100 * scored.time.mape:.1f} %"
        for scored in (score_source(source, calibration) for source in sources())))


def _held_out_report(shipped: Calibration) -> None:
    """Fit on one hidden size's groups, score the other's: the longer-of-the-two rule against the fitted softness."""
    for fitted_on in HIDDEN_SIZES:
        (held_out,) = (size for size in HIDDEN_SIZES if size != fitted_on)
        for label, grid in (("longer of the two", (0.0,)), ("softness fitted  ", SOFTNESS_GRID)):
            calibration = fit_host_constants(shipped, grid, fitted_on)
            times = predicted_times(calibration)
            runs = times[(times["study"] == VTRAIN_STUDY) & times["group"].str.contains(held_out, regex=False)]
            scores = group_scores(runs)
            print(f"  fit on {fitted_on}, {label} (host {1e6 * calibration.host_kernel_s:.1f} µs, softness "
                  f"{calibration.host_overlap_softness:.3f}): {held_out} MAPE "
                  f"{100 * _study_mape(times, VTRAIN_STUDY, held_out):.1f} %, median Spearman "
                  f"{scores['spearman'].median():.3f}, mean regret {scores['regret'].mean():.3f}")


def main() -> None:
    shipped = default_calibration()
    _report("shipped", shipped)
    _report("fitted ", fit_host_constants(shipped))
    print("held out across hidden sizes:")
    _held_out_report(shipped)


if __name__ == "__main__":
    main()
