"""The interleaved schedule in torch.distributed.pipelining's order (`PyTorchInterleaved`, torchtitan's
"Interleaved1F1B"), checked pass for pass against torch's own `ScheduleInterleaved1F1B`, and how the framework
selects it (`ParallelConfig.pipeline_order`)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import main
from planner.config import ParallelConfig, Recompute, Schedule
from planner.cost.schedule import BACKWARD, FORWARD, PyTorchInterleaved, schedule_of, simulate
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS

PYTORCH = schedule_of(Schedule.INTERLEAVED, "pytorch")
MEGATRON = schedule_of(Schedule.INTERLEAVED)
CONFIG = ParallelConfig(dp=1, tp=1, pp=4, vpp=2, micro_batch=1, schedule=Schedule.INTERLEAVED)


def _runnable_layouts() -> list[tuple[int, int, int]]:
    """(pp, vpp, m) PyTorch's flexible rounds accept: m < p, m = p, multiples of p and others (10 over 4)."""
    return [(pp, v, m) for pp in (2, 3, 4, 8) for v in (2, 3, 4) for m in range(1, 3 * pp + 3)
            if m % max(1, m // pp) == 0]


def _torch_order(pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's own order for `rank`: (F or B, chunk, micro-batch) of each non-idle step."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    schedule = object.__new__(schedules.ScheduleInterleaved1F1B)  # the order needs no process group
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = pp, vpp, m
    schedule.number_of_rounds = max(1, m // pp)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    forward = schedules._ComputationType.FORWARD
    return [("F" if action.computation_type == forward else "B", action.stage_index // pp, action.microbatch_index)
            for action in schedule._calculate_single_rank_operations(rank) if action is not None]


@pytest.mark.parametrize(("pp", "vpp", "m"), _runnable_layouts())
def test_every_rank_runs_torchs_own_order(pp: int, vpp: int, m: int) -> None:
    letter = {FORWARD: "F", BACKWARD: "B"}
    for rank in range(pp):
        ours = [(letter[kind], chunk, mb) for kind, chunk, mb in PYTORCH.order(rank, pp, vpp, m)]
        assert ours == _torch_order(pp, vpp, m, rank), f"rank {rank}"


def test_as_many_micro_batches_as_ranks_no_all_forwards_warm_up() -> None:
    """m = p: Megatron-LM runs all m·v forwards first (every micro-batch in flight on every chunk of every rank);
    PyTorch warms rank r up with (v − 1)·p + 2(p − 1 − r) forwards, at most m·v: at pp 4, vpp 2 ranks 0 and 1 still
    run all 8 first, rank 2 holds (6 + 1) / 2 per chunk, rank 3 (4 + 1) / 2 — and its last chunk, the head's, runs
    each micro-batch's backward before the next forward after the warm-up."""
    assert [MEGATRON.in_flight(r, 4, 2, 4) for r in range(4)] == [4, 4, 4, 4]
    assert [PYTORCH.in_flight(r, 4, 2, 4) for r in range(4)] == [4, 4, 3.5, 2.5]
    assert MEGATRON.head_in_flight(4, 2, 4) == 4
    assert PYTORCH.head_in_flight(4, 2, 4) < 4
    # where p divides m and m > p the orders are the same
    for m in (8, 12):
        assert all(PYTORCH.order(r, 4, 2, m) == MEGATRON.order(r, 4, 2, m) for r in range(4))


@pytest.mark.parametrize(("m", "megatron", "pytorch"), [(6, False, True), (10, False, True), (3, False, True),
                                                         (8, True, True), (7, False, False)])
def test_which_micro_batch_counts_each_order_runs(m: int, megatron: bool, pytorch: bool) -> None:
    """Megatron-LM needs p | m; PyTorch needs its rounds, max(1, m // p), to divide m (7 over pp 2: 3 rounds)."""
    pp = 2 if m == 7 else 4
    assert MEGATRON.runnable(pp, m) is megatron
    assert PYTORCH.runnable(pp, m) is pytorch


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(_runnable_layouts()), times=st.lists(st.floats(0.5, 2.0), min_size=32, max_size=32))
def test_the_simulator_runs_every_order_torch_accepts(layout: tuple[int, int, int], times: list[float]) -> None:
    """No deadlock: every pass of every micro-batch runs, and the iteration is at least the busiest rank's work."""
    pp, vpp, m = layout
    forward = times[: pp * vpp]
    backward = [2 * t for t in forward]
    timeline = simulate(forward, backward, [0.0] * len(forward), pp, m, PYTORCH)
    busiest = max(sum(3 * forward[k] for k in range(r, pp * vpp, pp)) for r in range(pp)) * m
    assert math.isfinite(timeline.iteration_s) and timeline.iteration_s >= busiest - 1e-9
    assert len(timeline.events) == 2 * m * pp * vpp


def test_torchtitan_runs_pytorchs_order_and_the_others_megatrons() -> None:
    assert FRAMEWORKS["torchtitan"].runs(CONFIG).pipeline_schedule is PYTORCH
    assert isinstance(PYTORCH, PyTorchInterleaved)
    for name in ("megatron", "deepspeed", "any"):
        assert FRAMEWORKS[name].runs(replace(CONFIG, pipeline_order="pytorch")).pipeline_order == "megatron"
    # one order for every other schedule
    assert schedule_of(Schedule.ONE_F_ONE_B, "pytorch") is schedule_of(Schedule.ONE_F_ONE_B)


def test_bad_order_is_refused() -> None:
    with pytest.raises(PlannerError, match="pipeline_order"):
        replace(CONFIG, pipeline_order="deepspeed")


ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--pp", "4", "--dp", "2", "--vpp", "2",
            "--schedule", "interleaved", "--micro-batch", "1", "--seq-len", "4096", "--recompute", "full", "--json"]


def test_torchtitan_plan_at_m_equal_p_holds_less_than_megatrons(tmp_path) -> None:
    """Global batch 8 over dp 2: 4 micro-batches on 4 ranks, where Megatron-LM's order keeps every forward in
    flight; under PyTorch's the last rank (the head's logits included) holds less. The plan file records the order
    and `estimate --plan` replays it."""
    out = tmp_path / "plan.json"
    titan = CliRunner().invoke(main, [*ESTIMATE, "--global-batch", "8", "--framework", "torchtitan", "--zero", "3",
                                      "--out", str(out)])
    megatron = CliRunner().invoke(main, [*ESTIMATE, "--global-batch", "8", "--framework", "megatron"])
    assert titan.exit_code == 0 and megatron.exit_code == 0, titan.output + megatron.output
    document = json.loads(out.read_text())
    assert document["parallelism"]["pipeline_order"] == "pytorch"
    assert document["parallelism"]["num_microbatches"] == 4
    titan_last = document["stages"][-1]["memory_bytes"]["activations"]
    megatron_last = json.loads(megatron.stdout)["stages"][-1]["memory_bytes"]["activations"]
    assert titan_last < 0.8 * megatron_last
    again = json.loads(CliRunner().invoke(main, ["estimate", "--plan", str(out), "--json"]).stdout)
    assert again["estimate"]["peak_memory_bytes"] == pytest.approx(document["estimate"]["peak_memory_bytes"])


def test_torchtitan_simulates_micro_batch_counts_megatron_cannot_order() -> None:
    """6 micro-batches on 4 ranks: PyTorch's one round runs them (and `timeline` draws them); Megatron-LM's order
    deadlocks, so its estimate falls back on the closed form and its timeline refuses."""
    titan = CliRunner().invoke(main, [*ESTIMATE, "--global-batch", "12", "--framework", "torchtitan", "--zero", "3"])
    assert titan.exit_code == 0, titan.output
    detail = json.loads(titan.stdout)["estimate"]["breakdown_detail_s"]
    assert detail["pipeline_simulated"] != detail["pipeline_closed_form"]
    config = replace(CONFIG, recompute=Recompute.FULL)
    with pytest.raises(PlannerError, match="divisible by pp"):
        simulate([1.0] * 8, [2.0] * 8, [0.0] * 8, 4, 6, config.pipeline_schedule)
