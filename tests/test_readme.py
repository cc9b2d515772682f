"""README figures stay true: every block marked `<!-- check: COMMAND [;; COMMAND …] -->` in README.md and
docs/*.md is rerun and each of its numbers must match the command's output within CHECK_TOLERANCE
(benchmarks/readme_figures.py); every repository path those documents name must exist. Expensive figures
(search speed, the heterogeneous benchmark, leave-one-source-out) and those of upstream pages not in the
repository are not rerun here: the documents label them with the date they were measured."""

from __future__ import annotations

import re

import pytest

from benchmarks.readme_figures import DOCUMENTS, ROOT, Block, block_output, blocks, drift, matches

LINES = {document.relative_to(ROOT).as_posix(): document.read_text().splitlines() for document in DOCUMENTS}
BLOCKS = [(name, block) for name, lines in LINES.items() for block in blocks(lines)]


def test_the_readme_marks_its_checked_figures() -> None:
    assert len(blocks(LINES["README.md"])) >= 5
    assert "docs/accuracy.md" in LINES


@pytest.mark.parametrize(("name", "block"), BLOCKS, ids=[f"{n}:{b.commands[-1][:60]}" for n, b in BLOCKS])
def test_quoted_output_matches_a_fresh_run(name: str, block: Block) -> None:
    lines, output = LINES[name], block_output(block)
    for index, actual in matches(lines, block, output):
        assert actual is not None, f"{name}:{index + 1} no longer printed:\n  {lines[index]}\noutput:\n{output}"
        moved = drift(lines[index], actual)
        assert not moved, f"{name}:{index + 1} figures drifted (quoted, now) {moved}:\n  {lines[index]}\n  {actual}"


PATH = re.compile(r"(?<![\w/.])((?:planner|benchmarks|tests|profiles|\.ci)/[\w./*-]*\w)")


@pytest.mark.parametrize("name", LINES)
def test_every_path_the_documents_name_exists(name: str) -> None:
    missing = sorted({p for p in PATH.findall("\n".join(LINES[name])) if not any(ROOT.glob(p))})
    assert not missing, f"{name} names files that do not exist: {missing}"


def test_exact_drift_reports_what_the_tolerance_lets_through() -> None:
    """8.248 → 8.270 s is within the test's 1 %: only `--exact` (drift(..., exact=True)) reports and requotes it."""
    quoted, now = "iteration time  8.248 s, 12 GPUs", "iteration time  8.270 s, 12 GPUs"
    assert drift(quoted, now) == []
    assert drift(quoted, now, exact=True) == [("8.248", "8.270")]
    assert drift(now, now, exact=True) == []
