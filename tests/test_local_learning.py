"""The `local` schedule (local learning, PPLL: Guo et al. 2024, arXiv:2411.12780): its simulator order and queue, its
closed form, its memory (one micro-batch, the queue, the auxiliary heads), the comparison with 1F1B, and the CLI."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import load_cluster
from planner.config import ParallelConfig, Schedule, Training
from planner.cost.estimate import estimate
from planner.cost.local import aux_head_model
from planner.cost.memory import activation_bytes
from planner.cost.schedule import BACKWARD, FORWARD, schedule_of, simulate
from planner.cost.time import boundary_tensor_bytes
from planner.explain import neighbours
from planner.frameworks import framework_named
from planner.model import UnitKind, load_model
from planner.plan import load_plan
from planner.replay import problem_of
from planner.timeline import iteration_timeline

LOCAL = schedule_of(Schedule.LOCAL)
MODEL = load_model("gpt3-1.3b")
CLUSTER = load_cluster("1x8xA100-80GB")
TRAINING = Training(global_batch=64, seq_len=2048)


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def local_config(**fields) -> ParallelConfig:
    return ParallelConfig(**{"dp": 1, "tp": 2, "pp": 4, "sequence_parallel": True, "schedule": Schedule.LOCAL,
                             **fields})


def test_fill_form_matches_the_simulator_with_any_queue() -> None:
    """Two derivations of one time: the simulator runs every pass with the queue's back-pressure, the closed form is
    the fill (micro-batch 0's forwards) plus m times the slowest rank up to the path's end."""
    rng = random.Random(15)
    for _ in range(400):
        pp, m, depth = rng.randint(2, 6), rng.randint(1, 30), rng.randint(1, 4)
        forward = [rng.uniform(0.1, 3) for _ in range(pp)]
        backward = [rng.uniform(0.0, 3) for _ in range(pp)]
        simulated = simulate(forward, backward, [0.0] * pp, pp, m, Schedule.LOCAL, record=False,
                             queue_depth=depth).iteration_s
        assert LOCAL.fill_form(forward, backward, m).total_s == pytest.approx(simulated, rel=1e-12)


def test_uniform_stages_fill_then_steady_state() -> None:
    """pp = 4, F = 1, B = 2, m = 8: three forwards fill the pipeline, then the last rank runs 8 × (F + B): 27, where
    1F1B takes (m − 1)·3 + 4·3 = 33."""
    timeline = simulate([1.0] * 4, [2.0] * 4, [0.0] * 4, 4, 8, Schedule.LOCAL, queue_depth=2)
    assert timeline.iteration_s == pytest.approx(27.0)
    assert simulate([1.0] * 4, [2.0] * 4, [0.0] * 4, 4, 8, Schedule.ONE_F_ONE_B).iteration_s == pytest.approx(33.0)
    # no backward waits for a later stage: stage 0 ends micro-batch 0's backward by the time stage 3 starts its forward
    first_backward = next(e for e in timeline.events if e.kind == BACKWARD and e.stage == 0 and e.microbatch == 0)
    last_forward = next(e for e in timeline.events if e.kind == FORWARD and e.stage == 3 and e.microbatch == 0)
    assert first_backward.end_s <= last_forward.start_s


def test_queue_holds_a_fast_stage_back() -> None:
    """A fast stage before a slow one may run only `queue_depth` micro-batches ahead: with one slot its forward of
    micro-batch j ends no earlier than the slow stage starts micro-batch j − 1; the iteration is the same."""
    forward, backward, m = [1.0, 1.0], [0.0, 4.0], 6
    tight = simulate(forward, backward, [0.0, 0.0], 2, m, Schedule.LOCAL, queue_depth=1)
    loose = simulate(forward, backward, [0.0, 0.0], 2, m, Schedule.LOCAL, queue_depth=m)
    starts = {e.microbatch: e.start_s for e in tight.events if e.kind == FORWARD and e.stage == 1}
    for e in tight.events:
        if e.kind == FORWARD and e.stage == 0 and e.microbatch >= 1:
            assert e.end_s >= starts[e.microbatch - 1]
    last = {name: max(e.end_s for e in t.events if e.stage == 0) for name, t in (("tight", tight), ("loose", loose))}
    assert last["tight"] > last["loose"] == pytest.approx(m * 1.0)
    assert tight.iteration_s == pytest.approx(loose.iteration_s)


def test_estimate_agrees_with_its_closed_form() -> None:
    """`estimate` simulates (extrapolating past a prefix at m = 256); the closed form gives the same time."""
    training = replace(TRAINING, global_batch=256)
    result = estimate(MODEL, CLUSTER, training, local_config())
    detail = result.breakdown_detail_s
    assert detail["pipeline_simulated"] == pytest.approx(detail["pipeline_closed_form"], rel=1e-9)


def test_memory_one_microbatch_the_queue_and_the_aux_heads() -> None:
    """Every rank holds one micro-batch's activations (1F1B's rank 0 holds pp of them) with its auxiliary head's
    (fp32 logits), a receiving rank its queue of boundary tensors, every rank but the last the head's weights."""
    config = local_config()
    local = estimate(MODEL, CLUSTER, TRAINING, config)
    one_f_one_b = estimate(MODEL, CLUSTER, TRAINING, replace(config, schedule=Schedule.ONE_F_ONE_B))
    deeper = estimate(MODEL, CLUSTER, TRAINING, replace(config, local_queue_depth=5))
    boundary = boundary_tensor_bytes(MODEL, TRAINING, config)
    for stage, bigger in zip(local.stages, deeper.stages, strict=True):
        queued = 3 * boundary if stage.index else 0.0
        assert bigger.memory.activations - stage.memory.activations == pytest.approx(queued)
    aux_logits = activation_bytes(aux_head_model(MODEL, "linear"), UnitKind.HEAD, TRAINING, config)
    assert local.stages[0].memory.activations == pytest.approx(one_f_one_b.stages[0].memory.activations / 4
                                                               + aux_logits)
    aux = aux_head_model(MODEL, "linear").head_parameters() / config.tp
    for stage, baseline in zip(local.stages, one_f_one_b.stages, strict=True):
        extra = stage.memory.weights - baseline.memory.weights
        assert extra == pytest.approx(2 * aux if stage.index < 3 else 0.0)  # 16-bit weights


def test_aux_heads_cost_time_and_the_mlp_head_more() -> None:
    """gpt3-1.3b ties its embedding: the auxiliary head still has its own h × V matrix; the MLP head adds h × h."""
    linear, mlp = aux_head_model(MODEL, "linear"), aux_head_model(MODEL, "mlp")
    h, vocab = MODEL.hidden_size, MODEL.vocab_size
    assert MODEL.head_parameters() < h * vocab <= linear.head_parameters()
    assert mlp.head_parameters() - linear.head_parameters() == h * h
    times = {head: estimate(MODEL, CLUSTER, TRAINING, local_config(local_head=head)) for head in ("linear", "mlp")}
    baseline = estimate(MODEL, CLUSTER, TRAINING, local_config(schedule=Schedule.ONE_F_ONE_B))
    for head, result in times.items():
        assert result.stages[0].forward_s > baseline.stages[0].forward_s, head
        assert result.stages[3].forward_s == pytest.approx(baseline.stages[3].forward_s)  # the model's own head
    assert times["mlp"].stages[0].forward_s > times["linear"].stages[0].forward_s


def test_not_searched_unless_named() -> None:
    assert not framework_named("any").searches(Schedule.LOCAL)
    for target in ("megatron", "deepspeed", "torchtitan"):
        assert Schedule.LOCAL not in framework_named(target).schedules


def test_estimate_json_says_it_changes_the_algorithm_and_compares_with_1f1b(tmp_path) -> None:
    out = tmp_path / "local.json"
    result = run("estimate", "--model", "gpt3-1.3b", "--cluster", "1x8xA100-80GB", "--global-batch", "64",
                 "--seq-len", "2048", "--tp", "2", "--pp", "4", "--schedule", "local", "--local-queue-depth", "3",
                 "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert "changes the training algorithm" in document["notes"][0]
    section = document["local_learning"]
    assert section["changes_training_algorithm"] and section["queue_depth"] == 3 and section["aux_head"] == "linear"
    assert section["speedup_over_1f1b"] == pytest.approx(
        section["one_f_one_b_iteration_time_s"] / document["estimate"]["iteration_time_s"])
    assert document["parallelism"]["local_queue_depth"] == 3 and document["runs_on"] == []
    plan = load_plan(out)  # the queue and head round-trip, and `timeline` draws the plan
    assert (plan.parallel.local_queue_depth, plan.parallel.local_head) == (3, "linear")
    problem = problem_of(plan)
    drawn = iteration_timeline(problem, problem.estimate())
    assert drawn.iteration_s == pytest.approx(document["estimate"]["iteration_time_s"])
    text = run("estimate", "--plan", str(out))
    assert text.exit_code == 0, text.output
    assert "reproduced exactly" in text.output and "vs 1F1B" in text.output
    assert "note: the local schedule changes the training algorithm" in text.output


def test_plan_searches_the_local_schedule_when_named() -> None:
    result = run("plan", "--model", "gpt3-350m", "--cluster", "1x4xA100-80GB", "--global-batch", "32",
                 "--seq-len", "1024", "--pp", "4", "--schedule", "local", "--local-head", "mlp", "--top", "2",
                 "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    for plan in (document, *document["alternatives"]):
        assert plan["parallelism"]["schedule"] == "local" and plan["parallelism"]["local_head"] == "mlp"
        assert "local_learning" in plan and plan["notes"]


@pytest.mark.parametrize(("args", "words"), [
    (("--schedule", "local", "--local-queue-depth", "0"), ("--local-queue-depth", "at least 1", "got 0")),
    (("--schedule", "local", "--pp", "1"), ("--schedule local", "--pp 2 or more", "got --pp 1")),
    (("--schedule", "local", "--local-head", "conv"), ("--local-head", "linear, mlp", "'conv'")),
    (("--pp", "4", "--local-queue-depth", "3"), ("--local-queue-depth", "need --schedule local")),
])
def test_bad_local_options_exit_2_naming_the_value(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    for command in ("estimate", "plan"):
        result = run(command, "--model", "gpt3-350m", "--cluster", "1x4xA100-80GB", "--global-batch", "32",
                     "--seq-len", "1024", *args)
        assert result.exit_code == 2, (command, result.output)
        line = result.output.strip()
        assert "\n" not in line and "Traceback" not in line
        for word in words:
            assert word in line, (command, line)


def test_explain_keeps_a_local_plan_local(tmp_path) -> None:
    """`explain`'s one-step what-ifs stay local learning (no vpp step: it has no chunks)."""
    out = tmp_path / "local.json"
    assert run("estimate", "--model", "gpt3-350m", "--cluster", "1x4xA100-80GB", "--global-batch", "32",
               "--seq-len", "1024", "--pp", "4", "--schedule", "local", "--out", str(out)).exit_code == 0
    labels = [label for label, config in neighbours(problem_of(load_plan(out)).config)]
    assert labels and not any(label.startswith("vpp") for label in labels)
    assert all(config.schedule is Schedule.LOCAL for _, config in neighbours(problem_of(load_plan(out)).config))
