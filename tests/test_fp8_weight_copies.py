"""FP8 weight copies in memory: Transformer Engine's linears keep a row-wise FP8 copy of each weight through an
iteration and a column-wise one where the GPU's FP8 GEMMs need it (`fp8_weight_copy_bytes`); `--fp8-param-gather`
stores the weights in FP8 instead, which `plan` turns on wherever it can."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from benchmarks.validation_runs import h100_runs, predict
from cli import main
from planner.cluster import load_cluster
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.cost.memory import MXFP8_SCALE_BYTES, fp8_weight_copy_bytes
from planner.errors import PlannerError
from planner.gpu import gpu_from_dict, lookup_gpu
from planner.model import load_model
from planner.profile.calibration import default_calibration
from planner.search.planning import plan
from planner.search.space import FixedOptions

SHARDED = ParallelConfig(dp=8, tp=1, pp=1, distributed_optimizer=True)
FP8_SHARDED = replace(SHARDED, fp8_param_gather=True)
H100, B200 = lookup_gpu("H100-80GB"), lookup_gpu("B200")


def _fp8(recipe: str, saved: str = "fp8") -> Training:
    return Training(global_batch=8, seq_len=4096, dtype="fp8", fp8_recipe=recipe, fp8_saved_input=saved)


@pytest.mark.parametrize(("training", "config", "gpu", "expected"), [
    (_fp8("tensorwise"), SHARDED, H100, 2.0),  # Hopper: a row-wise copy and its transpose
    (_fp8("delayed"), SHARDED, H100, 2.0),
    (_fp8("tensorwise"), SHARDED, B200, 1.0),  # Blackwell's FP8 GEMMs read the row-wise data transposed
    (_fp8("mxfp8"), SHARDED, B200, 2 * (1 + MXFP8_SCALE_BYTES)),  # MXFP8 scales rows and columns apart
    (_fp8("tensorwise"), FP8_SHARDED, H100, 0.0),  # FP8 weights: the copies are the weights
    (_fp8("tensorwise"), FP8_SHARDED, B200, -1.0),  # one byte where the 16-bit weight took two
    (_fp8("mxfp8"), FP8_SHARDED, B200, 2 * MXFP8_SCALE_BYTES),
    (_fp8("tensorwise", saved="bf16"), SHARDED, H100, 0.0),  # torchao's Float8Linear casts every pass
    (Training(global_batch=8, seq_len=4096, dtype="bf16"), SHARDED, H100, 0.0),
    (_fp8("tensorwise"), replace(SHARDED, distributed_optimizer=False, zero_stage=3), H100, 0.0),
])
def test_fp8_weight_copy_bytes(training: Training, config: ParallelConfig, gpu, expected: float) -> None:
    assert fp8_weight_copy_bytes(training, config, gpu) == pytest.approx(expected)


def test_estimate_counts_the_copies_with_the_weights_of_the_linears_only() -> None:
    """llama3-8b on 8 H100 under the distributed optimizer: FP8 adds 2 bytes per linear parameter to the weights
    (not the embedding's or head's), and FP8 weights bring them back to the 16-bit weights' bytes."""
    model, cluster = load_model("llama3-8b"), load_cluster("1x8xH100-80GB")
    bf16 = estimate(model, cluster, Training(global_batch=8, seq_len=4096, dtype="bf16"), SHARDED)
    fp8 = estimate(model, cluster, _fp8("tensorwise"), SHARDED)
    fp8_weights = estimate(model, cluster, _fp8("tensorwise"), FP8_SHARDED)
    linear = sum(count * block.linear_weight_parameters() for block, count in model.block_types().items())
    added = fp8.stages[0].memory.weights - bf16.stages[0].memory.weights
    assert added == pytest.approx(2 * linear, rel=1e-9)
    assert fp8_weights.stages[0].memory.weights == pytest.approx(bf16.stages[0].memory.weights)
    assert fp8.peak_memory_bytes - fp8_weights.peak_memory_bytes == pytest.approx(added, rel=1e-6)


def test_nvidia_fp8_recipes_run_with_fp8_weights() -> None:
    """NeMo 24.07's GPT3-20B (tp 2, 10 B parameters per GPU) ran: with 16-bit weights beside their FP8 copies it
    would not have fit; with FP8 weights, as NeMo 2.0's recipe stores them, it does."""
    (run,) = [r for r in h100_runs()[0] if r.label.startswith("GPT3-20B")]
    assert run.config.fp8_param_gather
    calibration = default_calibration()
    assert predict(run, calibration).fits
    assert not predict(replace(run, config=replace(run.config, fp8_param_gather=False)), calibration).fits


def test_plan_stores_fp8_weights_where_the_target_can() -> None:
    """`plan` turns FP8 weights on wherever weights are sharded and the target gathers them in FP8 under the
    recipe; `--no-fp8-param-gather` keeps them 16-bit; torchtitan gathers FP8 weights only under tensorwise."""
    model, cluster = load_model("llama3-8b"), load_cluster("1x8xH100-80GB")
    fixed = FixedOptions(tp=1, pp=1, distributed_optimizer=True, micro_batch=1)
    on = plan(model, cluster, _fp8("tensorwise"), fixed, top_k=1).plans[0].config
    assert on.fp8_param_gather and on.optimizer_sharding > 0
    off = plan(model, cluster, _fp8("tensorwise"), replace(fixed, fp8_param_gather=False), top_k=1).plans[0].config
    assert not off.fp8_param_gather
    titan = FixedOptions(tp=1, pp=1, zero_stage=3, micro_batch=1, framework="torchtitan")
    rowwise = Training(global_batch=8, seq_len=4096, dtype="fp8", fp8_recipe="rowwise", fp8_saved_input="bf16")
    assert not plan(model, cluster, rowwise, titan, top_k=1).plans[0].config.fp8_param_gather
    tensorwise = replace(rowwise, fp8_recipe="tensorwise")
    assert plan(model, cluster, tensorwise, titan, top_k=1).plans[0].config.fp8_param_gather


@pytest.mark.parametrize(("option", "exported"), [([], True), (["--no-fp8-param-gather"], False)])
def test_cli_plan_exports_fp8_weights_unless_told_not_to(tmp_path, option: list[str], exported: bool) -> None:
    common = ["--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "8", "--seq-len", "4096",
              "--dtype", "fp8", "--tp", "1", "--pp", "1", "--distributed-optimizer", "--micro-batch", "1"]
    result = CliRunner().invoke(main, ["plan", *common, *option, "--top", "1", "--export", "megatron",
                                       "--export-out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert ("--fp8-param-gather" in (tmp_path / "megatron_args.txt").read_text()) is exported


def test_a_gpu_entry_with_a_non_boolean_fp8_gemm_tn_only_is_refused() -> None:
    entry = {"sm_count": 132, "peak_tflops": {"bf16": 989, "fp8": 1979}, "memory_gib": 80, "hbm_gbps": 3350,
             "matmul_efficiency": 0.8, "intra_node": {"link": "nvlink4", "gbps": 450}, "gpus_per_node": 8,
             "nic_gbps": 50}
    assert gpu_from_dict("X", {**entry, "fp8_gemm_tn_only": True}, "test").fp8_gemm_tn_only
    assert not gpu_from_dict("X", entry, "test").fp8_gemm_tn_only
    with pytest.raises(PlannerError, match="fp8_gemm_tn_only must be true or false, got 'yes'"):
        gpu_from_dict("X", {**entry, "fp8_gemm_tn_only": "yes"}, "test")
    assert H100.fp8_gemm_tn_only and not B200.fp8_gemm_tn_only


def test_the_advice_for_an_fp8_plan_that_does_not_fit_names_fp8_weights() -> None:
    """GPT3-20B as NeMo 24.07 ran it but with 16-bit weights beside their FP8 copies: 94.7 GiB of 79.2; the advice
    offers FP8 weights first."""
    from cli import shortfall_message

    (run,) = [r for r in h100_runs()[0] if r.label.startswith("GPT3-20B")]
    sixteen_bit = replace(run.config, fp8_param_gather=False)
    result = predict(replace(run, config=sixteen_bit), default_calibration())
    assert not result.fits
    assert "try --fp8-param-gather, " in shortfall_message(sixteen_bit, result, run.training)
    fitted = predict(run, default_calibration())
    assert fitted.fits


def test_estimate_shows_the_copies_apart_and_the_plan_file_records_them(tmp_path) -> None:
    """`estimate` prints the term-by-term memory with the FP8 copies in a column of their own, and the plan JSON's
    `memory_bytes` names them (inside `weights`); without copies neither appears."""
    import json

    common = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "8", "--seq-len",
              "4096", "--dtype", "fp8", "--dp", "8", "--distributed-optimizer", "--micro-batch", "1"]
    runner = CliRunner()
    result = runner.invoke(main, [*common, "--out", str(tmp_path / "copies.json")])
    assert result.exit_code == 1 and "fp8 weight copies" in result.output  # 87.9 GiB of 79.2: does not fit
    document = json.loads((tmp_path / "copies.json").read_text())  # written whole, fits false
    assert not document["estimate"]["fits"] and document["stages"][0]["memory_bytes"]["fp8_weight_copies"] > 0
    result = runner.invoke(main, [*common, "--fp8-param-gather", "--out", str(tmp_path / "weights.json")])
    assert result.exit_code == 0, result.output
    assert "fp8 weight copies" not in result.output
    memory = json.loads((tmp_path / "weights.json").read_text())["stages"][0]["memory_bytes"]
    assert "fp8_weight_copies" not in memory
    model = load_model("llama3-8b")
    copies = estimate(model, load_cluster("1x8xH100-80GB"), _fp8("tensorwise"), SHARDED).stages[0].memory
    linear = sum(count * block.linear_weight_parameters() for block, count in model.block_types().items())
    assert copies.as_dict()["fp8_weight_copies"] == pytest.approx(copies.fp8_weight_copies) == pytest.approx(
        2 * linear)


@pytest.mark.parametrize(("options", "message"), [
    (["--framework", "deepspeed"], "DeepSpeed 0.19 (Megatron-DeepSpeed) gathers its sharded weights in 16 bits, "
                                   "never in FP8"),
    (["--framework", "torchtitan", "--fp8-recipe", "rowwise"],
     "torchtitan 0.2.2 gathers weights in FP8 only with tensorwise scaling, got rowwise"),
])
def test_plan_refuses_fp8_weights_its_target_cannot_gather(options: list[str], message: str) -> None:
    """Asked for FP8 weights a target cannot gather, `plan` exits 2 naming why (as `estimate` does), rather than
    planning a layout the launch would not run; left open, it plans 16-bit gathers there."""
    common = ["plan", "--model", "llama3-8b", "--cluster", "2x8xH100-80GB", "--global-batch", "64", "--seq-len",
              "4096", "--dtype", "fp8", "--top", "1", *options]
    refused = CliRunner().invoke(main, [*common, "--fp8-param-gather"])
    assert refused.exit_code == 2 and f"error: --fp8-param-gather: {message}" in refused.output
    assert "Traceback" not in refused.output
    planned = CliRunner().invoke(main, common)
    assert planned.exit_code == 0, planned.output
    assert "fp8-gather" not in planned.output.split("best plan:")[1].splitlines()[0]


def test_fp8_weights_with_optimizer_states_in_host_memory_need_delayed_scaling() -> None:
    """Megatron-LM's optimizer CPU offload keeps FP8 weights only under delayed scaling (validate_args): plan leaves
    them 16-bit under another recipe, and asking for them there exits 2 naming the recipe it needs."""
    common = ["plan", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "64", "--seq-len",
              "4096", "--dtype", "fp8", "--optimizer-states", "cpu", "--top", "1"]
    runner = CliRunner()
    tensorwise = runner.invoke(main, [*common, "--fp8-recipe", "tensorwise"])
    assert tensorwise.exit_code == 0, tensorwise.output
    assert "fp8-gather" not in tensorwise.output.split("best plan:")[1].splitlines()[0]
    asked = runner.invoke(main, [*common, "--fp8-recipe", "tensorwise", "--fp8-param-gather"])
    assert asked.exit_code == 2 and "needs --fp8-recipe delayed" in asked.output and "got tensorwise" in asked.output
    delayed = runner.invoke(main, common)
    assert delayed.exit_code == 0 and "fp8-gather" in delayed.output.split("best plan:")[1].splitlines()[0]


@pytest.mark.parametrize(("options", "offered"), [
    (["--zero", "1"], True),
    (["--zero", "1", "--framework", "deepspeed"], False),  # it gathers 16-bit weights only
    (["--distributed-optimizer", "--optimizer-states", "cpu", "--fp8-recipe", "tensorwise"], False),  # delayed only
    (["--distributed-optimizer", "--optimizer-states", "cpu"], True),
])
def test_the_advice_offers_fp8_weights_only_where_the_target_can_run_them(options: list[str], offered: bool) -> None:
    """llama3-8b at micro-batch 4 over 8192 tokens does not fit an H100 whichever way; FP8 weights are offered where
    the target would run them with these settings."""
    common = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "32", "--seq-len",
              "8192", "--dtype", "fp8", "--dp", "8", "--micro-batch", "4", *options]
    result = CliRunner().invoke(main, common)
    assert result.exit_code == 1, result.output
    assert ("--fp8-param-gather" in result.output.split("does not fit:")[1]) is offered
