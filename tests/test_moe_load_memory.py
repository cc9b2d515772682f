"""The busiest expert rank's memory: a dropless router that sends one EP rank more than the mean routed tokens makes
that rank keep their activations too, and it is the rank that runs out of memory first."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import main
from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate, moe_load_fit_limit, moe_load_headroom
from planner.cost.memory import block_type_activation_bytes, mlp_tensors
from planner.model import load_model

MIXTRAL = load_model("mixtral-8x7b")
QWEN = load_model("qwen3-30b-a3b")  # routed and no shared experts
DEEPSEEK = load_model("deepseek-v3")  # routed and shared experts
TRAINING = Training(global_batch=256, seq_len=4096)
CONFIG = ParallelConfig(dp=8, tp=1, pp=1, ep=8, distributed_optimizer=True)
CLUSTER = parse_shorthand("1x8xH100-80GB")


def _moe_block(model):
    return next(block for block in model.block_types() if block.mlp is not None and block.mlp.is_moe)


@pytest.mark.parametrize("model", [QWEN, DEEPSEEK], ids=["qwen3", "deepseek-v3"])
def test_routed_tensors_grow_with_the_load_and_shared_experts_do_not(model) -> None:
    """The routed copies, the experts' first-matrix output and activation output scale with the load; the shared
    experts see every token once whatever the router does."""
    block = _moe_block(model)
    balanced = mlp_tensors(block, TRAINING, 4096.0, 1, 8)
    skewed = mlp_tensors(block, replace(TRAINING, moe_load_imbalance=1.6), 4096.0, 1, 8)
    assert [t.bytes for t in skewed[:3]] == pytest.approx([1.6 * t.bytes for t in balanced[:3]])
    assert skewed[3].bytes == balanced[3].bytes
    assert [t.freed_by for t in skewed] == [t.freed_by for t in balanced]


def test_block_activations_grow_by_exactly_the_extra_routed_tensors() -> None:
    block = _moe_block(QWEN)
    routed = sum(t.bytes for t in mlp_tensors(block, TRAINING, 4096.0, 1, 8)[:3])
    balanced = block_type_activation_bytes(QWEN, block, TRAINING, CONFIG)
    skewed = block_type_activation_bytes(QWEN, block, replace(TRAINING, moe_load_imbalance=1.25), CONFIG)
    assert skewed - balanced == pytest.approx(0.25 * routed)


def test_a_capacity_factor_caps_the_load_memory_is_costed_at() -> None:
    block = _moe_block(QWEN)
    capped = replace(TRAINING, moe_load_imbalance=2.0, moe_capacity_factor=1.25)
    assert block_type_activation_bytes(QWEN, block, capped, CONFIG) == pytest.approx(
        block_type_activation_bytes(QWEN, block, replace(TRAINING, moe_load_imbalance=1.25), CONFIG))


def test_dense_blocks_and_full_recompute_keep_what_they_kept() -> None:
    """A dense block has no router; under full recompute a block keeps only its input, whatever the load."""
    dense = next(block for block in DEEPSEEK.block_types() if block.mlp is not None and not block.mlp.is_moe)
    skewed = replace(TRAINING, moe_load_imbalance=2.0)
    assert block_type_activation_bytes(DEEPSEEK, dense, skewed, CONFIG) == block_type_activation_bytes(
        DEEPSEEK, dense, TRAINING, CONFIG)
    full = replace(CONFIG, recompute=Recompute.FULL)
    block = _moe_block(QWEN)
    assert block_type_activation_bytes(QWEN, block, skewed, full) == block_type_activation_bytes(
        QWEN, block, TRAINING, full)


@settings(max_examples=15, deadline=None)
@given(low=st.floats(1.0, 2.0), extra=st.floats(0.0, 1.0))
def test_peak_memory_never_falls_as_the_busiest_rank_gets_busier(low: float, extra: float) -> None:
    peaks = [estimate(MIXTRAL, CLUSTER, replace(TRAINING, moe_load_imbalance=load), CONFIG).peak_memory_bytes
             for load in (low, low + extra)]
    assert peaks[1] >= peaks[0]


def test_cli_costs_the_busiest_rank_and_says_so(tmp_path) -> None:
    """`--moe-load-imbalance` raises the estimate's peak and time and names the load in the header; the plan file
    records it, and `estimate --plan` reproduces the figures."""
    base = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB", "--dp", "16", "--ep", "8",
            "--micro-batch", "1", "--global-batch", "256", "--seq-len", "4096", "--distributed-optimizer"]
    balanced = json.loads(CliRunner().invoke(main, [*base, "--json"]).stdout)["estimate"]
    out = tmp_path / "plan.json"
    skewed_run = CliRunner().invoke(main, [*base, "--moe-load-imbalance", "1.5", "--json", "--out", str(out)])
    assert skewed_run.exit_code in (0, 1), skewed_run.output
    document = json.loads(out.read_text())
    skewed = document["estimate"]
    assert document["training"]["moe_load_imbalance"] == 1.5
    assert skewed["peak_memory_bytes"] > balanced["peak_memory_bytes"]
    assert skewed["iteration_time_s"] > balanced["iteration_time_s"]
    replayed = CliRunner().invoke(main, ["estimate", "--plan", str(out), "--json"])
    assert json.loads(replayed.stdout)["estimate"]["peak_memory_bytes"] == pytest.approx(skewed["peak_memory_bytes"])
    text = CliRunner().invoke(main, [*base, "--moe-load-imbalance", "1.5", "--moe-capacity-factor", "1.25"])
    assert "busiest expert rank at 1.25x the mean routed tokens" in text.output.splitlines()[0]


@pytest.mark.parametrize(("options", "message"), [
    (["--moe-load-imbalance", "0.9"], "'--moe-load-imbalance': 0.9 is not in the range x>=1.0"),
    (["--moe-load-imbalance", "inf"], "'--moe-load-imbalance': 'inf' is not a finite number"),
    (["--moe-capacity-factor", "abc"], "'--moe-capacity-factor': 'abc' is not a valid float"),
])
def test_cli_bad_router_values_exit_2_naming_them(options: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["estimate", "--model", "qwen3-30b-a3b", *options])
    assert result.exit_code == 2 and message in result.output


def test_cli_router_options_on_a_dense_model_exit_2() -> None:
    result = CliRunner().invoke(main, ["estimate", "--moe-load-imbalance", "1.3"])
    assert result.exit_code == 2
    assert "shape an MoE router; llama3-8b has no routed experts" in result.output
    assert "Traceback" not in result.output


def _estimate_at(config: ParallelConfig):
    return lambda training: estimate(QWEN, parse_shorthand("2x8xH100-80GB"), training, config)


DIST_OPT = ParallelConfig(dp=16, tp=1, pp=1, ep=8, distributed_optimizer=True)


def test_the_router_headroom_is_the_load_at_which_the_plan_stops_fitting() -> None:
    """Memory is linear in the load, so the headroom is exact: just under it the plan fits, just over it it does not;
    it is the same whichever fitting load it is computed from."""
    at = _estimate_at(DIST_OPT)
    headroom = moe_load_headroom(TRAINING, DIST_OPT, at(TRAINING), at)
    assert headroom is not None and 1.0 < headroom < 3.0
    assert at(replace(TRAINING, moe_load_imbalance=headroom - 1e-3)).fits
    assert not at(replace(TRAINING, moe_load_imbalance=headroom + 1e-3)).fits
    busier = replace(TRAINING, moe_load_imbalance=1.2)
    assert moe_load_headroom(busier, DIST_OPT, at(busier), at) == pytest.approx(headroom)


def test_no_router_headroom_where_the_load_cannot_move_memory() -> None:
    """No expert parallelism (every rank routes its own tokens to its own experts), a capacity factor, a dense model
    or a plan that does not fit: no headroom to report."""
    without_ep = _estimate_at(replace(DIST_OPT, ep=1))
    assert moe_load_headroom(TRAINING, replace(DIST_OPT, ep=1), without_ep(TRAINING), without_ep) is None
    capped = replace(TRAINING, moe_capacity_factor=1.25)
    at = _estimate_at(DIST_OPT)
    assert moe_load_headroom(capped, DIST_OPT, at(capped), at) is None
    replicated = replace(DIST_OPT, distributed_optimizer=False)
    unsharded = _estimate_at(replicated)
    assert not unsharded(TRAINING).fits and moe_load_headroom(TRAINING, replicated, unsharded(TRAINING),
                                                               unsharded) is None
    dense = load_model("llama3-8b")
    dense_at = lambda training: estimate(dense, CLUSTER, training, ParallelConfig(dp=8, tp=1, pp=1))  # noqa: E731
    assert moe_load_headroom(TRAINING, ParallelConfig(dp=8, tp=1, pp=1), dense_at(TRAINING), dense_at) is None


def test_without_expert_parallelism_the_load_changes_nothing() -> None:
    """With ep 1 no rank gets more than its own tokens' routed copies: time and memory ignore the router's load."""
    at = _estimate_at(replace(DIST_OPT, ep=1))
    balanced, skewed = at(TRAINING), at(replace(TRAINING, moe_load_imbalance=1.7))
    assert skewed.peak_memory_bytes == balanced.peak_memory_bytes
    assert skewed.iteration_time_s == pytest.approx(balanced.iteration_time_s)


def test_cli_estimate_and_explain_report_the_router_headroom(tmp_path) -> None:
    out = tmp_path / "plan.json"
    base = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB", "--dp", "16", "--ep", "8",
            "--micro-batch", "1", "--global-batch", "256", "--seq-len", "4096", "--distributed-optimizer"]
    text = CliRunner().invoke(main, [*base, "--out", str(out)])
    assert text.exit_code == 0, text.output
    headroom = json.loads(out.read_text())["estimate"]["moe_load_headroom"]
    assert f"router headroom fits while the busiest expert rank gets up to {headroom:.2f}x" in text.output
    explained = CliRunner().invoke(main, ["explain", str(out), "--json"])
    memory = json.loads(explained.stdout)["memory"]
    assert memory["moe_load_headroom"] == pytest.approx(headroom)
    assert f"more than {headroom:.2f}x the mean routed tokens would not fit" in memory["note"]


def test_plan_searches_for_the_load_and_reports_the_best_plans_headroom() -> None:
    """`plan --moe-load-imbalance` only keeps plans whose busiest expert rank fits at that load, and reports how far
    beyond it the best plan stays within."""
    base = ["plan", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB", "--global-batch", "256", "--seq-len",
            "4096", "--json"]
    balanced = json.loads(CliRunner().invoke(main, base).stdout)
    skewed = json.loads(CliRunner().invoke(main, [*base, "--moe-load-imbalance", "1.2"]).stdout)
    assert balanced["estimate"]["moe_load_headroom"] >= 1.0
    assert skewed["estimate"]["moe_load_headroom"] >= 1.2
    assert skewed["training"]["moe_load_imbalance"] == 1.2
    assert skewed["estimate"]["iteration_time_s"] >= balanced["estimate"]["iteration_time_s"]


def test_plan_warns_when_only_a_balanced_router_fits() -> None:
    """The fastest plan for a balanced router that barely fits one says so and names the option; planned for a load,
    it does not."""
    base = ["plan", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB", "--global-batch", "256", "--seq-len",
            "4096"]
    warning = "only a nearly balanced router fits"
    assert warning in CliRunner().invoke(main, base).output
    assert warning not in CliRunner().invoke(main, [*base, "--moe-load-imbalance", "1.2"]).output


def test_the_fit_limit_of_a_plan_that_does_not_fit_is_the_load_it_would_fit_under() -> None:
    at = _estimate_at(DIST_OPT)
    heavy = replace(TRAINING, moe_load_imbalance=3.0)
    assert not at(heavy).fits
    limit = moe_load_fit_limit(heavy, at(heavy), at)
    assert limit == pytest.approx(moe_load_headroom(TRAINING, DIST_OPT, at(TRAINING), at))
    assert at(replace(TRAINING, moe_load_imbalance=limit - 1e-3)).fits
    assert moe_load_headroom(heavy, DIST_OPT, at(heavy), at) is None  # no headroom for a plan that does not fit
