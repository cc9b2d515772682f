"""`PLAN.json#N`: a plan file's N-th plan, as `planner plan` numbered them (#1 the best, #2 onwards its
`alternatives`), in every command that reads a plan file, so that the listed alternatives can be exported and
timed; bad numbers exit 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from planner.errors import PlannerError
from planner.plan import load_plan


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's default plan with its top three distinct layouts."""
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    result = CliRunner().invoke(cli.main, ["plan", "--top", "3", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {path}: plan #1 and its alternatives #2 to #3" in result.output  # how to name them
    return path


def _layout(parallelism: dict) -> tuple:
    return tuple(parallelism[key] for key in ("dp", "tp", "pp", "vpp", "micro_batch", "schedule"))


def test_the_number_picks_the_plan_as_plan_listed_it(plan_file: Path) -> None:
    document = json.loads(plan_file.read_text())
    listed = [document, *document["alternatives"]]
    assert len(listed) == 3
    for number, expected in enumerate(listed, start=1):
        loaded = load_plan(f"{plan_file}#{number}")
        assert _layout(loaded.document["parallelism"]) == _layout(expected["parallelism"])
    assert load_plan(plan_file).document == load_plan(f"{plan_file}#1").document
    assert len({_layout(plan["parallelism"]) for plan in listed}) == 3  # distinct layouts: each number differs


def test_export_and_compare_take_an_alternative(plan_file: Path, tmp_path: Path) -> None:
    second = json.loads(plan_file.read_text())["alternatives"][0]["parallelism"]
    runner = CliRunner()
    exported = runner.invoke(cli.main, ["export", f"{plan_file}#2", "--to", "megatron", "--out", str(tmp_path / "alt")])
    assert exported.exit_code == 0, exported.output
    flags = (tmp_path / "alt" / "megatron_args.txt").read_text().split()
    assert flags[flags.index("--tensor-model-parallel-size") + 1] == str(second["tp"])
    assert flags[flags.index("--micro-batch-size") + 1] == str(second["micro_batch"])
    compared = runner.invoke(cli.main, ["compare", str(plan_file), f"{plan_file}#2"])
    assert compared.exit_code == 0, compared.output
    assert f"{plan_file}#2" in compared.output


@pytest.mark.parametrize(("suffix", "message"), [
    ("#4", "the file holds plans #1 to #3"),
    ("#0", "1 (the best) or more, not '0'"),
    ("#two", "1 (the best) or more, not 'two'"),
])
def test_a_plan_number_the_file_lacks_exits_2_with_one_line(plan_file: Path, tmp_path: Path, suffix: str,
                                                            message: str) -> None:
    result = CliRunner().invoke(cli.main, ["export", f"{plan_file}{suffix}", "--to", "megatron",
                                           "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_file_without_alternatives_holds_only_its_plan(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    result = CliRunner().invoke(cli.main, ["estimate", "--tp", "2", "--pp", "2", "--out", str(path)])
    assert result.exit_code == 0, result.output
    with pytest.raises(PlannerError, match="holds only its plan #1"):
        load_plan(f"{path}#2")


def test_a_file_named_with_a_hash_is_read_whole(plan_file: Path, tmp_path: Path) -> None:
    named = tmp_path / "run#2"
    named.write_text(plan_file.read_text())
    assert load_plan(named).document["parallelism"] == load_plan(plan_file).document["parallelism"]


def test_a_plan_written_alone_says_so(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    result = CliRunner().invoke(cli.main, ["plan", "--top", "1", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith(f"wrote {path}: plan #1")
    assert json.loads(path.read_text())["alternatives"] == []


def test_a_numbered_reference_to_a_file_that_is_no_plan_says_what_it_is(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(PlannerError, match=r"list.json#2: expected a JSON object"):
        load_plan(f"{path}#2")
