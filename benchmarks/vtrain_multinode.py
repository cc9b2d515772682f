"""Held-out check: vTrain's multi-node measurements, never fitted, ranked and estimated as the single-node sweep is.

VIA-Research/vTrain's data/ground_truth_multi.csv (f8dda84) holds 109 Megatron-DeepSpeed runs of four GPT models
(3.6B on 64 A100, 18.4B on 256, 39.1B and 175B on 512), each over many (tp, dp, pp, micro-batch) layouts at a fixed
global batch and sequence 2048. It is not in ../shared/validation, so nothing is calibrated on it; the single-node
sweep that `host_kernel_s` and `host_overlap_softness` are fitted on comes from the same study and codebase. The
runs are costed as `benchmarks.ranking.vtrain_time` costs the single-node ones (fp16, unfused attention, full
activation checkpointing, no ZeRO, 1/tp of a boundary tensor per TP rank, gradients all-reduced after the flush), on
nodes of 8 A100 with the inter-node bandwidth the study's validation configs state (`inter_node_bandwidth` 800
Gbps per node: 12.5 GB/s per GPU). Per model: the Spearman correlation of predicted with measured time over its
layouts, the regret of planner's first pick (its measured time ÷ the best measured) and the time MAPE.

    PYTHONPATH=. python -m benchmarks.vtrain_multinode ground_truth_multi.csv [--runs]
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pandas as pd

from benchmarks.accuracy import held_out_pages
from benchmarks.ranking import VTrainRun, group_scores, study_summary, summary_lines, vtrain_time
from planner.cluster import Cluster, cluster_from_dict
from planner.errors import PlannerError
from planner.profile.calibration import Calibration, default_calibration

__all__ = ["COLUMNS", "STUDY", "multinode_runs", "multinode_times"]

STUDY = "vTrain multi-node (A100, held out)"
GPUS_PER_NODE = 8
NIC_GBPS_PER_GPU = 800 / 8 / GPUS_PER_NODE  # the configs' 800 Gbps per node, in GB/s per GPU
COLUMNS = {"params": "Parameters (billion)", "gpus": "# GPUs", "global_batch": "global batch",
           "micro_batch": "micro batch", "hidden": "hidden size", "heads": "attention heads", "layers": "# layers",
           "seq_len": "sequence length", "tp": "tensor parallelism", "dp": "data parallelism",
           "pp": "pipeline parallelism", "time_ms": "iteration time (ms)"}


def multinode_runs(text: str) -> pd.DataFrame:
    """The table's runs: one row per run with COLUMNS' keys as column names; PlannerError naming what is missing or
    inconsistent (a layout whose degrees do not multiply to its GPU count)."""
    table = pd.read_csv(io.StringIO(text.lstrip("\ufeff")))
    missing = [name for name in COLUMNS.values() if name not in table.columns]
    if missing:
        raise PlannerError(f"not vTrain's ground_truth_multi.csv: no column {', '.join(map(repr, missing))}")
    table = table.rename(columns={name: key for key, name in COLUMNS.items()})[list(COLUMNS)]
    if table.empty:
        raise PlannerError("the table holds no runs")
    numbers = table.apply(pd.to_numeric, errors="coerce")
    for key, name in COLUMNS.items():
        bad = numbers.index[~(numbers[key] > 0)]
        if len(bad):
            raise PlannerError(f"row {bad[0] + 2}: {name} {table.loc[bad[0], key]!r} is not a positive number")
    wrong = numbers[numbers["tp"] * numbers["dp"] * numbers["pp"] != numbers["gpus"]]
    if not wrong.empty:
        row = wrong.iloc[0]
        raise PlannerError(f"row {wrong.index[0] + 2}: tp {row['tp']:g} × dp {row['dp']:g} × pp {row['pp']:g} is not "
                           f"its {row['gpus']:g} GPUs")
    return numbers


def _cluster(gpus: int) -> Cluster:
    if gpus % GPUS_PER_NODE:
        raise PlannerError(f"{gpus} GPUs is not a whole number of {GPUS_PER_NODE}-GPU nodes")
    return cluster_from_dict({"name": f"vtrain-{gpus}", "node_groups": [
        {"gpu": "A100-80GB", "nodes": gpus // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE,
         "inter_node_gbps": NIC_GBPS_PER_GPU}]}, "vTrain's validation configs")


def multinode_times(table: pd.DataFrame, calibration: Calibration) -> pd.DataFrame:
    """`benchmarks.ranking.predicted_times`' table for the runs: study, group (one per model, GPU count and global
    batch), measured and predicted seconds per iteration."""
    rows = []
    for _, row in table.iterrows():
        name = f"{row['params']:g}B"
        run = VTrainRun(f"gpt-{name}", int(row["layers"]), int(row["hidden"]), int(row["heads"]), int(row["seq_len"]),
                        int(row["global_batch"]), int(row["dp"]), int(row["tp"]), int(row["pp"]),
                        int(row["micro_batch"]))
        rows.append({"study": STUDY, "group": f"vtrain-multi-{name}-{int(row['gpus'])}gpu-gbs{run.global_batch}",
                     "measured": row["time_ms"] / 1e3,
                     "predicted": vtrain_time(run, _cluster(int(row["gpus"])), calibration),
                     "layout": f"tp{run.tp} dp{run.dp} pp{run.pp} mb{run.micro_batch}"})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser, texts, print_runs = held_out_pages(__doc__.splitlines()[0], "vTrain's data/ground_truth_multi.csv", argv)
    try:
        table = pd.concat([multinode_runs(text) for text in texts], ignore_index=True)
        times = multinode_times(table, default_calibration())
    except PlannerError as exc:
        parser.error(str(exc))
    times["error"] = times["predicted"] / times["measured"] - 1
    if print_runs:
        for _, row in times.iterrows():
            print(f"{row['group']:32s} {row['layout']:22s} measured {row['measured']:7.3f} s  predicted "
                  f"{row['predicted']:7.3f} s  {100 * row['error']:+6.1f} %")
    scores = group_scores(times)
    for _, row in scores.iterrows():
        group = times[times["group"] == row["group"]]
        print(f"{row['group']:32s} {row['layouts']:3.0f} layouts  Spearman {row['spearman']:.2f}  regret "
              f"{row['regret']:.3f}  time MAPE {100 * group['error'].abs().mean():.1f} %  mean "
              f"{100 * group['error'].mean():+.1f} %")
    print("\n".join(summary_lines(study_summary(scores))))


if __name__ == "__main__":
    main()
