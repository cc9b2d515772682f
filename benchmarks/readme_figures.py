"""README figures: every block marked `<!-- check: COMMAND [;; COMMAND …] -->` in README.md or docs/*.md
(`DOCUMENTS`) is output of those commands. `tests/test_readme.py` reruns them and fails when a quoted number
drifts beyond CHECK_TOLERANCE; this script prints the drift, and with `--write` requotes the numbers in place.
`--exact` reports (and requotes) every number that differs at all, the small drifts the tolerance lets through too.

    PYTHONPATH=. python -m benchmarks.readme_figures [--exact] [--write]

A line whose text (numbers aside) is no longer printed is reported, never rewritten: a changed
layout or a different winning plan needs a person to reread the prose around it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = (README, *sorted((ROOT / "docs").glob("*.md")))  # every document whose figures are checked
MARKER = re.compile(r"<!-- check: (.+?) -->")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
CHECK_TOLERANCE = 0.01  # relative, or one unit of the last digit the README prints, whichever is larger


@dataclass(frozen=True)
class Block:
    """A marked block: its commands and the README line numbers (0-based) of its quoted output lines."""

    commands: tuple[str, ...]
    lines: tuple[int, ...]


def blocks(lines: list[str]) -> list[Block]:
    """Every marked block: the fenced, indented or table block after the marker, without its
    `$ command` lines (and their `\\` continuations) and lines without numbers."""
    out = []
    for index, line in enumerate(lines):
        match = MARKER.search(line)
        if match:
            commands = tuple(c.strip() for c in match.group(1).split(";;"))
            out.append(Block(commands, tuple(_output_lines(lines, index + 1))))
    return out


def _output_lines(lines: list[str], start: int) -> Iterator[int]:
    first = next(i for i in range(start, len(lines)) if lines[i].strip())
    if lines[first].startswith("```"):
        end = next(i for i in range(first + 1, len(lines)) if lines[i].startswith("```"))
        body = range(first + 1, end)
    else:
        table = lines[first].startswith("|")
        end = first
        while end < len(lines) and (lines[end].startswith("|") if table
                                    else not lines[end] or lines[end].startswith("    ")):
            end += 1
        body = range(first, end)
    continued = False
    for i in body:
        text = lines[i].strip()
        command = continued or text.startswith("$")
        continued = command and text.endswith("\\")
        if text and not command and NUMBER.search(text) and text not in ("...", "…"):
            yield i


def run(command: str, cwd: Path) -> str:
    """stdout and stderr of one README command: `planner …` in-process, `python -m benchmarks.…` as a process."""
    argv = shlex.split(command)
    if argv[0] == "planner":
        from cli import main

        previous = Path.cwd()
        os.chdir(cwd)
        try:
            return CliRunner().invoke(main, argv[1:]).output
        finally:
            os.chdir(previous)
    if argv[:2] != ["python", "-m"]:
        raise ValueError(f"unsupported README check command: {command}")
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.stdout + done.stderr


def shape(line: str) -> str:
    """A line with its numbers blanked and its spacing collapsed: what must stay the same."""
    return " ".join(NUMBER.sub("#", line).split())


def close(quoted: str, actual: str, exact: bool = False) -> bool:
    """Whether a quoted number still stands: within CHECK_TOLERANCE, or (`exact`) printed the same."""
    if exact:
        return quoted == actual
    a, b = float(quoted.replace(",", "")), float(actual.replace(",", ""))
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(a - b) <= max(CHECK_TOLERANCE * abs(b), 10.0 ** -decimals)


def matches(lines: list[str], block: Block, output: str) -> list[tuple[int, str | None]]:
    """(README line, the output line it corresponds to, or None when none is printed any more)."""
    actual = [line.strip() for line in output.splitlines() if line.strip()]
    found, position = [], 0
    for index in block.lines:
        hit = next((i for i in range(position, len(actual)) if shape(actual[i]) == shape(lines[index])), None)
        found.append((index, None if hit is None else actual[hit]))
        position = position if hit is None else hit + 1
    return found


def block_output(block: Block) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        return "\n".join(run(command, Path(scratch)) for command in block.commands)


def drift(quoted: str, actual: str, exact: bool = False) -> list[tuple[str, str]]:
    """(quoted, now) of every number of a line that moved beyond the tolerance (`exact`: that moved at all)."""
    return [(q, a) for q, a in zip(NUMBER.findall(quoted), NUMBER.findall(actual), strict=True)
            if not close(q, a, exact)]


def requote(quoted: str, actual: str) -> str:
    """The README line with the numbers of the fresh output, keeping the README's indentation."""
    numbers = iter(NUMBER.findall(actual.strip()))
    return NUMBER.sub(lambda _: next(numbers), quoted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="requote drifted numbers in place")
    parser.add_argument("--exact", action="store_true", help="count any change of a quoted number as drift")
    args = parser.parse_args()
    stale = sum(_check_document(document, args.exact, args.write) for document in DOCUMENTS)
    sys.exit(1 if stale else 0)


def _check_document(document: Path, exact: bool, write: bool) -> int:
    """Print the drifted and no-longer-printed lines of one document (requoting the drifted ones with `write`);
    the count of lines no longer printed."""
    name = document.relative_to(ROOT)
    lines = document.read_text().splitlines()
    stale = 0
    for block in blocks(lines):
        for index, actual in matches(lines, block, block_output(block)):
            if actual is None:
                stale += 1
                print(f"{name}:{index + 1}: no longer printed by {' ;; '.join(block.commands)}: {lines[index]}")
            elif moved := drift(lines[index], actual, exact):
                print(f"{name}:{index + 1}: {moved}")
                if write:
                    lines[index] = requote(lines[index], actual)
    if write:
        document.write_text("\n".join(lines) + "\n")
    return stale


if __name__ == "__main__":
    main()
