"""Fit the cost model's physical constants to published runs; print them, or write a calibration file.

    python -m benchmarks.calibrate                 # fit and print the calibration.yaml it would write
    python -m benchmarks.calibrate --out FILE      # fit and write FILE (e.g. for `planner --calibration`)
    python -m benchmarks.calibrate --write         # fit and rewrite the tracked profiles/calibration.yaml

Data (../shared/validation copies, see benchmarks/validation_runs.py): the *fit half* of the BLOOM
topology sweep (alternate rows; the other half is held out and reported by benchmarks/accuracy.py),
Korthikanti et al. 2022 Table 4 layer times, the H100 FP8 NeMo / Megatron-Bridge runs, and NeMo's H100
long-sequence runs (4K to 1M tokens: the only group in which the fused attention's share of the time, and so its
rate, varies enough to be told apart from the GEMMs'; the long-context file's other rows stay held out).

Two cluster-state constants are fitted with them, written to `cluster_states`: the inter-node bandwidth ratio of
Jean Zay before its PCIe/NUMA fix (the BLOOM rows whose `pcie_numa_fix_applied` is "no"), and the pipeline
send/receive rate of Jean Zay's Omni-Path fabric relative to the p2p_efficiency_inter every other cluster is costed
at (all BLOOM rows). `--only` refits any of them, or both, with the cost-model constants as shipped.

Objective: the mean over those four groups of each group's mean absolute relative error, so a
group with many rows does not drown the others. Memory constants are sourced, not fitted
(`MEMORY_FITTED` is empty). Method: cyclic coordinate descent, a golden-section
search of each constant inside its physical bounds (scipy is not a dependency). Every constant is a
global efficiency or overhead; nothing is fitted per run.
"""

from __future__ import annotations

import argparse
import datetime
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.validation_runs import (
    BLOOM_FILE,
    JEAN_ZAY_BEFORE_FIX,
    JEAN_ZAY_PIPELINE,
    Run,
    bloom_runs,
    h100_runs,
    is_nemo_long_sequence_h100,
    korthikanti_layer_rows,
    nemo_long_sequence_h100_runs,
    predict,
    predict_layer,
    shipped_before_fix_nic_ratio,
    shipped_jean_zay_p2p_ratio,
    split_fit_hold,
)
from planner.plan import write_atomic
from planner.profile.calibration import Calibration, default_calibration
from planner.resources import load_structured_file, profiles_dir

__all__ = ["BEFORE_FIX_NIC_RATIO", "CLUSTER_STATES", "FITTED", "JEAN_ZAY_P2P_RATIO", "MEMORY_FITTED",
           "coordinate_descent", "destination", "fit", "golden_section", "memory_objective", "objective"]


@dataclass(frozen=True)
class Fitted:
    """A constant the fit may move, inside bounds that keep it physical, and what it means."""

    name: str
    prior: float  # the pre-calibration assumption every fit starts from (so reruns are reproducible)
    low: float
    high: float
    meaning: str


FITTED = (
    Fitted("gemm_efficiency", 1.0, 0.5, 1.0, "share of the max achievable matmul rate (MAMF) training GEMMs reach"),
    Fitted("memory_bound_efficiency", 0.7, 0.3, 0.95, "fraction of HBM bandwidth element-wise kernels reach"),
    Fitted("collective_efficiency_inter", 0.9, 0.3, 1.0, "NCCL bus bandwidth / NIC line rate for DP collectives"),
    Fitted("p2p_efficiency_inter", 0.9, 0.3, 1.0, "pipeline send/recv bandwidth / NIC line rate"),
    Fitted("fp8_gemm_efficiency_ratio", 1.0, 0.4, 1.0, "FP8 GEMM efficiency (of the FP8 peak) relative to BF16's"),
    Fitted("flash_attention_efficiency", 0.6, 0.2, 0.9, "FlashAttention forward FLOP rate / BF16 peak"),
    Fitted("iteration_overhead_s", 0.0, 0.0, 2.0, "fixed cost per iteration: data loader, loss scaling, logging"),
    Fitted("misaligned_gemm_efficiency", 1.0, 0.05, 1.0,
           "GEMM efficiency relative to aligned when a 16-bit leading dimension is not a multiple of 16 bytes"),
    Fitted("legacy_pipeline_layer_s", 0.0, 0.0, 0.01,
           "seconds DeepSpeed's legacy pipeline engine adds per layer and forward pass of a micro-batch"),
)
# Memory constants are no longer fitted: CUDA context, NCCL buffers and allocator fragmentation are sourced
# physical terms (profiles/calibration.yaml, planner/cost/memory.py); refitting the fragmentation on the BLOOM
# memory rows alone would drive it past its bound and call runs that ran infeasible (docs/accuracy.md).
MEMORY_FITTED: tuple[Fitted, ...] = ()
# Cluster states, not cost-model constants: they scale the BLOOM rows' cluster (benchmarks/validation_runs.py).
BEFORE_FIX_NIC_RATIO = Fitted("nic_bandwidth_ratio", 1.0, 0.3, 1.0,
                              "inter-node bandwidth before Jean Zay's PCIe/NUMA fix relative to after it")
JEAN_ZAY_P2P_RATIO = Fitted("p2p_bandwidth_ratio", 1.0, 0.1, 1.0,
                            "pipeline send/receive bandwidth on Jean Zay's Omni-Path fabric relative to the "
                            "p2p_efficiency_inter other clusters are costed at")
CLUSTER_STATES = {JEAN_ZAY_BEFORE_FIX: BEFORE_FIX_NIC_RATIO, JEAN_ZAY_PIPELINE: JEAN_ZAY_P2P_RATIO}
States = dict[str, float]  # cluster-state ratios by their Fitted name
_GOLDEN = (math.sqrt(5) - 1) / 2
_SECTION_STEPS = 10
_SWEEPS = 2


def _run_errors(runs: tuple[Run, ...], calibration: Calibration) -> list[float]:
    return [predict(run, calibration).iteration_time_s / run.iteration_s - 1 for run in runs]


def _layer_errors(calibration: Calibration) -> list[float]:
    errors = []
    for row in korthikanti_layer_rows():
        forward, backward = predict_layer(row, calibration)
        errors += [forward / row.forward_s - 1, backward / row.backward_s - 1]
    return errors


def group_errors(calibration: Calibration, bloom: tuple[Run, ...], h100: tuple[Run, ...]) -> dict[str, list[float]]:
    """Relative errors (predicted / published − 1) of every data point, per group; `h100` holds the short- and the
    long-sequence H100 runs (`calibration_h100_runs`), each its own group."""
    short = tuple(run for run in h100 if not is_nemo_long_sequence_h100(run))
    long = tuple(run for run in h100 if is_nemo_long_sequence_h100(run))
    return {"bloom": _run_errors(bloom, calibration), "korthikanti": _layer_errors(calibration),
            "h100": _run_errors(short, calibration), "h100_long_sequence": _run_errors(long, calibration)}


def calibration_h100_runs() -> tuple[Run, ...]:
    """The H100 runs of the calibration set: NeMo 24.07 / Megatron-Bridge 25.11 and NeMo's long-sequence table."""
    return h100_runs()[0] + nemo_long_sequence_h100_runs()


def objective(calibration: Calibration, bloom: tuple[Run, ...], h100: tuple[Run, ...]) -> float:
    groups = group_errors(calibration, bloom, h100)
    return sum(sum(abs(e) for e in errs) / len(errs) for errs in groups.values()) / len(groups)


def memory_objective(calibration: Calibration, runs: tuple[Run, ...]) -> float:
    """Mean absolute relative error of the peak memory per GPU over runs that report one."""
    errors = [run.memory_error(predict(run, calibration)) for run in runs if run.memory_bytes]
    return sum(abs(e) for e in errors) / len(errors)


def golden_section(loss: Callable[[float], float], low: float, high: float, start: float,
                    steps: int = _SECTION_STEPS) -> float:
    """Minimiser of a one-dimensional loss on [low, high]; keeps `start` unless something beats it."""
    a, b = low, high
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = loss(d)
    best, best_loss = (c, fc) if fc < fd else (d, fd)
    return best if best_loss < loss(start) else start


def coordinate_descent(start: Calibration, constants: tuple[Fitted, ...], loss: Callable[[Calibration], float],
                       verbose: bool = True, sweeps: int = _SWEEPS, steps: int = _SECTION_STEPS) -> Calibration:
    """Cyclic coordinate descent: a golden-section search of each constant in turn, `sweeps` times."""
    current = start
    for sweep in range(sweeps):
        for constant in constants:
            value = golden_section(lambda x, name=constant.name, base=current: loss(base.updated(**{name: x})),
                                    constant.low, constant.high, getattr(current, constant.name), steps)
            current = current.updated(**{constant.name: value})
            if verbose:
                print(f"sweep {sweep + 1} {constant.name:30s} {value:12.4g}  objective {100 * loss(current):6.2f} %",
                      flush=True)
    return current


def fit_half_runs(states: States) -> tuple[Run, ...]:
    """The BLOOM fit half with the given cluster-state ratios."""
    return split_fit_hold(bloom_runs(states[BEFORE_FIX_NIC_RATIO.name], states[JEAN_ZAY_P2P_RATIO.name]))[0]


def shipped_states() -> States:
    """The cluster-state ratios profiles/calibration.yaml ships."""
    return {BEFORE_FIX_NIC_RATIO.name: shipped_before_fix_nic_ratio(),
            JEAN_ZAY_P2P_RATIO.name: shipped_jean_zay_p2p_ratio()}


def fit_states(calibration: Calibration, states: States, which: Sequence[Fitted],
               bloom: Callable[[States], tuple[Run, ...]], h100: tuple[Run, ...], verbose: bool = True) -> States:
    """A golden-section search of each named cluster-state ratio in turn, the cost-model constants held."""
    for state in which:
        value = golden_section(
            lambda x, name=state.name, held=states: objective(calibration, bloom(held | {name: x}), h100),
            state.low, state.high, states[state.name])
        states = states | {state.name: value}
        if verbose:
            loss = objective(calibration, bloom(states), h100)
            print(f"{state.name:37s} {value:12.4g}  objective {100 * loss:6.2f} %", flush=True)
    return states


def fit(start: Calibration, bloom: Callable[[States], tuple[Run, ...]], h100: tuple[Run, ...],
        verbose: bool = True) -> tuple[Calibration, States]:
    """Time constants on all groups, alternating each sweep with the cluster-state ratios (BLOOM rows from
    `bloom(states)`), then memory constants on the BLOOM memory rows."""
    current, states = start, {state.name: state.prior for state in CLUSTER_STATES.values()}
    for _ in range(_SWEEPS):
        runs = bloom(states)
        current = coordinate_descent(current, FITTED, lambda c, runs=runs: objective(c, runs, h100), verbose, 1)
        states = fit_states(current, states, tuple(CLUSTER_STATES.values()), bloom, h100, verbose)
    runs = bloom(states)
    return coordinate_descent(current, MEMORY_FITTED, lambda c: memory_objective(c, runs), verbose), states


def _document(calibration: Calibration, states: States, previous: dict[str, str], source: str,
              refitted: frozenset[str] | None = None) -> dict:
    """The calibration file's document: the fitted constants and cluster states (only `refitted` ones, when given)
    with `source`, every other one with its previous source."""
    fitted = {c.name: c for c in FITTED + MEMORY_FITTED if refitted is None or c.name in refitted}
    constants = {}
    for key, value in calibration.__dict__.items():
        if key in fitted:
            constants[key] = {"value": round(value, 4), "source": f"{fitted[key].meaning}; {source}"}
        else:
            constants[key] = {"value": value, "source": previous.get(key, "default")}
    cluster_states = {
        key: {state.name: round(states[state.name], 4),
              "source": (f"{state.meaning}; {source}" if refitted is None or state.name in refitted
                         else previous.get(state.name, state.meaning))}
        for key, state in CLUSTER_STATES.items()}
    return {"schema_version": 1, "constants": constants, "cluster_states": cluster_states}


def _previous_sources() -> dict[str, str]:
    document = load_structured_file(profiles_dir() / "calibration.yaml")
    sources = {k: v.get("source", "") for k, v in document["constants"].items() if isinstance(v, dict)}
    states = document.get("cluster_states") or {}
    return sources | {fitted.name: states[key]["source"] for key, fitted in CLUSTER_STATES.items()
                      if "source" in states.get(key, {})}


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--out", type=Path, help="write the fitted calibration here")
    target.add_argument("--write", action="store_true", help="rewrite the tracked profiles/calibration.yaml")
    parser.add_argument("--only", metavar="NAME[,NAME]", type=_fitted_named,
                        help="refit only these constants or cluster-state ratios, from their shipped values, the "
                             "others kept as shipped "
                             f"(one of {', '.join(c.name for c in (*FITTED, *CLUSTER_STATES.values()))})")
    return parser.parse_args(argv)


def _fitted_named(text: str) -> tuple[Fitted, ...]:
    """`--only gemm_efficiency,...`: the named fitted constants or cluster states (argparse's error for any other
    name)."""
    fitted = {c.name: c for c in (*FITTED, *CLUSTER_STATES.values())}
    unknown = [name for name in text.split(",") if name not in fitted]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not a fitted constant; one of {', '.join(fitted)}")
    return tuple(fitted[name] for name in text.split(","))


def destination(argv: Sequence[str] | None = None) -> Path | None:
    """Where the fitted calibration goes: `--out FILE`, the tracked profiles/calibration.yaml only when
    `--write` asks for it, otherwise nowhere (printed), so a trial fit never edits tracked data."""
    return _destination(_arguments(argv))


def _destination(args: argparse.Namespace) -> Path | None:
    return profiles_dir() / "calibration.yaml" if args.write else args.out


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    path, only = _destination(args), args.only
    states = shipped_states() if only else {state.name: state.prior for state in CLUSTER_STATES.values()}
    fit_half = fit_half_runs(states)
    h100 = calibration_h100_runs()
    start = (default_calibration() if only
             else default_calibration().updated(**{c.name: c.prior for c in FITTED + MEMORY_FITTED}))
    long = len(nemo_long_sequence_h100_runs())
    print(f"fitting on {len(fit_half)} BLOOM rows (fit half), {len(korthikanti_layer_rows())} Korthikanti "
          f"Table 4 rows, {len(h100) - long} H100 runs and {long} H100 long-sequence runs; start objective "
          f"{100 * objective(start, fit_half, h100):.2f} %")
    if only:
        result = coordinate_descent(start, tuple(c for c in only if c in FITTED),
                                    lambda c: objective(c, fit_half, h100))
        named_states = tuple(c for c in only if c in CLUSTER_STATES.values())
        for _ in range(_SWEEPS if len(named_states) > 1 else 1):
            states = fit_states(result, states, named_states, fit_half_runs, h100)
    else:
        result, states = fit(start, fit_half_runs, h100)
    today = datetime.date.today().isoformat()
    how = (f"refitted {today} alone (the others as shipped) by benchmarks/calibrate.py --only "
           f"{','.join(c.name for c in only)}" if only else f"fitted {today} by benchmarks/calibrate.py")
    source = (f"{how} on {BLOOM_FILE} (fit half, {len(fit_half)} rows), "
              f"korthikanti2022_table4_layer_time_22b.csv, nemo_2407_h100_fp8_pretraining.csv and "
              f"megatron_bridge_2511_h100_dense.csv ({len(h100) - long} runs), long_context_cp_throughput.csv's "
              f"NeMo H100 long-sequence rows ({long} runs, 4K-1M tokens)")
    document = _document(result, states, _previous_sources(), source,
                         frozenset(c.name for c in only) if only else None)
    text = ("# Efficiencies and latencies of the analytic cost model. Every constant is physical (a fraction\n"
            "# of a peak, a latency in seconds) and names the data it came from. The fitted ones are rewritten\n"
            "# by `python -m benchmarks.calibrate --write` from ../shared/validation copies only.\n"
            "# `cluster_states` are not cost-model constants: benchmarks/validation_runs.py applies them to\n"
            "# runs of that machine state.\n"
            + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=200))
    if path:
        write_atomic(path, text)
        print(f"wrote {path}")
    else:
        print(text)


if __name__ == "__main__":
    main()
