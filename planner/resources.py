"""File boundaries: the data files shipped in ``profiles/``, parsing of every file a user gives, and
the one atomic writer of every output.

Installed, ``profiles/`` lives inside the package (``planner/profiles``); in a source checkout it
sits at the repository root. Every loader of shipped data goes through here. Every parsed document
is checked for shape before any loader sees it (`check_tree`: nesting depth, finite numbers), and
every output goes through `write_atomic`, which replaces only regular files.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import PlannerError

__all__ = ["MAX_DEPTH", "check_output", "check_tree", "load_structured_file", "parse_json", "profiles_dir",
           "write_all_atomic", "write_atomic"]

MAX_DEPTH = 32
"""Deepest nesting of lists and mappings any input file may have; planner's own files need 6, and a
limit well under Python's recursion limit keeps every later walk of the document safe."""


@cache
def profiles_dir() -> Path:
    """The directory holding the shipped data files."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "profiles", package.parent / "profiles"):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"planner's data directory 'profiles' is missing next to {package}")


def load_structured_file(path: Path) -> Any:
    """Parse a YAML or JSON file given by a user; bad syntax is a PlannerError naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlannerError(f"file not found: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise PlannerError(f"cannot read {path}: {exc}") from None
    if not text.strip():
        raise PlannerError(f"{path} is empty")
    try:
        if path.suffix.lower() == ".json":
            return parse_json(text, str(path))
        return check_tree(_parse_yaml(text, str(path)), str(path))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).splitlines()[0]
        raise PlannerError(f"{path} is not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {first_line}") from None


def _parse_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise PlannerError(f"{origin}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer past Python's digit limit for str → int, a date that is none
        raise PlannerError(f"{origin}: {_value_problem(exc)}") from None


def parse_json(text: str, origin: str) -> Any:
    """JSON text checked by `check_tree`; a syntax error stays a JSONDecodeError for the caller to word."""
    try:
        document = json.loads(text)
    except RecursionError:
        raise PlannerError(f"{origin}: nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        raise PlannerError(f"{origin}: {_value_problem(exc)}") from None
    return check_tree(document, origin)


def _value_problem(exc: ValueError) -> str:
    """The one line for a value Python refuses to convert: an integer past sys.get_int_max_str_digits(), or a YAML
    date that is no date (2024-13-45)."""
    if "digits" in str(exc):
        return f"a number has more digits than planner reads (limit {sys.get_int_max_str_digits():,} digits)"
    return f"a value cannot be read ({exc})"


def check_tree(document: Any, origin: str) -> Any:
    """`document` unchanged when it nests at most MAX_DEPTH deep and every number in it is finite;
    walked without recursion, so no later code meets a structure that could exhaust the stack. A container YAML
    shares under several aliases is walked again only where it sits deeper than before, so an alias bomb (nine
    lines naming 10⁹ nodes) is checked in the time its distinct nodes take."""
    pending: list[tuple[Any, str, int]] = [(document, "", 0)]
    deepest: dict[int, int] = {}  # id of a container walked → the depth it was walked at
    while pending:
        value, where, depth = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise PlannerError(f"{origin}: {where or 'the document'} is {value}; numbers must be finite")
        if isinstance(value, (dict, list)):
            if deepest.get(id(value), -1) >= depth:
                continue
            deepest[id(value)] = depth
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in children:
            if depth >= MAX_DEPTH:
                raise PlannerError(f"{origin}: nested deeper than {MAX_DEPTH} levels (at {where or 'the top'})")
            name = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}".lstrip(".")
            pending.append((child, name, depth + 1))
    return document


def _output_target(path: Path) -> tuple[Path, int]:
    """The regular file to replace for `path` (a symlink's target) and the mode to give it; devices,
    directories, FIFOs, sockets and dangling links are refused, as curl refuses to write over a device."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        parent = path.parent
        if not parent.is_dir():
            raise PlannerError(f"cannot write {path}: directory {parent} does not exist") from None
        umask = os.umask(0)
        os.umask(umask)
        return path, 0o666 & ~umask
    except OSError as exc:
        raise PlannerError(f"cannot write {path}: {exc.strerror}") from None
    target = path
    if stat.S_ISLNK(info.st_mode):
        try:
            target = path.resolve(strict=True)
            info = target.stat()
        except (OSError, RuntimeError):
            raise PlannerError(f"cannot write {path}: a symlink to a missing file; refusing to follow it") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise PlannerError(f"refusing to write {path}: it is {kind}; give a regular file or a new path")
    return target, stat.S_IMODE(info.st_mode)


def check_output(path: Path) -> None:
    """Refuse, before any work, an output `path` that `write_atomic` could not write: a missing or unwritable
    directory, or a path that is not a regular file (one-line PlannerError)."""
    target, _ = _output_target(Path(path))
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise PlannerError(f"cannot write {path}: directory {target.parent} is not writable")


def write_atomic(path: Path, text: str) -> None:
    """Replace the regular file `path` (or create it) with `text` atomically, keeping its mode (a new file
    gets the umask's), writing through a symlink to its target, and leaving no temporary file behind on
    any exit Python sees (errors, KeyboardInterrupt)."""
    write_all_atomic([(Path(path), text)])


def write_all_atomic(outputs: Sequence[tuple[Path, str]]) -> None:
    """`write_atomic` for several files that belong together (a trace and its SVG, a table and its CSV): every
    file is written to a temporary beside its target first, and only when all are written are they moved into
    place, so a path that cannot be written leaves none of them behind."""
    staged: list[tuple[Path, Path, str]] = []  # (given path, temporary, target)
    try:
        for path, text in outputs:
            target, mode = _output_target(Path(path))
            try:
                handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            except OSError as exc:
                raise PlannerError(f"cannot write {path}: {exc.strerror} (directory {target.parent})") from None
            staged.append((Path(path), Path(name), target))
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as stream:
                    stream.write(text)
                    stream.flush()
                    os.fsync(stream.fileno())
                os.chmod(name, mode)
            except OSError as exc:
                raise PlannerError(f"cannot write {path}: {exc.strerror or exc}") from None
        for path, temporary, target in staged:
            try:
                os.replace(temporary, target)
            except OSError as exc:
                raise PlannerError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        for _, temporary, _ in staged:
            temporary.unlink(missing_ok=True)
