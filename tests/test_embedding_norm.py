"""A norm after the token embedding (BLOOM's word_embeddings_layernorm, `ModelSpec.embedding_norm`): its parameters,
the 16-bit input it keeps for backward on the first stage, its memory-bound time, and the exports that cannot build
it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.accuracy import outcomes
from benchmarks.validation_runs import bloom_model, bloom_runs
from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.memory import activation_bytes
from planner.export.flags import Dialect, model_flags
from planner.gpu import GIB
from planner.model import UnitKind, load_model
from planner.profile.analytic import AnalyticProfile, unit_setting
from planner.profile.calibration import default_calibration

BLOOM = load_model("bloom-176b")
WITHOUT = replace(BLOOM, embedding_norm=False)
TRAINING = Training(global_batch=16, seq_len=2048, dtype="bf16", attention="unfused")


def test_bloom_176b_counts_its_embedding_layernorm() -> None:
    """The model card's 176,247,271,424 parameters include the LayerNorm's weight and bias (2 × 14336)."""
    assert BLOOM.num_parameters == 176_247_271_424
    assert BLOOM.num_parameters - WITHOUT.num_parameters == 2 * 14336
    assert BLOOM.embedding_parameters() == 250880 * 14336 + 2 * 14336
    assert not BLOOM.dropout  # bigscience/bloom config.json: hidden and attention dropout 0.0


@pytest.mark.parametrize(("tp", "sequence_parallel"), [(1, False), (8, False), (8, True)])
def test_the_norm_keeps_its_16_bit_input(tp: int, sequence_parallel: bool) -> None:
    """2 bytes per element of the embedding's output, whole on every TP rank (it follows the vocab-parallel
    all-reduce), 1/tp of it under sequence parallelism; nothing without the norm and without dropout."""
    config = ParallelConfig(dp=1, tp=tp, pp=1, micro_batch=4, sequence_parallel=sequence_parallel,
                            recompute=Recompute.FULL)
    kept = activation_bytes(BLOOM, UnitKind.EMBEDDING, TRAINING, config)
    assert kept == 2 * 2048 * 4 * 14336 / (tp if sequence_parallel else 1)
    assert activation_bytes(WITHOUT, UnitKind.EMBEDDING, TRAINING, config) == 0


def test_the_norm_costs_memory_bound_time_on_the_embedding() -> None:
    """One more kernel over the embedding's output: read and write 2 bytes each forward, twice that backward."""
    calibration = default_calibration()
    a100 = parse_shorthand("1x8xA100-80GB").nodes[0].gpu
    setting = unit_setting(TRAINING, 8, 4, False)
    with_norm = AnalyticProfile(BLOOM, calibration).times(UnitKind.EMBEDDING, setting, a100)
    without = AnalyticProfile(WITHOUT, calibration).times(UnitKind.EMBEDDING, setting, a100)
    norm_bytes = 4 * 2048 * 4 * 14336
    assert with_norm.forward_s > without.forward_s + norm_bytes / a100.hbm_bandwidth_bytes_per_s
    assert with_norm.backward_s > without.backward_s + 2 * norm_bytes / a100.hbm_bandwidth_bytes_per_s


@pytest.mark.parametrize("dialect", list(Dialect))
def test_exports_say_they_build_the_model_without_it(dialect: Dialect) -> None:
    model = replace(load_model("gpt3-1.3b"), embedding_norm=True)
    notes = model_flags(model, Training(), dialect).unsupported
    assert any("norm after the token embedding" in note for note in notes)
    assert not any("token embedding" in note for note in model_flags(load_model("gpt3-1.3b"), Training(),
                                                                       dialect).unsupported)


def test_bloom_sweep_first_stage_holds_the_norm_input_per_micro_batch_in_flight() -> None:
    """The BLOOM sweep's first stage (the published reading) keeps one norm input per micro-batch in flight: L609
    (tp 8, pp 12, micro-batch 4: twelve in flight) gains 12 × 2 × 2048 × 4 × 14336 bytes over the model without it."""
    run = next(r for r in bloom_runs() if r.label.startswith("L609 "))
    assert run.model == bloom_model(14336, 72, 64) and run.model.embedding_norm
    plain = replace(run, model=replace(run.model, embedding_norm=False))
    with_norm, without = outcomes((run, plain), default_calibration())
    gained = (with_norm.peak_memory_bytes - without.peak_memory_bytes) / GIB
    assert gained == pytest.approx(12 * 2 * 2048 * 4 * 14336 / GIB, rel=1e-3)
