"""Import nccl-tests stdout logs (all_reduce_perf, sendrecv_perf, ...) into a LINKS table.

Columns are found by the names in the log's header row, so old builds (no `root` column, an
`error` column) and current ones (v2.19: `root`, `#wrong`, `-I 1` per-iteration columns, `-C 1`
`cputime`, `-S 1` timestamps) read alike. See `planner.profile.links` for the table and the fit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerError
from planner.profile.links import (
    COLLECTIVES,
    CollectiveResult,
    LinksTable,
    links_from_results,
    normalize_collective,
)

__all__ = ["import_nccl_tests", "parse_nccl_tests_log", "read_nccl_tests_log"]

_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+-?\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_NAME_IN_TEXT = re.compile(
    r"(all_?reduce|all_?gather|reduce_?scatter|send_?recv|all_?to_?all|broadcast|reduce)", re.IGNORECASE
)
_TEST_NAMED = re.compile(r"^#\s*Collective test (?:starting|concluded):\s*(\S+)")
_FOOTER = re.compile(r"^#\s*(Out of bounds values|Avg bus bandwidth)\b")


def _name_in(text: str) -> str | None:
    match = _NAME_IN_TEXT.search(text.replace("-", "_"))
    return normalize_collective(match[1]) if match else None


@dataclass
class _Table:
    """A result table being read: its column positions, rows so far, the devices above it."""

    columns: dict[str, int]
    time_column: str
    hosts: tuple[str, ...]
    named: str | None
    line: int
    sizes: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    ratios: list[tuple[float, float]] = field(default_factory=list)  # (algbw, busbw) for n inference


def _header_columns(line: str) -> dict[str, int] | None:
    tokens = line.lstrip("#").split()
    if not {"size", "algbw", "busbw"} <= set(tokens) or not {"time", "cputime"} & set(tokens):
        return None
    columns: dict[str, int] = {}
    for position, token in enumerate(tokens):
        columns.setdefault(token, position)  # first group = out-of-place
    return columns


def parse_nccl_tests_log(text: str, origin: str, collective: str | None = None) -> list[CollectiveResult]:
    """Every result table of an nccl-tests stdout log, read by its header row's column names.

    Handles old (`redop` without `root`, `error` column) and current (v2.19: `root`, `#wrong`,
    `-I 1` per-iteration columns, `-C 1` `cputime`, `-S 1` timestamps) formats. Uses the
    out-of-place time. The test is named by the log's `# Collective test …: NAME` line, else by
    `collective`, else by `origin` (the file name); a conflict between the log and `collective`
    is an error. Ranks and hosts come from the `#  Rank N … on HOST device …` lines; without them
    n is inferred from busbw/algbw.
    """
    explicit = normalize_collective(collective) if collective else None
    if not text.strip():
        raise PlannerError(f"{origin}: log is empty")
    devices: list[tuple[int, str]] = []
    in_devices = False
    named: str | None = None
    table: _Table | None = None
    finished: list[_Table] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.lstrip("#").strip().startswith("Using devices"):
                devices, in_devices = [], True
                continue
            rank_match = _RANK_LINE.match(line)
            if rank_match and in_devices:
                devices.append((int(rank_match[1]), rank_match[2]))
                continue
            in_devices = False
            test_match = _TEST_NAMED.match(line)
            if test_match:
                if "concluded" not in line:
                    named = _name_in(test_match[1])
                elif finished and finished[-1].named is None:
                    finished[-1].named = _name_in(test_match[1])
                continue
            columns = _header_columns(line)
            if columns is not None:
                if table is not None:
                    raise PlannerError(f"{origin}:{table.line}: result table ends without its footer "
                                       "('# Avg bus bandwidth'): truncated log?")
                hosts = tuple(host for _rank, host in sorted(devices))
                time_column = "time" if "time" in columns else "cputime"
                table = _Table(columns, time_column, hosts, named, number)
                named = None
                continue
            if _FOOTER.match(line) and table is not None:
                finished.append(table)
                table = None
            continue
        if table is None:
            continue
        tokens = line.split()
        if not tokens[0].isdigit():
            continue  # interleaved NCCL_DEBUG output
        _read_row(table, tokens, f"{origin}:{number}")
    if table is not None:
        raise PlannerError(f"{origin}:{table.line}: result table ends without its footer "
                           "('# Avg bus bandwidth'): truncated log?")
    if not finished:
        raise PlannerError(f"{origin}: no nccl-tests result rows found (is this nccl-tests output?)")
    return [_result_from_table(t, origin, explicit) for t in finished]


def _read_row(table: _Table, tokens: list[str], where: str) -> None:
    needed = {name: table.columns[name] for name in ("size", table.time_column, "algbw", "busbw")}
    if len(tokens) <= max(needed.values()):
        raise PlannerError(f"{where}: result row has {len(tokens)} fields, the header needs "
                           f"{max(needed.values()) + 1}: truncated log?")
    values: dict[str, float] = {}
    for name, position in needed.items():
        try:
            values[name] = float(tokens[position])
        except ValueError:
            raise PlannerError(f"{where}: {name} {tokens[position]!r} is not a number") from None
    if values["size"] <= 0:
        return  # a zero-byte operation measures no bandwidth
    time_us = values[table.time_column]
    if time_us <= 0:
        raise PlannerError(f"{where}: {table.time_column} must be positive, got {time_us:g}")
    table.sizes.append(int(values["size"]))
    table.times.append(time_us * 1e-6)
    table.ratios.append((values["algbw"], values["busbw"]))


def _infer_nranks(name: str, ratios: Sequence[tuple[float, float]], origin: str) -> int | None:
    """n from busbw/algbw of the row with the largest algbw (the most printed digits)."""
    if name in ("sendrecv", "broadcast", "reduce"):
        return None
    algbw, busbw = max(ratios)
    ratio = busbw / algbw if algbw > 0 else 0.0
    limit = 2.0 if name == "all_reduce" else 1.0
    if not 0 < ratio < limit * 0.999:
        raise PlannerError(f"{origin}: cannot infer the rank count of {name} from busbw/algbw = "
                           f"{busbw}/{algbw}; keep the '# Using devices' lines in the log")
    return round(limit / (limit - ratio))


def _result_from_table(table: _Table, origin: str, explicit: str | None) -> CollectiveResult:
    if not table.sizes:
        raise PlannerError(f"{origin}:{table.line}: result table has no rows with a positive size")
    named = table.named
    if explicit and named and explicit != named:
        raise PlannerError(f"{origin}: log says the test is {named}, not {explicit}")
    name = explicit or named or _name_in(Path(origin).name)
    if name is None:
        raise PlannerError(f"{origin}: cannot tell which collective this log measured; "
                           f"pass it explicitly (one of {', '.join(COLLECTIVES)})")
    nranks = len(table.hosts) if table.hosts else _infer_nranks(name, table.ratios, origin)
    if nranks is not None and nranks < 2:
        raise PlannerError(f"{origin}: {name} ran on {nranks} rank, so it measured no link")
    return CollectiveResult(name, nranks, table.hosts, tuple(table.sizes), tuple(table.times), origin)


def read_nccl_tests_log(path: str | os.PathLike[str],
                        collective: str | None = None) -> list[CollectiveResult]:
    """`parse_nccl_tests_log` of a file; unreadable files are a PlannerError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise PlannerError(f"nccl-tests log not found: {path}") from None
    except OSError as exc:
        raise PlannerError(f"cannot read nccl-tests log {path}: {exc}") from None
    return parse_nccl_tests_log(text, str(path), collective)


def import_nccl_tests(paths: Sequence[str | os.PathLike[str]], collective: str | None = None) -> LinksTable:
    """A LINKS table from nccl-tests logs (see `links_from_results` for what fills which entry)."""
    if not paths:
        raise PlannerError("give at least one nccl-tests log")
    results = [result for path in paths for result in read_nccl_tests_log(path, collective)]
    return links_from_results(results, {"kind": "nccl-tests", "files": [str(p) for p in paths]})
