"""Element-wise kernels (issue 10): fused (Transformer Engine, torch.compile) against eager PyTorch's op-by-op
kernels as torchtitan's Llama code runs without torch.compile, and what each framework and export does with them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_export_plans import plan_document

from cli import main
from planner.config import Training
from planner.errors import PlannerError
from planner.export.torchtitan import export_torchtitan, torchtitan_toml
from planner.frameworks import FRAMEWORKS
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.plan import parse_plan_document
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration
from tests.host_overlap import full_overlap

H100 = lookup_gpu("H100-80GB")
SETTING = UnitSetting(tp=1, micro_batch=1, seq_len=8192, sequence_parallel=False, dtype="bf16", attention="flash")


def _forward_gap(model_name: str, block_index: int | None = None) -> float:
    """Eager minus fused forward seconds of a block at SETTING on an H100 (host and GPU overlapping fully, so the
    extra work shows exactly)."""
    model = load_model(model_name)
    profile = AnalyticProfile(model, full_overlap())
    eager = replace(SETTING, elementwise="eager")
    if block_index is None:
        fused_s = profile.times(UnitKind.BLOCK, SETTING, H100).forward_s
        return profile.times(UnitKind.BLOCK, eager, H100).forward_s - fused_s
    block = list(model.block_types())[block_index]
    return profile.block_times(block, eager, H100).forward_s - profile.block_times(block, SETTING, H100).forward_s


def test_eager_llama_block_moves_torchtitans_extra_bytes_and_launches() -> None:
    """Llama 3 8B: two RMSNorms at 32 extra bytes per element over h = 4096, RoPE at 16 over q + k (4096 + 1024),
    SwiGLU at 4 over 14336 channels: 401,408 bytes per token more, and 7·2 + 2·2 + 1 = 19 more kernels."""
    profile = AnalyticProfile(load_model("llama3-8b"), default_calibration())
    extra_bytes = 2 * 32 * 4096 + 16 * (4096 + 1024) + 4 * 14336
    assert extra_bytes == 401_408
    expected = profile.memory_time(H100, 8192 * extra_bytes) + 19 * default_calibration().kernel_launch_s
    assert _forward_gap("llama3-8b") == pytest.approx(expected)


def test_eager_backward_doubles_the_extra_like_fused_kernels() -> None:
    profile = AnalyticProfile(load_model("llama3-8b"), default_calibration())
    fused = profile.times(UnitKind.BLOCK, SETTING, H100)
    eager = profile.times(UnitKind.BLOCK, replace(SETTING, elementwise="eager"), H100)
    assert eager.backward_s - fused.backward_s == pytest.approx(2 * (eager.forward_s - fused.forward_s), rel=0.05)


def test_eager_composed_block_adds_its_norm_only() -> None:
    """Nemotron-H's MLP-only block (squared ReLU, no RoPE) pays the eager RMSNorm's 32 bytes per element alone."""
    model = load_model("nemotron-h-8b")
    block_index = next(i for i, block in enumerate(model.block_types()) if block.attention is None
                       and block.mamba is None)
    profile = AnalyticProfile(model, default_calibration())
    expected = profile.memory_time(H100, 8192 * 32 * 4096) + 7 * default_calibration().kernel_launch_s
    assert _forward_gap("nemotron-h-8b", block_index) == pytest.approx(expected)


def test_unknown_elementwise_mode_is_refused() -> None:
    with pytest.raises(PlannerError, match="elementwise must be one of fused, eager, got 'lazy'"):
        Training(elementwise="lazy")


def test_megatron_and_deepspeed_refuse_eager_torchtitan_runs_it() -> None:
    eager = Training(elementwise="eager")
    for name in ("megatron", "deepspeed"):
        assert "has no eager element-wise kernels" in (FRAMEWORKS[name].training_why_not(eager) or "")
    assert FRAMEWORKS["torchtitan"].training_why_not(eager) is None


ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len",
            "8192", "--dp", "8", "--tp", "1", "--pp", "1", "--micro-batch", "2", "--zero", "3",
            "--recompute", "selective", "--framework", "torchtitan"]


def test_cli_eager_is_slower_and_named() -> None:
    runner = CliRunner()
    fused = runner.invoke(main, [*ESTIMATE, "--json"])
    eager = runner.invoke(main, [*ESTIMATE, "--elementwise", "eager", "--json"])
    assert fused.exit_code == eager.exit_code == 0
    fused_doc, eager_doc = json.loads(fused.output), json.loads(eager.output)
    assert eager_doc["training"]["elementwise"] == "eager"
    assert eager_doc["estimate"]["iteration_time_s"] > fused_doc["estimate"]["iteration_time_s"]
    text = runner.invoke(main, [*ESTIMATE, "--elementwise", "eager"])
    assert "eager element-wise kernels" in text.output


def test_cli_bad_elementwise_and_megatron_eager_exit_2() -> None:
    runner = CliRunner()
    bad = runner.invoke(main, [*ESTIMATE, "--elementwise", "lazy"])
    assert bad.exit_code == 2 and "'lazy' is not one of 'fused', 'eager'" in bad.output
    refused = runner.invoke(main, [*ESTIMATE, "--elementwise", "eager", "--framework", "megatron"])
    assert refused.exit_code == 2
    assert "has no eager element-wise kernels" in refused.output and "Traceback" not in refused.output


def test_torchtitan_export_compiles_fused_plans_only() -> None:
    """The cost model's fused kernels are torch.compile's under torchtitan: a fused plan's export turns compile on,
    an eager one's leaves it off (torchtitan's default)."""
    document = plan_document(cluster="1x8xH100-80GB", blocks=(32,), tp=1, pp=1, dp=8, zero_stage=3)
    fused = torchtitan_toml(parse_plan_document(document))
    document["training"]["elementwise"] = "eager"
    eager = torchtitan_toml(parse_plan_document(document))
    assert "[compile]\nenable = true" in fused
    assert "\n[compile]" not in eager and "--elementwise eager" in eager


def test_torchtitan_zero_bubble_export_leaves_compile_off_and_says_so() -> None:
    """A split backward needs each block's own autograd graph: a zero-bubble plan's export runs uncompiled and
    notes that its fused element-wise costing does not hold there."""
    document = plan_document(cluster="1x8xH100-80GB", blocks=(8, 8, 8, 8), tp=1, pp=2, vpp=2, dp=4, zero_stage=3,
                             schedule="zb-v")
    plan = parse_plan_document(document)
    text = torchtitan_toml(plan)
    assert "\n[compile]" not in text and "zero-bubble" in text
    notes = export_torchtitan(plan).notes
    assert any("--elementwise eager" in note for note in notes)
