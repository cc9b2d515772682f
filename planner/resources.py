"""Locates and reads the data files shipped in ``profiles/`` (GPU catalog, models, calibration).

Installed, ``profiles/`` lives inside the package (``planner/profiles``); in a source checkout it
sits at the repository root. Every loader of shipped data goes through here.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import PlannerError

__all__ = ["load_structured_file", "profiles_dir"]


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
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).splitlines()[0]
        raise PlannerError(f"{path} is not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {first_line}") from None
