"""The search behind `planner plan`: enumerate, bound, partition, estimate, rank.

Every configuration of the space (space.py) first gets two cheap bounds from its unit costs:
a memory lower bound (model states plus the fewest in-flight activations, spread perfectly over
all pipeline ranks) rejects what cannot fit, and a time lower bound (the schedule's time with
perfectly balanced stages, plus the smallest possible optimizer step) orders the rest. Candidates
are then partitioned (partition.py) and estimated (cost/estimate.py) best bound first, and the
scan stops as soon as the next bound cannot beat the k-th best plan found — so only a handful of
ILPs run even on thousands of GPUs. Partitions are cached on their problem; GroupLinks, which cost
O(GPUs), are computed once per (dp, tp, pp).
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cache, wraps
from operator import attrgetter
from typing import Any

import numpy as np

from planner.cluster import Cluster, Link
from planner.config import ParallelConfig, Partition, Recompute, Training
from planner.cost.estimate import Estimate, estimate, fit_advice
from planner.cost.memory import (
    RankMemoryModel,
    fp8_weight_copy_bytes,
    in_flight_microbatches,
    rank_memory_model,
    sharded_state_bytes,
)
from planner.cost.schedule import JointTypes, RankTerms, costlier_sets, joint_fits, schedule_of
from planner.cost.time import (
    CostKey,
    UnitCost,
    UnitTimer,
    boundary_times,
    data_parallel_time,
    data_parallel_time_of_runs,
    embedding_sync_time,
    optimizer_step_time,
    resharded_costs,
    stage_boundary_s,
    unit_costs,
)
from planner.errors import InfeasibleError, PlannerError
from planner.finetune import parameter_states
from planner.frameworks import framework_named
from planner.gpu import GIB, GPUSpec
from planner.model import BlockSpec, ModelSpec, UnitKind
from planner.placement import GroupLinks, Placement, default_placement
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import Calibration, default_calibration
from planner.search.partition import (
    GAP_REL,
    MEMORY_TOLERANCE,
    PartitionProblem,
    PartitionResult,
    bound_partition,
    dp_partition,
    fits,
    ilp_partition,
    objective_s,
    solver_name,
)
from planner.search.space import FixedOptions, enumerate_configs, require_nonempty

__all__ = ["PlacementFn", "RankedPlan", "SearchResult", "SearchStats", "distinct_layouts", "layout_key",
           "search"]

# Maps a configuration to GPUs. Called once per (dp, tp, pp, cp, hsdp replicas), so it must depend on those only.
PlacementFn = Callable[[Cluster, ParallelConfig], Placement]


@dataclass(frozen=True)
class RankedPlan:
    """One searched plan: configuration, stage split, placement, its estimate and the uniform split's."""

    config: ParallelConfig
    partition: Partition
    placement: Placement
    estimate: Estimate
    uniform: Estimate
    optimal: bool  # proven: the estimate meets a lower bound on every split's estimate for this config
    # that bound (the search's, valid for `estimate` over all splits); None where the plan was refined after the
    # search (planning.lighter_recompute), which bounds the configuration it searched, not this one
    lower_bound_s: float | None


@dataclass(frozen=True)
class SearchStats:
    """What the search did, for the user and the speed benchmark."""

    configurations: int
    pruned_memory: int  # examined and rejected by the memory lower bound
    pruned_time: int  # skipped: time lower bound no better than the k-th best plan (memory never checked)
    infeasible: int  # partitioned, but no stage split fits in memory
    ilps_solved: int
    proven_by_bound: int  # partitions whose rank-load lower bound was met: no solver needed
    cache_hits: int
    bounds_tightened: int  # bound refinements: rank-load pipeline bound, then the least DP exposure
    time_limited: int  # ILPs stopped by --time-limit (their best split so far is used)
    solver: str
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SearchResult:
    plans: tuple[RankedPlan, ...]  # best first
    stats: SearchStats


@dataclass(frozen=True)
class _Candidate:
    """A configuration with its cheap bounds and what partitioning it needs."""

    order: int
    config: ParallelConfig
    time_bound_s: float
    rank_costs: tuple[dict[CostKey, UnitCost], ...]
    boundary_s: tuple[float, ...]
    num_microbatches: int
    split_free_s: float  # the time terms no stage split changes (optimizer, embedding sync, overhead)
    dp_exposed_s: float  # least exposed DP traffic known so far (exact for one stage, else 0 until refined)
    refined: int = 0  # 0: cheap bound; 1: + rank-load pipeline bound; 2: + least DP exposure (`_tighten`)
    pipeline_s: float = 0.0  # the pipeline part of the bound once refined
    memory_need_bytes: float = 0.0  # the memory bound (`_with_memory`), computed when first examined
    memory_available_bytes: float = math.inf
    most_by_type: tuple[tuple[float, ...], ...] | None = None  # per block type, most each rank holds (`_most_blocks`)
    joint: JointTypes | None = None  # mixed block types: every type's time and bytes per rank, each rank's room

    @property
    def fits_bound(self) -> bool:
        """Whether some split may fit: the ranks' memory together, and each rank's own, hold the model."""
        return self.memory_need_bytes <= self.memory_available_bytes and self.most_by_type is not None

    @property
    def most_blocks(self) -> tuple[float, ...]:
        """Most blocks each rank's memory holds, each at the smallest block type's bytes."""
        assert self.most_by_type is not None
        return tuple(map(max, zip(*self.most_by_type, strict=True)))


class _Context:
    """Per-search caches: links per degree triple, unit costs per (GPU, TP link, setting), partitions."""

    def __init__(self, model: ModelSpec, cluster: Cluster, training: Training, placement_fn: PlacementFn,
                 timer: UnitTimer, calibration: Calibration) -> None:
        self.model, self.cluster, self.training = model, cluster, training
        self.placement_fn, self.timer, self.calibration = placement_fn, timer, calibration
        self.parameter_states = parameter_states(model, training)
        self.links: dict[tuple[int, ...], tuple[Placement, GroupLinks]] = {}
        self.costs: dict[tuple, dict[CostKey, UnitCost]] = {}
        self.link_index: dict[tuple, int] = {}  # `unit_links`: each distinct (GPU, TP, CP, EP links), its index
        self.distinct_links: list[tuple] = []
        self.block_types: tuple[tuple[BlockSpec, int], ...] = tuple(model.block_types().items())
        self.unit_counts: tuple[tuple[CostKey, int], ...] = ((UnitKind.EMBEDDING, 1), (UnitKind.HEAD, 1),
                                                             *self.block_types)
        keys = tuple(dict.fromkeys(model.unit_cost_keys))
        # the distinct cost keys and each unit's position among them (no per-unit hashing of block types)
        self.unit_types = (keys, tuple(keys.index(key) for key in model.unit_cost_keys))
        self.partitions: dict[PartitionProblem, PartitionResult | None] = {}
        # per problem without memory limits: False (seen once, not solved) or its solution
        self.unlimited: dict[PartitionProblem, PartitionResult | bool | None] = {}
        self.rank_bounds: dict[tuple, float] = {}
        self.dp_tables: dict[tuple, np.ndarray] = {}
        self.per_config: dict[tuple, tuple] = {}  # per-rank costs and boundaries per (links, setting)
        self.terms: dict[tuple, RankTerms] = {}
        self.memories: dict[tuple, tuple[RankMemoryModel, float]] = {}

    def placed(self, config: ParallelConfig) -> tuple[Placement, GroupLinks]:
        """The configuration's placement and group links: the placement and every link but the expert groups' once
        per (dp, tp, pp, cp, hsdp replicas), the expert groups' once per ep and etp besides."""
        key = _placement_key(config)
        if key not in self.links:
            dense = key[:len(_DENSE_PLACEMENT_FIELDS)]
            if dense not in self.links:
                placement = self.placement_fn(self.cluster, config)
                links = GroupLinks.without_experts(self.cluster, config, placement)
                for rank, gpu in enumerate(links.gpu):
                    if not gpu.supports(self.training.dtype):
                        raise PlannerError(f"{self.training.dtype} is not supported by {gpu.name} "
                                           f"(pipeline rank {rank})")
                self.links[dense] = (placement, links)
            placement, links = self.links[dense]
            self.links[key] = (placement, links.with_experts(self.cluster, config, placement))
        return self.links[key]

    def setting_costs(self, config: ParallelConfig, links: GroupLinks) -> tuple[dict[CostKey, UnitCost], ...]:
        """Each pipeline rank's unit costs for the configuration's setting before any MoE resharding: the
        times, which no sharding changes (`resharded_costs` replaces parameters only)."""
        setting = _setting(config)
        whole = (id(links), "setting", *setting)
        if whole not in self.per_config:
            tables: dict[int, dict[CostKey, UnitCost]] = {}  # per distinct rank links, by `unit_links` index
            for index in self.unit_links(config, links):
                if index not in tables:
                    key = (index, *setting)
                    if key not in self.costs:
                        gpu, tp_link, cp_link, ep_link = self.distinct_links[index]
                        self.costs[key] = unit_costs(self.model, self.training, config, gpu, tp_link, self.timer,
                                                     self.calibration, cp_link, ep_link)
                    tables[index] = self.costs[key]
            self.per_config[whole] = tuple(tables[index] for index in self.unit_links(config, links))
            self.per_config[(*whole, "distinct")] = tuple({id(table): table for table in tables.values()}.values())
        return self.per_config[whole]

    def distinct_setting_costs(self, config: ParallelConfig, links: GroupLinks) -> tuple[dict[CostKey, UnitCost], ...]:
        """`setting_costs` without repeats (ranks alike in links share one table)."""
        self.setting_costs(config, links)
        return self.per_config[(id(links), "setting", *_setting(config), "distinct")]

    def unit_links(self, config: ParallelConfig, links: GroupLinks) -> tuple[int, ...]:
        """Per pipeline rank, the index in `distinct_links` of what its unit costs depend on besides the setting:
        its GPU and TP ring, its CP ring when cp > 1 and its expert links when ep > 1 (links of equal value share
        one index, so their unit costs are computed once, and a cost key hashes no link)."""
        whole = (id(links), "unit links")
        if whole not in self.per_config:
            out = []
            for gpu, tp_link, cp_link, ep_link in zip(links.gpu, links.tp, links.cp, links.ep, strict=True):
                value = (gpu, tp_link, cp_link if config.cp > 1 else None, ep_link if config.ep > 1 else None)
                out.append(self.link_index.setdefault(value, len(self.link_index)))
                if out[-1] == len(self.distinct_links):  # the first ranks' links stand for the equal ones
                    self.distinct_links.append((gpu, tp_link, cp_link, ep_link))
            self.per_config[whole] = tuple(out)
        return self.per_config[whole]

    def rank_costs(self, config: ParallelConfig, links: GroupLinks) -> tuple[dict[CostKey, UnitCost], ...]:
        """Each pipeline rank's unit costs under the configuration's sharding (`setting_costs`, resharded)."""
        # an MoE block's state weighting (`_block_parameters`) depends on the sharding, nothing else does
        if not self.model.is_moe:
            return self.setting_costs(config, links)
        whole = (id(links), *_setting(config), config.dp, config.distributed_optimizer, config.zero_stage)
        if whole not in self.per_config:
            self.per_config[whole] = tuple(self.resharded(config, cost) for cost in self.setting_costs(config, links))
        return self.per_config[whole]

    def first_rank_costs(self, config: ParallelConfig, links: GroupLinks) -> dict[CostKey, UnitCost]:
        """`rank_costs(config, links)[0]` without resharding the other ranks' tables (what a whole-model total
        needs: every rank holds the same parameters and activations per unit)."""
        first = self.setting_costs(config, links)[0]
        return self.resharded(config, first) if self.model.is_moe else first

    def resharded(self, config: ParallelConfig, cost: dict[CostKey, UnitCost]) -> dict[CostKey, UnitCost]:
        """A setting's unit costs (`setting_costs`) under the configuration's sharding (MoE models only)."""
        key = (id(cost), config.dp, config.distributed_optimizer, config.zero_stage)  # tables live with the context
        if key not in self.costs:
            self.costs[key] = resharded_costs(self.model, self.training, config, cost)
        return self.costs[key]

    def boundary(self, config: ParallelConfig, links: GroupLinks) -> tuple[float, ...]:
        """`boundary_times` of the configuration's rank boundaries (an overlapped transfer hides behind the ranks'
        block forward, so those depend on the setting's unit costs too)."""
        whole = (id(links), "p2p", config.tp, config.micro_batch, config.cp, config.p2p_overlapped,
                 *(_setting(config) if config.p2p_overlapped else ()))
        if whole not in self.per_config:
            costs = self.setting_costs(config, links) if config.p2p_overlapped else [{}] * config.pp
            self.per_config[whole] = tuple(boundary_times(self.model, self.training, config, links.pp, costs,
                                                          self.calibration))
        return self.per_config[whole]

    def memory_kinds(self, links: GroupLinks) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The pipeline ranks memory tells apart — by being first or last (the tied-embedding communicator,
        the loss's logits) and by GPU; within a kind only the in-flight micro-batches differ — as (a
        representative rank per kind, the last rank's kind last; each rank's kind)."""
        whole = (id(links), "memory kinds")
        if whole not in self.per_config:
            pp = len(links.gpu)
            keys = [(r == 0, r == pp - 1, id(links.gpu[r])) for r in range(pp)]
            order = [*dict.fromkeys(key for key in keys if key != keys[-1]), keys[-1]]
            self.per_config[whole] = (tuple(keys.index(key) for key in order),
                                      tuple(order.index(key) for key in keys))
        return self.per_config[whole]

    def memory_models(self, config: ParallelConfig, links: GroupLinks, m: int) -> tuple[tuple[RankMemoryModel, ...],
                                                                                          float]:
        """The memory model of each kind of rank (`memory_kinds`) and the fixed bytes of all ranks, shared by
        configurations that differ only in what does not touch memory (the CP exchange variant, TP overlap)."""
        key = (id(links), m, _memory_key(config))
        if key not in self.memories:
            representatives, kind_of = self.memory_kinds(links)
            models = tuple(rank_memory_model(self.model, self.training, config, r, m, links.gpu[r], self.calibration,
                                             self.parameter_states)
                           for r in representatives)
            ranks = Counter(kind_of)
            self.memories[key] = (models, sum(model.fixed_bytes * ranks[kind] for kind, model in enumerate(models)))
        return self.memories[key]

    def least_memory_factors(self, config: ParallelConfig, m: int, links: GroupLinks) -> tuple[float, float, float]:
        """(Model-state bytes per parameter, the least FP8 weight-copy bytes per FP8-linear parameter of any rank's
        GPU, bytes held per activation byte of one micro-batch on the rank with the fewest in flight): the whole
        pipeline's least need, before any rank's memory model is built."""
        in_flight = min(self.in_flight(config, m))
        states = sharded_state_bytes(config, self.training.grad_bytes, self.parameter_states)
        copies = min(fp8_weight_copy_bytes(self.training, config, gpu) for gpu in self.gpu_types(links))
        return states.total, copies, (1 + self.calibration.allocator_fragmentation) * in_flight

    def in_flight(self, config: ParallelConfig, m: int) -> tuple[float, ...]:
        """Each pipeline rank's in-flight micro-batches."""
        key = ("in flight", config.schedule, config.pipeline_order, config.pp, config.vpp, m)
        if key not in self.per_config:
            self.per_config[key] = tuple(in_flight_microbatches(config, r, m) for r in range(config.pp))
        return self.per_config[key]

    def head_activation_factor(self, config: ParallelConfig, m: int) -> float:
        """Bytes the last stage's rank holds per byte of the head's activations per micro-batch
        (`RankMemoryModel.head_activation_factor`)."""
        return ((1 + self.calibration.allocator_fragmentation)
                * config.pipeline_schedule.head_in_flight(config.pp, config.vpp, m))

    def capacity_bytes(self, links: GroupLinks) -> float:
        """All pipeline ranks' memory together."""
        key = (id(links), "capacity")
        if key not in self.per_config:
            self.per_config[key] = float(sum(links.capacity_bytes))
        return self.per_config[key]

    def gpu_types(self, links: GroupLinks) -> tuple[GPUSpec, ...]:
        """The distinct GPUs of the pipeline ranks (by identity: no hashing of each rank's spec per call)."""
        key = (id(links), "gpu types")
        if key not in self.per_config:
            self.per_config[key] = tuple({id(gpu): gpu for gpu in links.gpu}.values())
        return self.per_config[key]

    def least_load(self, config: ParallelConfig, costs: tuple[dict[CostKey, UnitCost], ...],
                   boundary_s: tuple[float, ...]) -> tuple[float, float]:
        """(The least sum of all ranks' loads per micro-batch — every rank's fixed terms, every block at its
        type's cheapest rank's time —, the model's parameters per TP rank), shared by the configurations
        alike in both."""
        key = ("least load", config.pp, config.vpp, id(costs), id(boundary_s))
        if key not in self.per_config:
            terms = self.rank_terms(config, costs, boundary_s)
            least_sum = sum(terms.fixed_s) + sum(count * min(cost[block].total_s for cost in costs)
                                                 for block, count in self.block_types)
            self.per_config[key] = (least_sum, _model_total(self, costs[0], "params"))
        return self.per_config[key]

    def rank_terms(self, config: ParallelConfig, costs: tuple[dict[CostKey, UnitCost], ...],
                   boundary_s: tuple[float, ...]) -> RankTerms:
        """Per rank: what a split cannot change (its end units, its stages' boundaries at both ends —
        `stage_boundary_s`'s rule over the rank's stages in the schedule's layout), the cheapest block type's time and
        the largest and least block forward times (with mixed block types every bound term stays a lower bound: a
        rank's load grows by at least the cheapest block, 1F1B's bound subtracts forward work, the zero-bubble
        ones add the least), the fewest blocks
        (every stage needs a unit) and its least stage; one array computation over the ranks."""
        ranks = config.stage_ranks
        key = (ranks, id(costs), id(boundary_s))  # both are this context's cached tuples
        if key not in self.terms:
            pp, v = config.pp, config.vpp
            embedding, head, embedding_forward, head_forward, block, forward_block, least_forward_block = np.array(
                [self.unit_terms(cost) for cost in costs]).T
            rank = np.arange(pp)
            first, last = rank == ranks[0], rank == ranks[-1]
            stage_p2p = np.asarray(stage_boundary_s(boundary_s, len(ranks), config.schedule), dtype=float)
            first_stage = _first_stages(ranks)
            fixed = embedding * first + head * last + np.bincount(ranks, weights=stage_p2p, minlength=pp)
            # a pass carries half of each boundary its first chunk's stage touches
            forward_fixed = embedding_forward * first + head_forward * last + stage_p2p[first_stage] / 2
            least_stage = np.where(first, embedding, block) + np.asarray(boundary_s, dtype=float)
            self.terms[key] = RankTerms(tuple(fixed.tolist()), tuple(block.tolist()),
                                        tuple(np.maximum(v - first - last, 0).tolist()), tuple(forward_fixed.tolist()),
                                        tuple(forward_block.tolist()), tuple(least_stage.tolist()),
                                        least_forward_block_s=tuple(least_forward_block.tolist()))
        return self.terms[key]

    def unit_terms(self, cost: dict[CostKey, UnitCost]) -> tuple[float, ...]:
        """Of one rank's cost table: (embedding and head time, their forward passes, the cheapest block type's
        time, the largest and the least block forward pass)."""
        key = (id(cost), "unit terms")
        if key not in self.per_config:
            embedding, head = cost[UnitKind.EMBEDDING], cost[UnitKind.HEAD]
            forwards = [cost[b].forward_pass_s for b, _ in self.block_types]
            self.per_config[key] = (embedding.total_s, head.total_s, embedding.forward_pass_s, head.forward_pass_s,
                                    min(cost[b].total_s for b, _ in self.block_types), max(forwards), min(forwards))
        return self.per_config[key]


_DENSE_PLACEMENT_FIELDS = ("dp", "tp", "pp", "cp", "hsdp_replicas")
"""What a configuration's placement depends on (`PlacementFn`), and its group links but the expert groups'."""
_PLACEMENT_FIELDS = (*_DENSE_PLACEMENT_FIELDS, "ep", "etp")
_SETTING_FIELDS = ("tp", "micro_batch", "sequence_parallel", "recompute", "tp_comm_overlap", "cp", "cp_comm", "ep",
                   "etp", "moe_dispatcher", "moe_ep_overlap")
_placement_key: Callable[[ParallelConfig], tuple] = attrgetter(*_PLACEMENT_FIELDS)
"""What a configuration's placement and group links depend on."""
_setting: Callable[[ParallelConfig], tuple] = attrgetter(*_SETTING_FIELDS)
"""What a configuration's unit costs depend on besides its links (and, for MoE blocks, its sharding)."""
_FAMILY_FIELDS = tuple(dict.fromkeys(_PLACEMENT_FIELDS + _SETTING_FIELDS))
_family_key: Callable[[ParallelConfig], tuple] = attrgetter(*_FAMILY_FIELDS)
"""Placement and setting at once (`_Family`): one C-level call per configuration of the space."""
_KIN_FIELDS = tuple(name for name in _FAMILY_FIELDS if name not in ("recompute", "moe_ep_overlap"))
_kin_key: Callable[[ParallelConfig], tuple] = attrgetter(*_KIN_FIELDS)
"""A family's placement and setting but recompute and EP overlap (`_Kin`)."""


@dataclass(frozen=True)
class _Family:
    """Configurations alike in placement and unit-cost setting (so in micro-batches), which differ only in
    schedule, chunks per rank and sharding; the search bounds them together and builds their candidates
    (`_bound`) only when that bound reaches the top of its heap."""

    order: int  # its first member's: the family comes off the heap before any of its members would
    bound_s: float  # at most every member's cheap bound (`_family_bound`)
    members: tuple[int, ...]


@dataclass(frozen=True)
class _Kin:
    """Families alike but in recompute (none, selective, full) and EP overlap. Recompute only adds to a unit's time
    (the forward again, its TP collectives, CP exchange and expert all-to-alls; `_block_cost`) and EP overlap only
    hides all-to-alls (`_ep_overlap_exposed_s` leaves at most the 2·one-way each pass shows without it), so one
    bound from the unit costs without recompute, with EP overlap where a family has it (`_kin_bound`), holds for
    them all, and the others' unit costs are computed only when it reaches the top of the heap."""

    order: int  # its first family's: the kin comes off the heap before any of its families would
    bound_s: float  # at most every family's bound
    families: tuple[tuple[int, ...], ...]  # each family's members, in enumeration order


def _kins(ctx: _Context, configs: list[ParallelConfig]) -> list[_Kin]:
    """The configurations grouped into families and the families into kins, each kin with its bound, in
    enumeration order."""
    families: dict[tuple, list[int]] = {}
    for order, config in enumerate(configs):
        families.setdefault(_family_key(config), []).append(order)
    kins: dict[tuple, list[tuple[int, ...]]] = {}
    for orders in families.values():
        kins.setdefault(_kin_key(configs[orders[0]]), []).append(tuple(orders))
    return [_Kin(members[0][0], _kin_bound(ctx, configs, members), tuple(members)) for members in kins.values()]


def _kin_bound(ctx: _Context, configs: list[ParallelConfig], families: list[tuple[int, ...]]) -> float:
    """`_family_bound` of all the kin's members at once, with the unit costs of its setting without recompute and
    with EP overlap if a family has it: at most each family's (every unit time, so the least load, no larger; the
    least rate over more schedules)."""
    members = [configs[order] for orders in families for order in orders]
    base = next((member for member in members if member.moe_ep_overlap), members[0])
    bare = base if base.recompute is Recompute.NONE else replace(base, recompute=Recompute.NONE)
    return _family_bound(ctx, bare, members)


def _family(ctx: _Context, configs: list[ParallelConfig], members: tuple[int, ...]) -> _Family:
    """The family of these members with its bound."""
    return _Family(members[0], _family_bound(ctx, configs[members[0]], [configs[order] for order in members]),
                   members)


def _family_bound(ctx: _Context, config: ParallelConfig, members: list[ParallelConfig]) -> float:
    """A lower bound on the cheap bound (`_bound`) of every member: the pipeline term a·S/pp + b·S at the least
    a/pp + b of the members' schedules, with S — the least sum of rank loads — cut to every unit at its cheapest
    rank's time (no stage boundaries) in `config`'s setting, plus the fixed overhead; the optimizer step, the
    embedding sync and one stage's DP exposure, all ≥ 0, are left out. Members share the unit times: sharding
    changes only parameters."""
    costs = ctx.distinct_setting_costs(config, ctx.placed(config)[1])
    least_sum = sum(count * min(cost[key].total_s for cost in costs) for key, count in ctx.unit_counts)
    m = config.num_microbatches(ctx.training.global_batch)
    forms = (schedule_of(schedule).bound_form(m) for schedule in {member.schedule for member in members})
    rate = min(a / config.pp + b for a, b in forms)
    return rate * least_sum + ctx.calibration.iteration_overhead_s


@cache
def _first_stages(ranks: tuple[int, ...]) -> np.ndarray:
    """Each pipeline rank's first stage (its chunk 0) in a stage-to-rank layout."""
    return np.unique(ranks, return_index=True)[1]


def _bound(ctx: _Context, order: int, config: ParallelConfig) -> _Candidate:
    """A cheap lower bound on time, valid for every stage split, in O(pp): the pipeline time with every
    rank at the average load (every block at its type's cheapest rank's time), plus the terms of estimate()
    that do not depend on the split (least optimizer step, tied-embedding all-reduce, fixed overhead; the
    exposed DP traffic, exact for one stage).
    `_tighten` refines it for candidates that get close; memory is checked then (`_with_memory`), so
    configurations the time bound skips never pay for their memory model."""
    model, training, cal = ctx.model, ctx.training, ctx.calibration
    _, links = ctx.placed(config)
    costs = ctx.rank_costs(config, links)
    m = config.num_microbatches(training.global_batch)
    boundary = ctx.boundary(config, links)
    a, b = schedule_of(config.schedule).bound_form(m)
    least_sum, params = ctx.least_load(config, costs, boundary)
    pipeline = a * least_sum / config.pp + b * least_sum
    optimizer = min(optimizer_step_time(params / config.pp, config, gpu, cal, ctx.parameter_states,
                                        training.grad_bytes) for gpu in ctx.gpu_types(links))
    embedding_sync = embedding_sync_time(model, training, config, links.pp[-1], cal)
    dp_exposed = _least_dp_exposure(ctx, config, m, costs, links) if config.pp == 1 else 0.0
    split_free_s = optimizer + embedding_sync + cal.iteration_overhead_s
    return _Candidate(order, config, pipeline + dp_exposed + split_free_s, costs, boundary, m, split_free_s,
                      dp_exposed)


def _model_total(ctx: _Context, costs: dict[CostKey, UnitCost], name: str) -> float:
    """A per-unit quantity of `UnitCost` (parameters, activation bytes) summed over the whole model per TP rank
    (per cost table: each lives as long as the context)."""
    key = (id(costs), name)
    if key not in ctx.per_config:
        ctx.per_config[key] = (getattr(costs[UnitKind.EMBEDDING], name) + getattr(costs[UnitKind.HEAD], name)
                               + sum(count * getattr(costs[block], name) for block, count in ctx.block_types))
    return ctx.per_config[key]


def _with_memory(ctx: _Context, candidate: _Candidate) -> _Candidate:
    """The candidate with its memory bounds, valid for every stage split. First the whole pipeline: model
    states plus the fewest in-flight activations, spread perfectly over all ranks (every rank shares the
    per-parameter cost; every rank holds at least the fewest in-flight micro-batches of any rank; each rank's
    fixed bytes are its own). Then, when that holds, each rank's own: the most blocks its memory holds
    (`_most_blocks`) must reach its fewest, and all ranks together every block — 1F1B's first rank keeps pp
    micro-batches in flight, so the total alone misses most layouts that cannot fit —, and all ranks together
    every block of each type at its own bytes (an MoE block can hold many times a dense one's)."""
    config, costs = candidate.config, candidate.rank_costs
    _, links = ctx.placed(config)
    need = _pipeline_need_bytes(ctx, config, costs, candidate.num_microbatches, links)
    available = ctx.capacity_bytes(links)
    if need > available:  # short even before any rank's fixed bytes: no other rank's model is needed
        return replace(candidate, memory_need_bytes=need, memory_available_bytes=available)
    available -= ctx.memory_models(config, links, candidate.num_microbatches)[1]
    most, joint = _most_blocks(ctx, candidate) if need <= available else (None, None)
    if most is not None:
        fewest_blocks, blocks = ctx.rank_terms(config, costs, candidate.boundary_s).lower, ctx.model.num_layers
        caps, counts = tuple(map(max, zip(*most, strict=True))), [count for _, count in ctx.block_types]
        if (any(cap < low for cap, low in zip(caps, fewest_blocks, strict=True)) or not _room_for(caps, blocks)
                or not all(_room_for(type_caps, count) for type_caps, count in zip(most, counts, strict=True))
                or (joint is not None and not joint_fits(fewest_blocks, joint))):
            most = None
    return replace(candidate, memory_need_bytes=need, memory_available_bytes=available, most_by_type=most,
                   joint=joint)


def _pipeline_need_bytes(ctx: _Context, config: ParallelConfig, costs: tuple[dict[CostKey, UnitCost], ...],
                         m: int, links: GroupLinks) -> float:
    """The whole pipeline's least memory need over every split: model states plus the fewest in-flight activations
    of any rank (`_with_memory`), before any rank's fixed bytes."""
    param_bytes, copy_bytes, activation_factor = ctx.least_memory_factors(config, m, links)
    head = costs[0][UnitKind.HEAD].activation_bytes
    head_factor = ctx.head_activation_factor(config, m)
    return (param_bytes * _model_total(ctx, costs[0], "params")
            + copy_bytes * _model_total(ctx, costs[0], "linear_params")
            + activation_factor * (_model_total(ctx, costs[0], "activation_bytes") - head)
            + min(activation_factor, head_factor) * head)


def _fits_pipeline(ctx: _Context, config: ParallelConfig) -> bool:
    """Whether the configuration passes `_with_memory`'s first test (its whole pipeline's least need within all its
    ranks' memory) — checked when its family is opened, so members that cannot fit are never bounded."""
    _, links = ctx.placed(config)
    need = _pipeline_need_bytes(ctx, config, (ctx.first_rank_costs(config, links),),
                                config.num_microbatches(ctx.training.global_batch), links)
    return need <= ctx.capacity_bytes(links)


def _room_for(most: tuple[float, ...], blocks: int) -> bool:
    """Whether ranks holding at most `most` blocks each hold `blocks` together."""
    return sum(min(cap, blocks) for cap in most) >= blocks


def _memory_key(config: ParallelConfig) -> tuple:
    """The configuration without the fields memory does not depend on (CP exchange variant, TP overlap)."""
    return tuple(value for name, value in vars(config).items() if name not in ("cp_comm", "tp_comm_overlap"))


def _members(ctx: _Context, configs: list[ParallelConfig], family: _Family, variants: dict[int, list[int]],
             undominated: dict[int, set[int]]) -> Iterator[tuple[int, ParallelConfig]]:
    """A family's members (order, configuration as the space built it), less the CP exchange variants another
    variant dominates (`undominated` caches them per group of variants, by its first order)."""
    for order in family.members:
        group = variants.get(order)
        if group is not None:
            if group[0] not in undominated:
                undominated[group[0]] = _undominated_cp_comms(ctx, [configs[o] for o in group], group)
            if order not in undominated[group[0]]:
                continue
        yield order, configs[order]


def _cp_comm_variants(configs: list[ParallelConfig]) -> dict[int, list[int]]:
    """Per configuration with context parallelism, the orders of its CP exchange variants (itself included):
    the configurations equal to it but in `cp_comm`."""
    groups: dict[tuple, list[int]] = {}
    for order, config in enumerate(configs):
        if config.cp > 1:
            groups.setdefault(tuple(value for name, value in vars(config).items() if name != "cp_comm"),
                              []).append(order)
    return {order: orders for orders in groups.values() for order in orders}


def _undominated_cp_comms(ctx: _Context, variants: list[ParallelConfig], orders: list[int]) -> set[int]:
    """The orders of the CP exchange variants of one configuration to bound: all but those another variant
    dominates. Variants differ only in each block's exposed CP time (memory, DP traffic and everything else
    are equal), and the estimate only grows with a unit's time, so a variant no faster than another for every
    block type on every pipeline rank can never rank above it (ties keep the earlier variant)."""
    times = []
    for config in variants:
        costs = ctx.rank_costs(config, ctx.placed(config)[1])
        times.append([(cost[block].cp_forward_s, cost[block].cp_backward_s)
                      for cost in costs for block, _ in ctx.block_types])
    return {order for i, order in enumerate(orders)
            if not any(all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(times[j], times[i], strict=True))
                       and (j < i or times[j] != times[i]) for j in range(len(orders)) if j != i)}


def _tighten(ctx: _Context, candidate: _Candidate) -> _Candidate:
    """The candidate with its time bound refined one level: first the pipeline's rank-load relaxation,
    then (pipelines only) the least exposed DP traffic any split can have — both from each rank's
    own costs and links. Two levels, so the costlier DP table is built only for close candidates."""
    config, m, costs = candidate.config, candidate.num_microbatches, candidate.rank_costs
    if candidate.refined == 1:
        _, links = ctx.placed(config)
        exposed = _least_dp_exposure(ctx, config, m, costs, links)
        bound = candidate.pipeline_s + exposed + candidate.split_free_s
        return replace(candidate, time_bound_s=max(bound, candidate.time_bound_s), dp_exposed_s=exposed, refined=2)
    assert candidate.most_by_type is not None
    costlier = costlier_sets([[cost[b].total_s for cost in costs] for b, _ in ctx.block_types],
                             [count for _, count in ctx.block_types], candidate.most_by_type
                             ) if len(ctx.block_types) > 1 else ()  # one type: no costlier set (no block hashing)
    terms = replace(ctx.rank_terms(config, costs, candidate.boundary_s), upper=candidate.most_blocks,
                    costlier=costlier, joint=candidate.joint)
    key = (config.schedule, terms, m)
    if key not in ctx.rank_bounds:
        ctx.rank_bounds[key] = schedule_of(config.schedule).lower_bound(terms, m, ctx.model.num_layers)
    return _refined(candidate, ctx.rank_bounds[key])


def _most_blocks(ctx: _Context, candidate: _Candidate) -> tuple[tuple[tuple[float, ...], ...], JointTypes | None]:
    """Per block type (`ctx.block_types`), the most blocks of its bytes each pipeline rank's memory holds beside
    its end units (the accounting of `estimate`, with the partitioner's float tolerance; -1 when not even its end
    units fit): no split that fits gives a rank more, so the rank-load bound may cap them — the fastest layouts
    are the memory-tight ones, where this bound matters. With mixed block types also every type's time and bytes
    and each rank's room at once (`JointTypes`: a rank short of one large block's room may hold a small one).
    Ranks alike in memory kind and costs differ only in their in-flight micro-batches, so each such group's terms
    are computed once."""
    config, m, costs = candidate.config, candidate.num_microbatches, candidate.rank_costs
    _, links = ctx.placed(config)
    models, _ = ctx.memory_models(config, links, m)
    in_flight = ctx.in_flight(config, m)
    most = [[0.0] * config.pp for _ in ctx.block_types]
    type_bytes, rooms = [[0.0] * config.pp for _ in ctx.block_types], [0.0] * config.pp
    head_factor = ctx.head_activation_factor(config, m)
    for kind, first, last, ranks in _memory_groups(ctx, config, links, costs):
        memory, cost = models[kind], costs[ranks[0]]
        ends = [cost[unit] for unit, held in ((UnitKind.EMBEDDING, first), (UnitKind.HEAD, last)) if held]
        end_states = memory.state_bytes(sum(unit.params for unit in ends), sum(unit.linear_params for unit in ends))
        embedding = cost[UnitKind.EMBEDDING].activation_bytes if first else 0.0
        head = cost[UnitKind.HEAD].activation_bytes if last else 0.0
        blocks = [(memory.state_bytes(cost[b].params, cost[b].linear_params), cost[b].activation_bytes)
                  for b, _ in ctx.block_types]
        for r in ranks:
            per_activation = (1 + memory.fragmentation) * in_flight[r]
            held = (end_states + per_activation * embedding + head_factor * head
                    + memory.fixed_bytes)
            room = links.capacity_bytes[r] * (1 + MEMORY_TOLERANCE) - held
            rooms[r] = room
            for t, (params, activations) in enumerate(blocks):
                block = params + per_activation * activations
                most[t][r] = max(math.floor(room / block + 1e-9), -1) if block > 0 else math.inf
                type_bytes[t][r] = block
    joint = None
    if len(ctx.block_types) > 1:
        joint = JointTypes(tuple(tuple(cost[b].total_s for cost in costs) for b, _ in ctx.block_types),
                           tuple(map(tuple, type_bytes)), tuple(count for _, count in ctx.block_types), tuple(rooms))
    return tuple(map(tuple, most)), joint


def _memory_groups(ctx: _Context, config: ParallelConfig, links: GroupLinks,
                   costs: tuple[dict[CostKey, UnitCost], ...]) -> tuple[tuple[int, bool, bool, list[int]], ...]:
    """The pipeline ranks grouped by memory kind, cost table and holding the first or last stage (the
    schedule's layout), as (kind, first, last, ranks)."""
    first, last = config.stage_ranks[0], config.stage_ranks[-1]
    key = (id(links), id(costs), first, last, "memory groups")
    if key not in ctx.per_config:
        kind_of = ctx.memory_kinds(links)[1]
        groups: dict[tuple, list[int]] = {}
        for r in range(len(costs)):
            groups.setdefault((kind_of[r], id(costs[r]), r == first, r == last), []).append(r)
        ctx.per_config[key] = tuple((kind, first, last, ranks) for (kind, _, first, last), ranks in groups.items())
    return ctx.per_config[key]


def _refined(candidate: _Candidate, pipeline_s: float) -> _Candidate:
    """The candidate with the pipeline part of its bound refined (level 1; level 2 for one stage)."""
    bound = pipeline_s + candidate.dp_exposed_s + candidate.split_free_s
    return replace(candidate, time_bound_s=max(bound, candidate.time_bound_s), pipeline_s=pipeline_s,
                   refined=2 if candidate.config.pp == 1 else 1)


def _least_dp_exposure(ctx: _Context, config: ParallelConfig, m: int, costs: tuple[dict[CostKey, UnitCost], ...],
                       links: GroupLinks) -> float:
    """Least max over ranks of the DP traffic the schedule exposes, over all blocks-per-rank counts.

    A rank's exposure depends on its units' parameters (traffic) and compute (hiding), all fixed
    by how many blocks of each type it holds when the blocks of a type are alike; so g_r is tabulated per kind
    of rank over those counts (`_dp_exposure_table`), and the least threshold E such that, for every block type
    and for the blocks together, Σ_r min{n: g_r ≤ E} ≤ blocks ≤ Σ_r max{n: g_r ≤ E} is a lower bound (exact
    when each {n: g_r(n) ≤ E} is an interval and the blocks are alike, a relaxation otherwise). With mixed block
    types it is exact for one stage (the whole model); for a pipeline g_r is a bound valid for every order of
    the rank's blocks: which blocks a rank holds, and in what order, is not known.
    """
    pp, v = config.pp, config.vpp
    if len(ctx.block_types) > 1 and pp == 1:
        units = [costs[0][key] for key in ctx.model.unit_cost_keys]
        return data_parallel_time(units, ctx.training, config, links.dp[0], ctx.calibration, m,
                                  links.replicate[0], ctx.parameter_states, links.edp[0]).exposed_s
    groups: dict[tuple, list[int]] = {}
    for r in range(pp):
        groups.setdefault((id(costs[r]), links.dp[r], links.replicate[r], links.edp[r], r == config.stage_ranks[0],
                           r == config.stage_ranks[-1]), []).append(r)
    tables, weights = [], []
    for (_, dp_link, replicate_link, edp_link, first, last), ranks in groups.items():
        key = (id(costs[ranks[0]]), dp_link, replicate_link, edp_link, first, last, v, config.pp > 1,
               config.replicas, config.edp, config.hsdp_replicas, config.optimizer_sharding,
               config.reshard_after_forward, config.overlap_grad_reduce, config.overlap_param_gather,
               m if config.optimizer_sharding >= 2 else 0)
        if key not in ctx.dp_tables:
            ctx.dp_tables[key] = _dp_exposure_table(ctx, config, m, costs[ranks[0]], (dp_link, edp_link),
                                                    replicate_link, first, last)
        tables.append(ctx.dp_tables[key])
        weights.append(len(ranks))
    totals = np.array([*(count for _, count in ctx.block_types), ctx.model.num_layers])
    thresholds = np.unique(np.concatenate([values for values, _ in tables]))

    def feasible(limit: float) -> bool:
        low = high = 0
        for (values, counts), weight in zip(tables, weights, strict=True):
            allowed = counts[values <= limit]
            if not len(allowed):
                return False
            low, high = low + weight * allowed.min(axis=0), high + weight * allowed.max(axis=0)
        return bool(np.all((low <= totals) & (totals <= high)))

    lo, hi = 0, len(thresholds) - 1
    if hi < 0 or not feasible(thresholds[hi]):
        return 0.0
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(thresholds[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(thresholds[lo])


MIXES_MAX = 1 << 16
"""Most mixes of block types `_dp_exposure_table` tabulates (a catalogue model has at most 3,125); beyond, a
pipeline rank's DP exposure is bounded by 0."""


def _dp_exposure_table(ctx: _Context, config: ParallelConfig, m: int, cost: dict[CostKey, UnitCost],
                       dp_links: tuple[Link, Link], replicate_link: Link, first: bool, last: bool
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(Exposed DP traffic, the blocks of each type (`ctx.block_types`) and in all) of a rank of this kind, for every
    number of blocks it can hold: one call over all counts at once, the run of blocks' length being an array.
    `dp_links`: the dense and the expert data-parallel groups' rings. With mixed block types (a pipeline): every mix
    of them, each type's count an array along its own axis, at the exposure bound valid for any order of the rank's
    blocks (`data_parallel_time_of_runs`'s `any_order`)."""
    layers = ctx.model.num_layers
    head, tail = ((cost[UnitKind.EMBEDDING], 1),) * first, ((cost[UnitKind.HEAD], 1),) * last
    dp_link, edp_link = dp_links
    mixed = len(ctx.block_types) > 1
    least = layers if config.pp == 1 else max(config.vpp - first - last, 0)

    def exposed(*middle: tuple[UnitCost, Any], shape: tuple[int, ...] = ()) -> np.ndarray:
        """The exposure of the rank holding `middle` between its end units, as an array of `shape` (without a DP
        group it is a plain 0)."""
        return np.broadcast_to(data_parallel_time_of_runs(
            (*head, *middle, *tail), ctx.training, config, dp_link, ctx.calibration, m, replicate_link,
            ctx.parameter_states, edp_link, mixed).exposed_s, shape)

    if not mixed:
        counts = np.arange(max(least, 1), layers + 1)  # run lengths ≥ 1
        values = exposed((cost[ctx.block_types[0][0]], counts), shape=counts.shape)
        if least == 0:  # a rank with both ends may hold no block
            counts, values = np.concatenate(([0], counts)), np.concatenate((exposed(shape=(1,)), values))
        return values, np.stack((counts, counts), axis=1)
    grid = tuple(count + 1 for _, count in ctx.block_types)  # every mix: 0..count blocks of each type
    if math.prod(grid) > MIXES_MAX:
        totals = np.arange(least, layers + 1)
        return np.zeros(len(totals)), np.column_stack((np.zeros((len(totals), len(grid)), dtype=int), totals))
    counts = np.indices(grid).reshape(len(grid), -1).T
    axes = [np.arange(size).reshape([size if axis == t else 1 for axis in range(len(grid))])
            for t, size in enumerate(grid)]
    values = exposed(*((cost[block], held) for (block, _), held in zip(ctx.block_types, axes, strict=True)),
                     shape=grid).reshape(-1)
    counts = np.column_stack((counts, counts.sum(axis=1)))
    keep = counts[:, -1] >= least
    return values[keep], counts[keep]


def _problem(ctx: _Context, candidate: _Candidate) -> PartitionProblem:
    """The partition problem of a candidate: per-rank unit times and memory (each unit its type's), budgets."""
    config, cal, m = candidate.config, ctx.calibration, candidate.num_microbatches
    _, links = ctx.placed(config)
    keys, type_of = ctx.unit_types
    times, memories, budgets = [], [], []
    for r, costs in enumerate(candidate.rank_costs):
        rank = rank_memory_model(ctx.model, ctx.training, config, r, m, links.gpu[r], cal, ctx.parameter_states)
        fixed = rank.fixed_bytes
        time_of = [costs[key].total_s for key in keys]
        memory_of = [rank.total(costs[key].params, 0.0, head_activations=costs[key].activation_bytes,
                                linear_params=costs[key].linear_params) - fixed
                     if key is UnitKind.HEAD else
                     rank.total(costs[key].params, costs[key].activation_bytes,
                                linear_params=costs[key].linear_params) - fixed
                     for key in keys]
        times.append(tuple(time_of[t] for t in type_of))
        memories.append(tuple(memory_of[t] for t in type_of))
        budgets.append(float(links.capacity_bytes[r]) - fixed)
    return PartitionProblem(tuple(times), candidate.boundary_s, tuple(memories), tuple(budgets), config.vpp, m,
                            config.schedule)


def _partition_reusing(ctx: _Context, problem: PartitionProblem, time_limit_s: float, ceiling_s: float | None = None
                       ) -> tuple[PartitionResult | None, str]:
    """`_partition`, reusing work across problems that differ only in memory (e.g. the EP degrees of one
    layout, whose expert weights alone differ): from the second such problem on, the optimum without memory
    limits is solved once; where its split fits a problem's memory it is that problem's optimum too (no
    split does better with fewer allowed). "how" adds "unlimited" when reused, "unlimited ilp" when solved.
    `ceiling_s` (`_partition`'s) applies to the problem's own solve, never to the shared unlimited one."""
    unlimited = replace(problem, unit_memory_bytes=tuple((0.0,) * problem.num_units for _ in range(problem.pp)),
                        memory_budget_bytes=(0.0,) * problem.pp)
    seen = ctx.unlimited.get(unlimited)
    if seen is None:
        ctx.unlimited[unlimited] = False  # first of its kind: solve as it is
        return _partition(problem, time_limit_s, ceiling_s)
    how = "unlimited"
    if seen is False:
        ctx.unlimited[unlimited], solved = _partition(unlimited, time_limit_s)
        how += " " + solved
    free = ctx.unlimited[unlimited]
    if free is not None and free.optimal and fits(problem, free.partition.unit_counts):
        return free, how
    found, solved = _partition(problem, time_limit_s, ceiling_s)
    return found, f"{how} {solved}"


def _partition(problem: PartitionProblem, time_limit_s: float, ceiling_s: float | None = None
               ) -> tuple[PartitionResult | None, str]:
    """(result, how: "single stage", "bound", "dp", "ilp" or "none"). The rank-load bound settles most problems
    without a solver. Otherwise, with one chunk per rank the exact DP gives the closed form's optimum and the ILP
    confirms it; with chunks the DP's stage-balanced split (`dp_partition`: each rank paced by its slowest chunk, as
    the simulated order runs) is taken, and only where no split fits its memory shares the ILP runs on the closed
    form, bounded by the relaxation's or the uniform split, and by `ceiling_s` (`ilp_partition`'s: the search's
    incumbent, so it looks only where a split can still reach the top plans)."""
    lower_s, relaxed = bound_partition(problem)
    if problem.num_stages == 1:
        return relaxed, "single stage"
    if relaxed is not None and relaxed.optimal:
        return relaxed, "bound"
    if math.isinf(lower_s):
        return None, "none"
    upper = dp_partition(problem)
    if schedule_of(problem.schedule).chunked:
        if upper is not None:
            return upper, "dp"
        uniform = Partition.uniform(problem.num_units - 2, problem.num_stages).unit_counts
        known = [found for found in (relaxed, PartitionResult(Partition(uniform), objective_s(problem, uniform),
                                                               False, "uniform") if fits(problem, uniform) else None)
                 if found is not None]
        upper = min(known, key=lambda found: found.objective_s) if known else None
    else:
        if upper is None:
            return None, "none"
        lower_s = upper.objective_s  # the DP is exact for one chunk per rank: the ILP only has to meet it
    return ilp_partition(problem, time_limit_s, upper, lower_s, ceiling_s), "ilp"


def _without_cyclic_gc(function: Callable[..., SearchResult]) -> Callable[..., SearchResult]:
    """`function` run with Python's cyclic garbage collector paused (reference counting still frees what is
    dropped), and resumed after if it was on. A search allocates up to 10⁶ objects — layouts, candidates, cost
    tables — that form no cycles and live until it returns, so the collector's full passes over them free nothing:
    DeepSeek-V3 on 2,048 H800 ran 7 of them, 0 objects collected, about 1 s of its 5.5 s. Process-wide while it
    runs (the collector has no per-thread switch)."""
    @wraps(function)
    def paused(*args: Any, **kwargs: Any) -> SearchResult:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()
    return paused


@_without_cyclic_gc
def search(
    model: ModelSpec,
    cluster: Cluster,
    training: Training,
    fixed: FixedOptions | None = None,
    top_k: int = 5,
    time_limit_s: float = 10.0,
    placement_fn: PlacementFn = default_placement,
    timer: UnitTimer | None = None,
    calibration: Calibration | None = None,
) -> SearchResult:
    """The top-k plans by estimated iteration time (ties: less memory, fewer GPUs, enumeration order), each layout
    once (`distinct_layouts`: its fastest way to shard the states; the k-th distinct layout bounds the search).

    Raises InfeasibleError naming the closest configuration's tightest stage when nothing fits.
    """
    if top_k < 1:
        raise PlannerError(f"--top must be at least 1, got {top_k}")
    if time_limit_s <= 0:
        raise PlannerError(f"--time-limit must be positive, got {time_limit_s}")
    started = time.perf_counter()
    fixed = fixed or FixedOptions()
    calibration = calibration or default_calibration()
    ctx = _Context(model, cluster, training, placement_fn, timer or AnalyticProfile(model, calibration), calibration)
    configs = require_nonempty(list(enumerate_configs(model, cluster, training, fixed)), model, cluster, training,
                               fixed)
    variants = _cp_comm_variants(configs)
    undominated: dict[int, set[int]] = {}  # per group of CP exchange variants (its first order), those kept
    # Best bound first, kins before their families, families before their members; when popped, a kin bounds its
    # families, a family builds its members' candidates and a cheap bound is checked for memory, tightened and
    # pushed back (lazy best-first): what the time bound skips is never built or checked for memory.
    heap: list[tuple[float, int, int, Any]] = [(k.bound_s, k.order, -1, k) for k in _kins(ctx, configs)]
    heapq.heapify(heap)
    plans: list[RankedPlan] = []
    rejected: list[_Candidate] = []
    unbuilt: list[tuple[int, ParallelConfig]] = []  # members short of memory when their family opened
    ilps = proven = hits = limited = tightened = pruned_memory = partitioned = infeasible = 0
    while heap:
        bound_s, _, _, item = heap[0]
        if len(plans) >= top_k and bound_s > plans[top_k - 1].estimate.iteration_time_s * (1 + 1e-9):
            break
        heapq.heappop(heap)
        if isinstance(item, _Kin):
            for family in (_family(ctx, configs, members) for members in item.families):
                heapq.heappush(heap, (family.bound_s, family.order, 0, family))
            continue
        if isinstance(item, _Family):
            for order, config in _members(ctx, configs, item, variants, undominated):
                if not _fits_pipeline(ctx, config):  # rejected by `_with_memory` whenever examined: never bounded
                    unbuilt.append((order, config))
                    pruned_memory += 1
                    continue
                candidate = _bound(ctx, order, config.checked())  # what the search bounds passes every check
                heapq.heappush(heap, (candidate.time_bound_s, candidate.order, 1, candidate))
            continue
        candidate = item
        if candidate.refined == 0:
            candidate = _with_memory(ctx, candidate)
            if not candidate.fits_bound:
                rejected.append(candidate)
                pruned_memory += 1
                continue
        if candidate.refined < 2:
            candidate = _tighten(ctx, candidate)
            tightened += 1
            heapq.heappush(heap, (candidate.time_bound_s, candidate.order, 1, candidate))
            continue
        partitioned += 1
        problem = _problem(ctx, candidate)
        capped = False
        if problem in ctx.partitions:
            hits += 1
            found = ctx.partitions[problem]
        else:
            ceiling = _pipeline_ceiling(plans, top_k, candidate)
            found, how = _partition_reusing(ctx, problem, time_limit_s, ceiling)
            ilps += how.count("ilp")
            limited += how.endswith("ilp") and found is not None and not found.optimal
            proven += how.endswith("bound")
            hits += how == "unlimited"
            capped = ceiling is not None and how.endswith("ilp")
            if not capped:  # an ILP under a ceiling answers for that ceiling only
                ctx.partitions[problem] = found
        if found is None and capped:  # no split under the incumbent: pruned by time, not short of memory
            partitioned -= 1
            continue
        plan = _evaluate(ctx, candidate, found)
        if plan is None:
            rejected.append(candidate)
            infeasible += 1
            continue
        plans = list(distinct_layouts((*plans, plan), top_k))  # each layout once, its fastest sharding
    if plans:
        plans[0] = _polished(ctx, plans[0])
    pruned_time = len(configs) - pruned_memory - partitioned  # on the heap, in unopened kins or families, dominated
    stats = SearchStats(
        configurations=len(configs), pruned_memory=pruned_memory, pruned_time=pruned_time,
        infeasible=infeasible, ilps_solved=ilps, proven_by_bound=proven,
        cache_hits=hits, bounds_tightened=tightened,
        time_limited=limited, solver=solver_name(), wall_s=time.perf_counter() - started,
    )
    if not plans:  # every member was examined: those short of memory as a whole pipeline join the rest
        rejected += [_with_memory(ctx, _bound(ctx, order, config.checked())) for order, config in unbuilt]
        raise InfeasibleError(_infeasible_message(ctx, rejected, fixed.framework))
    return SearchResult(tuple(plans), stats)


def _pipeline_ceiling(plans: list[RankedPlan], top_k: int, candidate: _Candidate) -> float | None:
    """The longest simulated pipeline with which `candidate` could still reach the top `top_k` (None until they are
    filled): `estimate` adds to the pipeline the terms no split changes (`split_free_s`) and the exposed DP traffic,
    never below the least any split exposes (`dp_exposed_s`), and a plan must not be slower than the k-th best to
    join (ties rank by memory, so equal is kept)."""
    if len(plans) < top_k:
        return None
    return plans[-1].estimate.iteration_time_s - candidate.split_free_s - candidate.dp_exposed_s


def _rank_key(plan: RankedPlan) -> tuple:
    return (plan.estimate.iteration_time_s, plan.estimate.peak_memory_bytes, plan.config.num_gpus)


def layout_key(config: ParallelConfig) -> ParallelConfig:
    """A configuration without how it shards its states (ZeRO stage, distributed optimizer, DeepSpeed's optimizer,
    HSDP replicas and what follows from them): configurations alike in this are one layout, told apart only by that
    choice."""
    return replace(config, zero_stage=0, distributed_optimizer=False, deepspeed_optimizer="zero", hsdp_replicas=1,
                   fp8_param_gather=False, overlap_param_gather=False, reshard_after_forward=None)


def distinct_layouts(plans: Iterable[RankedPlan], top_k: int) -> tuple[RankedPlan, ...]:
    """The best `top_k` of `plans` by rank, each layout (`layout_key`) once: its best-ranked plan."""
    best: dict[ParallelConfig, RankedPlan] = {}
    for plan in sorted(plans, key=_rank_key):
        best.setdefault(layout_key(plan.config), plan)
    return tuple(best.values())[:top_k]


def _evaluate(ctx: _Context, candidate: _Candidate, found: PartitionResult | None) -> RankedPlan | None:
    """Estimate the partitioned plan and the uniform split and keep the faster one that fits. It is
    claimed optimal only when its estimate meets the candidate's lower bound — a bound valid for
    `estimate` over every split (simulated schedule, DP exposure, optimizer), so the claim is proven
    against what `estimate` reports, not against the partitioner's closed form."""
    if found is None:  # no split fits the partition problem's memory model, the uniform one included
        return None
    config = candidate.config
    placement, links = ctx.placed(config)

    def evaluate(partition: Partition) -> Estimate:
        return estimate(ctx.model, ctx.cluster, ctx.training, config, partition, placement, ctx.timer,
                        ctx.calibration, links, candidate.rank_costs)

    even = Partition.uniform(ctx.model.num_layers, config.num_virtual_stages)
    uniform = evaluate(even)
    start = [(even, uniform)] if uniform.fits else []
    if found.partition != even:
        result = evaluate(found.partition)
        if result.fits:
            start.append((found.partition, result))
    if not start:
        return None
    partition, result = min(start, key=lambda pair: pair[1].iteration_time_s)
    proven = bool(result.iteration_time_s <= candidate.time_bound_s * (1 + GAP_REL))
    return RankedPlan(config, partition, placement, result, uniform, proven, candidate.time_bound_s)


POLISH_ESTIMATES = 32
"""Most estimates spent polishing the best plan's split (`_polished`)."""


def _polished(ctx: _Context, plan: RankedPlan) -> RankedPlan:
    """The best plan with its split improved one block at a time across a stage boundary while `estimate`
    improves (first improvement, at most POLISH_ESTIMATES estimates), unless already proven optimal. The
    partitioner optimises the schedule's closed form, which leaves out what only the estimate sees (each rank's
    exposed DP traffic, the simulated order of passes): on uneven GPUs these can move the best split by
    several blocks, so the closed form's split is the start, and the estimate decides."""
    if plan.optimal or plan.config.num_virtual_stages == 1:
        return plan
    placement, links = ctx.placed(plan.config)
    costs = ctx.rank_costs(plan.config, links)
    best, budget, improved = plan, POLISH_ESTIMATES, True
    while improved and budget > 0:
        improved = False
        counts = best.partition.unit_counts
        for k, step in ((k, step) for k in range(len(counts) - 1) for step in (1, -1)):
            moved = list(counts)
            moved[k], moved[k + 1] = moved[k] - step, moved[k + 1] + step
            if min(moved[k], moved[k + 1]) < 1:
                continue
            if budget == 0:
                break
            budget -= 1
            split = Partition(tuple(moved))
            result = estimate(ctx.model, ctx.cluster, ctx.training, plan.config, split, placement, ctx.timer,
                              ctx.calibration, links, costs)
            if result.fits and result.iteration_time_s < best.estimate.iteration_time_s * (1 - 1e-9):
                best, improved = replace(best, partition=split, estimate=result), True
                break
    return replace(best, optimal=bool(best.estimate.iteration_time_s <= plan.lower_bound_s * (1 + GAP_REL)))


CLOSEST_ESTIMATES_MAX = 256
"""Most uniform-split estimates the search of the nearest configuration runs (smallest bound first)."""


def _closeness(candidate: _Candidate) -> float:
    """A lower bound on the bytes its tightest pipeline rank is short under any split: the ranks together
    lack need − available, so the worst lacks at least the average (0 when the bound alone fits)."""
    return max(candidate.memory_need_bytes - candidate.memory_available_bytes, 0.0) / candidate.config.pp


def _shortfall_bytes(result: Estimate) -> float:
    stage = result.tightest_stage()
    return max(stage.memory.required - stage.memory.capacity, 0.0)


def _nearest(ctx: _Context, rejected: list[_Candidate]) -> tuple[_Candidate, Estimate]:
    """The rejected configuration whose uniform-split estimate is short by the fewest bytes, found by
    branch and bound over `_closeness` (no candidate whose bound exceeds the best shortfall can win)."""
    best: tuple[float, int, _Candidate, Estimate] | None = None
    for count, candidate in enumerate(sorted(rejected, key=lambda c: (_closeness(c), c.order))):
        if best is not None and (_closeness(candidate) >= best[0] or count >= CLOSEST_ESTIMATES_MAX):
            break
        placement, _ = ctx.placed(candidate.config)
        result = estimate(ctx.model, ctx.cluster, ctx.training, candidate.config, None, placement, ctx.timer,
                          ctx.calibration)
        key = (_shortfall_bytes(result), candidate.order)
        if best is None or key < best[:2]:
            best = (*key, candidate, result)
    assert best is not None, "an infeasible search rejected at least one candidate"
    return best[2], best[3]


def _gpus_for_states(ctx: _Context, config: ParallelConfig, gpu: GPUSpec, capacity_bytes: float) -> float:
    """GPUs of this type that the model states alone need, sharded perfectly over all of them: the
    replicated states (weights, gradients, optimizer) over what a GPU holds beyond its fixed bytes."""
    replicated = replace(config, dp=1, cp=1, hsdp_replicas=1, zero_stage=0, distributed_optimizer=False)
    rank = rank_memory_model(ctx.model, ctx.training, replicated, 0, 1, gpu, ctx.calibration)
    room = capacity_bytes - rank.fixed_bytes
    return math.inf if room <= 0 else math.ceil(ctx.model.num_parameters * rank.param_bytes / room)


def _infeasible_message(ctx: _Context, rejected: list[_Candidate], framework: str | None) -> str:
    """The searched configuration nearest to fitting (smallest shortfall by its estimate) and its tightest
    stage; when the model states alone exceed the cluster, how many GPUs of this type they need; the advice only
    what the target `framework` runs."""
    closest, result = _nearest(ctx, rejected)
    stage = result.tightest_stage()
    needed = _gpus_for_states(ctx, closest.config, ctx.placed(closest.config)[1].gpu[stage.pp_rank],
                              stage.memory.capacity)
    advice = (f"the model states alone need at least {needed:,.0f} {stage.gpu} GPUs, the cluster has "
              f"{ctx.cluster.num_gpus:,}" if needed > ctx.cluster.num_gpus else fit_advice(
                  closest.config, result, ctx.training,
                  framework_named(framework or "any").gathers_weights_in_fp8(ctx.training.fp8_recipe)))
    return (
        f"no configuration fits in memory; the closest ({closest.config.describe()}) has stage {stage.index} "
        f"needing {stage.memory.required / GIB:.1f} GiB, {stage.gpu} has {stage.memory.capacity / GIB:.1f} GiB "
        f"(short by {_shortfall_bytes(result) / GIB:.1f} GiB); {advice}"
    )
