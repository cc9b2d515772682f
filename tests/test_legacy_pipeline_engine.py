"""DeepSpeed's legacy pipeline engine (planner/config.py `deepspeed_legacy_pipeline`, planner/cost/time.py): releases
before 0.8 add `Calibration.legacy_pipeline_layer_s` per transformer layer and forward pass of a micro-batch (twice
in a backward) under pipeline parallelism; the runs that show it (BLOOM, MT-NLG) and those that do not (vTrain's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.published_scaling import MT_NLG_ROWS, mt_nlg_layouts
from benchmarks.ranking import VTrainRun, vtrain_time
from benchmarks.validation_runs import bloom_runs
from planner.cluster import Link, parse_shorthand
from planner.config import ParallelConfig, Recompute, Training, deepspeed_legacy_pipeline
from planner.cost.estimate import estimate
from planner.cost.time import unit_costs
from planner.model import UnitKind, load_model
from planner.placement import default_placement
from planner.plan import build_plan_document, parse_plan_document
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

ENGINE_S = 0.003
CALIBRATION = default_calibration().updated(legacy_pipeline_layer_s=ENGINE_S)
MODEL = load_model("llama3-8b")
TRAINING = Training(global_batch=64, seq_len=2048)


@pytest.mark.parametrize(("version", "legacy"), [("0.3", True), ("0.5.7", True), ("0.6", True), ("0.7.3", True),
                                                 ("0.8", False), ("0.9.5", False), ("0.19.8", False)])
def test_releases_before_0_8_run_the_legacy_engine(version: str, legacy: bool) -> None:
    assert deepspeed_legacy_pipeline(version) is legacy


def _block(config: ParallelConfig):
    gpu = parse_shorthand("2x8xA100-80GB").nodes[0].gpu
    return unit_costs(MODEL, TRAINING, config, gpu, Link(300e9, 0.0, "intra"), AnalyticProfile(MODEL, CALIBRATION),
                      CALIBRATION)[UnitKind.BLOCK]


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL])
def test_each_layer_pays_the_engine_once_per_forward_pass(recompute: Recompute) -> None:
    """Forward +s, backward +2s, a fully recomputed forward +s; the embedding and head are not layers."""
    modern = ParallelConfig(dp=2, tp=2, pp=4, recompute=recompute)
    legacy = replace(modern, legacy_pipeline_engine=True)
    before, after = _block(modern), _block(legacy)
    assert after.forward_s - before.forward_s == pytest.approx(ENGINE_S)
    assert after.backward_s - before.backward_s == pytest.approx(2 * ENGINE_S)
    assert after.recompute_s - before.recompute_s == pytest.approx(ENGINE_S * (recompute is Recompute.FULL))


def test_without_pipeline_parallelism_there_is_no_pipeline_engine() -> None:
    """Megatron-DeepSpeed runs pp 1 on DeepSpeed's plain engine: no cost."""
    modern = ParallelConfig(dp=8, tp=2, pp=1)
    assert _block(replace(modern, legacy_pipeline_engine=True)) == _block(modern)


def test_an_iteration_grows_by_the_engine_on_every_micro_batch() -> None:
    """1F1B on 4 stages of 8 layers, 8 micro-batches, no recompute: the bottleneck stage's (m + pp − 1) slots each
    grow by 8 layers × 3 s."""
    cluster = parse_shorthand("2x8xA100-80GB")
    modern = ParallelConfig(dp=2, tp=2, pp=4, micro_batch=4)
    legacy = replace(modern, legacy_pipeline_engine=True)
    grown = (estimate(MODEL, cluster, TRAINING, legacy, calibration=CALIBRATION).iteration_time_s
             - estimate(MODEL, cluster, TRAINING, modern, calibration=CALIBRATION).iteration_time_s)
    assert grown == pytest.approx((8 + 4 - 1) * 8 * 3 * ENGINE_S, rel=0.05)


def test_a_plan_file_keeps_the_engine() -> None:
    """Written only when set (a plan planner makes never is), read back as written."""
    cluster = parse_shorthand("2x8xA100-80GB")
    config = replace(ParallelConfig(dp=2, tp=2, pp=4), legacy_pipeline_engine=True)
    placement = default_placement(cluster, config)
    result = estimate(MODEL, cluster, TRAINING, config, calibration=CALIBRATION)
    document = build_plan_document(MODEL, cluster, TRAINING, config, placement, result)
    assert document["parallelism"]["legacy_pipeline_engine"] is True
    assert parse_plan_document(document).parallel.legacy_pipeline_engine
    plain = replace(config, legacy_pipeline_engine=False)
    assert "legacy_pipeline_engine" not in build_plan_document(MODEL, cluster, TRAINING, plain, placement,
                                                               result)["parallelism"]


def test_the_runs_of_2021_22_run_it_and_vtrains_2023_runs_do_not() -> None:
    """BLOOM's sweep (2022) and MT-NLG (2021) pay it; a vTrain run at pp 4 (2023) costs the same at any value."""
    assert all(run.config.legacy_pipeline_engine for run in bloom_runs())
    assert all(config.legacy_pipeline_engine for config in mt_nlg_layouts(MT_NLG_ROWS[0]))
    run = VTrainRun("gpt", 24, 2048, 16, 1024, 32, 1, 2, 4, 1)
    cluster = parse_shorthand("1x8xA100-80GB")
    assert vtrain_time(run, cluster, CALIBRATION) == vtrain_time(run, cluster, default_calibration())
