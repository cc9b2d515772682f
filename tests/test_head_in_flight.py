"""How many micro-batches' head activations (the output layer's input, what the loss keeps of the logits) the last
virtual stage holds: the schedule's own order decides, not the average over its rank's chunks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Schedule, Training
from planner.cost.estimate import estimate
from planner.cost.memory import activation_bytes, rank_memory_model
from planner.cost.schedule import schedule_of
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.calibration import default_calibration


@given(pp=st.integers(1, 8), m=st.integers(1, 40))
def test_1f1b_backs_each_micro_batch_through_the_head_at_once_and_gpipe_holds_them_all(pp: int, m: int) -> None:
    assert schedule_of(Schedule.ONE_F_ONE_B).head_in_flight(pp, 1, m) == 1.0
    assert schedule_of(Schedule.GPIPE).head_in_flight(pp, 1, m) == float(m)


@settings(max_examples=30)
@given(pp=st.integers(2, 8), vpp=st.integers(2, 4), rounds=st.integers(2, 5))
def test_megatron_interleaved_order_holds_one_head_micro_batch(pp: int, vpp: int, rounds: int) -> None:
    """With more micro-batches than ranks the last rank's warm-up forwards are all on its other chunks; its last
    chunk then runs each micro-batch's forward and backward back to back. The rank's per-chunk mean is higher."""
    interleaved = schedule_of(Schedule.INTERLEAVED)
    m = rounds * pp
    assert interleaved.head_in_flight(pp, vpp, m) == 1.0
    assert interleaved.in_flight(pp - 1, pp, vpp, m) > 1.0


def test_megatron_interleaved_with_as_many_micro_batches_as_ranks_runs_every_forward_first() -> None:
    assert schedule_of(Schedule.INTERLEAVED).head_in_flight(4, 2, 4) == 4.0


@pytest.mark.parametrize("schedule", [Schedule.ZB_H1, Schedule.ZB_H2, Schedule.ZB_V, Schedule.LOCAL])
def test_split_backward_and_local_schedules_keep_the_ranks_own_count(schedule: Schedule) -> None:
    """Zero-bubble orders keep the output layer's input until its W; local learning trains a head on every stage."""
    behaviour = schedule_of(schedule)
    pp, vpp = 4, 2 if schedule is Schedule.ZB_V else 1
    rank = behaviour.stage_rank(pp * vpp - 1, pp)
    assert behaviour.head_in_flight(pp, vpp, 16) == behaviour.in_flight(rank, pp, vpp, 16)


def test_the_last_rank_holds_the_head_once_under_the_interleaved_schedule(monkeypatch) -> None:
    """The last rank's memory is its blocks at the rank's count plus the head's activations once: less, by the
    head's extra in-flight micro-batches, than holding the head like the rank's chunks on average."""
    model = load_model("llama3-70b")
    training = Training(global_batch=64, seq_len=4096)
    config = ParallelConfig(dp=1, tp=8, pp=4, vpp=2, micro_batch=1, sequence_parallel=True,
                            schedule=Schedule.INTERLEAVED, distributed_optimizer=True)
    cluster = parse_shorthand("4x8xH100-80GB")
    m = config.num_microbatches(training.global_batch)
    last = config.stage_ranks[-1]
    memory = rank_memory_model(model, training, config, last, m, lookup_gpu("H100-80GB"), default_calibration())
    assert memory.head_in_flight == 1.0 and memory.in_flight > 1.0
    exact = next(s for s in estimate(model, cluster, training, config).stages if s.head).memory.activations
    monkeypatch.setattr(type(schedule_of(Schedule.INTERLEAVED)), "head_in_flight",
                        lambda self, pp, vpp, num_microbatches: self.in_flight(pp - 1, pp, vpp, num_microbatches))
    uniform = next(s for s in estimate(model, cluster, training, config).stages if s.head).memory.activations
    head = activation_bytes(model, UnitKind.HEAD, training, config)
    assert uniform - exact == pytest.approx((memory.in_flight - 1) * head)
