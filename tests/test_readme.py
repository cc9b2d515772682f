"""README figures stay true: every block marked `<!-- check: COMMAND [;; COMMAND …] -->` is rerun and
each of its numbers must match the command's output within CHECK_TOLERANCE (benchmarks/readme_figures.py);
every repository path the README names must exist. Expensive figures (search speed, the heterogeneous
benchmark, leave-one-source-out) are not rerun here: the README labels them with the date and machine
they were measured on."""

from __future__ import annotations

import re

import pytest

from benchmarks.readme_figures import README, ROOT, Block, block_output, blocks, drift, matches

LINES = README.read_text().splitlines()
BLOCKS = blocks(LINES)


def test_the_readme_marks_its_checked_figures() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("block", BLOCKS, ids=[b.commands[-1][:60] for b in BLOCKS])
def test_quoted_output_matches_a_fresh_run(block: Block) -> None:
    output = block_output(block)
    for index, actual in matches(LINES, block, output):
        assert actual is not None, f"README.md:{index + 1} no longer printed:\n  {LINES[index]}\noutput:\n{output}"
        moved = drift(LINES[index], actual)
        assert not moved, f"README.md:{index + 1} figures drifted (quoted, now) {moved}:\n  {LINES[index]}\n  {actual}"


PATH = re.compile(r"(?<![\w/.])((?:planner|benchmarks|tests|profiles|\.ci)/[\w./*-]*\w)")


def test_every_path_the_readme_names_exists() -> None:
    missing = sorted({p for p in PATH.findall(README.read_text()) if not any(ROOT.glob(p))})
    assert not missing, f"README names files that do not exist: {missing}"


def test_exact_drift_reports_what_the_tolerance_lets_through() -> None:
    """8.248 → 8.270 s is within the test's 1 %: only `--exact` (drift(..., exact=True)) reports and requotes it."""
    quoted, now = "iteration time  8.248 s, 12 GPUs", "iteration time  8.270 s, 12 GPUs"
    assert drift(quoted, now) == []
    assert drift(quoted, now, exact=True) == [("8.248", "8.270")]
    assert drift(now, now, exact=True) == []
