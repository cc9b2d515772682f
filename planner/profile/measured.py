"""A measured PROFILE.json (written by `planner profile layers`) as a `UnitTimer` for the cost model.

Times are looked up by (unit kind, TP degree, micro-batch). Micro-batch sizes that were not
measured are interpolated linearly between the nearest measured sizes (time is close to linear
in tokens), extrapolated linearly from the two largest above the range and proportionally from
the smallest below it; each such step is recorded as a note the CLI prints. TP degrees, sequence
lengths, dtypes and attention kernels that were not measured are refused (attention time is
quadratic in the sequence and TP changes GEMM shapes, so scaling would be a guess): the error
names what the profile holds. Sequence parallelism is accepted on a profile measured without it
(it only shards the element-wise norm/dropout work, a few per cent of a block).

Activation memory measured on CUDA (`memory_measured`) replaces the analytic bytes only where it
describes the same tensors: no recompute and the profile's sequence-parallel setting; it is
interpolated in micro-batch like the times. Otherwise the cost model keeps its analytic bytes, noted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from planner.config import ATTENTION_KERNELS, Recompute
from planner.errors import PlannerError
from planner.gpu import GPUSpec
from planner.limits import MAX_SEQ_LEN
from planner.model import ModelSpec, UnitKind, model_from_dict
from planner.profile.analytic import AnalyticProfile, UnitSetting, UnitTimes
from planner.profile.calibration import Calibration
from planner.profile.measure import PROFILE_DTYPES, PROFILE_SCHEMA_VERSION
from planner.resources import load_structured_file

__all__ = ["MeasuredProfile", "bind_to_model", "load_measured_profile", "parse_profile_document"]

_T = TypeVar("_T")
_TIME_FIELDS = ("forward_s", "backward_s", "attention_core_forward_s")


@dataclass(frozen=True)
class MeasuredProfile:
    """Measured unit times of one model on one device type; `fallback` times GPUs the profile is not for.

    `gpu` is the catalog GPU type the profile was measured on, or None (e.g. a CPU profile), in
    which case the times apply to every GPU. `activation_bytes_by_setting` is empty unless memory
    was measured. `notes` collects what was interpolated or defaulted.
    """

    model: ModelSpec
    gpu: str | None
    seq_len: int
    dtype: str
    attention: str
    device: str
    times_by_setting: dict[tuple[UnitKind, int], dict[int, UnitTimes]] = field(repr=False)
    fallback: AnalyticProfile | None = None
    source: str = ""
    sequence_parallel: bool = False
    activation_bytes_by_setting: dict[tuple[UnitKind, int], dict[int, float]] = field(default_factory=dict,
                                                                                       repr=False)
    _notes: dict[str, None] = field(default_factory=dict, repr=False, compare=False)

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    def _note(self, text: str) -> None:
        self._notes.setdefault(f"profile: {text}")

    def with_fallback(self, fallback: AnalyticProfile) -> MeasuredProfile:
        """The same profile timing GPUs of another type with `fallback` (fresh notes)."""
        return replace(self, fallback=fallback, _notes={})

    def measured_tps(self) -> list[int]:
        return sorted({tp for _, tp in self.times_by_setting})

    def times(self, kind: UnitKind, setting: UnitSetting, gpu: GPUSpec) -> UnitTimes:
        if self.gpu is not None and gpu.name.lower() != self.gpu.lower():
            if self.fallback is None:
                raise PlannerError(f"{self.source} was measured on {self.gpu}; the cluster has {gpu.name}")
            self._note(f"measured on {self.gpu}; {gpu.name} uses analytic times")
            return self.fallback.times(kind, setting, gpu)
        self._check(setting)
        if self.gpu is None:
            self._note(f"times measured on {self.device} applied to every GPU ({gpu.name})")
        by_batch = self._at_tp(self.times_by_setting, kind, setting.tp)
        weights = self._micro_batch_weights(sorted(by_batch), self._per_rank_batch(setting))
        values = [max(0.0, sum(w * getattr(by_batch[b], name) for b, w in weights)) for name in _TIME_FIELDS]
        return UnitTimes(*values)

    def activation_bytes(self, kind: UnitKind, setting: UnitSetting, recompute: Recompute) -> float | None:
        """Measured activation bytes of one unit per micro-batch, or None where the analytic ones apply."""
        if not self.activation_bytes_by_setting:
            self._note(f"memory not measured on {self.device}; activations are analytic")
            return None
        if recompute is not Recompute.NONE:
            self._note(f"memory measured without recompute; {recompute.value} recompute uses analytic activations")
            return None
        if setting.sequence_parallel != self.sequence_parallel:
            measured = "with" if self.sequence_parallel else "without"
            self._note(f"memory measured {measured} sequence parallelism; activations are analytic")
            return None
        self._check(setting)
        by_batch = self._at_tp(self.activation_bytes_by_setting, kind, setting.tp)
        self._note(f"activation memory measured on {self.device} (allocated after forward, per unit)")
        weights = self._micro_batch_weights(sorted(by_batch), self._per_rank_batch(setting))
        return max(0.0, sum(w * by_batch[b] for b, w in weights))

    def _per_rank_batch(self, setting: UnitSetting) -> int | float:
        """The measured micro-batch with this rank's work: a context-parallel rank holds seq_len / cp tokens and
        does 1/cp of the causal attention, as micro-batch b / cp does at the whole sequence."""
        if setting.cp == 1:
            return setting.micro_batch
        self._note(f"cp={setting.cp}: a rank's work taken as micro-batch {setting.micro_batch}/{setting.cp}")
        return setting.micro_batch / setting.cp

    def _at_tp(self, table: dict[tuple[UnitKind, int], dict[int, _T]], kind: UnitKind,
               tp: int) -> dict[int, _T]:
        """One unit's measurements by micro-batch at `tp`; an unmeasured TP degree is an error."""
        by_batch = table.get((kind, tp))
        if by_batch is None:
            tps = ", ".join(map(str, self.measured_tps()))
            raise PlannerError(f"{self.source} has no measurements at tp={tp}; measured tp: {tps}")
        return by_batch

    def _check(self, setting: UnitSetting) -> None:
        for option, wanted, have in (("--seq-len", setting.seq_len, self.seq_len),
                                     ("--dtype", setting.dtype, self.dtype),
                                     ("--attention", setting.attention, self.attention)):
            if wanted != have:
                raise PlannerError(
                    f"{self.source} was measured at {option} {have}, not {wanted}; use {option} {have} or re-profile"
                )
        if setting.sequence_parallel and not self.sequence_parallel:
            self._note("measured without sequence parallelism; its element-wise savings are not in the times")

    def _micro_batch_weights(self, sizes: list[int], micro_batch: int) -> list[tuple[int, float]]:
        """Measured micro-batches and the weights that give a value at `micro_batch` (noted if not measured)."""
        if micro_batch in sizes:
            return [(micro_batch, 1.0)]
        position = bisect.bisect(sizes, micro_batch)
        if position == 0 or len(sizes) == 1:
            nearest = sizes[0]
            direction = "down" if position == 0 else "up"
            self._note(f"micro-batch {micro_batch} scaled {direction} from measured {nearest}")
            return [(nearest, micro_batch / nearest)]
        if position == len(sizes):
            low, high = sizes[-2], sizes[-1]
            self._note(f"micro-batch {micro_batch} extrapolated from {low} and {high}")
        else:
            low, high = sizes[position - 1], sizes[position]
            self._note(f"micro-batch {micro_batch} interpolated between {low} and {high}")
        weight = (micro_batch - low) / (high - low)
        return [(low, 1.0 - weight), (high, weight)]


def _require(mapping: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise PlannerError(f"{where}: '{key}' is missing or not a {getattr(kinds, '__name__', 'number')}, "
                           f"got {value!r}")
    return value


def parse_profile_document(document: Any, source: str) -> MeasuredProfile:
    """Validate a PROFILE.json document (schema_version 1) and index its unit times."""
    if not isinstance(document, dict):
        raise PlannerError(f"{source}: a profile must be a JSON object")
    version = document.get("schema_version")
    if version != PROFILE_SCHEMA_VERSION:
        raise PlannerError(f"{source}: schema_version {version!r} is not supported; expected {PROFILE_SCHEMA_VERSION}")
    model = model_from_dict(_require(document, "model", dict, source), source)
    settings = _require(document, "settings", dict, source)
    device = _require(document, "device", dict, source)
    units = _require(document, "units", list, source)
    gpu = document.get("gpu")
    if gpu is not None and not isinstance(gpu, str):
        raise PlannerError(f"{source}: 'gpu' must be a GPU type name or null, got {gpu!r}")
    memory_measured = document.get("memory_measured", False)
    sequence_parallel = settings.get("sequence_parallel", False)
    for key, value in (("memory_measured", memory_measured), ("settings.sequence_parallel", sequence_parallel)):
        if not isinstance(value, bool):
            raise PlannerError(f"{source}: '{key}' must be true or false, got {value!r}")
    table: dict[tuple[UnitKind, int], dict[int, UnitTimes]] = {}
    memory: dict[tuple[UnitKind, int], dict[int, float]] = {}
    for position, entry in enumerate(units):
        where = f"{source}: units[{position}]"
        if not isinstance(entry, dict):
            raise PlannerError(f"{where}: must be an object")
        try:
            kind = UnitKind(entry.get("kind"))
        except ValueError:
            raise PlannerError(f"{where}: kind must be embedding, block or head, got {entry.get('kind')!r}") from None
        tp, batch = (_require(entry, key, int, where) for key in ("tp", "micro_batch"))
        values = [_require(entry, name, (int, float), where) for name in _TIME_FIELDS]
        if tp < 1 or batch < 1 or any(v < 0 for v in values):
            raise PlannerError(f"{where}: tp and micro_batch must be positive and times non-negative")
        table.setdefault((kind, tp), {})[batch] = UnitTimes(*map(float, values))
        if memory_measured:
            measured = _require(entry, "activation_bytes", (int, float), where)
            if measured < 0:
                raise PlannerError(f"{where}: activation_bytes must be non-negative, got {measured!r}")
            memory.setdefault((kind, tp), {})[batch] = float(measured)
    if not table:
        raise PlannerError(f"{source}: 'units' is empty")
    for tp in {tp for _, tp in table}:
        batches = {frozenset(table.get((kind, tp), {})) for kind in UnitKind}
        if len(batches) != 1:
            raise PlannerError(f"{source}: tp={tp} does not have embedding, block and head at the same micro-batches")
    seq_len = _require(settings, "seq_len", int, f"{source}: settings")
    if not 1 <= seq_len <= MAX_SEQ_LEN:
        raise PlannerError(f"{source}: settings.seq_len must be in [1, {MAX_SEQ_LEN:,}], got {seq_len:,}")
    dtype, attention = (_require(settings, key, str, f"{source}: settings") for key in ("dtype", "attention"))
    for key, value, allowed in (("dtype", dtype, PROFILE_DTYPES), ("attention", attention, ATTENTION_KERNELS)):
        if value not in allowed:
            raise PlannerError(f"{source}: settings.{key} must be one of {', '.join(allowed)}, got {value!r}")
    return MeasuredProfile(
        model=model, gpu=gpu, seq_len=seq_len, dtype=dtype, attention=attention,
        device=str(device.get("name", device.get("type", "unknown device"))),
        times_by_setting=table, source=source, sequence_parallel=sequence_parallel,
        activation_bytes_by_setting=memory,
    )


def load_measured_profile(path: Path) -> MeasuredProfile:
    """Read and validate PROFILE.json."""
    return parse_profile_document(load_structured_file(path), str(path))


def bind_to_model(profile: MeasuredProfile, model: ModelSpec, calibration: Calibration) -> MeasuredProfile:
    """The profile checked against the model being estimated, timing other GPU types analytically."""
    if replace(profile.model, name=model.name) != model:
        raise PlannerError(
            f"{profile.source} was measured for model {profile.model.name!r}, whose architecture differs from "
            f"{model.name!r}; pass --model {profile.source} or re-profile"
        )
    return profile.with_fallback(AnalyticProfile(model, calibration))
