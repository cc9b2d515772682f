"""Pipeline p2p overlap: Megatron-LM's interleaved schedule posts each chunk's sends and receives ahead and waits
on them only before the chunk that needs them (--overlap-p2p-communication, its default there), so the transfer
hides behind compute; other schedules and torchtitan's PyTorch schedules wait on them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_export_plans import make_plan, parse_flags, plan_document

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Schedule, Training
from planner.cost.time import boundary_tensor_bytes, boundary_times, p2p_boundary_time, p2p_hiding_s, unit_costs
from planner.errors import PlannerError
from planner.export.megatron import export_megatron
from planner.frameworks import FRAMEWORKS
from planner.model import UnitKind, load_model
from planner.placement import GroupLinks, default_placement
from planner.plan import parse_plan_document
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

MODEL, TRAINING = load_model("llama3-70b"), Training(global_batch=64, seq_len=4096)
INTERLEAVED = ParallelConfig(dp=2, tp=4, pp=4, vpp=2, schedule=Schedule.INTERLEAVED, sequence_parallel=True)


def _link(config: ParallelConfig):
    cluster = load_cluster("4x8xH100-80GB")
    return GroupLinks.from_placement(cluster, config, default_placement(cluster, config)).pp[0]


def _transfer(config: ParallelConfig, link) -> float:
    calibration = default_calibration()
    return boundary_tensor_bytes(MODEL, TRAINING, config) / (
        link.bandwidth_bytes_per_s * calibration.p2p_efficiency(link.kind))


def test_interleaved_megatron_hides_the_transfer_behind_compute() -> None:
    """The activation and the gradient cross at once (`p2p_duplex`): the boundary pays one latency and what of one
    transfer the hiding compute does not cover; sent one after the other, each of the two legs does."""
    link, calibration = _link(INTERLEAVED), default_calibration()
    transfer = _transfer(INTERLEAVED, link)
    assert INTERLEAVED.p2p_overlapped and INTERLEAVED.p2p_duplex
    assert p2p_boundary_time(MODEL, TRAINING, INTERLEAVED, link, calibration, hidden_s=transfer) == pytest.approx(
        link.latency_s)
    assert p2p_boundary_time(MODEL, TRAINING, INTERLEAVED, link, calibration, hidden_s=transfer / 4) == pytest.approx(
        link.latency_s + 0.75 * transfer)
    one_by_one = replace(INTERLEAVED, p2p_duplex=False)
    assert p2p_boundary_time(MODEL, TRAINING, one_by_one, link, calibration, hidden_s=transfer / 4) == pytest.approx(
        2 * (link.latency_s + 0.75 * transfer))


def test_estimate_hides_behind_one_block_forward() -> None:
    """`boundary_times` hides each transfer behind the cheaper of its two ranks' block forward (`p2p_hiding_s`)."""
    cluster = load_cluster("4x8xH100-80GB")
    links = GroupLinks.from_placement(cluster, INTERLEAVED, default_placement(cluster, INTERLEAVED))
    calibration = default_calibration()
    costs = [unit_costs(MODEL, TRAINING, INTERLEAVED, gpu, tp, AnalyticProfile(MODEL, calibration), calibration)
             for gpu, tp in zip(links.gpu, links.tp, strict=True)]
    hidden = p2p_hiding_s(costs[0])
    assert hidden == pytest.approx(costs[0][UnitKind.BLOCK].forward_s)
    times = boundary_times(MODEL, TRAINING, INTERLEAVED, links.pp, costs, calibration)
    assert times == pytest.approx([p2p_boundary_time(MODEL, TRAINING, INTERLEAVED, link, calibration, hidden)
                                   for link in links.pp])


def test_other_schedules_and_opting_out_pay_the_transfer() -> None:
    calibration = default_calibration()
    for config in (ParallelConfig(dp=2, tp=4, pp=4, sequence_parallel=True),
                   ParallelConfig(dp=2, tp=4, pp=4, vpp=2, schedule=Schedule.INTERLEAVED, sequence_parallel=True,
                                  overlap_p2p_comm=False)):
        link = _link(config)
        assert not config.p2p_overlapped
        assert p2p_boundary_time(MODEL, TRAINING, config, link, calibration, hidden_s=1.0) == pytest.approx(
            link.latency_s + _transfer(config, link))
        assert p2p_boundary_time(MODEL, TRAINING, replace(config, p2p_duplex=False), link, calibration,
                                 hidden_s=1.0) == pytest.approx(2 * (link.latency_s + _transfer(config, link)))


def test_deepspeed_sends_one_tensor_at_a_time_megatron_and_torchtitan_both_ways_at_once() -> None:
    """DeepSpeed's PipelineEngine sends and receives with blocking p2p.send / p2p.recv, one tensor per instruction;
    Megatron-LM batches each step's send and receive (send_forward_recv_backward), as PyTorch's pipeline schedules
    do, so the activation and the gradient share the full-duplex link's two directions."""
    config = ParallelConfig(dp=2, tp=4, pp=4, zero_stage=1)
    assert not FRAMEWORKS["deepspeed"].runs(config).p2p_duplex
    assert FRAMEWORKS["megatron"].runs(config).p2p_duplex and FRAMEWORKS["torchtitan"].runs(config).p2p_duplex
    from benchmarks.validation_runs import bloom_runs
    assert not any(run.config.p2p_duplex for run in bloom_runs()[:5])


def test_plan_files_keep_the_duplex_flag_and_old_ones_read_true() -> None:
    document = plan_document()
    assert document["parallelism"]["p2p_duplex"] is True
    document["parallelism"]["p2p_duplex"] = False
    assert not parse_plan_document(document).parallel.p2p_duplex
    del document["parallelism"]["p2p_duplex"]
    assert parse_plan_document(document).parallel.p2p_duplex
    document["parallelism"]["p2p_duplex"] = "no"
    with pytest.raises(PlannerError, match=r"parallelism\.p2p_duplex must be true or false"):
        parse_plan_document(document)


def test_overlap_outside_the_interleaved_schedule_is_refused() -> None:
    with pytest.raises(PlannerError, match="overlap_p2p_comm needs the interleaved schedule with pp > 1"):
        ParallelConfig(dp=2, tp=4, pp=4, overlap_p2p_comm=True)


def test_torchtitan_waits_on_its_transfers() -> None:
    assert not FRAMEWORKS["torchtitan"].runs(INTERLEAVED).p2p_overlapped
    assert FRAMEWORKS["megatron"].runs(INTERLEAVED).p2p_overlapped


def test_megatron_export_opts_out_only_when_the_plan_does() -> None:
    default = parse_flags(export_megatron(make_plan(vpp=2, blocks=(4,) * 8)).files["megatron_args.txt"])
    assert "--no-overlap-p2p-communication" not in default
    document = plan_document(vpp=2, blocks=(4,) * 8)
    assert document["parallelism"]["overlap_p2p_comm"] is None  # Megatron-LM's default: on when interleaved
    assert parse_plan_document(document).parallel.p2p_overlapped
    document["parallelism"]["overlap_p2p_comm"] = False
    plan = parse_plan_document(document)
    assert not plan.parallel.p2p_overlapped
    assert "--no-overlap-p2p-communication" in parse_flags(export_megatron(plan).files["megatron_args.txt"])


def test_a_plan_file_with_a_non_boolean_overlap_is_refused() -> None:
    document = plan_document(vpp=2, blocks=(4,) * 8)
    document["parallelism"]["overlap_p2p_comm"] = "yes"
    with pytest.raises(PlannerError, match=r"parallelism\.overlap_p2p_comm must be true or false"):
        parse_plan_document(document)


def test_deepspeed_sends_each_tp_ranks_slice_and_whole_tensors_cost_tp_times_the_bytes() -> None:
    """DeepSpeed's PipelineEngine partitions a boundary tensor over the TP ranks (is_pipe_partitioned): each sends
    s·b·h·2 / tp bytes, as Megatron-LM's scatter/gather does; with `p2p_scatter_gather` off each sends it whole."""
    config = ParallelConfig(dp=2, tp=4, pp=4, zero_stage=1)
    deepspeed = FRAMEWORKS["deepspeed"].runs(config)
    slice_bytes = 2 * TRAINING.seq_len * config.micro_batch * MODEL.hidden_size / config.tp
    assert boundary_tensor_bytes(MODEL, TRAINING, deepspeed) == pytest.approx(slice_bytes)
    whole = ParallelConfig(dp=2, tp=4, pp=4, zero_stage=1, p2p_scatter_gather=False)
    assert boundary_tensor_bytes(MODEL, TRAINING, whole) == pytest.approx(config.tp * slice_bytes)
