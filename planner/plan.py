"""`Plan` ↔ JSON (schema_version 1, field names per DESIGN.md), with invariants checked both ways.

A plan file is the contract between `planner plan` and everything downstream (`planner export`,
users' scripts): stages cover every transformer block once, in order; dp·tp·pp·cp = GPUs; the
batch divides into micro-batches. Loading a file that breaks any of these is a PlannerError.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.cluster import Cluster
from planner.config import ParallelConfig, Partition, Recompute, Schedule, Training
from planner.cost.estimate import Estimate
from planner.errors import PlannerError
from planner.model import ModelSpec, model_from_dict
from planner.placement import Placement, rank_coordinates

__all__ = ["SCHEMA_VERSION", "Plan", "build_plan_document", "load_plan", "parse_plan_document", "write_atomic"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Plan:
    """A loaded plan: what exporters need, rebuilt from the JSON document."""

    model: ModelSpec
    cluster: dict[str, Any]
    training: Training
    parallel: ParallelConfig
    partition: Partition
    document: dict[str, Any]

    @property
    def blocks_per_stage(self) -> tuple[int, ...]:
        return self.partition.blocks_per_stage()


def build_plan_document(
    model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig, placement: Placement,
    result: Estimate, extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plan JSON document for an estimated configuration."""
    m = result.num_microbatches
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": {**model.to_dict(), "num_parameters": model.num_parameters},
        "cluster": {
            "name": cluster.name, "num_nodes": cluster.num_nodes, "gpus_per_node": cluster.gpus_per_node,
            "gpu": cluster.gpu_label, "num_gpus": cluster.num_gpus,
            "nodes": [node.name for node in cluster.nodes],
        },
        "training": {"global_batch": training.global_batch, "seq_len": training.seq_len,
                     "dtype": training.dtype, "attention": training.attention},
        "parallelism": {
            "dp": config.dp, "tp": config.tp, "pp": config.pp, "vpp": config.vpp, "cp": config.cp,
            "micro_batch": config.micro_batch, "num_microbatches": m,
            "sequence_parallel": config.sequence_parallel, "recompute": config.recompute.value,
            "zero_stage": config.zero_stage, "distributed_optimizer": config.distributed_optimizer,
            "schedule": config.schedule.value, "overlap_grad_reduce": config.overlap_grad_reduce,
            "overlap_param_gather": config.overlap_param_gather,
        },
        "stages": [
            {
                "index": s.index, "pp_rank": s.pp_rank, "virtual_index": s.virtual_index,
                "blocks": list(s.blocks), "embedding": s.embedding, "head": s.head, "gpu": s.gpu,
                "memory_bytes": {k: round(v) for k, v in s.memory.as_dict().items()},
                "time_s": {"forward": s.forward_s, "backward": s.backward_s, "p2p": s.p2p_s},
            }
            for s in result.stages
        ],
        "placement": {
            "order": "tp-cp-ep-dp-pp",
            "ranks": [
                dict(zip(("rank", "node", "gpu_index", "dp", "pp", "tp"),
                         (rank, cluster.nodes[gpu[0]].name, gpu[1], *rank_coordinates(config, rank)), strict=True))
                for rank, gpu in enumerate(placement.gpus)
            ],
        },
        "estimate": {
            "iteration_time_s": result.iteration_time_s, "tokens_per_s": result.tokens_per_s,
            "model_tflops_per_gpu": result.model_tflops_per_gpu, "mfu": result.mfu,
            "breakdown_s": dict(result.breakdown_s), "peak_memory_bytes": round(result.peak_memory_bytes),
            "fits": result.fits, "breakdown_detail_s": dict(result.breakdown_detail_s),
        },
    }
    if extra:
        document.update(extra)
    return document


def _require(mapping: Any, key: str, where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise PlannerError(f"plan file: missing '{where}.{key}'" if where else f"plan file: missing '{key}'")
    return mapping[key]


def parse_plan_document(document: Any, origin: str = "plan file") -> Plan:
    """Validate a plan document and rebuild its typed parts."""
    if not isinstance(document, dict):
        raise PlannerError(f"{origin}: expected a JSON object")
    version = _require(document, "schema_version", "")
    if version != SCHEMA_VERSION:
        raise PlannerError(f"{origin}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    model_section = _require(document, "model", "")
    model = model_from_dict(
        {k: v for k, v in model_section.items() if k != "num_parameters"} if isinstance(model_section, dict) else {},
        f"{origin} model",
    )
    training_section = _require(document, "training", "")
    par = _require(document, "parallelism", "")
    try:
        training = Training(
            global_batch=_require(training_section, "global_batch", "training"),
            seq_len=_require(training_section, "seq_len", "training"),
            dtype=_require(training_section, "dtype", "training"),
            attention=training_section.get("attention", "flash"),
        )
        config = ParallelConfig(
            dp=_require(par, "dp", "parallelism"), tp=_require(par, "tp", "parallelism"),
            pp=_require(par, "pp", "parallelism"), vpp=par.get("vpp", 1), cp=par.get("cp", 1),
            micro_batch=_require(par, "micro_batch", "parallelism"),
            sequence_parallel=bool(par.get("sequence_parallel", False)),
            recompute=Recompute(par.get("recompute", "none")),
            zero_stage=par.get("zero_stage", 0),
            distributed_optimizer=bool(par.get("distributed_optimizer", False)),
            schedule=Schedule(par.get("schedule", "1f1b")),
            overlap_grad_reduce=bool(par.get("overlap_grad_reduce", True)),
            overlap_param_gather=bool(par.get("overlap_param_gather", False)),
        )
    except ValueError as exc:
        raise PlannerError(f"{origin}: {exc}") from None
    m = config.num_microbatches(training.global_batch)
    if par.get("num_microbatches", m) != m:
        raise PlannerError(f"{origin}: parallelism.num_microbatches is {par['num_microbatches']}, expected {m}")
    cluster = _require(document, "cluster", "")
    if isinstance(cluster, dict) and cluster.get("num_gpus") is not None and config.num_gpus > cluster["num_gpus"]:
        raise PlannerError(
            f"{origin}: dp·tp·pp·cp = {config.num_gpus} exceeds the cluster's {cluster['num_gpus']} GPUs"
        )
    partition = _partition_from_stages(_require(document, "stages", ""), model, config, origin)
    return Plan(model, cluster, training, config, partition, document)


def _partition_from_stages(stages: Any, model: ModelSpec, config: ParallelConfig, origin: str) -> Partition:
    if not isinstance(stages, list) or not stages:
        raise PlannerError(f"{origin}: 'stages' must be a non-empty list")
    if len(stages) != config.num_virtual_stages:
        raise PlannerError(
            f"{origin}: {len(stages)} stages listed but pp × vpp = {config.num_virtual_stages}"
        )
    counts, expected_start = [], 0
    for position, stage in enumerate(stages):
        blocks = _require(stage, "blocks", f"stages[{position}]")
        if (not isinstance(blocks, list) or len(blocks) != 2 or not all(isinstance(b, int) for b in blocks)
                or blocks[0] != expected_start or blocks[1] < blocks[0]):
            raise PlannerError(
                f"{origin}: stages[{position}].blocks is {blocks!r}; stages must cover blocks "
                f"0..{model.num_layers - 1} once, in order (expected to start at {expected_start})"
            )
        units = blocks[1] - blocks[0]
        units += 1 if stage.get("embedding", position == 0) else 0
        units += 1 if stage.get("head", position == len(stages) - 1) else 0
        counts.append(units)
        expected_start = blocks[1]
    if expected_start != model.num_layers:
        raise PlannerError(f"{origin}: stages cover blocks 0..{expected_start - 1}, model has {model.num_layers}")
    if not stages[0].get("embedding", True) or not stages[-1].get("head", True):
        raise PlannerError(f"{origin}: the embedding must be on the first stage and the head on the last")
    return Partition(tuple(counts))


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file; any problem is one PlannerError line naming the file."""
    try:
        text = Path(path).read_text()
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise PlannerError(f"cannot read plan file {path}: {reason}") from None
    if not text.strip():
        raise PlannerError(f"plan file {path} is empty")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlannerError(f"plan file {path} is not valid JSON (truncated?): {exc.msg} at line {exc.lineno}") from None
    return parse_plan_document(document, f"plan file {path}")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory, so no half-written file remains."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise PlannerError(f"cannot write {path}: directory {directory} does not exist")
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
