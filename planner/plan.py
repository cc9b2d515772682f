"""`Plan` ↔ JSON (schema_version 2, field names per DESIGN.md; version 1 files are still read), with
invariants checked both ways.

A plan file is the contract between `planner plan` and everything downstream (`planner export`,
`planner estimate --plan`, users' scripts): stages cover every transformer block once, in order;
dp·tp·pp·cp = GPUs; the batch divides into micro-batches. Loading a file that breaks any of these is a
PlannerError. Version 2 is lossless: the whole model, cluster (planner.plan_sections), training,
calibration and the framework whose execution semantics the estimate assumed, so that the estimate
can be reproduced exactly from the file alone.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.cluster import Cluster
from planner.config import (
    DEFAULT_LOCAL_QUEUE_DEPTH,
    DEFAULT_RECOMPUTE_MODULES,
    ParallelConfig,
    Partition,
    Recompute,
    Schedule,
    Training,
)
from planner.cost.estimate import Estimate, mfu_convention
from planner.cost.schedule import schedule_of
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORK_NAMES, runs_on
from planner.limits import decimal_digits, finite_number
from planner.model import ModelSpec, model_from_dict
from planner.placement import Placement, rank_coordinates
from planner.plan_sections import (
    calibration_from_record,
    calibration_record,
    cluster_from_record,
    cluster_record,
    training_from_record,
    training_record,
)
from planner.profile.calibration import Calibration, default_calibration
from planner.resources import parse_json, write_atomic

__all__ = ["LISTED_RANKS_MAX", "SCHEMA_VERSION", "Plan", "build_plan_document", "load_plan", "parse_plan_document",
           "placement_runs", "write_atomic"]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
LISTED_RANKS_MAX = 1024
"""Up to this many ranks a plan lists every rank (`placement.ranks`); above, only `placement.runs` unless
asked (`--placement full`), so that a plan's size follows its structure, not the cluster's size."""


@dataclass(frozen=True)
class Plan:
    """A loaded plan: what exporters need, rebuilt from the JSON document.

    `cluster` is the document's cluster section; `machines` the Cluster it describes and `calibration` the
    constants the estimate used (both None in a version 1 file, which did not record them); `framework` the
    target whose execution semantics the estimate assumed ("any": Megatron-LM's).
    """

    model: ModelSpec
    cluster: dict[str, Any]
    training: Training
    parallel: ParallelConfig
    partition: Partition
    document: dict[str, Any]
    framework: str = "any"
    machines: Cluster | None = None
    calibration: Calibration | None = None

    @property
    def blocks_per_stage(self) -> tuple[int, ...]:
        return self.partition.blocks_per_stage()


def build_plan_document(
    model: ModelSpec, cluster: Cluster, training: Training, config: ParallelConfig, placement: Placement,
    result: Estimate, extra: dict[str, Any] | None = None, full_placement: bool = False, *,
    framework: str = "any", calibration: Calibration | None = None,
) -> dict[str, Any]:
    """The plan JSON document for an estimated configuration; the per-rank placement table is listed up
    to LISTED_RANKS_MAX ranks or when `full_placement` asks for it, its runs always. `framework` is the
    target searched for and `calibration` the constants used (default: the shipped ones)."""
    m = result.num_microbatches
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "framework": framework,
        "runs_on": runs_on(config, model, [end - start for start, end in (stage.blocks for stage in result.stages)],
                           training),
        "model": {**model.to_dict(), "num_parameters": model.num_parameters},
        "cluster": cluster_record(cluster),
        "training": training_record(training),
        "calibration": calibration_record(calibration or default_calibration()),
        "parallelism": {
            "dp": config.dp, "tp": config.tp, "pp": config.pp, "vpp": config.vpp, "cp": config.cp,
            "cp_comm": config.cp_comm, "hsdp_replicas": config.hsdp_replicas,
            "reshard_after_forward": config.reshard_after_forward, "zero3_collectives": config.zero3_collectives,
            "fsdp_backward_prefetch": config.fsdp_backward_prefetch,
            "selective_recompute": config.selective_recompute, "sac_keeps_attention": config.sac_keeps_attention,
            "fp8_param_gather": config.fp8_param_gather, "micro_batch": config.micro_batch, "num_microbatches": m,
            "sequence_parallel": config.sequence_parallel, "tp_comm_overlap": config.tp_comm_overlap,
            "recompute": config.recompute.value, "recompute_modules": list(config.recompute_modules),
            "recompute_num_layers": config.recompute_num_layers, "cpu_offload_layers": config.cpu_offload_layers,
            "zero_stage": config.zero_stage, "distributed_optimizer": config.distributed_optimizer,
            "deepspeed_optimizer": config.deepspeed_optimizer,
            "schedule": config.schedule.value,
            **({"local_queue_depth": config.local_queue_depth, "local_head": config.local_head}
               if schedule_of(config.schedule).local_losses else {}),
            "overlap_grad_reduce": config.overlap_grad_reduce,
            "overlap_param_gather": config.overlap_param_gather, "ep": config.ep, "etp": config.etp,
            "moe_dispatcher": config.moe_dispatcher, "moe_ep_overlap": config.moe_ep_overlap,
            "p2p_scatter_gather": config.p2p_scatter_gather, "p2p_duplex": config.p2p_duplex,
            **({"legacy_pipeline_engine": True} if config.legacy_pipeline_engine else {}),
            "overlap_tp_backward": config.overlap_tp_backward,
            "sp_saves_gathered_input": config.sp_saves_gathered_input, "pipeline_order": config.pipeline_order,
            "overlap_p2p_comm": config.overlap_p2p_comm,  # null: Megatron-LM's default (on when interleaved)
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
            "runs": placement_runs(cluster, placement),
            **({"ranks": [
                dict(zip(("rank", "node", "gpu_index", "dp", "pp", "tp", "cp"),
                         (rank, cluster.nodes[gpu[0]].name, gpu[1], *rank_coordinates(config, rank)), strict=True))
                for rank, gpu in enumerate(placement.gpus)
            ]} if full_placement or config.num_gpus <= LISTED_RANKS_MAX else {}),
        },
        "estimate": {
            "iteration_time_s": result.iteration_time_s, "tokens_per_s": result.tokens_per_s,
            "model_tflops_per_gpu": result.model_tflops_per_gpu, "mfu": result.mfu,
            "mfu_convention": mfu_convention(training),
            "breakdown_s": dict(result.breakdown_s), "peak_memory_bytes": round(result.peak_memory_bytes),
            "fits": result.fits, "breakdown_detail_s": dict(result.breakdown_detail_s),
        },
    }
    if extra:
        document.update(extra)
    return document


def placement_runs(cluster: Cluster, placement: Placement) -> list[dict[str, Any]]:
    """The placement as runs: `count` consecutive ranks from `rank` on consecutive GPUs in cluster order
    (node by node) from (`node`, `gpu_index`); rank order on an ordinary cluster is one run."""
    offsets = list(itertools.accumulate((node.num_gpus for node in cluster.nodes), initial=0))
    runs: list[dict[str, Any]] = []
    previous = -2
    for rank, (node, gpu) in enumerate(placement.gpus):
        position = offsets[node] + gpu
        if position == previous + 1:
            runs[-1]["count"] += 1
        else:
            runs.append({"rank": rank, "count": 1, "node": cluster.nodes[node].name, "gpu_index": gpu})
        previous = position
    return runs


def _require(mapping: Any, key: str, where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise PlannerError(f"plan file: missing '{where}.{key}'" if where else f"plan file: missing '{key}'")
    return mapping[key]


def parse_plan_document(document: Any, origin: str = "plan file") -> Plan:
    """Validate a plan document and rebuild its typed parts."""
    if not isinstance(document, dict):
        raise PlannerError(f"{origin}: expected a JSON object")
    version = _require(document, "schema_version", "")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise PlannerError(f"{origin}: schema_version {version!r} is not supported (expected one of "
                           f"{', '.join(map(str, READABLE_VERSIONS))})")
    model_section = _require(document, "model", "")
    model = model_from_dict(
        {k: v for k, v in model_section.items() if k != "num_parameters"} if isinstance(model_section, dict) else {},
        f"{origin} model",
    )
    training_section = _require(document, "training", "")
    par = _require(document, "parallelism", "")
    for key in ("global_batch", "seq_len", "dtype"):
        _require(training_section, key, "training")
    training = training_from_record(training_section, origin)
    try:
        config = ParallelConfig(
            dp=_require(par, "dp", "parallelism"), tp=_require(par, "tp", "parallelism"),
            pp=_require(par, "pp", "parallelism"), vpp=par.get("vpp", 1), cp=par.get("cp", 1),
            cp_comm=par.get("cp_comm", "p2p"), hsdp_replicas=par.get("hsdp_replicas", 1),
            reshard_after_forward=par.get("reshard_after_forward"),
            zero3_collectives=par.get("zero3_collectives", "per-unit"),
            fsdp_backward_prefetch=par.get("fsdp_backward_prefetch", "pre"),
            selective_recompute=par.get("selective_recompute", "attention"),
            fp8_param_gather=_flag(par, "fp8_param_gather", False, origin),
            sac_keeps_attention=_flag(par, "sac_keeps_attention", True, origin),
            micro_batch=_require(par, "micro_batch", "parallelism"),
            sequence_parallel=_flag(par, "sequence_parallel", False, origin),
            tp_comm_overlap=_flag(par, "tp_comm_overlap", False, origin),
            recompute=Recompute(par.get("recompute", "none")),
            recompute_modules=par.get("recompute_modules", DEFAULT_RECOMPUTE_MODULES),
            recompute_num_layers=par.get("recompute_num_layers"),
            cpu_offload_layers=par.get("cpu_offload_layers", 0),
            zero_stage=par.get("zero_stage", 0),
            distributed_optimizer=_flag(par, "distributed_optimizer", False, origin),
            deepspeed_optimizer=par.get("deepspeed_optimizer", "zero"),
            schedule=Schedule(par.get("schedule", "1f1b")),
            local_queue_depth=par.get("local_queue_depth", DEFAULT_LOCAL_QUEUE_DEPTH),
            local_head=par.get("local_head", "linear"),
            overlap_grad_reduce=_flag(par, "overlap_grad_reduce", True, origin),
            overlap_param_gather=_flag(par, "overlap_param_gather", False, origin),
            ep=par.get("ep", 1), etp=par.get("etp", 1), moe_dispatcher=par.get("moe_dispatcher", "alltoall"),
            moe_ep_overlap=_flag(par, "moe_ep_overlap", False, origin),
            p2p_scatter_gather=_flag(par, "p2p_scatter_gather", True, origin),
            p2p_duplex=_flag(par, "p2p_duplex", True, origin),
            legacy_pipeline_engine=_flag(par, "legacy_pipeline_engine", False, origin),
            overlap_tp_backward=_flag(par, "overlap_tp_backward", True, origin),
            sp_saves_gathered_input=_flag(par, "sp_saves_gathered_input", False, origin),
            pipeline_order=par.get("pipeline_order", "megatron"),
            overlap_p2p_comm=None if par.get("overlap_p2p_comm") is None else _flag(par, "overlap_p2p_comm", False,
                                                                                      origin),
        )
    except (ValueError, TypeError) as exc:
        raise PlannerError(f"{origin}: {exc}") from None
    m = config.num_microbatches(training.global_batch)
    if par.get("num_microbatches", m) != m:
        raise PlannerError(f"{origin}: parallelism.num_microbatches is {par['num_microbatches']}, expected {m}")
    cluster = _require(document, "cluster", "")
    if not isinstance(cluster, dict):
        raise PlannerError(f"{origin}: cluster must be an object, got {cluster!r}")
    num_gpus = cluster.get("num_gpus")
    if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1):
        raise PlannerError(f"{origin}: cluster.num_gpus must be a positive integer, got {num_gpus!r}")
    if num_gpus is not None and config.num_gpus > num_gpus:
        raise PlannerError(
            f"{origin}: dp·tp·pp·cp = {config.num_gpus} exceeds the cluster's {cluster['num_gpus']} GPUs"
        )
    partition = _partition_from_stages(_require(document, "stages", ""), model, config, origin)
    _check_estimate(_require(document, "estimate", ""), document["stages"], origin)
    framework = document.get("framework", "any")
    if framework not in FRAMEWORK_NAMES:
        raise PlannerError(f"{origin}: framework {framework!r} is not one of {', '.join(FRAMEWORK_NAMES)}")
    machines = cluster_from_record(cluster, origin) if version >= 2 else None
    calibration = calibration_from_record(_require(document, "calibration", ""), origin) if version >= 2 else None
    placement = document.get("placement")
    if placement is not None:
        sizes = ({node.name: node.num_gpus for node in machines.nodes} if machines
                 else _node_sizes(cluster, origin))
        document = {**document, "placement": _checked_placement(placement, sizes, config, origin)}
    return Plan(model, cluster, training, config, partition, document, framework, machines, calibration)


_ESTIMATE_NUMBERS = ("iteration_time_s", "tokens_per_s", "mfu", "peak_memory_bytes")


def _check_estimate(estimate: Any, stages: list[Any], origin: str) -> None:
    """The written estimate that `estimate --plan` and `compare` print: its figures and every stage's memory terms
    finite numbers >= 0, every breakdown term a finite number, `fits` a flag (one line naming the field)."""
    if not isinstance(estimate, dict):
        raise PlannerError(f"{origin}: 'estimate' must be an object")
    figures = {f"estimate.{key}": _require(estimate, key, "estimate") for key in _ESTIMATE_NUMBERS}
    if "model_tflops_per_gpu" in estimate:
        figures["estimate.model_tflops_per_gpu"] = estimate["model_tflops_per_gpu"]
    for position, stage in enumerate(stages):
        memory = _require(stage, "memory_bytes", f"stages[{position}]")
        if not isinstance(memory, dict):
            raise PlannerError(f"{origin}: stages[{position}].memory_bytes must map terms to bytes")
        figures.update({f"stages[{position}].memory_bytes.{key}": value for key, value in memory.items()})
    terms = {}
    for section in ("breakdown_s", "breakdown_detail_s"):
        mapping = estimate.get(section, {})
        if not isinstance(mapping, dict):
            raise PlannerError(f"{origin}: estimate.{section} must map terms to seconds")
        terms.update({f"estimate.{section}.{key}": value for key, value in mapping.items()})
    for name, value in (*figures.items(), *terms.items()):
        if not finite_number(value) or (value < 0 and name in figures):
            raise PlannerError(f"{origin}: {name} must be a finite number{' >= 0' if name in figures else ''}, "
                               f"got {value!r:.60}")
    if not isinstance(_require(estimate, "fits", "estimate"), bool):
        raise PlannerError(f"{origin}: estimate.fits must be true or false, got {estimate['fits']!r:.60}")


def _flag(section: dict[str, Any], key: str, default: bool, origin: str) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise PlannerError(f"{origin}: parallelism.{key} must be true or false, got {value!r}")
    return value


def _node_sizes(cluster: Any, origin: str) -> dict[str, int]:
    """GPUs per node name, from a version 1 cluster section (`node_gpus` when nodes differ in size)."""
    names = cluster.get("nodes") if isinstance(cluster, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise PlannerError(f"{origin}: cluster.nodes must list the node names to check the placement against")
    sizes = cluster.get("node_gpus", [cluster.get("gpus_per_node")] * len(names))
    if (not isinstance(sizes, list) or len(sizes) != len(names)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes)):
        raise PlannerError(f"{origin}: cluster.gpus_per_node (or node_gpus) must give each node's GPU count")
    return dict(zip(names, sizes, strict=True))


def _checked_placement(placement: Any, sizes: dict[str, int], config: ParallelConfig, origin: str) -> dict[str, Any]:
    """The placement section with `ranks` (expanded from `runs` when only those are listed), every rank
    0..world-1 exactly once on a GPU that exists on the plan's cluster, no GPU used twice."""
    if not isinstance(placement, dict):
        raise PlannerError(f"{origin}: 'placement' must be an object")
    world = config.num_gpus
    ranks = placement.get("ranks")
    if ranks is None and "runs" in placement:
        ranks = _expand_runs(placement["runs"], list(sizes.items()), config, origin)
    if not isinstance(ranks, list) or len(ranks) != world:
        raise PlannerError(f"{origin}: placement.ranks must list ranks 0..{world - 1} once each")
    seen_ranks, seen_gpus = set(), set()
    for entry in ranks:
        rank = entry.get("rank") if isinstance(entry, dict) else None
        node, gpu = (entry.get("node"), entry.get("gpu_index")) if isinstance(entry, dict) else (None, None)
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world or rank in seen_ranks:
            raise PlannerError(f"{origin}: placement.ranks must list ranks 0..{world - 1} once each, got {rank!r}")
        if node not in sizes:
            raise PlannerError(f"{origin}: placement rank {rank} is on node {node!r}, which the cluster lacks")
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < sizes[node]:
            raise PlannerError(f"{origin}: placement rank {rank} has gpu_index {gpu!r}; node {node} has GPUs "
                               f"0..{sizes[node] - 1}")
        if (node, gpu) in seen_gpus:
            raise PlannerError(f"{origin}: placement puts two ranks on GPU {gpu} of node {node}")
        seen_ranks.add(rank)
        seen_gpus.add((node, gpu))
    return {**placement, "ranks": ranks}


def _expand_runs(runs: Any, nodes: list[tuple[str, int]], config: ParallelConfig, origin: str) -> list[dict]:
    """Per-rank entries from `placement.runs`: each run puts `count` consecutive ranks from `rank` on
    consecutive GPUs in cluster order (node by node) from (`node`, `gpu_index`)."""
    order = [(name, g) for name, size in nodes for g in range(size)]
    position = {gpu: i for i, gpu in enumerate(order)}
    ranks: list[dict[str, Any]] = []
    for run in runs if isinstance(runs, list) else [None]:
        start = position.get((run.get("node"), run.get("gpu_index"))) if isinstance(run, dict) else None
        count = run.get("count") if isinstance(run, dict) else None
        if (start is None or not isinstance(count, int) or isinstance(count, bool) or count < 1
                or start + count > len(order) or run.get("rank") != len(ranks)):
            raise PlannerError(f"{origin}: placement.runs entry {run!r} is not a run of ranks on the cluster's "
                               f"GPUs continuing from rank {len(ranks)}")
        for offset in range(count):
            rank = len(ranks)
            ranks.append(dict(zip(("rank", "node", "gpu_index", "dp", "pp", "tp", "cp"),
                                  (rank, *order[start + offset], *rank_coordinates(config, rank)), strict=True)))
    return ranks


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
        for key, expected in (("embedding", position == 0), ("head", position == len(stages) - 1)):
            if stage.get(key, expected) is not expected:
                raise PlannerError(f"{origin}: stages[{position}].{key} is {stage[key]!r}; the embedding must be on "
                                   "the first stage only and the head on the last only")
        counts.append(blocks[1] - blocks[0] + (position == 0) + (position == len(stages) - 1))
        expected_start = blocks[1]
    if expected_start != model.num_layers:
        raise PlannerError(f"{origin}: stages cover blocks 0..{expected_start - 1}, model has {model.num_layers}")
    return Partition(tuple(counts))


def _split_plan_reference(reference: Path | str) -> tuple[Path, int]:
    """(file, plan number) of a plan reference: `PLAN.json` is the file's plan (number 1), `PLAN.json#N` its N-th
    as `planner plan` numbered them (#2 onwards: the file's `alternatives`). A file whose own name ends in `#N` is
    read whole when it exists."""
    text = str(reference)
    name, mark, number = text.rpartition("#")
    if not mark or Path(text).exists():
        return Path(text), 1
    if not decimal_digits(number) or int(number) < 1:
        raise PlannerError(f"plan reference {text}: after '#' comes the plan's number as `planner plan` lists it, "
                           f"1 (the best) or more, not {number!r}")
    return Path(name), int(number)


def _chosen_plan_document(document: Any, number: int, origin: str) -> Any:
    """The `number`-th plan of a plan document: itself (1) or one of its `alternatives` (2 onwards); a document that
    is not a JSON object is returned as it is, for `parse_plan_document` to say so."""
    if number == 1 or not isinstance(document, dict):
        return document
    alternatives = document.get("alternatives")
    held = 1 + len(alternatives) if isinstance(alternatives, list) else 1
    if number > held:
        listed = "only its plan #1 (written without alternatives)" if held == 1 else f"plans #1 to #{held}"
        raise PlannerError(f"{origin}#{number}: the file holds {listed}")
    return alternatives[number - 2]


def load_plan(path: Path | str) -> Plan:
    """Read and validate a plan file, or with `PLAN.json#N` its N-th plan (`_split_plan_reference`); any problem is
    one PlannerError line naming the file."""
    path, number = _split_plan_reference(path)
    origin = f"plan file {path}"
    try:
        text = path.read_text()
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise PlannerError(f"cannot read {origin}: {reason}") from None
    if not text.strip():
        raise PlannerError(f"{origin} is empty")
    try:
        document = parse_json(text, origin)
    except json.JSONDecodeError as exc:
        raise PlannerError(f"{origin} is not valid JSON (truncated?): {exc.msg} at line {exc.lineno}") from None
    return parse_plan_document(_chosen_plan_document(document, number, origin),
                               origin if number == 1 else f"{origin}#{number}")
