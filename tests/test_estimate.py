"""The composed estimate: invariants over random configurations and the breakdown's arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Partition, Recompute, Schedule, Training
from planner.cost.estimate import BREAKDOWN_KEYS, estimate
from planner.cost.memory import rank_memory_model
from planner.cost.schedule import pipeline_time, schedule_of
from planner.cost.time import unit_costs
from planner.errors import PlannerError
from planner.model import load_model
from planner.placement import GroupLinks, default_placement
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

MODEL = load_model("llama2-7b")
CLUSTER = parse_shorthand("4x8xA100-80GB")


@st.composite
def configurations(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = 32 // (tp * pp)
    micro_batch = draw(st.sampled_from([1, 2]))
    m = draw(st.sampled_from([1, 2, 4, 8]))
    schedule = draw(st.sampled_from(list(Schedule))) if pp > 1 else Schedule.ONE_F_ONE_B
    vpp = schedule_of(schedule).chunk_counts(2)[0]
    config = ParallelConfig(
        dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch=micro_batch, schedule=schedule,
        sequence_parallel=tp > 1 and draw(st.booleans()), recompute=draw(st.sampled_from(list(Recompute))),
        distributed_optimizer=draw(st.booleans()),
    )
    return config, Training(global_batch=micro_batch * dp * m, seq_len=2048)


@settings(max_examples=40, deadline=None)
@given(configurations())
def test_estimate_invariants(case) -> None:
    config, training = case
    result = estimate(MODEL, CLUSTER, training, config)
    assert config.dp * config.tp * config.pp * config.cp == CLUSTER.num_gpus
    assert set(result.breakdown_s) == set(BREAKDOWN_KEYS)
    assert all(v >= 0 for v in result.breakdown_s.values())
    assert result.iteration_time_s == pytest.approx(sum(result.breakdown_s.values()))
    # stages cover every block exactly once, in order; embedding first, head last
    covered = [b for stage in result.stages for b in range(*stage.blocks)]
    assert covered == list(range(MODEL.num_layers))
    assert result.stages[0].embedding and result.stages[-1].head
    assert [s.pp_rank for s in result.stages] == [schedule_of(config.schedule).stage_rank(k, config.pp)
                                                  for k in range(config.pp * config.vpp)]
    assert 0 < result.mfu < 1
    assert result.fits == all(s.memory.total <= s.memory.capacity for s in result.stages)


def test_recompute_trades_time_for_memory() -> None:
    training = Training(global_batch=64, seq_len=4096)
    results = {r: estimate(MODEL, CLUSTER, training, ParallelConfig(dp=8, tp=4, pp=1, recompute=r,
                                                                     sequence_parallel=True))
               for r in Recompute}
    assert results[Recompute.NONE].iteration_time_s < results[Recompute.SELECTIVE].iteration_time_s
    assert results[Recompute.SELECTIVE].iteration_time_s < results[Recompute.FULL].iteration_time_s
    memory = {r: results[r].peak_memory_bytes for r in Recompute}
    assert memory[Recompute.FULL] < memory[Recompute.SELECTIVE] < memory[Recompute.NONE]


def test_uneven_partition_changes_stage_times_and_is_validated() -> None:
    training = Training(global_batch=32, seq_len=2048)
    config = ParallelConfig(dp=2, tp=4, pp=4)
    uniform = estimate(MODEL, CLUSTER, training, config)
    skewed = estimate(MODEL, CLUSTER, training, config, Partition.from_blocks([5, 9, 9, 9], 32))
    assert [s.blocks for s in skewed.stages] == [(0, 5), (5, 14), (14, 23), (23, 32)]
    assert skewed.iteration_time_s > uniform.iteration_time_s
    with pytest.raises(PlannerError, match="partition has 3 stages but pp × vpp = 4 × 1 = 4"):
        estimate(MODEL, CLUSTER, training, config, Partition.from_blocks([10, 11, 11], 32))
    with pytest.raises(PlannerError, match="summing to 32"):
        Partition.from_blocks([10, 10, 10, 10], 32)
    with pytest.raises(PlannerError, match="must be non-negative"):
        Partition.from_blocks([-1, 33], 32)


def test_bubble_matches_narayanan_for_uniform_stages() -> None:
    """Bubble fraction (p − 1)/m for 1F1B, (p − 1)/(v·m) interleaved (Narayanan et al. 2021 §2.2)."""
    p, m, tau = 8, 32, 0.01
    one = pipeline_time([tau] * p, p, m, Schedule.ONE_F_ONE_B)
    assert one.bubble_s / one.steady_s == pytest.approx((p - 1) / m)
    v = 3
    inter = pipeline_time([tau / v] * (p * v), p, m, Schedule.INTERLEAVED)
    assert inter.bubble_s / inter.steady_s == pytest.approx((p - 1) / (v * m))


def test_config_errors_name_the_values() -> None:
    with pytest.raises(PlannerError, match="not divisible by micro_batch × dp = 2 × 4 = 8"):
        ParallelConfig(dp=4, tp=2, pp=1, micro_batch=2).num_microbatches(100)
    with pytest.raises(PlannerError, match="sequence_parallel needs tp > 1"):
        ParallelConfig(dp=1, tp=1, pp=1, sequence_parallel=True)
    with pytest.raises(PlannerError, match="hsdp_replicas 2 shards within replicas and needs zero_stage 3"):
        ParallelConfig(dp=2, tp=1, pp=2, zero_stage=2, hsdp_replicas=2)
    with pytest.raises(PlannerError, match="cp_comm must be one of p2p, all-gather, a2a"):
        ParallelConfig(dp=2, tp=1, pp=1, cp=2, cp_comm="ring")
    with pytest.raises(PlannerError, match="needs 64 GPUs"):
        estimate(MODEL, CLUSTER, Training(global_batch=64), ParallelConfig(dp=8, tp=8, pp=1))


@pytest.mark.parametrize("recompute", list(Recompute))
def test_linear_rank_memory_is_the_estimates_accounting(recompute: Recompute) -> None:
    """The partitioner's linear memory form (rank_memory_model) gives estimate()'s per-GPU totals."""
    training = Training(global_batch=32, seq_len=2048)
    config = ParallelConfig(dp=2, tp=4, pp=4, recompute=recompute, sequence_parallel=True,
                            distributed_optimizer=True)
    split = Partition.from_blocks([7, 8, 9, 8], 32)
    result = estimate(MODEL, CLUSTER, training, config, split)
    cal = default_calibration()
    links = GroupLinks.from_placement(CLUSTER, config, default_placement(CLUSTER, config))
    for stage, (start, end) in zip(result.stages, split.bounds(), strict=True):
        costs = unit_costs(MODEL, training, config, links.gpu[stage.pp_rank], links.tp[stage.pp_rank],
                           AnalyticProfile(MODEL, cal), cal)
        kinds = [costs[u.kind] for u in MODEL.units()[start:end]]
        rank = rank_memory_model(MODEL, training, config, stage.pp_rank, result.num_microbatches,
                                 links.gpu[stage.pp_rank], cal)
        total = rank.total(sum(c.params for c in kinds), sum(c.activation_bytes for c in kinds))
        assert total == pytest.approx(stage.memory.total, rel=1e-9)


def test_zero_bubble_breakdown_has_no_negative_bubble() -> None:
    """Found by hypothesis: ZB-V's total and steady share agreed up to rounding, leaving a bubble of -2e-16."""
    config = ParallelConfig(dp=16, tp=1, pp=2, vpp=2, recompute=Recompute.SELECTIVE, schedule=Schedule.ZB_V)
    result = estimate(MODEL, CLUSTER, Training(global_batch=128, seq_len=2048), config)
    assert all(value >= 0 and isinstance(value, float) for value in result.breakdown_s.values())
