"""Attention kernels (issue 10 item 4): the GPU's native fused attention ("flash") against FlashAttention-2's
kernels ("flash2"), which reach only part of a Hopper or Blackwell GPU's rate (Shah et al. 2024), and how each
is exported."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from cli import main
from planner.config import ParallelConfig, Training
from planner.cost.memory import activation_bytes
from planner.errors import PlannerError
from planner.export.flags import Dialect, model_flags
from planner.gpu import gpu_from_dict, lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile import analytic
from planner.profile.analytic import AnalyticProfile, UnitSetting
from planner.profile.calibration import default_calibration

MODEL = load_model("llama3-8b")


def _core(gpu_name: str, attention: str) -> tuple[float, float]:
    profile = AnalyticProfile(MODEL, default_calibration())
    setting = UnitSetting(tp=1, micro_batch=1, seq_len=32768, sequence_parallel=False, dtype="bf16",
                          attention=attention)
    times = profile.times(UnitKind.BLOCK, setting, lookup_gpu(gpu_name))
    return times.attention_core_forward_s, times.forward_s


def test_flash2_attention_runs_at_the_gpus_share_of_the_native_rate() -> None:
    """On an H100 FA2's attention core takes 1/0.57 of the native kernel's time (less its launch); the rest of
    the block is the same."""
    native_core, native_block = _core("H100-80GB", "flash")
    fa2_core, fa2_block = _core("H100-80GB", "flash2")
    launch = default_calibration().kernel_launch_s
    share = lookup_gpu("H100-80GB").flash_attention_2_share
    assert share == pytest.approx(0.57)
    assert fa2_core - launch == pytest.approx((native_core - launch) / share)
    assert fa2_block - fa2_core == pytest.approx(native_block - native_core)


def _core_at(seq_len: int, cp: int = 1) -> float:
    profile = AnalyticProfile(MODEL, default_calibration())
    setting = UnitSetting(tp=1, micro_batch=1, seq_len=seq_len, sequence_parallel=False, dtype="bf16",
                          attention="flash", cp=cp)
    return profile.times(UnitKind.BLOCK, setting, lookup_gpu("H100-80GB")).attention_core_forward_s


def test_fused_attention_rate_rises_with_sequence_as_published_and_saturates() -> None:
    """Each query tile's fixed work (1.8 key tiles' worth) reproduces the published non-causal ramp: FA2 and FA3
    on H100 reach 0.69 of their 16K rate at 512 tokens (4 key tiles); under the causal mask the achieved rate per
    FLOP keeps rising towards its asymptote, within 1 % of it by 256K tokens."""
    overhead = analytic._FLASH_QUERY_TILE_OVERHEAD
    assert (4 / (4 + overhead)) / (128 / (128 + overhead)) == pytest.approx(0.69, abs=0.02)
    launch = default_calibration().kernel_launch_s
    per_flop = [(_core_at(s) - launch) / (s * (s + analytic._FLASH_TILE)) for s in (2048, 8192, 32768, 262144)]
    assert per_flop == sorted(per_flop, reverse=True)
    assert analytic._flash_tile_utilisation(analytic._causal_mean_keys(262144)) == pytest.approx(1.0, abs=0.01)
    assert analytic._flash_tile_utilisation(analytic._causal_mean_keys(4096)) == pytest.approx(16.5 / 18.3)


def test_context_parallel_attention_streams_a_ranks_keys_per_step() -> None:
    """Ring CP runs one kernel per step over s/cp keys: at cp = 4 a 32K sequence's attention runs at the rate
    of 8K keys, a quarter of the FLOPs at a slightly lower rate."""
    launch = default_calibration().kernel_launch_s
    ratio = (_core_at(32768, cp=4) - launch) / (_core_at(32768) - launch)
    causal = analytic._causal_mean_keys
    expected = 0.25 * analytic._flash_tile_utilisation(causal(32768)) / analytic._flash_tile_utilisation(causal(8192))
    assert ratio == pytest.approx(expected)


def test_head_dimension_64_runs_at_the_published_share_of_128() -> None:
    """FlashAttention-3 paper, H100 forward at 16K tokens: native kernels (cuDNN, FA3) reach 0.73 of their head-dim
    128 rate at 64, FA2 0.88; 96 is half-way; 128 and wider heads run at the full rate."""
    assert analytic._head_dim_share(64, "flash") == pytest.approx(0.73)
    assert analytic._head_dim_share(64, "flash2") == pytest.approx(0.88)
    assert analytic._head_dim_share(96, "flash") == pytest.approx((0.73 + 1) / 2)
    assert analytic._head_dim_share(128, "flash") == analytic._head_dim_share(192, "flash") == 1.0
    assert analytic._head_dim_share(32, "flash") == pytest.approx(0.73)


def test_a_model_with_64_wide_heads_pays_the_slower_attention_rate() -> None:
    """Same attention FLOPs (twice the heads at half the width), slower kernel: the core takes 1/0.73 as long."""
    narrow = replace(MODEL, name="narrow", num_attention_heads=64, num_key_value_heads=16, head_dim=64)
    launch = default_calibration().kernel_launch_s
    times = []
    for model in (MODEL, narrow):
        setting = UnitSetting(tp=1, micro_batch=1, seq_len=8192, sequence_parallel=False, dtype="bf16",
                              attention="flash")
        core = AnalyticProfile(model, default_calibration()).times(UnitKind.BLOCK, setting, lookup_gpu("H100-80GB"))
        times.append(core.attention_core_forward_s - launch)
    assert times[1] / times[0] == pytest.approx(1 / 0.73)


def test_flash2_is_the_native_kernel_on_ampere() -> None:
    assert _core("A100-80GB", "flash2") == pytest.approx(_core("A100-80GB", "flash"))


def test_flash2_keeps_flash_attentions_memory() -> None:
    config = ParallelConfig(dp=1, tp=1, pp=1)
    flash, fa2 = (activation_bytes(MODEL, UnitKind.BLOCK, Training(seq_len=8192, attention=kernel), config)
                  for kernel in ("flash", "flash2"))
    assert fa2 == flash < activation_bytes(MODEL, UnitKind.BLOCK, Training(seq_len=8192, attention="unfused"),
                                           config)


@pytest.mark.parametrize("field", ["flash_attention_2_share", "fused_attention_share"])
@pytest.mark.parametrize("bad", [1.5, 0.0, -0.2])
def test_a_gpu_file_share_outside_0_1_is_refused(field: str, bad: float) -> None:
    data = {"peak_tflops": {"bf16": 989}, "memory_gib": 80, "hbm_gbps": 3350, "matmul_efficiency": 0.8,
            "intra_node": {"link": "nvlink4", "gbps": 450}, "gpus_per_node": 8, "nic_gbps": 50, "sm_count": 132}
    assert getattr(gpu_from_dict("X", data | {field: 0.5}, "test"), field) == 0.5
    with pytest.raises(PlannerError, match=rf"{field} must be in \(0, 1\], got {bad}"):
        gpu_from_dict("X", data | {field: bad}, "test")


def test_a_gpu_files_flash_attn_native_must_be_a_boolean() -> None:
    data = {"peak_tflops": {"bf16": 1307}, "memory_gib": 192, "hbm_gbps": 5300, "matmul_efficiency": 0.5,
            "intra_node": {"link": "xgmi", "gbps": 448}, "gpus_per_node": 8, "nic_gbps": 50, "sm_count": 304}
    assert gpu_from_dict("X", data | {"flash_attn_native": True}, "test").flash_attn_native
    with pytest.raises(PlannerError, match="flash_attn_native must be true or false, got 'yes'"):
        gpu_from_dict("X", data | {"flash_attn_native": "yes"}, "test")


def test_amd_native_attention_runs_at_its_share_of_hoppers_rate_per_peak() -> None:
    """Composable Kernel's FA2 on MI300X reaches 228 TFLOP/s forward+backward (0.174 of its peak) where FA3 on
    H100 reaches 574 (0.58): its attention core per FLOP takes 1/0.30 of the time an H100-like GPU of the same
    peak would; SDPA's AOTriton kernels (`flash2`) 1/0.72 of that again. GEMMs and element-wise work do not
    change."""
    mi300x = lookup_gpu("MI300X")
    assert mi300x.fused_attention_share == pytest.approx((228 / 1307.4) / (574 / 989), abs=0.005)
    launch = default_calibration().kernel_launch_s
    profile = AnalyticProfile(MODEL, default_calibration())
    setting = UnitSetting(tp=1, micro_batch=1, seq_len=8192, sequence_parallel=False, dtype="bf16",
                          attention="flash")
    hopper_like = replace(mi300x, fused_attention_share=1.0, flash_attention_2_share=1.0)
    amd = profile.times(UnitKind.BLOCK, setting, mi300x)
    reference = profile.times(UnitKind.BLOCK, setting, hopper_like)
    assert amd.attention_core_forward_s - launch == pytest.approx(
        (reference.attention_core_forward_s - launch) / 0.30)
    assert amd.linear_forward_s == reference.linear_forward_s
    sdpa = profile.times(UnitKind.BLOCK, replace(setting, attention="flash2"), mi300x)
    assert sdpa.attention_core_forward_s - launch == pytest.approx(
        (amd.attention_core_forward_s - launch) / 0.72)
    assert lookup_gpu("A100-80GB").fused_attention_share == lookup_gpu("B200").fused_attention_share == 1.0


@pytest.mark.parametrize(("kernel", "backend"), [("flash", "fused"), ("flash2", "flash"), ("unfused", "unfused")])
def test_megatron_attention_backend_per_kernel(kernel: str, backend: str) -> None:
    """Transformer Engine's cuDNN fused attention is the native kernel; its "flash" backend runs flash-attn."""
    flags = dict((flag[0], flag[1:]) for flag in
                 model_flags(MODEL, Training(attention=kernel), Dialect.MEGATRON_LM).flags)
    assert flags["--attention-backend"] == (backend,)


def test_megatron_deepspeed_runs_flashattention_2_and_says_so_on_hopper(tmp_path) -> None:
    """Both fused kernels export as --use-flash-attn-v2; a "flash" plan on H100 notes that FA2 is slower there, not on
    MI300X, where the flash-attn package is Composable Kernel's native kernel (only SDPA's AOTriton is slower)."""
    for kernel in ("flash", "flash2"):
        flags = model_flags(MODEL, Training(attention=kernel), Dialect.MEGATRON_DEEPSPEED).flags
        assert ("--use-flash-attn-v2",) in flags
    runner = CliRunner()
    notes = {}
    for kernel, gpu in (("flash", "H100-80GB"), ("flash2", "H100-80GB"), ("flash", "A100-80GB"), ("flash", "MI300X")):
        plan = tmp_path / f"{kernel}-{gpu}.json"
        planned = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", f"1x8x{gpu}", "--global-batch",
                                       "16", "--seq-len", "4096", "--dp", "8", "--micro-batch", "1", "--zero", "1",
                                       "--attention", kernel, "--out", str(plan)])
        assert planned.exit_code == 0, planned.output
        exported = runner.invoke(main, ["export", str(plan), "--to", "deepspeed", "--out", str(tmp_path / plan.stem)])
        assert exported.exit_code == 0, exported.output
        notes[kernel, gpu] = "--attention flash2" in exported.output
    assert notes == {("flash", "H100-80GB"): True, ("flash2", "H100-80GB"): False, ("flash", "A100-80GB"): False,
                     ("flash", "MI300X"): False}
    assert lookup_gpu("MI300X").flash_attention_2_share < 1


def test_torchtitan_export_notes_sdpas_aotriton_on_amd_only(tmp_path) -> None:
    """torchtitan calls SDPA: on MI300X its flash backend is AOTriton, slower than the Composable Kernel rate a
    "flash" plan assumed, so the export says to cost `flash2`; on H100 (cuDNN first) and for a flash2 plan it does
    not."""
    runner = CliRunner()
    notes = {}
    for kernel, gpu in (("flash", "MI300X"), ("flash2", "MI300X"), ("flash", "H100-80GB")):
        plan = tmp_path / f"{kernel}-{gpu}.json"
        planned = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", f"1x8x{gpu}", "--global-batch",
                                       "16", "--seq-len", "4096", "--dp", "8", "--micro-batch", "1", "--zero", "3",
                                       "--attention", kernel, "--framework", "torchtitan", "--out", str(plan)])
        assert planned.exit_code == 0, planned.output
        exported = runner.invoke(main, ["export", str(plan), "--to", "torchtitan", "--out", str(tmp_path / plan.stem)])
        assert exported.exit_code == 0, exported.output
        notes[kernel, gpu] = "AOTriton" in exported.output and "--attention flash2" in exported.output
    assert notes == {("flash", "MI300X"): True, ("flash2", "MI300X"): False, ("flash", "H100-80GB"): False}


def test_cli_estimates_flash2_and_refuses_an_unknown_kernel() -> None:
    runner = CliRunner()
    common = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "8",
              "--seq-len", "32768", "--dp", "8", "--micro-batch", "1", "--zero", "3", "--recompute", "full"]
    times = {}
    for kernel in ("flash", "flash2"):
        result = runner.invoke(main, [*common, "--attention", kernel])
        assert result.exit_code == 0, result.output
        times[kernel] = float(result.output.split("iteration time")[1].split()[0])
    assert times["flash2"] > 1.1 * times["flash"]  # 32K tokens: attention is most of the step
    bad = runner.invoke(main, [*common, "--attention", "fa3"])
    assert bad.exit_code == 2
    assert "fa3" in bad.output and "flash2" in bad.output and "Traceback" not in bad.output


def test_the_mfu_convention_is_named_in_the_text_and_the_json(tmp_path) -> None:
    runner = CliRunner()
    plan = tmp_path / "plan.json"
    result = runner.invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch",
                                  "16", "--seq-len", "4096", "--zero", "3", "--out", str(plan)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("MFU counts"))
    assert "causal attention counted whole" in line and "bf16 dense peak" in line
    import json
    assert json.loads(plan.read_text())["estimate"]["mfu_convention"] in line
