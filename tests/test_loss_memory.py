"""Memory terms measured against what the publications count: the loss by how it runs (Training.cross_entropy,
planner/cost/memory.py `LOSS_BYTES_PER_LOGIT`), the allocator's view of the peak (MemoryBreakdown.reserved,
benchmarks' Run.memory_error), the optimizer step's own allocator segments (`step_segment_bytes`) and a run's own
measured CUDA context (Run.cuda_context_bytes)."""

from __future__ import annotations

import pytest

from benchmarks.titan_runs import TITAN_FILES, titan_runs
from benchmarks.validation_runs import JEAN_ZAY_CUDA_CONTEXT_BYTES, Run, bloom_runs, predict
from planner.cluster import load_cluster
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.memory import (
    LOSS_BYTES_PER_LOGIT,
    activation_bytes,
    largest_transient_bytes,
    logit_elements,
    rank_memory_model,
    step_segment_bytes,
)
from planner.errors import PlannerError
from planner.gpu import GIB, lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.calibration import default_calibration

LLAMA = load_model("llama3-8b")
# torchtitan's Llama-3-8B runs: local batch 1, seq 8192, FSDP over 8 GPUs, no TP
TITAN = ParallelConfig(dp=8, tp=1, pp=1, micro_batch=1, zero_stage=3, recompute=Recompute.SELECTIVE)


def _loss_bytes(kernel: str, config: ParallelConfig = TITAN) -> float:
    """What the loss holds at its peak on the last rank: the fp32/16-bit logits it keeps plus its transient."""
    training = Training(global_batch=8, seq_len=8192, cross_entropy=kernel)
    loss = LOSS_BYTES_PER_LOGIT[kernel]
    return (loss.kept + loss.transient) * logit_elements(LLAMA, training, config)


def test_bytes_per_logit_by_kernel() -> None:
    """Megatron-LM's in-place kernel: an fp32 softmax and the 16-bit logits (6); eager PyTorch: the saved fp32
    log-softmax and two fp32 gradients (12); torch.compile: the 16-bit logits and their 16-bit gradient (4)."""
    assert {k: v.kept + v.transient for k, v in LOSS_BYTES_PER_LOGIT.items()} == {"fused": 6, "eager": 12,
                                                                                  "compiled": 4}


def test_eager_loss_peak_against_torchtitan_chunked_loss() -> None:
    """pytorch/torchtitan #996: chunking the eager loss 8 ways cut Llama-3-8B's peak (bs 1, seq 8192) by 7.3 GiB
    (49.58 -> 42.26 GiB). What chunking cannot remove is every chunk's saved fp32 log-softmax (4 bytes per logit), so
    the eager loss must hold at least 7.3 GiB more than that."""
    saved_by_chunks = 4 * logit_elements(LLAMA, Training(global_batch=8, seq_len=8192), TITAN)
    assert _loss_bytes("eager") - 7.3 * GIB >= saved_by_chunks
    assert _loss_bytes("eager") - 7.3 * GIB <= saved_by_chunks + 2 * logit_elements(
        LLAMA, Training(global_batch=8, seq_len=8192), TITAN)  # and not much more: the chunks' own transients


def test_loss_kernel_moves_only_the_head_and_its_transient() -> None:
    fused, eager = (Training(global_batch=8, seq_len=8192, cross_entropy=k) for k in ("fused", "eager"))
    logits = logit_elements(LLAMA, fused, TITAN)
    assert activation_bytes(LLAMA, UnitKind.HEAD, eager, TITAN) == activation_bytes(LLAMA, UnitKind.HEAD, fused, TITAN)
    assert largest_transient_bytes(LLAMA, eager, TITAN, 0) - largest_transient_bytes(LLAMA, fused, TITAN, 0) == \
        pytest.approx(6 * logits)
    compiled = Training(global_batch=8, seq_len=8192, cross_entropy="compiled")
    assert activation_bytes(LLAMA, UnitKind.HEAD, fused, TITAN) - activation_bytes(
        LLAMA, UnitKind.HEAD, compiled, TITAN) == pytest.approx(2 * logits)


def test_loss_shards_over_tp_and_cp() -> None:
    """Loss-parallel (vocabulary over TP) and context parallelism (tokens over CP) each divide the logits."""
    whole = logit_elements(LLAMA, Training(global_batch=8, seq_len=8192), TITAN)
    sharded = ParallelConfig(dp=2, tp=2, pp=1, cp=2, micro_batch=1, sequence_parallel=True)
    assert logit_elements(LLAMA, Training(global_batch=8, seq_len=8192), sharded) == pytest.approx(whole / 4)


def test_no_loss_transient_before_the_last_stage() -> None:
    config = ParallelConfig(dp=1, tp=1, pp=2, micro_batch=1)
    training = Training(global_batch=8, seq_len=8192, cross_entropy="eager")
    assert largest_transient_bytes(LLAMA, training, config, 0) < largest_transient_bytes(LLAMA, training, config, 1)


def test_unknown_loss_kernel_is_refused() -> None:
    with pytest.raises(PlannerError, match="cross_entropy must be one of fused, eager, compiled"):
        Training(cross_entropy="chunked")


def test_reserved_leaves_out_context_and_nccl() -> None:
    """torch.cuda.max_memory_reserved sees what the caching allocator holds: not the CUDA context nor NCCL's buffers."""
    gpu, calibration = lookup_gpu("H100-80GB"), default_calibration()
    training = Training(global_batch=8, seq_len=8192)
    memory = rank_memory_model(LLAMA, training, TITAN, 0, 1, gpu, calibration).breakdown(1e9, 1e9, gpu.memory_bytes)
    assert memory.total - memory.reserved == pytest.approx(memory.other_detail["cuda_context"]
                                                           + memory.other_detail["nccl"])
    assert memory.reserved < memory.total


def test_run_compares_like_with_like() -> None:
    """A run publishing the allocator's peak is scored on `peak_reserved_bytes`, one publishing nvidia-smi's on the
    whole device."""
    cluster, training = load_cluster("1x8xH100-80GB"), Training(global_batch=8, seq_len=8192)
    result = estimate(LLAMA, cluster, training, TITAN)
    run = Run("f", "r", LLAMA, cluster, training, TITAN, 1.0, 40 * GIB, "s")
    assert run.memory_error(result) == pytest.approx(result.peak_device_bytes / (40 * GIB) - 1)
    allocator = Run("f", "r", LLAMA, cluster, training, TITAN, 1.0, 40 * GIB, "s", memory_in_allocator=True)
    assert allocator.memory_error(result) == pytest.approx(result.peak_reserved_bytes / (40 * GIB) - 1)
    assert Run("f", "r", LLAMA, cluster, training, TITAN, 1.0, None, "s").memory_error(result) is None


def test_titan_rows_run_the_loss_their_torchtitan_ran() -> None:
    """Eager in the Dec-2024 benchmarks (9dec370 leaves the loss uncompiled) and torchao's H100 rows (torchtitan
    0.0.2 on a PyTorch 2.7.0a0 nightly); compiled in torchao's August-2025 MI300X and B200 rows."""
    dec2024, _ = titan_runs(TITAN_FILES[0])
    assert {run.training.cross_entropy for run in dec2024} == {"eager"}
    assert all(run.memory_in_allocator for run in dec2024)
    torchao, _ = titan_runs(TITAN_FILES[2])
    by_gpu = {(run.cluster.nodes[0].gpu.name, run.training.cross_entropy) for run in torchao}
    assert by_gpu == {("H100-96GB-HBM2e", "eager"), ("MI300X", "compiled"), ("B200", "compiled")}
    # and only the B200 rows ran cuDNN attention, which their torchtitan's per-op SAC does not keep
    assert {(run.cluster.nodes[0].gpu.name, run.config.sac_keeps_attention) for run in torchao} == {
        ("H100-96GB-HBM2e", True), ("MI300X", True), ("B200", False)}


def test_bloom_runs_carry_the_context_the_chronicles_measured() -> None:
    """nvidia-smi's BLOOM figures include the CUDA context, 1573 MiB on that stack (eager kernel loading)."""
    run = bloom_runs()[0]
    assert run.cuda_context_bytes == JEAN_ZAY_CUDA_CONTEXT_BYTES == 1573 * 2**20
    memory = predict(run, default_calibration()).stages[0].memory
    assert memory.other_detail["cuda_context"] == pytest.approx(1573 * 2**20)
    shipped = estimate(run.model, run.cluster, run.training, run.config).stages[0].memory
    assert memory.total - shipped.total == pytest.approx(1573 * 2**20 - shipped.other_detail["cuda_context"])


@pytest.mark.parametrize(("fields", "grad_bytes", "expected"), [
    ({"zero_stage": 1}, 2, 8 / 8),  # DeepSpeed ZeRO-1, fp16: the contiguous partition, its flat copy and fp32 copy
    ({"zero_stage": 2}, 4, 4 / 8),  # the partition is the sharded gradients; fp32 gradients: .to(fp32) copies nothing
    ({"zero_stage": 1, "deepspeed_optimizer": "bf16"}, 4, 2.0),  # BF16_Optimizer: its fp32 gradients' bf16 copy
    ({"distributed_optimizer": True}, 4, 0.0),  # Megatron-LM's buffers are allocated once
    ({"zero_stage": 3}, 4, 0.0),
])
def test_step_segments_of_deepspeed_zero_optimizer(fields: dict[str, object], grad_bytes: int,
                                                   expected: float) -> None:
    config = ParallelConfig(dp=8, tp=1, pp=1, **fields)
    training = Training(global_batch=8, seq_len=2048, dtype="fp16" if grad_bytes == 2 else "bf16",
                        grad_bytes=grad_bytes)
    assert step_segment_bytes(training, config) == pytest.approx(expected)


def test_step_segments_count_in_the_high_water_not_in_fits() -> None:
    """The step runs after the activations are freed: its segments raise what nvidia-smi and max_memory_reserved
    show, not what must fit."""
    config = ParallelConfig(dp=4, tp=1, pp=1, zero_stage=1)
    training = Training(global_batch=8, seq_len=2048, dtype="fp16")
    gpu, calibration = lookup_gpu("A100-80GB"), default_calibration()
    memory = rank_memory_model(LLAMA, training, config, 0, 1, gpu, calibration).breakdown(1e9, 1e9, gpu.memory_bytes)
    assert memory.device_peak - memory.total == pytest.approx(8 / 4 * 1e9)
    assert memory.reserved == pytest.approx(memory.device_peak - memory.outside_allocator)
    rank = rank_memory_model(LLAMA, training, config, 0, 1, gpu, calibration)
    tight = rank.breakdown(1e9, 1e9, memory.total + memory.step_segments / 2)  # room for the total, not the segments
    assert tight.fits and tight.device_peak > tight.capacity


@pytest.mark.parametrize(("options", "kernel"), [
    (["--framework", "torchtitan"], "compiled"), (["--framework", "torchtitan", "--elementwise", "eager"], "eager"),
    (["--framework", "megatron"], "fused"), ([], "fused")])
def test_the_target_framework_sets_the_loss_kernel_of_estimate_and_plan(tmp_path, options, kernel) -> None:
    """torchtitan runs F.cross_entropy, compiled with the model unless it runs eager; Megatron-LM (and "any") its
    fused kernel. The plan JSON records which."""
    import json

    from click.testing import CliRunner

    from cli import main

    common = ["--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "8", "--seq-len", "4096"]
    estimate_out, plan_out = tmp_path / "e.json", tmp_path / "p.json"
    result = CliRunner().invoke(main, ["estimate", *common, "--dp", "8", "--micro-batch", "1", "--zero", "3", *options,
                                       "--out", str(estimate_out)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["plan", *common, "--dp", "8", "--top", "1", *options, "--out", str(plan_out)])
    assert result.exit_code == 0, result.output
    for path in (estimate_out, plan_out):
        assert json.loads(path.read_text())["training"]["cross_entropy"] == kernel


def test_the_optimizer_step_must_fit_beside_the_model_states() -> None:
    """DeepSpeed's BF16_Optimizer keeps the bf16 gradients beside its fp32 ones while its reduction copies the latter
    to bf16: with the activations freed, the step's live set (states, that copy, the context and NCCL buffers) can
    exceed the backward's peak, and then it is what must fit."""
    config = ParallelConfig(dp=4, tp=1, pp=1, zero_stage=1, deepspeed_optimizer="bf16")
    training = Training(global_batch=8, seq_len=2048, dtype="bf16")
    gpu, calibration = lookup_gpu("A100-80GB"), default_calibration()
    rank = rank_memory_model(LLAMA, training, config, 0, 1, gpu, calibration)
    runtime = sum(value for _, value in rank.runtime)
    params = 4e9
    memory = rank.breakdown(params, 1e8, gpu.memory_bytes)
    assert memory.step_phase == pytest.approx((rank.param_bytes + 2.0) * params + runtime)
    assert memory.step_phase > memory.total and memory.required == memory.step_phase
    assert memory.as_dict()["optimizer_step"] == memory.step_phase
    assert not rank.breakdown(params, 1e8, memory.total * 1.001).fits  # room for the backward's peak only
    assert rank.breakdown(params, 1e8, memory.step_phase).fits
    # where the activations outweigh the step's copies, the backward's peak is what must fit, as before
    large = rank.breakdown(1e9, 20e9, gpu.memory_bytes)
    assert large.required == large.total and "optimizer_step" not in large.as_dict()


def test_bloom_l918_runs_out_of_memory_at_its_optimizer_step() -> None:
    """BLOOM's L918 (bf16, BF16_Optimizer, micro-batch 1) OOMed: its backward's peak is under the A100's 80 GB, its
    step's live set over; the estimate says so and the advice names the step."""
    from cli import shortfall_message
    from planner.render import describe_estimate

    (run,) = [r for r in bloom_runs(ooms=True) if "L918" in r.label]
    result = predict(run, default_calibration())
    stage = result.tightest_stage()
    assert stage.memory.total < stage.memory.capacity < stage.memory.step_phase
    assert not result.fits and result.peak_memory_bytes == pytest.approx(stage.memory.step_phase)
    message = shortfall_message(run.config, result, run.training)
    assert "the optimizer step needs" in message and f"{stage.memory.step_phase / GIB:.1f} GiB" in message
    assert "at the optimizer step" in describe_estimate(run.config, result, 384, "x")
