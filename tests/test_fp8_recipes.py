"""FP8 recipes (Training.fp8_recipe): what each adds around the linear layers, who runs which, and their exports."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import tomllib
from click.testing import CliRunner
from test_export_plans import parse_flags, plan_document
from test_export_torchtitan import _TORCHTITAN_CHECK

from cli import main
from planner.config import FP8_RECIPES, Training
from planner.errors import PlannerError
from planner.export.megatron import export_megatron
from planner.export.torchtitan import torchtitan_toml
from planner.frameworks import FRAMEWORKS
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.plan import parse_plan_document
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration
from tests.host_overlap import full_overlap

H100, B200 = lookup_gpu("H100-80GB"), lookup_gpu("B200")
FP8 = UnitSetting(tp=1, micro_batch=1, seq_len=8192, sequence_parallel=False, dtype="fp8", attention="flash",
                  fp8_recipe="delayed")


def _block(recipe: str, gpu=H100, model: str = "llama3-8b"):
    """The profile (host and GPU overlapping fully: the casts' bytes show exactly) and a block's times."""
    profile = AnalyticProfile(load_model(model), full_overlap())
    return profile, profile.times(UnitKind.BLOCK, replace(FP8, fp8_recipe=recipe), gpu)


def test_fp8_without_a_recipe_scales_as_megatrons_default_and_other_dtypes_take_none() -> None:
    assert Training(dtype="fp8").fp8_recipe == "delayed"
    assert Training(dtype="bf16").fp8_recipe is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"dtype": "bf16", "fp8_recipe": "rowwise"}, "fp8_recipe applies to dtype fp8 only, got dtype 'bf16'"),
    ({"dtype": "fp8", "fp8_recipe": "nvfp4"}, "fp8_recipe must be one of " + ", ".join(FP8_RECIPES)),
])
def test_bad_recipes_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(PlannerError, match=message):
        Training(**fields)


def test_current_scaling_pays_the_casts_delayed_scaling_fuses_and_an_amax_pass() -> None:
    """Llama 3 8B (h 4096, q 4096, SwiGLU 14336): current scaling casts the QKV, FC1 and FC2 inputs in kernels of
    their own (3 B per element) and reads the attention output once more for its amax (+2 B) in the forward;
    the backward reads every output gradient once more (+2 B)."""
    profile, delayed = _block("delayed")
    _, tensorwise = _block("tensorwise")
    h, f, qkv = 4096, 14336, 4096 + 2 * 1024
    forward_bytes = 3 * (h + h + f) + 2 * h
    backward_bytes = 2 * (qkv + h + 2 * f + h)
    tokens = 8192
    assert tensorwise.forward_s - delayed.forward_s == pytest.approx(profile.memory_time(H100, tokens * forward_bytes))
    assert tensorwise.backward_s - delayed.backward_s == pytest.approx(
        profile.memory_time(H100, tokens * backward_bytes))


def test_mxfp8_quantises_both_ways_at_once_and_transposes_nothing() -> None:
    """On Blackwell, MXFP8 writes the column-wise copies with the row-wise ones: its backward moves fewer bytes than
    delayed scaling's transposes."""
    _, delayed = _block("delayed", B200)
    _, mxfp8 = _block("mxfp8", B200)
    assert mxfp8.backward_s < delayed.backward_s


def test_mxfp8_needs_blackwells_block_scaling() -> None:
    with pytest.raises(PlannerError, match=r"mxfp8 needs MX block-scaled tensor cores.*H100-80GB has none"):
        _block("mxfp8", H100)


def test_rowwise_with_gw_hp_runs_the_weight_gradient_in_bf16() -> None:
    profile, hp = _block("rowwise_with_gw_hp")
    bf16 = profile.times(UnitKind.BLOCK, replace(FP8, dtype="bf16", fp8_recipe=None), H100)
    _, rowwise = _block("rowwise")
    assert hp.weight_grad_s == pytest.approx(bf16.weight_grad_s)
    assert hp.weight_grad_s > rowwise.weight_grad_s


def test_composed_blocks_pay_the_recipes_casts_too() -> None:
    """Nemotron-H's Mamba and MLP blocks are composed block by block: their FP8 casts count as a Llama block's."""
    model = load_model("nemotron-h-8b")
    profile = AnalyticProfile(model, default_calibration())
    for block in model.block_types():
        delayed = profile.block_times(block, FP8, H100)
        tensorwise = profile.block_times(block, replace(FP8, fp8_recipe="tensorwise"), H100)
        assert tensorwise.forward_s > delayed.forward_s and tensorwise.backward_s > delayed.backward_s


def test_each_framework_runs_its_own_recipes_and_defaults() -> None:
    megatron, titan = FRAMEWORKS["megatron"], FRAMEWORKS["torchtitan"]
    assert (megatron.fp8_recipes[0], titan.fp8_recipes[0]) == ("delayed", "tensorwise")
    assert "has no rowwise FP8 recipe" in (megatron.training_why_not(Training(dtype="fp8", fp8_recipe="rowwise"))
                                           or "")
    assert "has no delayed FP8 recipe" in (titan.training_why_not(Training(dtype="fp8")) or "")
    assert titan.training_why_not(Training(dtype="fp8", fp8_recipe="mxfp8")) is None


ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len",
            "4096", "--dp", "8", "--tp", "1", "--pp", "1", "--micro-batch", "2", "--zero", "3", "--dtype", "fp8"]


def test_cli_takes_the_frameworks_default_and_names_the_recipe() -> None:
    runner = CliRunner()
    for framework, recipe in (("megatron", "delayed"), ("torchtitan", "tensorwise"), ("any", "delayed")):
        result = runner.invoke(main, [*ESTIMATE, "--framework", framework])
        assert result.exit_code == 0, result.output
        assert f"fp8 ({recipe} scaling)" in result.output.splitlines()[0]
    document = json.loads(runner.invoke(main, [*ESTIMATE, "--fp8-recipe", "rowwise", "--json"]).output)
    assert document["training"]["fp8_recipe"] == "rowwise"


@pytest.mark.parametrize(("extra", "message"), [
    (["--fp8-recipe", "mxfp8"], "mxfp8 needs MX block-scaled tensor cores"),
    (["--fp8-recipe", "rowwise", "--framework", "megatron"], "has no rowwise FP8 recipe"),
    (["--fp8-recipe", "fp4"], "'fp4' is not one of"),
])
def test_cli_bad_recipe_exits_2_with_one_line(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(main, [*ESTIMATE, *extra])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_bf16_with_a_recipe_exits_2() -> None:
    args = [*ESTIMATE[:-2], "--fp8-recipe", "tensorwise"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "fp8_recipe applies to dtype fp8 only" in result.output


def _plan(recipe: str, model: str = "llama3-8b", cluster: str = "1x8xH100-80GB", **parallel):
    parallel = {"blocks": (32,), "tp": 1, "pp": 1, "dp": 8, "zero_stage": 3, **parallel}
    document = plan_document(model=model, cluster=cluster, dtype="fp8", **parallel)
    document["training"]["fp8_recipe"] = recipe
    return parse_plan_document(document)


def test_plan_file_round_trips_the_recipe_and_refuses_a_bad_one() -> None:
    assert _plan("blockwise").training.fp8_recipe == "blockwise"
    document = plan_document(cluster="1x8xH100-80GB", blocks=(32,), tp=1, pp=1, dp=8, dtype="fp8")
    document["training"]["fp8_recipe"] = "per-channel"
    with pytest.raises(PlannerError, match="fp8_recipe must be one of"):
        parse_plan_document(document)


def test_megatron_export_names_the_recipe() -> None:
    flags = parse_flags(export_megatron(_plan("tensorwise", zero_stage=0, distributed_optimizer=True))
                        .files["megatron_args.txt"])
    assert flags["--fp8-recipe"] == ["tensorwise"] and flags["--fp8-format"] == ["hybrid"]


def test_torchtitan_export_converts_the_linears_with_the_recipe() -> None:
    rowwise = tomllib.loads(torchtitan_toml(_plan("rowwise")))
    assert rowwise["model"]["converters"] == ["quantize.linear.float8"]
    assert rowwise["quantize"]["linear"]["float8"]["recipe_name"] == "rowwise"
    moe = tomllib.loads(torchtitan_toml(_plan("mxfp8", model="qwen3-30b-a3b", cluster="1x8xB200", blocks=(48,),
                                              ep=8)))
    assert moe["model"]["converters"] == ["quantize.linear.mx", "quantize.grouped_mm.mx"]
    assert moe["quantize"]["grouped_mm"]["mx"]["fqns"] == ["experts"]


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("tyro") is None,
                    reason="torchtitan 0.2.2 not installed (pip install --no-deps torchtitan==0.2.2 tyro)")
def test_torchtitans_own_parser_accepts_the_fp8_sections(tmp_path) -> None:
    for recipe, gather in (("tensorwise", True), ("tensorwise", False), ("rowwise_with_gw_hp", False)):
        path = tmp_path / f"{recipe}-{gather}.toml"
        path.write_text(torchtitan_toml(_plan(recipe, fp8_param_gather=gather)))
        run = subprocess.run([sys.executable, "-c", _TORCHTITAN_CHECK, str(path), "8"], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]


def test_torchao_keeps_the_bf16_input_and_casts_it_again() -> None:
    """torchao's Float8Linear saves the high-precision input (save_for_backward(input_hp, ...)) and casts it again
    for the weight gradient (read 2 B, write 1 B) where Transformer Engine transposes its FP8 copy (2 B); torchtitan
    sets it, and its activations keep 2 bytes per linear input, not 1."""
    profile, kept_fp8 = _block("tensorwise")
    kept_bf16 = profile.times(UnitKind.BLOCK, replace(FP8, fp8_recipe="tensorwise", fp8_saved_input="bf16"), H100)
    inputs = 4096 + 4096 + 4096 + 14336  # QKV, projection, FC1, FC2 inputs per token
    assert kept_bf16.backward_s - kept_fp8.backward_s == pytest.approx(profile.memory_time(H100, 8192 * inputs))
    assert FRAMEWORKS["torchtitan"].fp8_saved_input == "bf16" and FRAMEWORKS["megatron"].fp8_saved_input == "fp8"
    with pytest.raises(PlannerError, match="fp8_saved_input must be one of fp8, bf16"):
        Training(dtype="fp8", fp8_saved_input="fp16")


def test_torchtitan_fp8_plans_hold_more_activation_memory() -> None:
    runner = CliRunner()
    base = [*ESTIMATE, "--fp8-recipe", "tensorwise", "--recompute", "none", "--json"]
    megatron = json.loads(runner.invoke(main, [*base, "--framework", "any"]).output)
    titan = json.loads(runner.invoke(main, [*base, "--framework", "torchtitan"]).output)
    assert titan["training"]["fp8_saved_input"] == "bf16" and megatron["training"]["fp8_saved_input"] == "fp8"
    assert titan["estimate"]["peak_memory_bytes"] > megatron["estimate"]["peak_memory_bytes"]


def test_torchtitan_gathers_fp8_weights_only_under_its_default_tensorwise_config() -> None:
    """torchtitan's float8 converter asserts that no recipe_name stands beside enable_fsdp_float8_all_gather: a
    tensorwise plan is exported as the default config with the planned FP8 gather, any other by recipe name, and a
    rowwise plan that gathers in FP8 is refused."""
    gathered = tomllib.loads(torchtitan_toml(_plan("tensorwise", fp8_param_gather=True)))["quantize"]["linear"]
    assert gathered["float8"] == {"enable_fsdp_float8_all_gather": True,
                                  "precompute_float8_dynamic_scale_for_fsdp": True}
    rowwise = tomllib.loads(torchtitan_toml(_plan("rowwise")))["quantize"]["linear"]["float8"]
    assert rowwise == {"recipe_name": "rowwise"}
    why = FRAMEWORKS["torchtitan"].training_why_not(Training(dtype="fp8", fp8_recipe="rowwise"),
                                                    _plan("rowwise", fp8_param_gather=True).parallel)
    assert "gathers weights in FP8 only with tensorwise scaling, got rowwise" in (why or "")
    result = CliRunner().invoke(main, [*ESTIMATE, "--fp8-recipe", "rowwise", "--framework", "torchtitan",
                                       "--fp8-param-gather"])
    assert result.exit_code == 2 and "only with tensorwise" in result.output and "Traceback" not in result.output


def test_a_bad_saved_input_is_refused_whatever_the_dtype() -> None:
    with pytest.raises(PlannerError, match="fp8_saved_input must be one of fp8, bf16, got 'fp16'"):
        Training(dtype="bf16", fp8_saved_input="fp16")


def test_compare_shows_each_plans_recipe(tmp_path) -> None:
    """Two FP8 plans that differ only in their recipe differ in compare's dtype row, not only in their times."""
    runner, paths = CliRunner(), [tmp_path / "rowwise.json", tmp_path / "tensorwise.json"]
    for path in paths:
        recipe = path.stem
        result = runner.invoke(main, [*ESTIMATE, "--fp8-recipe", recipe, "--framework", "torchtitan",
                                      "--out", str(path)])
        assert result.exit_code == 0, result.output
    document = json.loads(runner.invoke(main, ["compare", *map(str, paths), "--json"]).output)
    dtype = next(row for row in document["rows"] if row["field"] == "dtype")
    assert dtype["differs"] and dtype["values"] == ["fp8 (rowwise scaling)", "fp8 (tensorwise scaling)"]
