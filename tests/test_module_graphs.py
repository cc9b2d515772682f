"""Per-layer CUDA graphs (`Training.cuda_graph_modules`, Megatron-Core's --cuda-graph-impl transformer_engine
--cuda-graph-scope): the graphed parts of a layer are launched as one replay each, forward and backward; a dropless MoE
layer's dispatch still syncs, and what Megatron-Core 0.16 refuses beside them is refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from planner.config import (
    CUDA_GRAPH_MODULES,
    ParallelConfig,
    Recompute,
    Training,
    graphed_recompute_why_not,
    parse_cuda_graph_modules,
)
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.plan_sections import training_from_record, training_record
from planner.profile.analytic import AnalyticProfile, UnitSetting, unit_setting
from tests.host_overlap import full_overlap

QWEN = load_model("qwen3-30b-a3b")
LLAMA = load_model("llama3-8b")


def _setting(seq_len: int, graphed: tuple[str, ...] = (), **fields: object) -> UnitSetting:
    base = {"tp": 1, "micro_batch": 1, "seq_len": seq_len, "sequence_parallel": False, "dtype": "bf16",
            "attention": "flash", "ep": 8, "dispatcher": "flex", "graphed_modules": graphed}
    return UnitSetting(**{**base, **fields})


def test_parts_are_stored_in_megatron_order_once_and_bad_ones_refused() -> None:
    assert CUDA_GRAPH_MODULES == ("attn", "mlp", "moe_router", "moe_preprocess", "mamba")
    assert Training().cuda_graph_modules == ()
    assert Training(cuda_graph_modules=["moe_preprocess", "attn", "moe_router", "attn"]).cuda_graph_modules == (
        "attn", "moe_router", "moe_preprocess")
    assert parse_cuda_graph_modules(" moe_router,attn ") == ("attn", "moe_router")
    assert parse_cuda_graph_modules("mamba,attn") == ("attn", "mamba")
    for bad, message in ((("moe",), "must be among"), ("attn", "list of module names"),
                         (("moe_preprocess",), "needs moe_router")):
        with pytest.raises(PlannerError, match=message):
            Training(cuda_graph_modules=bad)
    with pytest.raises(PlannerError, match="need cuda_graphs 'none'"):
        Training(cuda_graphs="full_iteration", cuda_graph_modules=("attn",))
    with pytest.raises(PlannerError, match="got 'full'"):
        parse_cuda_graph_modules("attn,full")


def test_unit_setting_and_plan_records_carry_the_parts() -> None:
    training = Training(cuda_graph_modules=("attn", "mlp"))
    assert unit_setting(training, 1, 1, False).graphed_modules == ("attn", "mlp")
    record = json.loads(json.dumps(training_record(training)))  # a tuple comes back from JSON as a list
    assert training_from_record(record, "plan") == training
    old = {k: v for k, v in training_record(Training()).items() if k != "cuda_graph_modules"}
    assert training_from_record(old, "old plan").cuda_graph_modules == ()


@pytest.mark.parametrize("model", [QWEN, LLAMA, load_model("deepseek-v3"), load_model("gpt3-175b")])
@pytest.mark.parametrize("fields", [{}, {"tp": 4, "sequence_parallel": True}, {"tp": 2}, {"attention": "unfused"},
                                    {"elementwise": "eager"}, {"dispatcher": "alltoall", "dtype": "fp8"}])
def test_the_two_halves_count_every_kernel_of_the_block_once(model, fields) -> None:
    profile = AnalyticProfile(model, full_overlap())
    setting = _setting(4096, ep=1 if not model.is_moe else 8, **fields)
    for moe in ((False, True) if model.is_moe else (False,)):
        attention_memory, attention = profile._attention_kernels(setting)
        mlp_memory, mlp, router = profile._mlp_kernels(setting, moe)
        assert (attention_memory + mlp_memory, attention + mlp) == profile._block_kernels(setting, moe)
        assert 0 <= router < mlp and (router > 0) == moe


def test_the_halves_hold_the_kernels_the_block_launches() -> None:
    """At tp 4 with sequence parallelism: Llama-3-8B's attention half launches its norm, residual add, RoPE on q and
    k, 2 GEMMs, the FlashAttention kernel and an all-gather and a reduce-scatter (9, 4 memory-bound); its MLP half
    the norm, residual add, activation, 3 GEMMs and 2 collectives (8, 3). Qwen3-30B-A3B's MoE half adds the router's
    top-k and softmax and the routed path's permute, un-permute and activation over 16 local experts (7 memory-bound;
    42 in all with the router GEMM and 32 grouped-linear GEMMs), 4 of them the router's: norm, GEMM, top-k, softmax.
    The block's 17 and 51 kernels are what `_block_kernels` counted before the halves."""
    def halves(model, moe: bool) -> tuple:
        profile = AnalyticProfile(model, full_overlap())
        setting = _setting(4096, tp=4, sequence_parallel=True, ep=8 if moe else 1)
        return profile._attention_kernels(setting), profile._mlp_kernels(setting, moe)

    assert halves(LLAMA, False) == ((4, 9), (3, 8, 0))
    assert halves(QWEN, True) == ((4, 9), (7, 42, 4))


def test_graphed_parts_launch_once_each_in_both_passes() -> None:
    """At 128 tokens the Qwen3-30B-A3B block is host-bound in both its synced halves: eagerly 15 kernels from Python
    and 32 from the grouped GEMM loop; with the attention half and the router replayed, the Python launches drop by
    the graphed kernels less one replay each, forward and backward, and the grouped GEMM loop stays."""
    calibration = full_overlap()
    profile, gpu = AnalyticProfile(QWEN, calibration), lookup_gpu("B200")
    graphed = ("attn", "moe_router", "moe_preprocess")
    eager = profile.times(UnitKind.BLOCK, _setting(128), gpu)
    replayed = profile.times(UnitKind.BLOCK, _setting(128, graphed), gpu)
    inside, graphs = profile._graphed_kernels(_setting(128, graphed), moe=True)
    assert graphs == 2 and inside == profile._attention_kernels(_setting(128))[1] + profile._mlp_kernels(
        _setting(128), True)[2]  # flex: its preprocessing permutes nothing
    assert eager.forward_s == pytest.approx(15 * calibration.host_kernel_s + 32 * calibration.grouped_gemm_host_s,
                                            rel=1e-12)
    assert eager.forward_s - replayed.forward_s == pytest.approx((inside - graphs) * calibration.host_kernel_s,
                                                                 rel=1e-9)
    assert eager.backward_s - replayed.backward_s == pytest.approx((2 * inside - graphs) * calibration.host_kernel_s,
                                                                   rel=1e-9)


def test_alltoall_preprocessing_graphs_its_first_permutation() -> None:
    profile = AnalyticProfile(QWEN, full_overlap())
    router_only, with_preprocess = (profile._graphed_kernels(_setting(128, parts, dispatcher="alltoall"), moe=True)
                                    for parts in (("moe_router",), ("moe_router", "moe_preprocess")))
    assert with_preprocess == (router_only[0] + 1, 1)


def test_a_gpu_bound_block_is_the_same_either_way_and_dense_parts_need_mlp() -> None:
    profile, gpu = AnalyticProfile(LLAMA, full_overlap()), lookup_gpu("H100-80GB")
    eager, graphed = (profile.times(UnitKind.BLOCK, _setting(32768, parts, ep=1), gpu)
                      for parts in ((), ("attn", "mlp")))
    assert (eager.forward_s, eager.backward_s) == (graphed.forward_s, graphed.backward_s)
    assert profile._graphed_kernels(_setting(128, ("moe_router",), ep=1), moe=False) == (0.0, 0)
    assert profile._graphed_kernels(_setting(128, ("mlp",), ep=1), moe=False)[1] == 1


@pytest.mark.parametrize(("model", "parts", "config", "training", "message"), [
    (LLAMA, ("moe_router",), {}, {}, "needs MoE layers"),
    (QWEN, ("mlp",), {}, {}, "mlp captures dense MLPs; the model has none"),
    (load_model("nemotron-3-nano-30b-a3b"), ("mlp",), {}, {}, "mlp captures dense MLPs; the model has none"),
    (QWEN, ("mamba",), {}, {}, "mamba captures Mamba layers; the model has none"),
    (LLAMA, ("attn",), {"recompute": Recompute.FULL}, {}, "recompute full does not run"),
    (QWEN, ("moe_router",), {"recompute": Recompute.SELECTIVE, "recompute_modules": ("moe",)}, {},
     "selective recompute of moe"),
    (load_model("gpt3-175b"), ("attn",), {"recompute": Recompute.SELECTIVE}, {}, "selective recompute of core_attn"),
    (QWEN, ("moe_router", "moe_preprocess"), {"moe_dispatcher": "alltoall"}, {"moe_capacity_factor": 1.25},
     "preprocessing syncs"),
])
def test_what_megatron_core_refuses_beside_per_layer_graphs(model, parts, config, training, message) -> None:
    parallel = ParallelConfig(dp=8, tp=1, pp=1, **config)
    with pytest.raises(PlannerError, match=message):
        parallel.check_cuda_graph_modules(Training(cuda_graph_modules=parts, **training), model.layer_kind_counts,
                                          model.dropout)


def test_graphed_core_attention_recompute_is_fine_without_dropout() -> None:
    assert graphed_recompute_why_not(("attn",), Recompute.SELECTIVE, frozenset({"core_attn"}), dropout=False) is None
    assert graphed_recompute_why_not((), Recompute.FULL, frozenset(), dropout=True) is None


def test_cpu_offload_refuses_per_layer_graphs() -> None:
    with pytest.raises(PlannerError, match="does not run under CUDA graphs"):
        ParallelConfig(dp=8, tp=1, pp=1, cpu_offload_layers=4).check_cpu_offload(
            32, Training(cuda_graph_modules=("attn",)))


QWEN_ESTIMATE = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "1x8xB200", "--dtype", "fp8", "--fp8-recipe",
                 "mxfp8", "--ep", "8", "--tp", "1", "--pp", "1", "--dp", "8", "--micro-batch", "1", "--global-batch",
                 "64", "--seq-len", "4096"]


def test_cli_graphed_parts_save_host_time_and_are_named() -> None:
    runner = CliRunner()
    launched = runner.invoke(main, [*QWEN_ESTIMATE, "--json"])
    graphed = runner.invoke(main, [*QWEN_ESTIMATE, "--json", "--cuda-graph-modules", "moe_router,attn"])
    assert launched.exit_code == graphed.exit_code == 0, graphed.output
    launched_doc, graphed_doc = json.loads(launched.output), json.loads(graphed.output)
    assert graphed_doc["training"]["cuda_graph_modules"] == ["attn", "moe_router"]
    assert graphed_doc["estimate"]["iteration_time_s"] < launched_doc["estimate"]["iteration_time_s"]
    text = runner.invoke(main, [*QWEN_ESTIMATE, "--cuda-graph-modules", "attn"]).output
    assert "per-layer CUDA graphs of attn" in text.splitlines()[0]


@pytest.mark.parametrize(("extra", "message"), [
    (["--cuda-graph-modules", "attn,moe"], "--cuda-graph-modules must be among attn, mlp, moe_router"),
    (["--cuda-graph-modules", "moe_preprocess"], "needs moe_router too"),
    (["--cuda-graph-modules", "attn", "--cuda-graphs", "full_iteration"], "need cuda_graphs 'none'"),
    (["--cuda-graph-modules", "mlp"], "mlp captures dense MLPs; the model has none"),
    (["--cuda-graph-modules", "attn", "--recompute", "full"], "recompute full does not run"),
    (["--cuda-graph-modules", "attn", "--framework", "torchtitan"], "cannot capture parts of each layer"),
    (["--cuda-graph-modules", "attn", "--framework", "deepspeed"], "cannot capture parts of each layer"),
])
def test_cli_bad_or_unsupported_parts_exit_2(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(main, [*QWEN_ESTIMATE, *extra])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_the_space_holds_only_recompute_the_graphs_allow() -> None:
    from planner.cluster import load_cluster
    from planner.search.space import enumerate_configs
    cluster, gpt3 = load_cluster("1x8xH100-80GB"), load_model("gpt3-175b")  # GPT-3 trains with dropout
    eager = list(enumerate_configs(gpt3, cluster, Training(global_batch=64, seq_len=2048)))
    graphed = list(enumerate_configs(gpt3, cluster, Training(global_batch=64, seq_len=2048,
                                                             cuda_graph_modules=("attn",))))
    assert {c.recompute for c in eager} == set(Recompute)
    assert graphed and all(graphed_recompute_why_not(("attn",), c.recompute, c.selective_modules, True) is None
                           for c in graphed)
    assert {c.recompute for c in graphed} == {Recompute.NONE}  # selective re-runs the attention core


def test_plan_with_graphed_parts_keeps_them_and_refuses_full_recompute() -> None:
    args = ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "64", "--seq-len", "2048",
            "--cuda-graph-modules", "attn,mlp", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["training"]["cuda_graph_modules"] == ["attn", "mlp"]
    fixed = CliRunner().invoke(main, [*args, "--recompute", "full"])
    assert fixed.exit_code == 2 and "recompute full does not run" in fixed.output


def test_megatron_export_names_the_transformer_engine_parts() -> None:
    from test_export_plans import parse_flags, plan_document

    from planner.export.megatron import export_megatron
    from planner.plan import parse_plan_document
    document = plan_document(cluster="1x8xH100-80GB", blocks=(32,), tp=1, pp=1, dp=8, distributed_optimizer=True)
    document["training"]["cuda_graph_modules"] = ["mlp", "attn"]
    flags = parse_flags(export_megatron(parse_plan_document(document)).files["megatron_args.txt"])
    assert flags["--cuda-graph-impl"] == ["transformer_engine"] and flags["--cuda-graph-scope"] == ["attn", "mlp"]


def test_moe_rows_run_their_presets_per_layer_graphs() -> None:
    """Megatron-Bridge's Qwen3-30B-A3B MXFP8 presets on 8 B200 capture the router and its preprocessing (v0.3.0 at
    micro-batch 1, MB-156), and attention too from v0.3.1 at micro-batch 4 (MB-133); GB300's the router until v0.5.0's
    full-iteration graphs (MB-066, 26.04.01; MB-007, 26.08); Qwen3-235B-A22B on GB200 attention and router (MB-072);
    H100 presets none (MB-043), nor a layout no preset of its release ran (GPT-OSS-120B BF16 on B300 at EP 8 in
    26.02.01, MB-127)."""
    from benchmarks.moe_runs import moe_runs

    runs = {r.source.split()[-1]: r.training for rack in (False, True) for r in moe_runs(rack_scale=rack)[0]}
    router, attention_router = ("moe_router", "moe_preprocess"), ("attn", "moe_router", "moe_preprocess")
    assert runs["MB-156"].cuda_graph_modules == router and runs["MB-133"].cuda_graph_modules == attention_router
    assert runs["MB-066"].cuda_graph_modules == router and runs["MB-072"].cuda_graph_modules == attention_router
    assert (runs["MB-007"].cuda_graphs, runs["MB-007"].cuda_graph_modules) == ("full_iteration", ())
    assert runs["MB-043"].cuda_graph_modules == () and runs["MB-127"].cuda_graph_modules == ()
    # Nemotron-3-Nano's presets graph its Mamba layers too (on H100 only them)
    assert runs["MB-050"].cuda_graph_modules == ("mamba",)
    assert runs["MB-011"].cuda_graph_modules == (*attention_router, "mamba")


def test_mamba_graphs_change_the_export_not_the_estimate() -> None:
    """planner counts no launches in a Mamba mixer (its blocks are costed at their GPU time), so graphing them, as
    Megatron-Bridge's Nemotron-3-Nano presets do, leaves the estimate as it is; the layer-kind counts say which parts a
    hybrid stack has."""
    from planner.cluster import load_cluster
    from planner.cost.estimate import estimate

    nemotron = load_model("nemotron-3-nano-30b-a3b")
    moe, dense, mamba = nemotron.layer_kind_counts
    assert moe > 0 and dense == 0 and mamba > 0 and QWEN.layer_kind_counts == (QWEN.num_layers, 0, 0)
    config = ParallelConfig(dp=8, tp=1, pp=1, ep=8, moe_dispatcher="flex")
    cluster, training = load_cluster("1x8xB200"), Training(global_batch=64, seq_len=4096)
    eager = estimate(nemotron, cluster, training, config).iteration_time_s
    mamba_only = estimate(nemotron, cluster, Training(global_batch=64, seq_len=4096, cuda_graph_modules=("mamba",)),
                          config).iteration_time_s
    assert mamba_only == eager


def test_megatron_core_0_16_refuses_a_full_iteration_graph_of_a_dropless_moe_model() -> None:
    """Its dispatcher syncs mid-layer, which no graph captures; per-layer graphs are the way there, and "any" keeps the
    full-iteration estimate (Megatron-Bridge's 26.06 presets, on Megatron-Core 0.18's per-rank expert capacity)."""
    from planner.frameworks import framework_named

    megatron = framework_named("megatron")
    full = Training(cuda_graphs="full_iteration")
    assert megatron.for_model(load_model("llama3-8b")).training_why_not(full) is None
    assert "dropless MoE layers" in megatron.for_model(QWEN).training_why_not(full)
    assert framework_named("any").for_model(QWEN).training_why_not(full) is None
    assert megatron.for_model(QWEN).training_why_not(Training(cuda_graph_modules=("attn", "moe_router"))) is None
    result = CliRunner().invoke(main, [*QWEN_ESTIMATE, "--cuda-graphs", "full_iteration", "--framework", "megatron"])
    assert result.exit_code == 2 and "dropless MoE layers" in result.output and "Traceback" not in result.output
    assert CliRunner().invoke(main, [*QWEN_ESTIMATE, "--cuda-graphs", "full_iteration"]).exit_code == 0


def test_runs_on_names_only_the_targets_that_run_the_plans_graphs(tmp_path) -> None:
    """A plan's `runs_on` lists the targets that run it exactly as planned, its training options included: per-layer
    graphs leave Megatron-LM alone where the eager plan of the same layout runs on torchtitan too."""
    args = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "64", "--tp", "1",
            "--pp", "1", "--dp", "8", "--zero", "3"]
    eager, graphed = tmp_path / "eager.json", tmp_path / "graphed.json"
    assert CliRunner().invoke(main, [*args, "--out", str(eager)]).exit_code == 0
    assert CliRunner().invoke(main, [*args, "--cuda-graph-modules", "attn,mlp", "--out", str(graphed)]).exit_code == 0
    assert "torchtitan" in json.loads(eager.read_text())["runs_on"]
    assert json.loads(graphed.read_text())["runs_on"] == ["megatron"]
