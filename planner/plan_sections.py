"""The lossless sections of a plan file (schema_version 2): cluster, training and calibration, both ways.

A plan file must rebuild exactly what was estimated, so these sections hold values, not names to look
up again: each GPU type's whole profile (a calibrated or slowed GPU is not in the catalog), every node
group with its bandwidths, the measured per-pair links and the per-GPU overrides (slowdowns). Sizes
follow the cluster's structure: runs of alike nodes are one group, generated node names (node0, …)
are not listed, and per-GPU data appears only for GPUs that differ from their node.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from typing import Any

from planner.cluster import Cluster, Link, Node
from planner.config import Training
from planner.errors import PlannerError
from planner.gpu import GPUSpec
from planner.limits import MAX_GPUS
from planner.profile.calibration import Calibration, calibration_from_constants

__all__ = ["calibration_from_record", "calibration_record", "cluster_from_record", "cluster_record",
           "training_from_record", "training_record"]

_NODE_VALUES = tuple(f.name for f in fields(Node) if f.name not in ("name", "gpu"))
_NODE_REQUIRED = tuple(f.name for f in fields(Node) if f.name in _NODE_VALUES and f.default is MISSING)
_CLUSTER_VALUES = tuple(f.name for f in fields(Cluster) if f.name not in ("name", "nodes", "pair_links",
                                                                           "gpu_overrides"))


def _scalar(value: Any, kind: str, where: str) -> Any:
    """`value` checked against a dataclass field's annotation (str, int, float, bool, optionally | None)."""
    if value is None and "None" in kind:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind.startswith("int") and number and isinstance(value, int) and value >= 1:
        return value
    if kind.startswith("float") and number and math.isfinite(value) and value >= 0:
        return float(value)
    if kind.startswith(("str", "bool")) and type(value) is (str if kind.startswith("str") else bool):
        return value
    raise PlannerError(f"{where} must be {kind.split(' ')[0]}, got {value!r:.60}")


def _record_values(cls: type, names: tuple[str, ...], record: Any, where: str) -> dict[str, Any]:
    """The fields `names` of dataclass `cls` read from `record` (absent ones keep their defaults)."""
    if not isinstance(record, dict):
        raise PlannerError(f"{where} must be an object")
    kinds = {f.name: str(f.type) for f in fields(cls)}
    return {name: _scalar(record[name], kinds[name], f"{where}.{name}") for name in names if name in record}


def _gpu_record(gpu: GPUSpec) -> dict[str, Any]:
    return {**{f.name: getattr(gpu, f.name) for f in fields(GPUSpec)}, "peak_flops_per_s": dict(gpu.peak_flops_per_s)}


def _gpu_from_record(record: Any, where: str) -> GPUSpec:
    names = tuple(f.name for f in fields(GPUSpec) if f.name != "peak_flops_per_s")
    peaks = record.get("peak_flops_per_s") if isinstance(record, dict) else None
    if not isinstance(peaks, dict) or not peaks:
        raise PlannerError(f"{where}.peak_flops_per_s must map dtypes to FLOP/s")
    try:
        return GPUSpec(**_record_values(GPUSpec, names, record, where),
                       peak_flops_per_s=tuple((str(k), _scalar(v, "float", f"{where}.peak_flops_per_s.{k}"))
                                              for k, v in peaks.items())).checked()
    except (TypeError, PlannerError) as exc:
        raise PlannerError(f"{where}: {exc}") from None


def cluster_record(cluster: Cluster) -> dict[str, Any]:
    """The cluster section: the v1 summary plus GPU profiles, node groups, pair links and per-GPU overrides."""
    gpus: list[GPUSpec] = []

    def gpu_index(gpu: GPUSpec) -> int:
        if gpu not in gpus:
            gpus.append(gpu)
        return gpus.index(gpu)

    groups: list[dict[str, Any]] = []
    for node in cluster.nodes:
        values = {"gpu": gpu_index(node.gpu), **{name: getattr(node, name) for name in _NODE_VALUES}}
        if groups and all(groups[-1][key] == value for key, value in values.items()):
            groups[-1]["nodes"] += 1
            groups[-1]["names"].append(node.name)
        else:
            groups.append({**values, "nodes": 1, "names": [node.name]})
    start = 0
    for group in groups:  # generated names (node0, node1, … in cluster order) are implied
        if group["names"] == [f"node{start + i}" for i in range(group["nodes"])]:
            del group["names"]
        start += group["nodes"]
    overrides: dict[tuple[int, int], list[int]] = {}
    for (node, gpu), spec in sorted(cluster.gpu_overrides.items()):
        overrides.setdefault((node, gpu_index(spec)), []).append(gpu)
    return {
        "name": cluster.name, "num_nodes": cluster.num_nodes, "gpus_per_node": cluster.gpus_per_node,
        "gpu": cluster.gpu_label, "num_gpus": cluster.num_gpus,
        **{name: getattr(cluster, name) for name in _CLUSTER_VALUES},
        "node_groups": groups,
        "pair_links": [{"nodes": [a, b], "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                        "latency_s": link.latency_s, "kind": link.kind}
                       for (a, b), link in sorted(cluster.pair_links.items())],
        "gpu_overrides": [{"node": node, "gpu_indices": indices, "gpu": spec}
                          for (node, spec), indices in overrides.items()],
        "gpus": [_gpu_record(gpu) for gpu in gpus],
    }


def cluster_from_record(record: Any, origin: str) -> Cluster:
    """The Cluster a v2 cluster section describes, every value checked (a PlannerError names the field)."""
    where = f"{origin}: cluster"
    if not isinstance(record, dict):
        raise PlannerError(f"{where} must be an object")
    gpus = [_gpu_from_record(g, f"{where}.gpus[{i}]") for i, g in enumerate(_list(record, "gpus", where))]

    def gpu_at(index: Any, at: str) -> GPUSpec:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(gpus):
            raise PlannerError(f"{at}.gpu must index cluster.gpus (0..{len(gpus) - 1}), got {index!r}")
        return gpus[index]

    nodes: list[Node] = []
    for i, group in enumerate(_list(record, "node_groups", where)):
        at = f"{where}.node_groups[{i}]"
        values = _record_values(Node, _NODE_VALUES, group, at)
        missing = [name for name in _NODE_REQUIRED if name not in values]
        if missing:
            raise PlannerError(f"{at} lacks {', '.join(missing)}")
        count = _scalar(group.get("nodes"), "int", f"{at}.nodes")
        if count * values["num_gpus"] + sum(node.num_gpus for node in nodes) > MAX_GPUS:
            raise PlannerError(f"{at}: {count:,} nodes of {values['num_gpus']:,} GPUs take the cluster past planner's "
                               f"limit of {MAX_GPUS:,} GPUs")
        names = group.get("names", [f"node{len(nodes) + k}" for k in range(count)])
        if not isinstance(names, list) or len(names) != count or not all(isinstance(n, str) for n in names):
            raise PlannerError(f"{at}.names must list {count} node names")
        try:
            nodes.extend(Node(name=name, gpu=gpu_at(group.get("gpu"), at), **values) for name in names)
        except PlannerError as exc:
            raise PlannerError(f"{at}: {exc}") from None
    try:
        cluster = Cluster(name=_scalar(record.get("name"), "str", f"{where}.name"), nodes=tuple(nodes),
                          **_record_values(Cluster, _CLUSTER_VALUES, record, where))
    except (TypeError, PlannerError) as exc:
        raise PlannerError(f"{where}: {exc}") from None
    for key, value in (("num_nodes", cluster.num_nodes), ("gpus_per_node", cluster.gpus_per_node),
                       ("num_gpus", cluster.num_gpus)):
        if key in record and (isinstance(record[key], bool) or record[key] != value):
            raise PlannerError(f"{where}.{key} is {record[key]!r:.40}, but its node_groups make {value}")
    links, overrides = {}, {}
    for i, entry in enumerate(_list(record, "pair_links", where)):
        at = f"{where}.pair_links[{i}]"
        a, b = _node_pair(entry, cluster, at)
        try:
            links[(a, b)] = Link(**_record_values(Link, ("bandwidth_bytes_per_s", "latency_s", "kind"), entry, at))
        except (TypeError, PlannerError) as exc:
            raise PlannerError(f"{at}: {exc}") from None
    for i, entry in enumerate(_list(record, "gpu_overrides", where)):
        at = f"{where}.gpu_overrides[{i}]"
        node = _node_pair({"nodes": [entry.get("node")] * 2} if isinstance(entry, dict) else None, cluster, at)[0]
        indices = entry.get("gpu_indices")
        size = cluster.nodes[node].num_gpus
        if not isinstance(indices, list) or not all(isinstance(g, int) and 0 <= g < size for g in indices):
            raise PlannerError(f"{at}.gpu_indices must list GPUs 0..{size - 1} of node {node}")
        overrides.update({(node, g): gpu_at(entry.get("gpu"), at) for g in indices})
    return cluster.with_pair_links(links).with_gpu_overrides(overrides)


def _list(record: dict[str, Any], key: str, where: str) -> list[Any]:
    value = record.get(key)
    if not isinstance(value, list):
        raise PlannerError(f"{where}.{key} must be a list")
    return value


def _node_pair(entry: Any, cluster: Cluster, where: str) -> tuple[int, int]:
    pair = entry.get("nodes") if isinstance(entry, dict) else None
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < cluster.num_nodes for n in pair)):
        raise PlannerError(f"{where} must name nodes by index 0..{cluster.num_nodes - 1}")
    return min(pair), max(pair)


def training_record(training: Training) -> dict[str, Any]:
    """Every field of the training job (dtype, attention kernel, gradient bytes, …)."""
    return {f.name: getattr(training, f.name) for f in fields(Training)}


def training_from_record(record: Any, origin: str) -> Training:
    if not isinstance(record, dict):
        raise PlannerError(f"{origin}: 'training' must be an object")
    unknown = set(record) - {f.name for f in fields(Training)}
    if unknown:
        raise PlannerError(f"{origin}: unknown training field(s) {', '.join(sorted(unknown))}")
    try:
        return Training(**record)
    except TypeError as exc:
        raise PlannerError(f"{origin}: training: {exc}") from None


def calibration_record(calibration: Calibration) -> dict[str, Any]:
    """The cost-model constants the estimate used; read back with calibration_from_constants."""
    return {"constants": {f.name: getattr(calibration, f.name) for f in fields(Calibration)}}


def calibration_from_record(record: Any, origin: str) -> Calibration:
    constants = record.get("constants") if isinstance(record, dict) else None
    return calibration_from_constants(constants, f"{origin}: calibration")
