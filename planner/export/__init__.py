"""Plans to launchable framework configurations: Megatron-LM, DeepSpeed (Megatron-DeepSpeed), torchtitan; and a
local-learning plan to a PyTorch reference script (pytorch-local), since no framework runs that algorithm.

`export_plan(plan, target)` renders every file in memory first; `write_export` then writes them
atomically, so a failed export leaves no partial output behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from planner.cost.schedule import schedule_of
from planner.errors import PlannerError
from planner.export.common import ExportResult, estimate_split
from planner.export.deepspeed import export_deepspeed
from planner.export.megatron import export_megatron
from planner.export.pytorch_local import export_pytorch_local
from planner.export.torchtitan import export_torchtitan
from planner.frameworks import framework_named
from planner.plan import Plan, write_atomic

__all__ = ["EXPORT_TARGETS", "LOCAL_TARGET", "MANIFEST", "TARGETS", "ExportResult", "export_plan", "exporter",
           "render_stdout", "write_export"]

LOCAL_TARGET = "pytorch-local"  # a PyTorch reference of local learning (the `local` schedule), which no framework runs
MANIFEST = ".planner-export.json"  # what the last export into a directory wrote, so that a re-export may replace it

_EXPORTERS: dict[str, Callable[[Plan], ExportResult]] = {
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "torchtitan": export_torchtitan,
    LOCAL_TARGET: export_pytorch_local,
}
TARGETS = tuple(target for target in _EXPORTERS if target != LOCAL_TARGET)  # the frameworks
EXPORT_TARGETS = tuple(_EXPORTERS)  # what `export --to` takes


def exporter(target: str) -> Callable[[Plan], ExportResult]:
    """The export function for `target` (one of TARGETS): it never substitutes, so a plan the target cannot
    run exactly as planned is refused (PlannerError naming why and which --framework to plan with)."""
    if target not in _EXPORTERS:
        raise PlannerError(f"unknown export target {target!r}: use one of {', '.join(EXPORT_TARGETS)}")
    return functools.partial(_export_runnable, target)


def _export_runnable(target: str, plan: Plan) -> ExportResult:
    """The target's files for a plan it runs; a note when its engine runs the plan unlike the estimate assumed."""
    if target == LOCAL_TARGET:
        return export_pytorch_local(plan)
    if schedule_of(plan.parallel.schedule).local_losses:
        raise PlannerError(f"--to {target}: the plan's local schedule changes the training algorithm (per-stage "
                           f"losses, no end-to-end backward) and no framework runs it; --to {LOCAL_TARGET} writes a "
                           f"runnable PyTorch reference")
    framework = framework_named(target)
    framework.require(plan.parallel, plan.model, plan.blocks_per_stage)
    framework.for_model(plan.model).require_training(plan.training, plan.parallel)
    result = _EXPORTERS[target](plan)
    if framework.runs(plan.parallel) == plan.parallel:
        return result
    seconds = estimate_split(plan, framework=target)
    note = (f"the plan was estimated with {plan.framework}'s execution semantics; as {framework.version} runs it "
            f"(gradient reduction, the weights' all-gather, TP backward overlap, pipeline sends) the cost model "
            f"estimates {seconds:.3f} s/iteration; plan with --framework {target} to search for {target}")
    return replace(result, notes=(*result.notes, note))


def export_plan(plan: Plan, target: str) -> ExportResult:
    """The files for `target` (one of TARGETS)."""
    return exporter(target)(plan)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _manifest(directory: Path) -> dict[str, str]:
    """name → sha256 of each file the last export into `directory` wrote (empty when there is none)."""
    try:
        files = json.loads((directory / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(name): str(digest) for name, digest in files.items()} if isinstance(files, dict) else {}


def _ours(path: Path, manifest: dict[str, str]) -> bool:
    """Whether `path` is a file an earlier export wrote and nobody has edited since."""
    try:
        return manifest.get(path.name) == _digest(path.read_text())
    except (OSError, UnicodeDecodeError):
        return False


def write_export(result: ExportResult, directory: Path, force: bool = False) -> list[Path]:
    """Write every file into `directory` (created if its parent exists); launch scripts are made executable.

    A file already there is overwritten only if an earlier export wrote it unchanged (MANIFEST keeps their
    digests) or with `force`; files of an earlier export that this one no longer writes are removed likewise.
    Everything is checked before anything is written.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise PlannerError(f"{directory} exists and is not a directory: name a directory to write the launch files "
                           f"into")
    if not directory.parent.is_dir():
        raise PlannerError(f"cannot write into {directory}: directory {directory.parent} does not exist")
    manifest = _manifest(directory)
    for name in result.files:
        path = directory / name
        if path.exists() and not force and not _ours(path, manifest):
            raise PlannerError(f"{path} exists and was not written by planner export (or was edited since); "
                               "move it away or pass --force to `planner export` to overwrite it")
    stale = [directory / name for name in manifest if name not in result.files]
    directory.mkdir(exist_ok=True)
    for path in stale:
        if path.is_file() and (force or _ours(path, manifest)):
            path.unlink()
    written = []
    for name, text in result.files.items():
        path = directory / name
        write_atomic(path, text)
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        written.append(path)
    manifest_text = json.dumps({"written_by": "planner export",
                                "files": {name: _digest(text) for name, text in result.files.items()}}, indent=2)
    write_atomic(directory / MANIFEST, manifest_text + "\n")
    return written


def render_stdout(result: ExportResult) -> str:
    """All files one after another, each under a `# ==> name <==` line (one file: its text alone)."""
    if len(result.files) == 1:
        return next(iter(result.files.values()))
    return "\n".join(f"# ==> {name} <==\n{text}" for name, text in result.files.items())
