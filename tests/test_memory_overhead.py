"""Memory outside the published formulas: named physical terms (planner/cost/memory.py), not a multiplier."""

from __future__ import annotations

import pytest

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Recompute, Schedule, Training
from planner.cost.estimate import estimate
from planner.cost.memory import (
    STACK_BYTES_PER_SM,
    framework_buffer_bytes,
    model_state_bytes,
    nccl_communicators,
    optimizer_held_gradient_bytes,
    rank_memory_model,
    sharded_state_bytes,
)
from planner.errors import PlannerError
from planner.finetune import ParameterStates
from planner.gpu import lookup_gpu
from planner.model import load_model
from planner.profile.calibration import default_calibration

MODEL = load_model("llama3-8b")
TRAINING = Training(global_batch=64, seq_len=4096)


def test_static_states_get_no_fragmentation() -> None:
    """Only transient allocations pay the allocator's share; weights, gradients and Adam states are allocated once."""
    config = ParallelConfig(dp=8, tp=1, pp=1, distributed_optimizer=True)
    gpu, cal = lookup_gpu("H100-80GB"), default_calibration()
    for fragmentation in (0.0, 0.2):
        rank = rank_memory_model(MODEL, TRAINING, config, 0, 8, gpu, cal.updated(allocator_fragmentation=fragmentation))
        assert rank.param_bytes == model_state_bytes(1.0, 8, 1, TRAINING.grad_bytes).total
        assert rank.activation_factor == pytest.approx((1 + fragmentation) * rank.in_flight)


def test_breakdown_names_every_byte_of_other() -> None:
    config = ParallelConfig(dp=2, tp=2, pp=2, sequence_parallel=True, distributed_optimizer=True)
    result = estimate(MODEL, load_cluster("1x8xH100-80GB"), TRAINING, config)
    for stage in result.stages:
        detail = stage.memory.other_detail
        assert stage.memory.other == pytest.approx(sum(detail.values()))
        assert detail["cuda_context"] == pytest.approx(default_calibration().cuda_context_bytes
                                                       + 132 * STACK_BYTES_PER_SM)
        assert {"nccl", "largest_transient", "allocator_fragmentation"} <= set(detail)


@pytest.mark.parametrize(("tp", "pp", "dp", "rank", "expected"), [
    (1, 1, 1, 0, 0), (8, 1, 1, 0, 1), (1, 1, 8, 0, 1), (2, 2, 2, 0, 4), (2, 4, 1, 1, 2), (2, 4, 1, 3, 3),
])
def test_nccl_communicators_per_rank(tp: int, pp: int, dp: int, rank: int, expected: int) -> None:
    """TP, the pipeline's send/recv, DP, and the tied-embedding group on the first and last rank."""
    tied = load_model("gpt3-125m")
    assert tied.tie_embeddings
    assert nccl_communicators(tied, ParallelConfig(dp=dp, tp=tp, pp=pp), rank) == expected


def test_framework_buffers_follow_the_engine() -> None:
    """ZeRO-3 holds two gathered units and one unsharded gradient; DeepSpeed ZeRO-1/2 one reduce bucket;
    Megatron's buckets are views into its gradient buffer."""
    block = MODEL.block_parameters()
    unit = max(block, MODEL.embedding_parameters(), MODEL.head_parameters())
    zero3 = dict(framework_buffer_bytes(MODEL, TRAINING, ParallelConfig(dp=8, tp=1, pp=1, zero_stage=3)))
    assert zero3["gathered_units"] == pytest.approx(unit * (2 * 2 + TRAINING.grad_bytes))
    zero1 = dict(framework_buffer_bytes(MODEL, TRAINING, ParallelConfig(dp=8, tp=1, pp=1, zero_stage=1)))
    assert zero1["gradient_bucket"] == pytest.approx(5e8 * TRAINING.grad_bytes)
    assert framework_buffer_bytes(MODEL, TRAINING, ParallelConfig(dp=8, tp=1, pp=1, distributed_optimizer=True)) == ()


BF16_OPT = ParallelConfig(dp=8, tp=4, pp=12, zero_stage=1, deepspeed_optimizer="bf16")


def test_bf16_optimizer_keeps_bf16_gradients_beside_fp32() -> None:
    """DeepSpeed's BF16_Optimizer: per parameter 2 (bf16 weight) + 4 (fp32 accumulation) + 2 (the bf16 .grad it
    leaves until the next backward) + 12/dp (fp32 master and Adam, sharded): 8 + 12/8 = 9.5 bytes; ZeRO's own
    optimizer path keeps 2 + 4 + 12/8 = 7.5. A LoRA-like accounting holds bf16 gradients of trainable parameters
    only."""
    zero = ParallelConfig(dp=8, tp=4, pp=12, zero_stage=1)
    assert optimizer_held_gradient_bytes(zero) == 0.0
    assert optimizer_held_gradient_bytes(BF16_OPT) == 2.0
    assert optimizer_held_gradient_bytes(BF16_OPT, ParameterStates(0.25, 0.0, 12.0)) == 0.5
    assert sharded_state_bytes(BF16_OPT, 4).total == pytest.approx(9.5)
    assert sharded_state_bytes(BF16_OPT, 4).gradients == pytest.approx(6.0)
    assert sharded_state_bytes(zero, 4).total == pytest.approx(7.5)


def test_bf16_optimizer_reduces_in_place_without_a_bucket() -> None:
    """The BF16_Optimizer all-reduces its flat fp32 gradient buffer in place: no ZeRO reduce bucket."""
    training = Training(global_batch=96, seq_len=4096, grad_bytes=4)
    assert framework_buffer_bytes(MODEL, training, BF16_OPT) == ()


@pytest.mark.parametrize(("fields", "message"), [
    ({"zero_stage": 1, "deepspeed_optimizer": "adam"}, "deepspeed_optimizer must be one of zero, bf16, got 'adam'"),
    ({"zero_stage": 0, "deepspeed_optimizer": "bf16"}, "needs zero_stage 1 without the distributed optimizer, got "
                                                       "zero_stage 0"),
    ({"zero_stage": 3, "deepspeed_optimizer": "bf16"}, "got zero_stage 3"),
    ({"zero_stage": 1, "distributed_optimizer": True, "deepspeed_optimizer": "bf16"}, "and distributed_optimizer"),
])
def test_deepspeed_optimizer_bad_inputs(fields: dict[str, object], message: str) -> None:
    """One-line PlannerError for an unknown wrapper or a BF16_Optimizer without its ZeRO-1 sharding."""
    with pytest.raises(PlannerError, match=message) as caught:
        ParallelConfig(dp=8, tp=1, pp=1, **fields)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_llama3_70b_megatron_bridge_row_fits() -> None:
    """Issue 10: Megatron-Bridge 25.11 ran Llama-3-70B on 64 H100 at tp4 pp8 vpp5, mbs 1, FP8
    (validation/megatron_bridge_2511_h100_dense.csv); the fitted multiplier called it 103.9 GiB."""
    config = ParallelConfig(dp=2, tp=4, pp=8, vpp=5, micro_batch=1, sequence_parallel=True, recompute=Recompute.NONE,
                            distributed_optimizer=True, overlap_param_gather=True, schedule=Schedule.INTERLEAVED)
    training = Training(global_batch=128, seq_len=8192, dtype="fp8", attention="flash")
    result = estimate(load_model("llama3-70b"), load_cluster("8x8xH100-80GB"), training, config)
    assert result.fits
