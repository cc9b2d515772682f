"""Runs the validation files document as out of memory, beyond the MoE sweeps: the BLOOM sweep's "OOM" rows and the
530B configuration Narayanan et al.'s Table 2 notes did not fit; each estimated and scored on not fitting."""

from __future__ import annotations

import math

import pandas as pd

from benchmarks.accuracy import oom_outcomes
from benchmarks.sources import sources
from benchmarks.validation_runs import (
    BLOOM_FILE,
    DATA,
    NARAYANAN_FILE,
    bloom_runs,
    bloom_skipped,
    narayanan_zero3_ooms,
    narayanan_zero3_runs,
)
from planner.profile.calibration import default_calibration


def _line(run) -> int:
    return int(run.source.split()[-1])


def test_every_bloom_oom_row_with_a_whole_configuration_is_a_documented_oom() -> None:
    frame = pd.read_csv(DATA / BLOOM_FILE)
    documented = set(frame.loc[frame["mem"].astype(str).str.strip() == "OOM", "source_line"])
    ooms = bloom_runs(ooms=True)
    assert {_line(run) for run in ooms} == {793, 806, 807, 917, 918, 957} <= documented
    assert all(math.isnan(run.iteration_s) and run.memory_bytes is None for run in ooms)
    assert not documented & {_line(run) for run in bloom_runs()}  # none scored for time
    skipped = {int(row.row.split()[-1]) for row in bloom_skipped()}
    assert not skipped & {_line(run) for run in ooms}
    assert len(skipped) + len(bloom_runs()) + len(ooms) <= len(frame)  # repeats of a run are skipped once each


def test_narayanan_530b_on_560_gpus_is_the_noted_oom() -> None:
    """"* did not fit on 560 GPUs with microbatch 4": one micro-batch per GPU, as every ZeRO-3 row of the table."""
    (oom,) = narayanan_zero3_ooms()
    assert (oom.config.dp, oom.config.micro_batch, oom.training.global_batch) == (560, 4, 2240)
    assert oom.model.hidden_size == 20480 and math.isnan(oom.iteration_s)
    table = pd.read_csv(DATA / NARAYANAN_FILE)
    zero3 = table[table["scheme"].str.startswith("ZeRO-3")]
    assert (zero3["batch_size"] == zero3["num_gpus"] * zero3["microbatch_size"]).all()
    assert len(narayanan_zero3_runs()) == len(zero3)


def test_which_are_caught() -> None:
    """The BLOOM rows at micro-batch 2 and the dp-48 one are predicted not to fit, and L918 at its optimizer step (the
    BF16_Optimizer's bf16 and fp32 gradients beside the bf16 copy its reduction makes); L807 (micro-batch 1) is
    predicted 3 % under the capacity, L957 far under (a puzzle: L939, as large per GPU, ran at 67 GB); the 530B one
    4 % under."""
    calibration = default_calibration()
    by_name = {source.name: source for source in sources()}
    bloom = oom_outcomes(by_name["BLOOM-176B sweep (Megatron-DeepSpeed, A100)"], calibration)
    assert {_line(o.run) for o in bloom if not o.fits} == {793, 806, 917, 918}
    (narayanan,) = oom_outcomes(by_name["Narayanan 2021 Table 2 (DeepSpeed ZeRO-3, A100)"], calibration)
    assert narayanan.fits and 0.95 < narayanan.peak_memory_bytes / narayanan.run.cluster.gpu.memory_bytes < 0.97
