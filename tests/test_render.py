"""Text rendering helpers."""

from __future__ import annotations

from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Partition, Schedule, Training
from planner.cost.estimate import estimate
from planner.model import load_model
from planner.render import format_table, stage_split_summary


def test_stage_split_summary_compresses_runs() -> None:
    model, cluster = load_model("llama2-7b"), parse_shorthand("1x8xA100-80GB")
    config = ParallelConfig(dp=1, tp=2, pp=4, vpp=2, schedule=Schedule.INTERLEAVED)
    split = Partition.from_blocks([3, 4, 4, 4, 4, 4, 4, 5], 32)
    result = estimate(model, cluster, Training(global_batch=8, seq_len=2048), config, split)
    assert stage_split_summary(result) == "E3|4*6|5H"


def test_format_table_aligns_columns() -> None:
    text = format_table(("a", "long header"), [(1, "x"), ("wide cell", 2)])
    lines = text.splitlines()
    assert lines[0].index("long header") == lines[2].index("x") == lines[3].index("2")


def test_node_list_abridges_long_lists_and_keeps_short_ones() -> None:
    """A pipeline rank of 128 nodes prints as the first few, the last and the count, not 128 names."""
    from planner.render import node_list

    assert node_list(["a", "b"]) == "a, b"
    names = [f"node{i}" for i in range(128)]
    text = node_list(names)
    assert text.startswith("node0, node1") and text.endswith("node127 (128 nodes)") and "node64" not in text
