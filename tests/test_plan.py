"""Plan JSON: build → write → load round trip, and every way a plan file can be wrong."""

from __future__ import annotations

import json

import pytest

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Partition, Schedule, Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.model import load_model
from planner.placement import default_placement
from planner.plan import build_plan_document, load_plan, write_atomic


@pytest.fixture()
def document() -> dict:
    model, cluster = load_model("llama2-7b"), parse_shorthand("2x8xH100-80GB")
    training = Training(global_batch=64, seq_len=4096)
    config = ParallelConfig(dp=2, tp=2, pp=4, vpp=2, schedule=Schedule.INTERLEAVED)
    placement = default_placement(cluster, config)
    partition = Partition.from_blocks([3, 4, 4, 4, 4, 4, 4, 5], 32)
    result = estimate(model, cluster, training, config, partition, placement)
    return build_plan_document(model, cluster, training, config, placement, result)


def test_round_trip(tmp_path, document: dict) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, json.dumps(document))
    plan = load_plan(path)
    assert plan.parallel.vpp == 2 and plan.parallel.schedule is Schedule.INTERLEAVED
    assert plan.partition.blocks_per_stage() == (3, 4, 4, 4, 4, 4, 4, 5)
    assert plan.model.num_parameters == document["model"]["num_parameters"]
    assert [s["pp_rank"] for s in document["stages"]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def mutate(document: dict, path: list, value) -> dict:
    clone = json.loads(json.dumps(document))
    target = clone
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return clone


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["schema_version"], 3, "schema_version 3 is not supported"),
        (["schema_version"], KeyError, "missing 'schema_version'"),
        (["parallelism", "tp"], KeyError, "missing 'parallelism.tp'"),
        (["parallelism", "num_microbatches"], 5, "num_microbatches is 5, expected 32"),
        (["parallelism", "schedule"], "zigzag", "'zigzag' is not a valid Schedule"),
        (["stages", 1, "blocks"], [4, 7], "stages\\[1\\].blocks is \\[4, 7\\]"),
        (["stages"], [], "'stages' must be a non-empty list"),
        (["model", "hidden_size"], -5, "hidden_size must be an integer in 1.."),
        (["cluster", "num_gpus"], 8, "exceeds the cluster's 8 GPUs"),
    ],
)
def test_schema_mismatch_is_one_clear_error(tmp_path, document: dict, path: list, value, message: str) -> None:
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(mutate(document, path, value)))
    with pytest.raises(PlannerError, match=message):
        load_plan(file)


@pytest.mark.parametrize(("content", "message"), [("", "is empty"), ('{"schema_version": 1, "mod', "truncated"),
                                                  ("[]", "expected a JSON object")])
def test_unreadable_plan_files(tmp_path, content: str, message: str) -> None:
    file = tmp_path / "plan.json"
    file.write_text(content)
    with pytest.raises(PlannerError, match=message):
        load_plan(file)
    with pytest.raises(PlannerError, match="cannot read plan file"):
        load_plan(tmp_path / "absent.json")
