"""CPU activation offloading (`ParallelConfig.cpu_offload_layers`, Megatron-LM's --cpu-offloading-num-layers): the
first N blocks' activations go to host memory one block at a time over the GPU's host link and come back for their
backward (Transformer Engine's offload handler), what it saves, what it costs, where it runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_export_plans import parse_flags

from benchmarks.bridge_systems import bridge_cluster, bridge_preset
from benchmarks.validation_runs import BRIDGE_PERF_GRAD_BYTES
from cli import main
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.memory import (
    activation_bytes,
    block_type_activation_bytes,
    largest_transient_bytes,
    offloaded_activation_bytes,
)
from planner.cost.time import UnitCost, activation_offload_s
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS
from planner.gpu import PCIE4_HOST_LINK_BYTES_PER_S, lookup_gpu
from planner.model import UnitKind, load_model

LLAMA = load_model("llama3-70b")
# as Megatron-Bridge's performance scripts run it: current-scaling FP8, 16-bit gradient buffers
TRAINING = Training(global_batch=256, seq_len=8192, dtype="fp8", fp8_recipe="tensorwise",
                    grad_bytes=BRIDGE_PERF_GRAD_BYTES)
FSDP = ParallelConfig(dp=64, tp=1, pp=1, micro_batch=2, zero_stage=3, overlap_param_gather=True)
GB200 = bridge_cluster(64, "GB200")  # 16 trays of 4 in one NVLink domain


def test_the_peak_holds_all_n_blocks_off_unless_a_block_outweighs_the_loss() -> None:
    """The last offloaded block leaves when the forward ends, before the loss runs: the peak is either that block
    resident without the loss's tensors, or all N off with them. Llama-3-70B's 128K-entry logits outweigh a block, so
    all N are off at its peak; GPT-3 175B's 51K-entry ones do not, so the resident block counts beyond them."""
    block = block_type_activation_bytes(LLAMA, LLAMA.blocks[0], TRAINING, FSDP)
    assert offloaded_activation_bytes(LLAMA, TRAINING, FSDP) == 0
    assert offloaded_activation_bytes(LLAMA, TRAINING, replace(FSDP, cpu_offload_layers=1)) == pytest.approx(block)
    assert offloaded_activation_bytes(LLAMA, TRAINING, replace(FSDP, cpu_offload_layers=40)) == pytest.approx(
        40 * block)
    gpt = load_model("gpt3-175b")
    config = ParallelConfig(dp=8, tp=8, pp=1, micro_batch=1, sequence_parallel=True, cpu_offload_layers=10)
    training = Training(global_batch=64, seq_len=2048)
    gpt_block = block_type_activation_bytes(gpt, gpt.blocks[0], training, config)
    loss = (activation_bytes(gpt, UnitKind.HEAD, training, config)
            + largest_transient_bytes(gpt, training, config, 0))
    assert loss < gpt_block
    assert offloaded_activation_bytes(gpt, training, config) == pytest.approx(10 * gpt_block - (gpt_block - loss))


def test_the_gb200_preset_fits_only_with_its_offload() -> None:
    """Megatron-Bridge's Llama-3-70B GB200 FP8 preset (Megatron-FSDP, micro-batch 2, no recompute) runs with 40
    blocks' activations in host memory: without them it needs about 330 GiB of the GPU's 186; with them it fits, and
    over NVLink-C2C the copies hide behind the blocks' compute."""
    without = estimate(LLAMA, GB200, TRAINING, FSDP)
    offloaded = estimate(LLAMA, GB200, TRAINING, replace(FSDP, cpu_offload_layers=40))
    saved = offloaded_activation_bytes(LLAMA, TRAINING, replace(FSDP, cpu_offload_layers=40))
    assert not without.fits and offloaded.fits
    assert without.peak_memory_bytes - offloaded.peak_memory_bytes == pytest.approx(saved)
    assert offloaded.breakdown_detail_s["activation_offload_exposed"] == 0
    assert offloaded.iteration_time_s == pytest.approx(without.iteration_time_s)
    assert bridge_preset("LLAMA3_70B", "GB200", "FP8").cpu_offload_layers == 40


def test_a_copy_longer_than_its_window_stalls_the_compute() -> None:
    """Over PCIe 4.0 (25 GB/s) a 4 GB block takes 160 ms to copy: a window of two 50 ms blocks hides 100 ms of it
    forward, two 100 ms blocks all of it backward."""
    block = UnitCost(forward_s=0.05, backward_s=0.1, recompute_s=0.0, tp_forward_s=0.0, tp_backward_s=0.0,
                     activation_bytes=4e9, params=1.0)
    a100 = lookup_gpu("A100-80GB")
    assert a100.host_link_bytes_per_s == PCIE4_HOST_LINK_BYTES_PER_S
    forward, backward = activation_offload_s([block] * 4, [block] * 8, a100)
    copy = 4e9 / PCIE4_HOST_LINK_BYTES_PER_S
    assert forward == pytest.approx(4 * (copy - 2 * 0.05))
    assert backward == 0
    assert activation_offload_s([], [block] * 8, a100) == (0.0, 0.0)
    assert lookup_gpu("GB200").host_link_bytes_per_s == 225e9  # NVLink-C2C, shared by the superchip's two GPUs


@pytest.mark.parametrize(("change", "message"), [
    ({"pp": 2, "dp": 32}, "needs pp 1"),
    ({"recompute": Recompute.FULL}, "needs recompute none"),
    ({"recompute": Recompute.SELECTIVE}, "needs recompute none"),
    ({"cpu_offload_layers": -1}, "whole number >= 0"),
    ({"cpu_offload_layers": 2.5}, "whole number >= 0"),
])
def test_what_megatron_core_refuses(change: dict, message: str) -> None:
    with pytest.raises(PlannerError, match=message):
        replace(FSDP, **{"cpu_offload_layers": 4, **change})


def test_fewer_blocks_than_the_model_has_and_no_cuda_graphs() -> None:
    with pytest.raises(PlannerError, match="below the model's 80 blocks"):
        estimate(LLAMA, GB200, TRAINING, replace(FSDP, cpu_offload_layers=80))
    with pytest.raises(PlannerError, match="CUDA graphs"):
        estimate(LLAMA, GB200, replace(TRAINING, cuda_graphs="full_iteration"), replace(FSDP, cpu_offload_layers=4))


def test_only_megatron_lm_runs_it() -> None:
    config = replace(FSDP, cpu_offload_layers=40)
    assert FRAMEWORKS["megatron"].why_not(config) is None and FRAMEWORKS["any"].why_not(config) is None
    for name in ("deepspeed", "torchtitan"):
        assert "cannot move activations to host memory" in FRAMEWORKS[name].why_not(config)


ESTIMATE = ["estimate", "--model", "llama3-70b", "--cluster", "16x4xGB200:nvl64", "--dp", "64", "--zero", "3",
            "--micro-batch", "2", "--global-batch", "256", "--seq-len", "8192", "--dtype", "fp8", "--json"]


def test_cli_estimate_plan_file_and_megatron_flag(tmp_path) -> None:
    """With Megatron-LM's defaults (delayed scaling, fp32 gradients) the plan may not fit even with 40 blocks off
    (exit 1); the plan file records the offload either way, and replays and exports it."""
    out = tmp_path / "plan.json"
    run = CliRunner().invoke(main, [*ESTIMATE, "--cpu-offload-layers", "40", "--out", str(out)])
    assert run.exit_code in (0, 1), run.output
    document = json.loads(out.read_text())
    assert document["parallelism"]["cpu_offload_layers"] == 40 and document["runs_on"] == ["megatron"]
    again = json.loads(CliRunner().invoke(main, ["estimate", "--plan", str(out), "--json"]).stdout)
    assert again["estimate"]["peak_memory_bytes"] == pytest.approx(document["estimate"]["peak_memory_bytes"])
    explained = json.loads(CliRunner().invoke(main, ["explain", str(out), "--json"]).stdout)["memory"]
    assert explained["offloaded_bytes"] == pytest.approx(offloaded_activation_bytes(
        LLAMA, Training(global_batch=256, seq_len=8192, dtype="fp8"), replace(FSDP, cpu_offload_layers=40)))
    assert "in host memory at the peak" in explained["note"]
    exported = CliRunner().invoke(main, ["export", str(out), "--to", "megatron", "--out", str(tmp_path / "mlm")])
    assert exported.exit_code == 0, exported.output
    assert parse_flags((tmp_path / "mlm" / "megatron_args.txt").read_text())["--cpu-offloading-num-layers"] == ["40"]
    without = json.loads(CliRunner().invoke(main, ESTIMATE).stdout)
    assert without["estimate"]["peak_memory_bytes"] - document["estimate"]["peak_memory_bytes"] == pytest.approx(
        offloaded_activation_bytes(LLAMA, Training(global_batch=256, seq_len=8192, dtype="fp8"),
                                   replace(FSDP, cpu_offload_layers=40)), rel=1e-6)


@pytest.mark.parametrize(("extra", "message"), [
    (["--cpu-offload-layers", "-3"], "--cpu-offload-layers"),
    (["--cpu-offload-layers", "x"], "--cpu-offload-layers"),
    (["--cpu-offload-layers", "4", "--recompute", "full"], "needs recompute none"),
    (["--cpu-offload-layers", "4", "--framework", "deepspeed"], "cannot move activations"),
])
def test_cli_bad_values_exit_2(extra: list[str], message: str) -> None:
    run = CliRunner().invoke(main, [*ESTIMATE, *extra])
    assert run.exit_code == 2 and message in run.output and "Traceback" not in run.output


PLAN = ["plan", "--model", "llama3-70b", "--cluster", "16x4xGB200:nvl64", "--global-batch", "256", "--seq-len", "8192",
        "--dtype", "fp8", "--fp8-recipe", "tensorwise", "--top", "3", "--json"]


def test_plan_searches_only_layouts_that_can_offload() -> None:
    run = CliRunner().invoke(main, [*PLAN, "--cpu-offload-layers", "40"])
    assert run.exit_code == 0, run.output
    document = json.loads(run.stdout)
    plans = [document, *document["alternatives"]]
    assert all(p["parallelism"]["cpu_offload_layers"] == 40 and p["parallelism"]["pp"] == 1
               and p["parallelism"]["recompute"] == "none" for p in plans)
    assert all(p["estimate"]["fits"] for p in plans)


@pytest.mark.parametrize(("extra", "message"), [
    (["--pp", "2"], "needs pp 1"),
    (["--recompute", "selective"], "needs recompute none"),
    (["--cpu-offload-layers", "80"], "below the model's 80 blocks"),
])
def test_plan_refuses_what_cannot_offload(extra: list[str], message: str) -> None:
    run = CliRunner().invoke(main, [*PLAN, "--cpu-offload-layers", "40", *extra])
    assert run.exit_code == 2 and message in run.output and "Traceback" not in run.output
