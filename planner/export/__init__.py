"""Plans to launchable framework configurations: Megatron-LM, DeepSpeed (Megatron-DeepSpeed), torchtitan.

`export_plan(plan, target)` renders every file in memory first; `write_export` then writes them
atomically, so a failed export leaves no partial output behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from planner.errors import PlannerError
from planner.export.common import ExportResult
from planner.export.deepspeed import export_deepspeed
from planner.export.megatron import export_megatron
from planner.export.torchtitan import export_torchtitan
from planner.plan import Plan, write_atomic

__all__ = ["TARGETS", "ExportResult", "export_plan", "exporter", "render_stdout", "write_export"]

_EXPORTERS: dict[str, Callable[[Plan], ExportResult]] = {
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "torchtitan": export_torchtitan,
}
TARGETS = tuple(_EXPORTERS)


def exporter(target: str) -> Callable[[Plan], ExportResult]:
    """The export function for `target` (one of TARGETS)."""
    if target not in _EXPORTERS:
        raise PlannerError(f"unknown export target {target!r}: use one of {', '.join(TARGETS)}")
    return _EXPORTERS[target]


def export_plan(plan: Plan, target: str) -> ExportResult:
    """The files for `target` (one of TARGETS)."""
    return exporter(target)(plan)


def write_export(result: ExportResult, directory: Path) -> list[Path]:
    """Write every file into `directory` (created if its parent exists); launch scripts are made executable."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise PlannerError(f"--out {directory} exists and is not a directory")
    if not directory.parent.is_dir():
        raise PlannerError(f"cannot write into {directory}: directory {directory.parent} does not exist")
    directory.mkdir(exist_ok=True)
    written = []
    for name, text in result.files.items():
        path = directory / name
        write_atomic(path, text)
        if name.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written


def render_stdout(result: ExportResult) -> str:
    """All files one after another, each under a `# ==> name <==` line (one file: its text alone)."""
    if len(result.files) == 1:
        return next(iter(result.files.values()))
    return "\n".join(f"# ==> {name} <==\n{text}" for name, text in result.files.items())
