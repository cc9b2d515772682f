"""`planner sweep` and `--tokens`: time-to-train, cost, and a Pareto front that nothing dominates."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from cli import main
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.sweep import SweepPoint, cheapest_by, cluster_spec, fastest_within, pareto_front, parse_prices
from planner.training_cost import TrainingCost, parse_tokens, training_cost

SWEEP = ["sweep", "--model", "tiny-llama", "--gpus", "1,2,8", "--gpu", "H100-80GB,A100-80GB", "--global-batch", "16",
         "--seq-len", "1024", "--tokens", "2e9"]


def point(time_s: float, price: float, name: str = "p") -> SweepPoint:
    cost = TrainingCost(1, 1, time_s, price, None)
    return SweepPoint("H100-80GB", 8, name, None, time_s, None, cost, price)


def dominated(a: SweepPoint, b: SweepPoint) -> bool:
    """Whether b dominates a: no slower, no dearer, and better in one."""
    return (b.cost.time_to_train_s <= a.cost.time_to_train_s and b.price <= a.price
            and (b.cost.time_to_train_s, b.price) != (a.cost.time_to_train_s, a.price))


@given(st.lists(st.tuples(st.floats(1, 1e6), st.floats(0, 1e6)), min_size=1, max_size=30))
def test_the_pareto_front_is_exactly_the_non_dominated_points(pairs: list[tuple[float, float]]) -> None:
    points = [point(t, c, str(i)) for i, (t, c) in enumerate(pairs)]
    front = pareto_front(points)
    for a, b in itertools.product(front, points):
        assert not dominated(a, b)
    for a in points:
        assert a in front or any(dominated(a, b) for b in points) or any(
            (b.cost.time_to_train_s, b.price) == (a.cost.time_to_train_s, a.price) for b in front)


def test_budget_and_deadline_pick_from_the_front() -> None:
    points = [point(10, 100, "fast"), point(20, 50, "middle"), point(40, 10, "slow"), point(30, 60, "dominated")]
    assert fastest_within(points, 60).cluster == "middle"
    assert fastest_within(points, 5) is None
    assert cheapest_by(points, 25).cluster == "middle"
    assert cheapest_by(points, 1000).cluster == "slow"


@pytest.mark.parametrize(("text", "tokens"), [("15T", 15 * 10**12), ("2e12", 2 * 10**12), ("300B", 3 * 10**11),
                                              ("1.5k", 1500), ("1000", 1000)])
def test_tokens_take_suffixes_and_exponents(text: str, tokens: int) -> None:
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize("text", ["", "15X", "-1T", "nan", "1e30", "T"])
def test_bad_token_counts_are_refused(text: str) -> None:
    with pytest.raises(PlannerError):
        parse_tokens(text)


def test_time_to_train_gpu_hours_cost_and_energy_at_tdp() -> None:
    h100 = lookup_gpu("H100-80GB")
    cost = training_cost(10**6, 1000, 2.0, [h100] * 8, 3.0)
    assert cost.iterations == 1000 and cost.time_to_train_s == 2000
    assert cost.gpu_hours == pytest.approx(8 * 2000 / 3600) and cost.cost_usd == pytest.approx(3 * 8 * 2000 / 3600)
    assert cost.energy_kwh == pytest.approx(8 * 700 * 2000 / 3.6e6)
    assert all(lookup_gpu(name).tdp_w for name in ("V100-32GB", "A100-80GB", "H100-80GB", "B200", "MI300X"))


def test_estimate_json_carries_the_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["estimate", "--model", "tiny-llama", "--global-batch", "16", "--seq-len", "1024",
                                       "--tokens", "1e9", "--gpu-hour-price", "2", "--json"])
    assert result.exit_code == 0, result.output
    estimate = json.loads(result.output)["estimate"]
    assert estimate["cost_usd"] == pytest.approx(2 * estimate["gpu_hours"])
    assert estimate["time_to_train_s"] == pytest.approx(estimate["training_iterations"] * estimate["iteration_time_s"])
    assert estimate["energy_kwh"] > 0
    alone = CliRunner().invoke(main, ["estimate", "--gpu-hour-price", "2"])
    assert alone.exit_code == 2 and "--tokens" in alone.output


def test_a_sweep_writes_table_csv_svg_and_a_non_dominated_front(tmp_path: Path) -> None:
    csv, svg = tmp_path / "s.csv", tmp_path / "s.svg"
    result = CliRunner().invoke(main, [*SWEEP, "--gpu-hour-price", "H100-80GB=3,A100-80GB=1.5", "--csv", str(csv),
                                       "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(csv)
    assert len(frame) == 6 and set(frame["gpu"]) == {"H100-80GB", "A100-80GB"}
    fitting = frame.dropna(subset=["cost_usd"])
    front = fitting[fitting["pareto"]]
    assert len(front) >= 1
    for _, a in front.iterrows():
        assert not any(b.time_to_train_s <= a.time_to_train_s and b.cost_usd <= a.cost_usd
                       and (b.time_to_train_s, b.cost_usd) != (a.time_to_train_s, a.cost_usd)
                       for _, b in fitting.iterrows())
    assert ET.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    document = json.loads(CliRunner().invoke(main, [*SWEEP, "--json"]).output)
    assert document["cost_unit"] == "GPU-hours" and len(document["points"]) == 6


def test_bad_sweep_options_are_one_line_exit_2() -> None:
    for args in (["--gpus", "8,x"], ["--gpus", "12", "--gpu", "H100-80GB"], ["--gpu", "H999"],
                 ["--gpu-hour-price", "H100-80GB=cheap"]):
        result = CliRunner().invoke(main, ["sweep", "--tokens", "1T", "--gpus", "8", *args])
        assert result.exit_code == 2 and result.output.startswith("error:"), (args, result.output)
    with pytest.raises(PlannerError):
        parse_prices("-1", ["H100-80GB"])
    assert cluster_spec("H100-80GB", 4) == "1x4xH100-80GB" and cluster_spec("B200", 64) == "8x8xB200"
