"""ZeRO-2/3 / FSDP time model (planner/cost/time.py `data_parallel_time`): traffic, latency, prefetch overlap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cluster import Link
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.comm import all_reduce_time
from planner.cost.time import PARAM_BYTES, UnitCost, data_parallel_time
from planner.profile.calibration import default_calibration

CALIBRATION = default_calibration()
TRAINING = Training(global_batch=1024, seq_len=2048, dtype="fp16")  # 16-bit gradients: same bytes as the weights
PARAMS = 1e9  # per unit


def _unit(compute_s: float, params: float = PARAMS) -> UnitCost:
    return UnitCost(forward_s=compute_s, backward_s=2 * compute_s, recompute_s=0.0, tp_forward_s=0.0,
                    tp_backward_s=0.0, activation_bytes=0.0, params=params)


def _zero(stage: int, dp: int, micro_batch: int = 1) -> ParallelConfig:
    return ParallelConfig(dp=dp, tp=1, pp=1, micro_batch=micro_batch, zero_stage=stage)


def test_zero3_moves_three_times_the_parameter_bytes_per_micro_batch():
    """Rajbhandari et al. 2020 §7.2.2: ZeRO-3 moves 3Ψ per step (2 all-gathers + 1 reduce-scatter),
    1.5× plain DP's 2Ψ all-reduce; with no latency the ring time is exactly proportional to bytes."""
    link = Link(100e9, 0.0, "inter")
    units, dp = [_unit(0.1)] * 10, 64
    config = _zero(3, dp)
    m = config.num_microbatches(TRAINING.global_batch)
    total = data_parallel_time(units, TRAINING, config, link, CALIBRATION, m).total_s
    bandwidth = link.bandwidth_bytes_per_s * CALIBRATION.collective_efficiency("inter")
    assert total == pytest.approx(m * 3 * 10 * PARAMS * PARAM_BYTES * (dp - 1) / dp / bandwidth)
    plain = all_reduce_time(10 * PARAMS * TRAINING.grad_bytes, dp, link, CALIBRATION)
    assert total / m == pytest.approx(1.5 * plain)


def test_zero3_exposure_grows_with_dp_through_per_collective_latency():
    """Each of the 3 collectives per unit pays (dp − 1)·α; with compute just covering the bandwidth term,
    what large dp adds is exposed."""
    link = Link(100e9, 20e-6, "inter")
    units = [_unit(0.02, params=1e8)] * 32
    exposed = [data_parallel_time(units, TRAINING, _zero(3, dp), link, CALIBRATION, 1).exposed_s
               for dp in (8, 64, 512)]
    assert exposed[0] < exposed[1] < exposed[2]
    no_latency = Link(100e9, 0.0, "inter")
    flat = [data_parallel_time(units, TRAINING, _zero(3, dp), no_latency, CALIBRATION, 1).exposed_s
            for dp in (64, 512)]
    assert exposed[2] - exposed[1] > 5 * (flat[1] - flat[0])


def test_zero3_exposure_shrinks_as_compute_per_unit_grows():
    """Prefetch hides a unit's collective only behind its neighbour's compute: more compute, less exposed,
    down to the first all-gather and the last reduce-scatter, which nothing hides."""
    link = Link(25e9, 10e-6, "inter")
    exposed = [data_parallel_time([_unit(c)] * 16, TRAINING, _zero(3, 64), link, CALIBRATION, 1).exposed_s
               for c in (0.01, 0.05, 0.2, 1.0)]
    assert exposed == sorted(exposed, reverse=True) and exposed[0] > exposed[-1]
    first_and_last = data_parallel_time([_unit(1.0)], TRAINING, _zero(3, 64), link, CALIBRATION, 1)
    assert exposed[-1] == pytest.approx(first_and_last.exposed_s)


def test_full_recompute_hides_but_does_not_add_zero3_traffic():
    """The recomputed forward runs inside its unit's backward with the weights gathered for that backward."""
    link = Link(25e9, 10e-6, "inter")
    plain = [_unit(0.01)] * 8
    recomputed = [UnitCost(0.01, 0.02, 0.01, 0.0, 0.0, 0.0, PARAMS)] * 8
    config = ParallelConfig(dp=64, tp=1, pp=1, zero_stage=3, recompute=Recompute.FULL)
    a = data_parallel_time(plain, TRAINING, config, link, CALIBRATION, 1)
    b = data_parallel_time(recomputed, TRAINING, config, link, CALIBRATION, 1)
    assert a.total_s == b.total_s and b.exposed_s < a.exposed_s


def test_zero2_reduces_every_micro_batch_and_gathers_weights_once():
    link = Link(25e9, 0.0, "inter")
    units = [_unit(0.0)] * 4
    one, four = (data_parallel_time(units, TRAINING, _zero(2, 64), link, CALIBRATION, m).total_s for m in (1, 4))
    bandwidth = link.bandwidth_bytes_per_s * CALIBRATION.collective_efficiency("inter")
    per_microbatch = 4 * PARAMS * TRAINING.grad_bytes * 63 / 64 / bandwidth
    assert four - one == pytest.approx(3 * per_microbatch)


def test_estimate_charges_zero3_at_scale():
    """The issue's case: GPT-3 175B, pure ZeRO-3 over 1536 A100s at micro-batch 1 is no longer free, and
    its exposed DP time grows as dp doubles while the compute that hides it halves."""
    from planner.cluster import load_cluster
    from planner.cost.estimate import estimate
    from planner.model import load_model

    model = load_model("gpt3-175b")
    training = Training(global_batch=1536, seq_len=2048, dtype="fp16", attention="unfused")
    exposed = []
    for dp, micro_batch in ((384, 4), (1536, 1)):
        config = ParallelConfig(dp=dp, tp=1, pp=1, micro_batch=micro_batch, zero_stage=3, recompute=Recompute.FULL)
        exposed.append(estimate(model, load_cluster(f"{dp // 8}x8xA100-80GB"), training, config).breakdown_s["dp_comm"])
    assert 0 < exposed[0] < exposed[1]


def _per_tensor(dp: int, **fields: object) -> ParallelConfig:
    return ParallelConfig(dp=dp, tp=1, pp=1, zero_stage=3, zero3_collectives="per-tensor", **fields)


def test_per_tensor_zero3_pays_each_tensors_ring_latency_and_hides_nothing():
    """DeepSpeed ZeRO-3 up to v0.5.10: one collective per parameter tensor, each gather after a device-wide
    synchronize. Per unit: 2 gathers of its gathered tensors + 1 reduce-scatter of all its tensors, each
    paying (n − 1)·α and a copy kernel per rank (PyTorch's list-form all_gather / reduce_scatter stage the
    partitions through one flat buffer), and all of it exposed however much compute there is to hide behind."""
    alpha, dp = 10e-6, 256
    link = Link(100e9, alpha, "inter")
    unit = UnitCost(1.0, 2.0, 0.0, 0.0, 0.0, 0.0, PARAMS, tensors=12, gathered_tensors=4)
    per_tensor = data_parallel_time([unit] * 8, TRAINING, _per_tensor(dp), link, CALIBRATION, 1)
    per_unit = data_parallel_time([unit] * 8, TRAINING, _zero(3, dp), link, CALIBRATION, 1)
    assert per_tensor.exposed_s == per_tensor.total_s
    assert per_unit.exposed_s < 0.2 * per_unit.total_s  # 1 s of compute per unit hides all but the ends
    extra_latency = 8 * ((2 * (4 - 1)) + (12 - 1)) * (dp - 1) * alpha
    copies = 8 * (2 * 4 + 12) * dp * CALIBRATION.kernel_launch_s
    assert per_tensor.total_s - per_unit.total_s == pytest.approx(extra_latency + copies)


def test_per_tensor_zero3_needs_deepspeed_zero3_without_pipelining():
    from planner.errors import PlannerError

    for fields in ({"zero_stage": 2}, {"pp": 2}):
        with pytest.raises(PlannerError, match="per-tensor"):
            ParallelConfig(**{"dp": 8, "tp": 1, "pp": 1, "zero_stage": 3, "zero3_collectives": "per-tensor",
                              **fields})
    with pytest.raises(PlannerError, match="per-unit, per-tensor"):
        ParallelConfig(dp=8, tp=1, pp=1, zero_stage=3, zero3_collectives="bucketed")


def test_narayanan_zero3_rows_are_no_longer_free():
    """Narayanan et al. 2021 Table 2 (DeepSpeed ZeRO-3 of early 2021): per-tensor collectives put the
    175B row on 1,536 A100s (measured 44 TFLOP/s per GPU, 66.8 s) within 12 % (+10.9 % since the recomputed
    forward's released weights are gathered again for the backward); per-unit FSDP semantics would call it 4×
    faster than measured."""
    from dataclasses import replace

    from benchmarks.validation_runs import narayanan_zero3_runs
    from planner.cost.estimate import estimate

    run = next(r for r in narayanan_zero3_runs() if r.config.dp == 1536 and r.model.hidden_size == 12288)
    assert run.config.zero3_collectives == "per-tensor"
    legacy = estimate(run.model, run.cluster, run.training, run.config).iteration_time_s
    modern_config = replace(run.config, zero3_collectives="per-unit")
    modern = estimate(run.model, run.cluster, run.training, modern_config).iteration_time_s
    assert abs(legacy / run.iteration_s - 1) < 0.12  # the per-rank partition copies: 12 s of its 66.7 s
    assert modern < 0.3 * run.iteration_s


def test_deepspeed_and_torchtitan_targets_run_zero3_per_unit():
    """The 2021 per-tensor gathers are for reproducing old runs: today's DeepSpeed (coalesced since v0.6.0) and
    FSDP2 gather per module, so their execution semantics say so; the catch-all target keeps what was asked."""
    from planner.frameworks import FRAMEWORKS

    legacy = _per_tensor(64)
    assert FRAMEWORKS["deepspeed"].runs(legacy).zero3_collectives == "per-unit"
    assert FRAMEWORKS["torchtitan"].runs(legacy).zero3_collectives == "per-unit"
    assert FRAMEWORKS["any"].runs(legacy).zero3_collectives == "per-tensor"


@pytest.mark.parametrize(("version", "collectives"), [("0.3", "per-tensor"), ("0.5.4", "per-tensor"),
                                                      ("0.5.7", "per-tensor"), ("0.5.10", "per-tensor"),
                                                      ("0.6.0", "per-unit"), ("0.19.1", "per-unit")])
def test_deepspeed_release_decides_how_its_zero3_collectives_run(version, collectives):
    """Per tensor behind device-wide synchronizes up to v0.5.10 (v0.5.5's PR #1188 only launches a submodule's
    per-tensor gathers together); flat per-module collectives from v0.6.0 (PR #1453, 2022-01-20)."""
    from planner.config import deepspeed_zero3_collectives

    assert deepspeed_zero3_collectives(version) == collectives


def test_autotuning_gpt2_xl_zero3_runs_per_tensor_and_ranks_behind_zero1():
    """DeepSpeed's autotuning examples ran days before v0.5.7: GPT-2 XL's ZeRO-3 (measured 3.1x slower than
    ZeRO-1 on 16 V100) pays per-tensor synchronous gathers, so planner no longer ranks it first."""
    from benchmarks.ranking import predicted_times

    times = predicted_times(CALIBRATION)
    xl = times[times["group"] == "dsat-gpt2-xl-table1"]
    assert xl["predicted"].idxmax() == xl["measured"].idxmax()
    assert xl["predicted"].idxmin() == xl["measured"].idxmin()


def test_fp8_param_gather_moves_the_linear_weights_in_one_byte():
    """torchao's FSDP float8 all-gather / Megatron's --fp8-param-gather: each unit's gathered bytes drop by one
    byte per linear weight (norms and the rest stay 16-bit); with no latency the gather time is exact."""
    link = Link(100e9, 0.0, "inter")
    fp8 = Training(global_batch=1024, seq_len=2048, dtype="fp8")
    unit = UnitCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, PARAMS, linear_share=0.75)
    config = ParallelConfig(dp=64, tp=1, pp=1, zero_stage=3)
    plain, fp8_gather = (data_parallel_time([unit] * 4, fp8, replace(config, fp8_param_gather=on), link,
                                            CALIBRATION, 1).total_s for on in (False, True))
    bandwidth = link.bandwidth_bytes_per_s * CALIBRATION.collective_efficiency("inter")
    saved_per_gather = PARAMS * 0.75 * 1 * 63 / 64 / bandwidth
    assert plain - fp8_gather == pytest.approx(4 * 2 * saved_per_gather)  # two gathers per unit (reshard)
    dist_opt = ParallelConfig(dp=64, tp=1, pp=1, distributed_optimizer=True)
    plain, fp8_gather = (data_parallel_time([unit] * 4, fp8, replace(dist_opt, fp8_param_gather=on), link,
                                            CALIBRATION, 1).total_s for on in (False, True))
    assert plain - fp8_gather == pytest.approx(4 * saved_per_gather)  # the updated weights, once


def test_fp8_param_gather_needs_sharded_weights_and_fp8_training():
    from planner.cluster import load_cluster
    from planner.cost.estimate import estimate
    from planner.errors import PlannerError
    from planner.model import load_model

    with pytest.raises(PlannerError, match="needs ZeRO-1/2/3 or the distributed optimizer"):
        ParallelConfig(dp=8, tp=1, pp=1, fp8_param_gather=True)
    with pytest.raises(PlannerError, match=r"needs FP8 training \(--dtype fp8\), got bf16"):
        estimate(load_model("tiny-llama"), load_cluster("1x8xH100-80GB"), Training(global_batch=8, seq_len=512),
                 ParallelConfig(dp=8, tp=1, pp=1, zero_stage=3, fp8_param_gather=True))


def test_linear_weights_are_nearly_all_of_a_transformer_block():
    from planner.model import load_model

    block = next(iter(load_model("llama3-8b").block_types()))
    h, kv, ffn = 4096, 1024, 14336
    assert block.linear_weight_parameters() == h * (h + 2 * kv) + h * h + 3 * h * ffn
    assert block.parameters() - block.linear_weight_parameters() == 2 * h  # the two RMSNorm weights


def test_per_tensor_zero3_holds_one_tensor_and_its_buckets_not_whole_blocks():
    """DeepSpeed's 2021 ZeRO-3 keeps whole only the submodule computing plus a 5e7-element prefetch bucket, and up
    to a 5e8-element reduce bucket of unsharded gradients (or one larger tensor): for GPT-3 175B the largest tensor
    is the 51,200 × 12,288 embedding (629 M elements, above a block's 4h × h MLP weight), not two 1.8 B-parameter
    blocks as FSDP's per-unit gathers."""
    from planner.cost.memory import framework_buffer_bytes
    from planner.model import load_model

    model = load_model("gpt3-175b")
    training = Training(global_batch=1536, seq_len=2048, dtype="fp16")
    largest = 51200 * 12288
    per_tensor = dict(framework_buffer_bytes(model, training, _per_tensor(1536)))["gathered_units"]
    assert per_tensor == pytest.approx((largest + 5e7) * 2 + largest * training.grad_bytes)
    per_unit = dict(framework_buffer_bytes(model, training, _zero(3, 1536)))["gathered_units"]
    assert per_unit > 3 * per_tensor


def test_backward_post_prefetch_waits_for_every_backward_gather():
    """FSDP's BACKWARD_POST (Composer's default) issues a unit's backward all-gather after the next unit's gradients,
    ahead of that unit's reduce-scatter: with compute to spare, BACKWARD_PRE hides every gather but the first, POST
    hides none of them, so POST exposes (units − 1) more backward gathers; the traffic is the same."""
    link = Link(100e9, 0.0, "inter")
    units, dp = [_unit(1.0)] * 12, 64
    pre = data_parallel_time(units, TRAINING, _zero(3, dp), link, CALIBRATION, 1)
    post = data_parallel_time(units, TRAINING, replace(_zero(3, dp), fsdp_backward_prefetch="post"), link,
                              CALIBRATION, 1)
    bandwidth = link.bandwidth_bytes_per_s * CALIBRATION.collective_efficiency("inter")
    gather = PARAMS * PARAM_BYTES * (dp - 1) / dp / bandwidth
    assert post.total_s == pytest.approx(pre.total_s)
    assert post.exposed_s - pre.exposed_s == pytest.approx(11 * gather)


def test_backward_post_prefetch_exposes_at_least_what_pre_does():
    """Whatever the compute per unit, waiting for the gathers never hides more than prefetching them."""
    link = Link(25e9, 10e-6, "inter")
    for compute in (0.001, 0.01, 0.1, 1.0):
        units = [_unit(compute)] * 8
        pre, post = (data_parallel_time(units, TRAINING, replace(_zero(3, 64), fsdp_backward_prefetch=mode), link,
                                        CALIBRATION, 2).exposed_s for mode in ("pre", "post"))
        assert post >= pre - 1e-12


@pytest.mark.parametrize("fields", [dict(zero_stage=2), dict(zero_stage=3, pp=2),
                                    dict(zero_stage=3, zero3_collectives="per-tensor")])
def test_backward_post_prefetch_needs_per_unit_zero3_without_pipelining(fields):
    from planner.errors import PlannerError

    config = {"dp": 8, "tp": 1, "pp": 1, **fields}
    with pytest.raises(PlannerError, match="fsdp_backward_prefetch 'post'"):
        ParallelConfig(**config, fsdp_backward_prefetch="post")


def test_backward_prefetch_is_pre_or_post():
    from planner.errors import PlannerError

    with pytest.raises(PlannerError, match="fsdp_backward_prefetch"):
        ParallelConfig(dp=8, tp=1, pp=1, zero_stage=3, fsdp_backward_prefetch="early")


def test_frameworks_prefetch_before_the_gradients():
    """FSDP2 (torchtitan) and DeepSpeed ZeRO-3 prefetch: a plan they run is costed so; the catch-all target keeps
    what was asked."""
    from planner.frameworks import FRAMEWORKS

    post = ParallelConfig(dp=8, tp=1, pp=1, zero_stage=3, fsdp_backward_prefetch="post")
    for name in ("deepspeed", "torchtitan"):
        assert FRAMEWORKS[name].runs(post).fsdp_backward_prefetch == "pre"
    assert FRAMEWORKS["any"].runs(post).fsdp_backward_prefetch == "post"


def test_per_tensor_zero3_gathers_the_released_weights_again_after_a_full_recompute():
    """DeepSpeed's per-tensor ZeRO-3 releases a submodule's weights after its recomputed forward unless its backward
    follows within max_reuse_distance (1e9 elements): for GPT-3 175B's blocks (h 12288) every linear but the MLP's
    output projection is gathered a third time, 8 of 12 h²; a 1.3B model's blocks are all kept. Charged in
    proportion to the bytes, all of it exposed, under full recompute only; FSDP's per-unit gathers keep the unit
    gathered through its recompute and backward."""
    from planner.cost.comm import all_gather_time
    from planner.cost.time import recompute_regathered_share
    from planner.model import load_model

    (big,) = load_model("gpt3-175b").block_types()
    (small,) = load_model("gpt3-1.3b").block_types()
    assert recompute_regathered_share(big.tensor_sizes(), 1) == pytest.approx(8 / 12, rel=1e-3)
    assert recompute_regathered_share(small.tensor_sizes(), 1) == 0.0
    assert recompute_regathered_share(big.tensor_sizes(), 8) == 0.0  # each rank's eighth is within the distance
    link, dp, share = Link(100e9, 10e-6, "inter"), 256, 2 / 3
    unit = UnitCost(1.0, 2.0, 1.0, 0.0, 0.0, 0.0, PARAMS, tensors=12, gathered_tensors=4, regathered_share=share)
    kept = replace(unit, regathered_share=0.0)

    def total(units: list[UnitCost], config: ParallelConfig) -> tuple[float, float]:
        result = data_parallel_time(units, TRAINING, config, link, CALIBRATION, 1)
        return result.total_s, result.exposed_s

    full = total([unit] * 8, _per_tensor(dp, recompute=Recompute.FULL))
    gather = (all_gather_time(PARAMS * PARAM_BYTES, dp, link, CALIBRATION, messages=4)
              + 4 * dp * CALIBRATION.kernel_launch_s)
    assert full[0] - total([kept] * 8, _per_tensor(dp, recompute=Recompute.FULL))[0] == pytest.approx(
        8 * share * gather)
    assert full[1] == full[0]
    assert total([unit] * 8, _per_tensor(dp, recompute=Recompute.SELECTIVE)) == total(
        [kept] * 8, _per_tensor(dp, recompute=Recompute.SELECTIVE))
    per_unit = replace(_zero(3, dp), recompute=Recompute.FULL)
    assert total([unit] * 8, per_unit) == total([kept] * 8, per_unit)
