"""The data-parallel bucket overlap cannot hide (planner/cost/time.py `data_parallel_time`): the input embedding's
gradient completes last in the backward and its bucket's reduction starts only then; with the weights' all-gather
overlapped, its gather is the first the next forward waits on."""

from __future__ import annotations

import pytest

from planner.cluster import Link, parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.comm import all_gather_time, all_reduce_time, reduce_scatter_time
from planner.cost.estimate import estimate
from planner.cost.time import PARAM_BYTES, UnitCost, data_parallel_time, unit_costs
from planner.frameworks import framework_named
from planner.model import UnitKind, load_model
from planner.placement import GroupLinks, default_placement
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

CALIBRATION = default_calibration()
TRAINING = Training(global_batch=256, seq_len=4096)  # bf16: 4-byte gradients
LINK = Link(50e9, 5e-6, "inter")
EMBEDDING = 2.5e8  # parameters per TP rank


def _block(compute_s: float) -> UnitCost:
    return UnitCost(forward_s=compute_s, backward_s=2 * compute_s, recompute_s=0.0, tp_forward_s=0.0,
                    tp_backward_s=0.0, activation_bytes=0.0, params=5e7)


def _embedding() -> UnitCost:
    return UnitCost(forward_s=0.001, backward_s=0.001, recompute_s=0.0, tp_forward_s=0.0, tp_backward_s=0.0,
                    activation_bytes=0.0, params=EMBEDDING, edge_bucket_params=EMBEDDING)


def test_plain_ddp_leaves_the_embeddings_all_reduce_exposed_behind_any_compute() -> None:
    """A backward long enough to hide every other bucket still leaves the last one, the embedding's."""
    units = [_embedding(), *[_block(10.0)] * 8]
    config = ParallelConfig(dp=64, tp=1, pp=1)
    exposed = data_parallel_time(units, TRAINING, config, LINK, CALIBRATION, 1).exposed_s
    assert exposed == pytest.approx(all_reduce_time(EMBEDDING * 4, 64, LINK, CALIBRATION))
    assert exposed > 0


def test_the_distributed_optimizer_exposes_its_reduce_scatter_and_its_first_gather() -> None:
    units = [_embedding(), *[_block(10.0)] * 8]
    config = ParallelConfig(dp=64, tp=1, pp=1, distributed_optimizer=True, overlap_param_gather=True)
    exposed = data_parallel_time(units, TRAINING, config, LINK, CALIBRATION, 1).exposed_s
    assert exposed == pytest.approx(reduce_scatter_time(EMBEDDING * 4, 64, LINK, CALIBRATION)
                                    + all_gather_time(EMBEDDING * PARAM_BYTES, 64, LINK, CALIBRATION))


def test_without_overlap_or_an_embedding_nothing_changes() -> None:
    """Unoverlapped reductions are exposed whole; a rank without the embedding hides everything behind enough
    compute; a backward too short to hide the rest exposes that, not the embedding's share alone."""
    units = [_embedding(), *[_block(10.0)] * 8]
    plain = ParallelConfig(dp=64, tp=1, pp=1, overlap_grad_reduce=False)
    result = data_parallel_time(units, TRAINING, plain, LINK, CALIBRATION, 1)
    assert result.exposed_s == pytest.approx(result.total_s)
    overlapped = ParallelConfig(dp=64, tp=1, pp=1)
    assert data_parallel_time(units[1:], TRAINING, overlapped, LINK, CALIBRATION, 1).exposed_s == 0
    short = [_embedding(), *[_block(1e-4)] * 8]
    result = data_parallel_time(short, TRAINING, overlapped, LINK, CALIBRATION, 1)
    assert result.exposed_s == pytest.approx(result.total_s - 8 * 2e-4 - 0.001, rel=1e-6)


def _costs(training: Training, config: ParallelConfig) -> dict:
    model, cluster = load_model("llama3-8b"), parse_shorthand("8x8xH100-80GB")
    node = cluster.nodes[0]
    return unit_costs(model, training, config, node.gpu, Link(node.intra_bandwidth_bytes_per_s, 0.0, "intra"),
                      AnalyticProfile(model, CALIBRATION), CALIBRATION)


def test_the_embedding_unit_carries_its_bucket_and_only_when_it_trains() -> None:
    """Llama-3-8B's 128,256 × 4,096 input embedding per TP rank; frozen under LoRA, it reduces nothing."""
    config = ParallelConfig(dp=32, tp=2, pp=1)
    costs = _costs(TRAINING, config)
    assert costs[UnitKind.EMBEDDING].edge_bucket_params == 128256 * 4096 / 2
    assert costs[UnitKind.HEAD].edge_bucket_params == 0 and costs[UnitKind.BLOCK].edge_bucket_params == 0
    lora = Training(global_batch=256, seq_len=4096, finetune="lora")
    assert _costs(lora, config)[UnitKind.EMBEDDING].edge_bucket_params == 0


def test_an_estimate_charges_the_embeddings_bucket_on_the_first_pipeline_rank() -> None:
    """Llama-3-8B on 64 H100 at dp 32, pp 2, as Megatron-LM runs it (gathers overlapped): each rank's backward hides
    the rest of its reduction, so the iteration's exposed data-parallel time is the first rank's embedding bucket,
    reduce-scattered and gathered (the last rank holds none)."""
    model, cluster = load_model("llama3-8b"), parse_shorthand("8x8xH100-80GB")
    config = framework_named("megatron").runs(ParallelConfig(dp=32, tp=1, pp=2, distributed_optimizer=True))
    result = estimate(model, cluster, TRAINING, config, calibration=CALIBRATION)
    link = GroupLinks.from_placement(cluster, config, default_placement(cluster, config)).dp[0]
    embedding = 128256 * 4096
    edge = (reduce_scatter_time(embedding * 4, 32, link, CALIBRATION)
            + all_gather_time(embedding * PARAM_BYTES, 32, link, CALIBRATION))
    assert result.breakdown_detail_s["dp_gradient_exposed"] == pytest.approx(edge)
