"""Does planner rank layouts as the measurements do? Layout sweeps of ../shared/validation/sweeps.

    python -m benchmarks.ranking              # per-group table, then the summary
    python -m benchmarks.ranking --summary    # the summary table only (README "Accuracy")

Within a group only the layout changes (dp, tp, pp, micro-batch, ZeRO stage). Per group: the Spearman
correlation of predicted with measured time, and the regret = measured time of the layout planner
ranks first ÷ the best measured time of the group (1.0: planner picks the fastest). Issue 10's
targets: median Spearman ≥ 0.9, mean regret ≤ 1.05.

Settings the sweeps do not state, as the studies ran them:
* vTrain single-node (Megatron-DeepSpeed on one 8×A100 node): GPT-2 BPE vocabulary (50257, padded as
  Megatron pads it), learned positions, fp16, unfused attention, full activation checkpointing
  (`use_checkpoint=true`), no ZeRO, DeepSpeed's pipeline engine as for BLOOM (each TP rank sends its 1/tp
  slice of a stage boundary's tensor, gradients reduced after the flush: `use_gradient_bucket=false`).
* DeepSpeed autotuning (HF transformers on one 16×V100-32GB node): GPT-2 family only (the BERT/DeBERTa
  encoders are skipped), sequence 1024 (run_clm's block size), fp16, unfused attention, no checkpointing;
  the metric is samples/s, so time per sample = 1 / throughput and planner's is iteration time / batch.
  Tuning spaces with no successful experiment are left out (the README does not say why they failed).
  The committed test_tune.sh passes `--block_size 512` for gpt2-medium and gpt2-xl, but those scripts were
  written after the runs (DeepSpeedExamples f9dc4de2, 2021-11-11, still held BERT placeholders for them) and
  the measured ZeRO-1 time per sample and parameter is alike for all four models (15–19 ns), as it is only
  if all ran the same sequence length: 1024, the default the gpt2 and gpt2-large scripts keep.
  DeepSpeed is the autotuning branch (PR #1554, merged 2021-11-13, the day the examples were committed;
  first released in v0.5.7), so ZeRO-3 is the per-tensor, synchronised ZeRO-3 of releases before v0.6.0
  (`deepspeed_zero3_collectives`). Its autotuning template (`config_templates/template_zero3.json`) leaves
  `contiguous_gradients` off, so that ZeRO-3 all-reduces its gradients in flat 5e8-element buckets
  (`buffered_reduce_fallback`) rather than reduce-scattering them tensor by tensor as "per-tensor" charges.
The Alpa ablation is skipped: its layouts are XLA auto-sharding plans, not framework layouts planner models.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import pandas as pd

from benchmarks.validation_runs import DATA
from planner.cluster import Cluster, load_cluster
from planner.config import ParallelConfig, Recompute, Training, deepspeed_zero3_collectives
from planner.cost.estimate import estimate
from planner.frameworks import FRAMEWORKS
from planner.model import ModelSpec
from planner.profile.calibration import Calibration, default_calibration

__all__ = ["VTrainRun", "group_scores", "predicted_times", "study_summary", "summary_lines", "vtrain_time"]

VTRAIN_FILE = "vtrain_singlenode_a100.csv"
AUTOTUNING_FILE = "deepspeed_autotuning_hf_v100.csv"
AUTOTUNING_DEEPSPEED = "0.5.7"  # the first release with autotuning; the runs used its branch days before
GPT2_VOCAB = 50257
SEQ_LEN = 1024
RANKING_COVERAGE = 0.9  # the share of groups whose measured fastest layout `fastest_gap_quantile` covers


def _gpt(name: str, layers: int, hidden: int, heads: int, seq_len: int = SEQ_LEN) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     ffn_hidden_size=4 * hidden, vocab_size=GPT2_VOCAB, max_position_embeddings=seq_len,
                     activation="gelu", normalization="layernorm", position_embedding="learned", tie_embeddings=True,
                     linear_bias=True, dropout=True, source="GPT-2 shape of the sweep row")


@dataclass(frozen=True)
class VTrainRun:
    """One Megatron-DeepSpeed run of vTrain's validation (single- or multi-node): a GPT shape and its layout."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    global_batch: int
    dp: int
    tp: int
    pp: int
    micro_batch: int


def vtrain_time(run: VTrainRun, cluster: Cluster, calibration: Calibration) -> float:
    """Predicted seconds per iteration of one vTrain run on `cluster`, as its configs ran it: fp16, unfused
    attention, full activation checkpointing, no ZeRO, DeepSpeed's pipeline engine of 2023 (1/tp of a boundary tensor
    per TP rank; not the legacy engine, `deepspeed_legacy_pipeline`), gradients all-reduced after the flush
    (`use_gradient_bucket=false`)."""
    model = _gpt(run.name, run.layers, run.hidden, run.heads, run.seq_len)
    training = Training(global_batch=run.global_batch, seq_len=run.seq_len, dtype="fp16", attention="unfused")
    config = FRAMEWORKS["deepspeed"].runs(ParallelConfig(dp=run.dp, tp=run.tp, pp=run.pp, micro_batch=run.micro_batch,
                                                         recompute=Recompute.FULL))
    return estimate(model, cluster, training, config, calibration=calibration).iteration_time_s


def _vtrain_time(row: pd.Series, calibration: Calibration) -> float:
    """Predicted seconds per iteration of one run of the single-node sweep (one 8×A100 node, sequence 1024)."""
    run = VTrainRun(str(row["model"]), int(row["layers"]), int(row["hidden"]), int(row["heads"]), SEQ_LEN,
                    int(row["global_batch"]), int(row["dp"]), int(row["tp"]), int(row["pp"]), int(row["micro_batch"]))
    return vtrain_time(run, load_cluster("dgx-a100"), calibration)


def _autotuning_time(row: pd.Series, calibration: Calibration) -> float:
    """Predicted seconds per sample of one DeepSpeed autotuning result."""
    model = _gpt(str(row["model"]), int(row["layers"]), int(row["hidden"]), int(row["heads"]))
    dp, micro_batch, accumulation = int(row["dp"]), int(row["micro_batch"]), int(row["grad_accum"])
    training = Training(global_batch=dp * micro_batch * accumulation, seq_len=SEQ_LEN, dtype="fp16",
                        attention="unfused")
    zero = int(row["zero_sharding"][-1])
    config = ParallelConfig(dp=dp, tp=1, pp=1, micro_batch=micro_batch, zero_stage=zero,
                            zero3_collectives=deepspeed_zero3_collectives(AUTOTUNING_DEEPSPEED) if zero == 3
                            else "per-unit")
    result = estimate(model, load_cluster("1x16xV100-32GB"), training, config, calibration=calibration)
    return result.iteration_time_s / training.global_batch


def predicted_times(calibration: Calibration) -> pd.DataFrame:
    """One row per usable sweep run: study, group, measured and predicted time (per iteration or per sample)."""
    vtrain = pd.read_csv(DATA / VTRAIN_FILE)
    vtrain = vtrain[vtrain["status"] == "ok"]
    tuning = pd.read_csv(DATA / AUTOTUNING_FILE)
    tuning = tuning[(tuning["status"] == "ok") & tuning["model"].str.startswith("gpt2")]
    frames = [
        pd.DataFrame({"study": "vTrain single-node (A100)", "group": vtrain["group_id"],
                      "measured": vtrain["measured_iter_time_s"],
                      "predicted": [_vtrain_time(row, calibration) for _, row in vtrain.iterrows()]}),
        pd.DataFrame({"study": "DeepSpeed autotuning GPT-2 (V100)", "group": tuning["group_id"],
                      "measured": 1 / tuning["measured_throughput"],
                      "predicted": [_autotuning_time(row, calibration) for _, row in tuning.iterrows()]}),
    ]
    return pd.concat(frames, ignore_index=True)


def _group(frame: pd.DataFrame) -> pd.Series:
    spearman = frame["predicted"].rank().corr(frame["measured"].rank())  # Spearman = Pearson of ranks (no scipy)
    regret = frame["measured"].loc[frame["predicted"].idxmin()] / frame["measured"].min()
    fastest = frame["predicted"].loc[frame["measured"].idxmin()]  # planner's time for the measured fastest layout
    return pd.Series({"layouts": len(frame), "spearman": spearman, "regret": regret,
                      "fastest_rank": int((frame["predicted"] < fastest).sum()) + 1,
                      "fastest_gap": fastest / frame["predicted"].min() - 1})


def group_scores(times: pd.DataFrame) -> pd.DataFrame:
    """Per (study, group): layouts, Spearman of predicted with measured time, regret of planner's first pick, and
    where planner ranks the measured fastest layout: its place and how much slower than the first it is predicted."""
    return times.groupby(["study", "group"], sort=False)[["predicted", "measured"]].apply(_group).reset_index()


def fastest_gap_quantile(groups: pd.DataFrame) -> float:
    """The predicted gap between planner's first pick and the measured fastest layout that RANKING_COVERAGE of the
    groups stay within: how close to the first a plan must be for the measurements to have preferred it."""
    gaps = sorted(groups["fastest_gap"])
    return float(gaps[math.ceil(RANKING_COVERAGE * len(gaps)) - 1])  # the smallest gap that many groups stay within


def study_summary(groups: pd.DataFrame) -> pd.DataFrame:
    """Per study: groups, layouts, median Spearman, mean and worst regret, share of groups won outright and with
    the measured fastest among planner's first three, and the RANKING_COVERAGE quantile of `fastest_gap`."""
    summary = groups.groupby("study", sort=False).agg(
        groups=("group", "size"), layouts=("layouts", "sum"), median_spearman=("spearman", "median"),
        mean_regret=("regret", "mean"), worst_regret=("regret", "max"),
        best_picked=("regret", lambda r: (r <= 1 + 1e-9).mean()),
        fastest_in_top3=("fastest_rank", lambda r: (r <= 3).mean()))
    gaps = groups.groupby("study", sort=False)[["fastest_gap"]].apply(fastest_gap_quantile)
    return summary.assign(fastest_gap=gaps)


def summary_lines(summary: pd.DataFrame) -> list[str]:
    lines = ["| sweep | groups | layouts | median Spearman | mean regret | worst regret | fastest picked | "
             f"fastest in top 3 | fastest predicted within ({100 * RANKING_COVERAGE:.0f} % of groups) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for study, row in summary.iterrows():
        lines.append(f"| {study} | {row['groups']:.0f} | {row['layouts']:.0f} | {row['median_spearman']:.2f} | "
                     f"{row['mean_regret']:.3f} | {row['worst_regret']:.3f} | {100 * row['best_picked']:.0f} % | "
                     f"{100 * row['fastest_in_top3']:.0f} % | {100 * row['fastest_gap']:.1f} % |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="print only the summary table")
    args = parser.parse_args()
    groups = group_scores(predicted_times(default_calibration()))
    if not args.summary:
        with pd.option_context("display.max_rows", None, "display.width", 160):
            print(groups.to_string(index=False, float_format=lambda x: f"{x:.3f}" if math.isfinite(x) else "nan"))
        print()
    print("\n".join(summary_lines(study_summary(groups))))


if __name__ == "__main__":
    main()
