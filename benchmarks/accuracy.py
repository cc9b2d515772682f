"""How well planner's `estimate` reproduces published training runs (a report, not a pass/fail timer).

    python -m benchmarks.accuracy              # per-run tables, skipped rows, summary
    python -m benchmarks.accuracy --summary    # the summary table only (README "Accuracy")
    python -m benchmarks.accuracy --margin     # runs that ran and ran out of memory by estimated need (README
                                               # "Memory margin")

Every file of ../shared/validation is a source (benchmarks/sources.py): each run it states fully goes
through `planner.cost.estimate.estimate` with its model, cluster, training and parallel configuration,
using the shipped profiles/calibration.yaml; rows planner cannot express are counted with the reason.
Per source: time MAPE and worst error, peak-memory error where the source publishes it, and how many
runs documented as having run are predicted to fit, and how many documented out-of-memory runs are predicted
not to fit.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.sources import Source, skipped_files, sources
from benchmarks.validation_runs import (
    Run,
    predict,
    predict_layer,
    shipped_before_fix_nic_ratio,
    shipped_jean_zay_p2p_ratio,
    split_fit_hold,
)
from planner.config import Training
from planner.cost.estimate import TIGHT_MEMORY_SHARE, Estimate, moe_load_fit_limit
from planner.errors import PlannerError
from planner.gpu import GIB
from planner.profile.calibration import Calibration, default_calibration
from planner.render import format_table

__all__ = ["Outcome", "Score", "SourceScore", "held_out_errors", "held_out_fit_lines", "held_out_line",
           "margin_counts", "margin_lines", "oom_outcomes", "outcomes", "score", "score_source", "summary_lines",
           "time_errors"]


@dataclass(frozen=True)
class Score:
    """Mean absolute relative error, the median and the worst one over a set of data points."""

    count: int
    mape: float
    median: float
    worst: float


def score(errors: Sequence[float]) -> Score:
    """Score of relative errors (predicted / published − 1)."""
    magnitudes = [abs(e) for e in errors]
    return Score(len(magnitudes), sum(magnitudes) / len(magnitudes), statistics.median(magnitudes), max(magnitudes))


@dataclass(frozen=True)
class Outcome:
    """One run's prediction against its publication."""

    run: Run
    predicted_s: float
    time_error: float
    memory_error: float | None
    fits: bool
    peak_memory_bytes: float
    memory_share: float  # `Estimate.memory_share`: the largest share of its GPU's memory a rank needs


def outcomes(runs: Sequence[Run], calibration: Calibration) -> tuple[Outcome, ...]:
    """Predict every run once: time, peak memory (where published) and whether it fits."""
    out = []
    for run in runs:
        result = predict(run, calibration)
        out.append(Outcome(run, result.iteration_time_s, result.iteration_time_s / run.iteration_s - 1,
                           run.memory_error(result), result.fits, result.peak_memory_bytes, result.memory_share))
    return tuple(out)


def time_errors(source: Source, calibration: Calibration) -> list[float]:
    """Relative time errors of a source: whole runs, or forward and backward of each layer row."""
    errors = [o.time_error for o in outcomes(source.runs, calibration)]
    for row in source.layers:
        forward, backward = predict_layer(row, calibration)
        errors += [forward / row.forward_s - 1, backward / row.backward_s - 1]
    return errors


@dataclass(frozen=True)
class SourceScore:
    """A source's scores: time, memory where published, runs predicted to fit, documented OOMs predicted not to
    fit, rows skipped."""

    source: Source
    time: Score
    memory: Score | None
    fits: int
    ooms_caught: int = 0


def oom_outcomes(source: Source, calibration: Calibration) -> tuple[Outcome, ...]:
    """The source's runs documented as out of memory, predicted (their time error is NaN: no time is published)."""
    return outcomes(source.ooms, calibration)


def score_source(source: Source, calibration: Calibration) -> SourceScore:
    results = outcomes(source.runs, calibration)
    memory = [o.memory_error for o in results if o.memory_error is not None]
    fits = sum(o.fits for o in (*results, *outcomes(source.completions, calibration)))
    return SourceScore(source, score(time_errors(source, calibration)), score(memory) if memory else None,
                       fits, sum(not o.fits for o in oom_outcomes(source, calibration)))


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def held_out_errors(runs: Sequence[Run], calibration: Calibration,
                    ) -> tuple[list[tuple[Run, float]], list[str], list[Run]]:
    """(run, time error) of each run from outside the validation files (the held-out checks), why the cost model
    refuses the others (a layout it cannot split, say), and the runs it predicts not to fit: each of them ran."""
    errors, refused, unfit = [], [], []
    for run in runs:
        try:
            result = predict(run, calibration)
        except PlannerError as exc:
            refused.append(f"{run.label}: {exc}")
            continue
        errors.append((run, result.iteration_time_s / run.iteration_s - 1))
        if not result.fits:
            unfit.append(run)
    return errors, refused, unfit


def held_out_fit_lines(errors: Sequence[tuple[Run, float]], unfit: Sequence[Run]) -> list[str]:
    """How many of the held-out runs, all of which ran, are predicted to fit, and which are not."""
    return ([f"ran, predicted to fit: {len(errors) - len(unfit)} of {len(errors)}"]
            + [f"  predicted not to fit: {run.label}" for run in unfit])


def held_out_pages(description: str, pages_help: str,
                   argv: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, list[str], bool]:
    """A held-out check's command line: the upstream pages it reads (each one's text; an unreadable one exits 2
    naming it) and --runs (every run's error, not only the summary); the parser, for the check's own refusals."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("pages", type=Path, nargs="+", help=pages_help)
    parser.add_argument("--runs", action="store_true", help="print every run's error, not only the summary")
    args = parser.parse_args(argv)
    texts = []
    for page in args.pages:
        try:
            texts.append(page.read_text())
        except OSError as exc:
            parser.error(f"cannot read {page}: {exc.strerror}")
    return parser, texts, args.runs


def held_out_line(label: str, errors: Sequence[float]) -> str:
    """A held-out check's summary of `errors`: runs, time MAPE, mean signed error, worst."""
    scored = score(errors)
    mean = 100 * statistics.mean(errors)
    return (f"{label} {scored.count:3d} runs  time MAPE {_pct(scored.mape)}  mean {mean:+.1f} %  "
            f"worst {_pct(scored.worst)}")


def summary_lines(scores: Sequence[SourceScore]) -> list[str]:
    """The README's table: one row per source, then the fits/OOM totals."""
    lines = ["| source | runs | time MAPE | worst | target | memory: runs, median, worst | ran, predicted to fit "
             "| rows skipped |", "|---|---|---|---|---|---|---|---|"]
    for s in scores:
        memory = f"{s.memory.count}, {_pct(s.memory.median)}, {_pct(s.memory.worst)}" if s.memory else "–"
        fits = f"{s.fits} of {len(s.source.ran)}" if s.source.ran else "–"
        lines.append(f"| {s.source.name} | {s.time.count} | {_pct(s.time.mape)} | {_pct(s.time.worst)} | "
                     f"≤ {100 * s.source.target:.0f} % | {memory} | {fits} | {len(s.source.skipped)} |")
    ran = sum(len(s.source.ran) for s in scores)
    unexpressed = sum("documented OOM" in k.reason
                      for k in (*skipped_files(), *(k for s in scores for k in s.source.skipped)))
    expressed = sum(len(s.source.ooms) for s in scores)
    lines.append(f"| all | {sum(s.time.count for s in scores)} | | | | | {sum(s.fits for s in scores)} of {ran} | "
                 f"{sum(len(s.source.skipped) for s in scores) + len(skipped_files())} "
                 f"(documented OOMs: {unexpressed + expressed}, {expressed} estimated, "
                 f"{sum(s.ooms_caught for s in scores)} of them predicted not to fit) |")
    return lines


def _margin_bands() -> tuple[tuple[str, float, float], ...]:
    """(label, low, high) shares of a GPU's memory: over it, `TIGHT_MEMORY_SHARE` up to it, 5 points below that,
    the rest."""
    tight, below = 100 * TIGHT_MEMORY_SHARE, 100 * TIGHT_MEMORY_SHARE - 5
    return (("over 100 %", 1.0, float("inf")), (f"{tight:g} – 100 %", TIGHT_MEMORY_SHARE, 1.0),
            (f"{below:g} – {tight:g} %", below / 100, TIGHT_MEMORY_SHARE), (f"under {below:g} %", 0.0, below / 100))


def margin_counts(calibration: Calibration) -> tuple[tuple[str, int, int], ...]:
    """Per band of estimated need (`_margin_bands`): how many published runs that ran, and how many documented as
    out of memory, were estimated in it."""
    loaded = sources()
    ran = [o.memory_share for s in loaded for o in outcomes(s.ran, calibration)]
    ooms = [o.memory_share for s in loaded for o in outcomes(s.ooms, calibration)]
    return tuple((label, sum(low < share <= high for share in ran), sum(low < share <= high for share in ooms))
                 for label, low, high in _margin_bands())


def margin_lines(calibration: Calibration) -> list[str]:
    """The README's "Memory margin" table: where an estimate that fits stops being a promise."""
    return (["| estimated need, share of the GPU's memory | ran | ran out of memory |", "|---|---|---|"]
            + [f"| {label} | {ran} | {oom} |" for label, ran, oom in margin_counts(calibration)])


def _print_runs(title: str, results: Sequence[Outcome]) -> None:
    print(f"\n## {title}")
    table = [[o.run.label, f"{o.run.iteration_s:.3f}", f"{o.predicted_s:.3f}", f"{100 * o.time_error:+.1f} %",
              "–" if o.memory_error is None else f"{100 * o.memory_error:+.1f} %", "yes" if o.fits else "NO"]
             for o in results]
    print(format_table(["run", "published s", "predicted s", "time error", "memory error", "fits"], table))


def verdict_load(run: Run, calibration: Calibration) -> float | None:
    """The router load at which a run's predicted fit would flip (`moe_load_fit_limit`): how much the verdict
    hangs on the load the run is estimated at."""
    def at(training: Training) -> Estimate:
        return predict(replace(run, training=training), calibration)

    return moe_load_fit_limit(run.training, at(run.training), at)


def _print_outcomes(title: str, results: Sequence[Outcome], calibration: Calibration, ran: bool) -> None:
    """Documented outcomes scored on fitting alone: OOMs (`ran` False) must not fit, completions must; with the
    router load each is estimated at and the load at which its verdict would flip."""
    print(f"\n## {title}: documented {'completions (time not scored)' if ran else 'OOMs'}")
    table = []
    for o in results:
        flip = verdict_load(o.run, calibration)
        load = f"{o.run.training.moe_load_imbalance:.2f}" if o.run.model.is_moe else "–"
        table.append([o.run.label, load, "–" if flip is None else f"{flip:.2f}",
                      f"{o.run.cluster.gpu.memory_bytes / GIB:.1f}", f"{o.peak_memory_bytes / GIB:.1f}",
                      "yes" if o.fits == ran else "NO"])
    print(format_table(["run", "router load", "verdict flips at load", "capacity GiB", "predicted peak GiB",
                        "predicted to fit?" if ran else "predicted not to fit?"], table))


def _print_details(scores: Sequence[SourceScore], calibration: Calibration) -> None:
    for s in scores:
        if s.source.runs:
            _print_runs(s.source.name, outcomes(s.source.runs, calibration))
        if s.source.ooms:
            _print_outcomes(s.source.name, oom_outcomes(s.source, calibration), calibration, ran=False)
        if s.source.completions:
            _print_outcomes(s.source.name, outcomes(s.source.completions, calibration), calibration, ran=True)
    fit_half, hold_half = split_fit_hold(scores[0].source.runs)
    for name, half in (("fit half", fit_half), ("hold-out half", hold_half)):
        result = score([o.time_error for o in outcomes(half, calibration)])
        print(f"BLOOM {name}: MAPE {_pct(result.mape)}, worst {_pct(result.worst)} over {result.count} runs")
    print(f"BLOOM rows before Jean Zay's PCIe/NUMA fix: inter-node bandwidth × {shipped_before_fix_nic_ratio():.3f}")
    print(f"BLOOM rows' pipeline transfers (Jean Zay's Omni-Path): p2p bandwidth × {shipped_jean_zay_p2p_ratio():.3f}")
    print("\n## Rows not estimated")
    skipped = Counter((k.file, k.reason) for s in scores for k in s.source.skipped) + Counter(
        (k.file, k.reason) for k in skipped_files())
    print(format_table(["file", "reason", "rows"], [[f, r, str(n)] for (f, r), n in sorted(skipped.items())]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="print only the summary table")
    parser.add_argument("--margin", action="store_true",
                        help="print only the runs that ran and ran out of memory by estimated need")
    args = parser.parse_args()
    calibration = default_calibration()
    if args.margin:
        print("\n".join(margin_lines(calibration)))
        return
    scores = [score_source(source, calibration) for source in sources()]
    if not args.summary:
        _print_details(scores, calibration)
        print()
    print("\n".join(summary_lines(scores)))


if __name__ == "__main__":
    main()
