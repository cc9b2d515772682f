"""torchtitan's per-op selective activation checkpointing (`selective_recompute` "op"): what it keeps, what it
recomputes, and that the torchtitan target costs "selective" with it (torchtitan/distributed/activation_checkpoint.py:
every op in its save list is kept except every second matrix multiply; norms and activations are recomputed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.config import ParallelConfig, Recompute, Training
from planner.cost.memory import block_type_activation_bytes, op_sac_applies, recompute_working_bytes
from planner.cost.time import unit_costs
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS
from planner.gpu import lookup_gpu
from planner.model import load_model
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

MODEL = load_model("llama3-8b")
BLOCK = next(iter(MODEL.block_types()))
TRAINING = Training(global_batch=16, seq_len=8192, dtype="bf16")
OP = ParallelConfig(dp=8, tp=1, pp=1, micro_batch=2, zero_stage=3, recompute=Recompute.SELECTIVE,
                    selective_recompute="op")


def test_llama_block_runs_seven_matmuls_in_torchtitans_order():
    h, kv, ffn = 4096, 1024, 14336
    assert BLOCK.separate_matmuls() == ((h, h, False), (h, kv, False), (h, kv, False), (h, h, True),
                                        (h, ffn, False), (h, ffn, False), (ffn, h, True))


def test_kept_activations_are_the_input_every_other_matmul_and_the_attention_output():
    """Per token: block input h, wq's h, wv's kv, w1's ffn, w2's h (16-bit), attention output h and its fp32
    log-sum-exp per head — 63.5 KB for Llama 3 8B, against 138 KB kept by Megatron-LM's selective recompute."""
    tokens = 8192 * 2
    per_token = 2 * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 32
    assert block_type_activation_bytes(MODEL, BLOCK, TRAINING, OP) == pytest.approx(tokens * per_token)
    megatron = replace(OP, selective_recompute="attention")
    assert block_type_activation_bytes(MODEL, BLOCK, TRAINING, megatron) > 2 * tokens * per_token


def test_recompute_repeats_all_but_the_attention_kernel_and_the_kept_matmuls():
    gpu = lookup_gpu("H100-80GB")
    profile = AnalyticProfile(MODEL, default_calibration())
    costs = {policy: unit_costs(MODEL, TRAINING, replace(OP, selective_recompute=policy), gpu,
                                _nvlink(), profile, default_calibration())[BLOCK]
             for policy in ("op", "attention")}
    times = profile.block_times(BLOCK, _setting(), gpu)
    kept = (4096 * 4096 + 4096 * 1024 + 4096 * 14336 + 14336 * 4096) / sum(a * b for a, b, _ in
                                                                       BLOCK.separate_matmuls())
    expected = times.forward_s - times.attention_core_forward_s - kept * sum(times.linear_forward_s)
    assert costs["op"].recompute_s == pytest.approx(expected)
    assert costs["attention"].recompute_s == pytest.approx(times.attention_core_forward_s)
    assert recompute_working_bytes(MODEL, TRAINING, OP) > 0
    assert recompute_working_bytes(MODEL, TRAINING, replace(OP, selective_recompute="attention")) == 0


def test_attention_missing_from_the_save_list_runs_again():
    """cuDNN attention under torchtitan 3b85aa31f..b39377f9f: the save list does not name its op, so per-op SAC keeps
    neither its output nor its log-sum-exp, and the backward runs the attention kernel again."""
    gpu = lookup_gpu("H100-80GB")
    profile = AnalyticProfile(MODEL, default_calibration())
    unsaved = replace(OP, sac_keeps_attention=False)
    costs = {config: unit_costs(MODEL, TRAINING, config, gpu, _nvlink(), profile, default_calibration())[BLOCK]
             for config in (OP, unsaved)}
    times = profile.block_times(BLOCK, _setting(), gpu)
    assert costs[unsaved].recompute_s - costs[OP].recompute_s == pytest.approx(times.attention_core_forward_s)
    attention = 8192 * 2 * (2 * 4096 + 4 * 32)  # output (16-bit) and fp32 LSE per head, per token
    assert block_type_activation_bytes(MODEL, BLOCK, TRAINING, OP) - block_type_activation_bytes(
        MODEL, BLOCK, TRAINING, unsaved) == pytest.approx(attention)
    assert recompute_working_bytes(MODEL, TRAINING, unsaved) - recompute_working_bytes(
        MODEL, TRAINING, OP) == pytest.approx(attention)


def test_torchtitan_runs_selective_as_per_op_sac_and_megatron_does_not():
    assert FRAMEWORKS["torchtitan"].runs(replace(OP, selective_recompute="attention")).selective_recompute == "op"
    assert FRAMEWORKS["megatron"].runs(OP).selective_recompute == "attention"


def test_blocks_outside_the_llama_family_keep_the_attention_policy():
    moe = next(block for block in load_model("mixtral-8x7b").block_types())
    assert moe.separate_matmuls() is None and not op_sac_applies(moe, OP)
    assert op_sac_applies(BLOCK, OP) and not op_sac_applies(BLOCK, replace(OP, recompute=Recompute.FULL))


def test_unknown_policy_is_refused():
    with pytest.raises(PlannerError, match="selective_recompute must be one of attention, op"):
        replace(OP, selective_recompute="layer")


def _nvlink():
    from planner.cluster import Link

    return Link(450e9, 5e-6, "intra")


def _setting():
    from planner.profile.analytic import unit_setting

    return unit_setting(TRAINING, 1, 2, False, 1, 1, 1)


def test_a_plan_file_keeps_the_sac_attention_setting_and_refuses_a_non_boolean():
    """`sac_keeps_attention` travels in the plan JSON (so `estimate --plan` reproduces such a plan); only a boolean."""
    from planner.cluster import load_cluster
    from planner.cost.estimate import estimate
    from planner.placement import default_placement
    from planner.plan import build_plan_document, parse_plan_document

    cluster = load_cluster("1x8xH100-80GB")
    config = ParallelConfig(dp=8, tp=1, pp=1, micro_batch=1, zero_stage=3, recompute=Recompute.SELECTIVE,
                            selective_recompute="op", sac_keeps_attention=False)
    training = Training(global_batch=8, seq_len=8192)
    placement = default_placement(cluster, config)
    result = estimate(MODEL, cluster, training, config, placement=placement)
    document = build_plan_document(MODEL, cluster, training, config, placement, result)
    assert parse_plan_document(document).parallel.sac_keeps_attention is False
    document["parallelism"]["sac_keeps_attention"] = "no"
    with pytest.raises(PlannerError, match="sac_keeps_attention must be true or false"):
        parse_plan_document(document)
