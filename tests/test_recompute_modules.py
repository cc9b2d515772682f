"""Megatron-LM's selective recompute modules (--recompute-modules): configuration, the activation bytes each module
stops keeping (hand-computed for a small MLA + MoE block and a dense GQA block), the time they re-run, the CLI, the
plan file and the exports."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_export_megatron import PLANS, check_megatron_rules
from test_export_plans import make_plan, plan_document

from cli import main
from planner.config import (
    DEFAULT_RECOMPUTE_MODULES,
    RECOMPUTE_MODULES,
    ParallelConfig,
    Recompute,
    Training,
    parse_recompute_modules,
)
from planner.cost.memory import block_type_activation_bytes, recompute_module_bytes, recompute_working_bytes
from planner.cost.time import selective_recompute_s
from planner.errors import PlannerError
from planner.export import export_plan
from planner.export.megatron import export_megatron
from planner.gpu import lookup_gpu
from planner.model import AttentionSpec, BlockSpec, MlpSpec, load_model
from planner.plan import parse_plan_document
from planner.profile.analytic import AnalyticProfile, UnitTimes, unit_setting
from planner.profile.calibration import default_calibration

S, B, H = 16, 2, 64  # sequence, micro-batch, width: 32 tokens, sbh = 2048 elements
MLA_MOE = BlockSpec(H, attention=AttentionSpec("full", 4, 4, 8, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
                                               v_head_dim=8),
                    mlp=MlpSpec(32, num_experts=4, moe_top_k=2, shared_expert_ffn_hidden_size=48))
GQA_DENSE = BlockSpec(H, attention=AttentionSpec("full", 4, 2, 16), mlp=MlpSpec(96))
MODEL = load_model("llama3-8b")  # only the head's accounting would read it; these blocks have none


def selective(*modules: str, **fields) -> ParallelConfig:
    return ParallelConfig(dp=1, tp=1, pp=1, micro_batch=B, recompute=Recompute.SELECTIVE, recompute_modules=modules,
                          **fields)


def kept(block: BlockSpec, config: ParallelConfig, dtype: str = "bf16") -> float:
    return block_type_activation_bytes(MODEL, block, Training(seq_len=S, dtype=dtype, attention="flash"), config)


# ---- configuration ----------------------------------------------------------------------------------------------

def test_modules_are_validated_and_stored_in_megatrons_order() -> None:
    assert ParallelConfig(dp=1, tp=1, pp=1).recompute_modules == DEFAULT_RECOMPUTE_MODULES
    assert selective("layernorm", "moe_act").recompute_modules == ("moe_act", "layernorm")
    assert selective(*["mlp", "mlp"]).recompute_modules == ("mlp",)
    with pytest.raises(PlannerError, match=r"^parallel config: recompute_modules must be among core_attn, .*'attn'$"):
        selective("core_attn", "attn")
    with pytest.raises(PlannerError, match="at least one module"):
        selective()
    with pytest.raises(PlannerError, match=r"must be among core_attn, .*\['mlp'\]$"):  # unhashable: named, not hashed
        selective("core_attn", ["mlp"])
    with pytest.raises(PlannerError, match="must be a list"):
        ParallelConfig(dp=1, tp=1, pp=1, recompute=Recompute.SELECTIVE, recompute_modules="mlp")
    with pytest.raises(PlannerError, match="selective_recompute 'op' has its own policy"):
        selective("mlp", selective_recompute="op")
    # outside selective recompute the modules mean nothing and fall back to the default
    assert replace(selective("mlp"), recompute=Recompute.FULL).recompute_modules == DEFAULT_RECOMPUTE_MODULES
    assert selective("mlp").selective_modules == {"mlp"}
    assert ParallelConfig(dp=1, tp=1, pp=1).selective_modules == frozenset()
    assert "recompute=selective[moe_act,layernorm]" in selective("layernorm", "moe_act").describe()


def test_cli_spelling_is_parsed_or_refused_in_one_line() -> None:
    assert parse_recompute_modules("mlp, layernorm") == ("layernorm", "mlp")
    for text in ("mlp,bogus", ","):
        with pytest.raises(PlannerError, match=r"^--recompute-modules must be among"):
            parse_recompute_modules(text)


# ---- memory: what each module stops keeping --------------------------------------------------------------------

# bf16, tp 1, no SP, 32 tokens. MLA + MoE block: heads 4, q/k head 8 + 4 RoPE, v 8; 4 experts of 32, top-2, shared 48.
MLA_MOE_FREED = {
    "core_attn": 4 * 32 * 4,  # fp32 log-sum-exp per head
    "layernorm": 2 * 2048 + 2 * 2048,  # MLA's input norm output + the MoE norm output the router reads
    "mla_up_proj": 2 * 32 * (4 * 12 + 4 * (12 + 8)),  # Q, K, V
    "mlp": 0,  # no dense MLP
    "moe": 2 * 32 * 2 * 64 + (4 + 2) * 32 * 2 * 32 + (4 + 2) * 32 * 48,  # routed copies, experts', shared experts'
    "moe_act": 2 * 32 * 2 * 32,  # the routed experts' activation output
    "shared_experts": (4 + 2) * 32 * 48,  # shared fc1 output (gated: both halves) and activation output
}
GQA_DENSE_FREED = {"core_attn": 4 * 32 * 4, "layernorm": 0, "mla_up_proj": 0, "mlp": 2 * 2048 + (4 + 2) * 32 * 96,
                   "moe": 0, "moe_act": 0, "shared_experts": 0}


@pytest.mark.parametrize(("block", "freed"), [(MLA_MOE, MLA_MOE_FREED), (GQA_DENSE, GQA_DENSE_FREED)])
def test_each_module_frees_its_hand_computed_bytes(block: BlockSpec, freed: dict[str, int]) -> None:
    none = kept(block, ParallelConfig(dp=1, tp=1, pp=1, micro_batch=B))
    training = Training(seq_len=S, attention="flash")
    for module in RECOMPUTE_MODULES:
        assert recompute_module_bytes(block, training, selective(module), module) == freed[module], module
        assert none - kept(block, selective(module)) == freed[module], module


def test_overlapping_modules_free_a_tensor_once() -> None:
    """moe discards moe_act's and shared_experts' tensors too; in FP8 layernorm and moe both discard the shared
    experts' FP8 copy of the normed input (2048 one-byte elements): counted once."""
    none = kept(MLA_MOE, ParallelConfig(dp=1, tp=1, pp=1, micro_batch=B))
    assert none - kept(MLA_MOE, selective("moe", "moe_act", "shared_experts")) == MLA_MOE_FREED["moe"]
    none8 = kept(MLA_MOE, ParallelConfig(dp=1, tp=1, pp=1, micro_batch=B), "fp8")
    alone = [none8 - kept(MLA_MOE, selective(module), "fp8") for module in ("layernorm", "moe")]
    assert none8 - kept(MLA_MOE, selective("layernorm", "moe"), "fp8") == sum(alone) - 2048


def test_default_selective_is_korthikantis_and_working_bytes_are_what_is_re_run() -> None:
    legacy = ParallelConfig(dp=1, tp=1, pp=1, micro_batch=B, recompute=Recompute.SELECTIVE)
    assert kept(MLA_MOE, legacy) == kept(MLA_MOE, selective("core_attn"))
    training = Training(seq_len=S, attention="flash")
    assert recompute_working_bytes(MODEL, training, legacy) == 0.0
    assert recompute_working_bytes(MODEL, training, selective("core_attn", "mlp")) == max(
        recompute_module_bytes(block, training, selective("mlp"), "mlp") for block in MODEL.block_types())


# ---- time: the forward the modules re-run ------------------------------------------------------------------------

def test_recompute_time_adds_each_modules_forward() -> None:
    times = UnitTimes(1.0, 2.0, attention_core_forward_s=0.25, module_forward_s=(("mlp", 0.5), ("layernorm", 0.125)))
    assert selective_recompute_s(times, frozenset({"core_attn", "mlp", "layernorm"})) == 0.875
    assert selective_recompute_s(replace(times, module_forward_s=()), frozenset({"core_attn", "mlp"})) == 0.25


def test_analytic_profile_breaks_out_the_modules() -> None:
    model = load_model("deepseek-v3")
    profile, gpu = AnalyticProfile(model, default_calibration()), lookup_gpu("H100-80GB")
    setting = unit_setting(Training(seq_len=4096, dtype="bf16"), tp=1, micro_batch=1, sequence_parallel=False, ep=8)
    types = {block.mlp.is_moe: dict(profile.block_times(block, setting, gpu).module_forward_s)
             for block in model.block_types()}
    moe, dense = types[True], types[False]
    assert moe["moe"] > moe["moe_act"] + moe["shared_experts"] > 0 and "mlp" not in moe
    assert dense["mlp"] > 0 and "moe" not in dense
    assert moe["mla_up_proj"] > 0 and moe["layernorm"] > dense["layernorm"] > 0  # MLA's norm; the MoE norm too


# ---- CLI, plan file, exports --------------------------------------------------------------------------------------

def run(*args: str):
    return CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--tp", "8",
                                     "--global-batch", "16", *args])


def test_cli_estimates_named_modules_and_refuses_bad_ones_in_one_line() -> None:
    result = run("--recompute-modules", "mlp,core_attn")
    assert result.exit_code == 0, result.output
    assert "recompute=selective[core_attn,mlp]" in result.output
    default = run("--recompute", "selective")
    recompute = [line for text in (result.output, default.output) for line in text.splitlines()
                 if line.startswith("recompute ")]
    assert float(recompute[0].split()[1]) > float(recompute[1].split()[1])  # the MLP's forward re-runs too
    for args, message in ((("--recompute-modules", "mlp,attention"), "got 'attention'"),
                          (("--recompute-modules", "mlp", "--recompute", "full"), "needs --recompute selective"),
                          (("--recompute-modules", "mlp", "--framework", "torchtitan"), "cannot recompute modules")):
        bad = run(*args)
        assert bad.exit_code == 2, bad.output
        assert len(bad.output.strip().splitlines()) == 1 and message in bad.output


def test_plan_file_round_trips_the_modules() -> None:
    document = plan_document(recompute="selective", recompute_modules=("mlp", "layernorm"))
    assert document["parallelism"]["recompute_modules"] == ["layernorm", "mlp"]
    assert parse_plan_document(document).parallel.recompute_modules == ("layernorm", "mlp")
    del document["parallelism"]["recompute_modules"]  # files written before the field: the default
    assert parse_plan_document(document).parallel.recompute_modules == DEFAULT_RECOMPUTE_MODULES


def test_megatron_export_names_the_modules_and_others_refuse_them() -> None:
    plan = make_plan(**PLANS["selective modules"])
    args = check_megatron_rules(plan, export_megatron(plan).files)
    assert args["--recompute-granularity"] == ["selective"] and args["--recompute-modules"] == ["layernorm", "mlp"]
    assert "--recompute-modules" not in check_megatron_rules(
        make_plan(**PLANS["uniform"]), export_megatron(make_plan(**PLANS["uniform"])).files)
    for target in ("deepspeed", "torchtitan"):
        with pytest.raises(PlannerError, match=r"cannot recompute modules layernorm,mlp"):
            export_plan(plan, target)


def test_moe_validation_rows_run_their_stated_modules() -> None:
    from benchmarks.moe_runs import moe_runs
    runs = {run.label.split()[0]: run.config for rack in (False, True) for run in moe_runs(rack)[0]}
    assert runs["MB-065"].recompute_modules == ("moe_act", "layernorm")  # "selective [layernorm, moe_act] (...)"
    assert runs["MB-057"].recompute_modules == ("mla_up_proj",)  # no recompute stated: its preset's
    assert runs["MB-058"].recompute is Recompute.NONE
