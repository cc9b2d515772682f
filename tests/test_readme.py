"""README figures stay true: every block marked `<!-- check: COMMAND [;; COMMAND …] -->` is rerun and
each of its numbers must match the command's output within CHECK_TOLERANCE; every repository path
the README names must exist. Expensive figures (search speed, the heterogeneous benchmark) are not
rerun here: the README labels them with the date and machine they were measured on."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MARKER = re.compile(r"<!-- check: (.+?) -->")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
CHECK_TOLERANCE = 0.01  # relative, or one unit of the last digit the README prints, whichever is larger


def _blocks() -> list[tuple[str, list[str]]]:
    """(commands, quoted lines) of every marked block: the fenced, indented or table block after the
    marker, without its `$ command` lines (and their `\\` continuations)."""
    lines, out = README.splitlines(), []
    for index, line in enumerate(lines):
        match = MARKER.search(line)
        if not match:
            continue
        rest = iter(lines[index + 1:])
        first = next(line for line in rest if line.strip())
        if first.startswith("```"):
            quoted = list(iter(lambda r=rest: next(r), "```"))
        else:
            inside = (lambda text: text.startswith("|")) if first.startswith("|") else (
                lambda text: not text or text.startswith("    "))
            quoted = [first, *itertools.takewhile(inside, rest)]
        out.append((match.group(1), _output_lines(quoted)))
    return out


def _output_lines(quoted: list[str]) -> list[str]:
    """The quoted lines that are output, not commands."""
    kept, continued = [], False
    for line in (q.strip() for q in quoted):
        command = continued or line.startswith("$")
        continued = command and line.endswith("\\")
        if line and not command:
            kept.append(line)
    return kept


def _run(command: str, cwd: Path) -> str:
    """stdout and stderr of one README command: `planner …` in-process, `python -m benchmarks.…` as a process."""
    argv = shlex.split(command)
    if argv[0] == "planner":
        previous = Path.cwd()
        os.chdir(cwd)
        try:
            result = CliRunner().invoke(main, argv[1:])
        finally:
            os.chdir(previous)
        return result.output
    assert argv[:2] == ["python", "-m"], f"unsupported README check command: {command}"
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.stdout + done.stderr


def _shape(line: str) -> str:
    return " ".join(NUMBER.sub("#", line).split())


def _close(quoted: str, actual: str) -> bool:
    a, b = float(quoted.replace(",", "")), float(actual.replace(",", ""))
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(a - b) <= max(CHECK_TOLERANCE * abs(b), 10.0 ** -decimals)


BLOCKS = _blocks()


def test_the_readme_marks_its_checked_figures() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("commands", "quoted"), BLOCKS, ids=[c[:60] for c, _ in BLOCKS])
def test_quoted_output_matches_a_fresh_run(commands: str, quoted: list[str], tmp_path: Path) -> None:
    output = "\n".join(_run(command.strip(), tmp_path) for command in commands.split(";;"))
    actual = [line.strip() for line in output.splitlines() if line.strip()]
    position = 0
    for line in quoted:
        if not NUMBER.search(line) or line in ("...", "…"):
            continue
        found = next((i for i in range(position, len(actual)) if _shape(actual[i]) == _shape(line)), None)
        assert found is not None, f"README line no longer printed by `{commands}`:\n  {line}\noutput:\n{output}"
        position = found + 1
        pairs = zip(NUMBER.findall(line), NUMBER.findall(actual[found]), strict=True)
        drift = [(q, a) for q, a in pairs if not _close(q, a)]
        assert not drift, f"README figures drifted (quoted, now) {drift} in:\n  {line}\n  {actual[found]}"


PATH = re.compile(r"(?<![\w/.])((?:planner|benchmarks|tests|profiles|\.ci)/[\w./*-]*\w)")


def test_every_path_the_readme_names_exists() -> None:
    missing = sorted({p for p in PATH.findall(README) if not any(ROOT.glob(p))})
    assert not missing, f"README names files that do not exist: {missing}"
