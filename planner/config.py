"""What a training job is (`Training`), how it is split (`ParallelConfig`) and the stage split (`Partition`).

Conventions used everywhere: dp·tp·pp·cp = GPUs used; micro-batches per iteration
m = global_batch / (micro_batch · dp); the model's units are [embedding, block 0 … block L−1,
head] and a `Partition` gives each *virtual* stage a contiguous run of them, in virtual-pipeline
order (virtual stage k runs on pipeline rank k mod pp as its (k div pp)-th model chunk — the
order of Megatron-LM's `--pipeline-model-parallel-layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from planner.cost.schedule import Schedule, schedule_of
from planner.errors import PlannerError

__all__ = ["DTYPES", "ParallelConfig", "Partition", "Recompute", "Schedule", "Training"]

DTYPES = ("bf16", "fp16", "fp8")
ATTENTION_KERNELS = ("flash", "unfused")


class Recompute(str, Enum):
    """Activation recomputation: none, selective (attention core, Korthikanti et al.) or full (whole block)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


def _positive(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"{owner}: {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Training:
    """The training job: global batch (sequences per iteration), sequence length, precision.

    `attention` is the attention kernel: "flash" (fused, no s² activations, causal work halved)
    or "unfused" (softmax/dropout materialised, as in Megatron-LM runs before FlashAttention).
    `grad_bytes` is the per-parameter gradient size: 4 when gradients accumulate in fp32
    (Megatron-LM's default for bf16 and fp8), 2 when they stay 16-bit (its fp16 optimizer);
    None takes that dtype's default.
    """

    global_batch: int = 512
    seq_len: int = 4096
    dtype: str = "bf16"
    attention: str = "flash"
    grad_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.grad_bytes is None:
            object.__setattr__(self, "grad_bytes", 2 if self.dtype == "fp16" else 4)
        _positive("training", "global_batch", self.global_batch)
        _positive("training", "seq_len", self.seq_len)
        if self.dtype not in DTYPES:
            raise PlannerError(f"training: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise PlannerError(
                f"training: attention must be one of {', '.join(ATTENTION_KERNELS)}, got {self.attention!r}"
            )
        if self.grad_bytes not in (2, 4):
            raise PlannerError(f"training: grad_bytes must be 2 or 4, got {self.grad_bytes!r}")

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class ParallelConfig:
    """How one training job is split. Degrees multiply to the GPUs used: dp·tp·pp·cp.

    `vpp` is the number of model chunks per pipeline rank (interleaved schedule only).
    `zero_stage` follows DeepSpeed (1: optimizer states, 2: + gradients, 3: + parameters,
    sharded over dp); `distributed_optimizer` is Megatron-LM's, which shards like ZeRO-1.
    """

    dp: int
    tp: int
    pp: int
    micro_batch: int = 1
    vpp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    zero_stage: int = 0
    distributed_optimizer: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    p2p_scatter_gather: bool = True  # Megatron-LM sends 1/tp of a boundary tensor; DeepSpeed's pipeline all
    overlap_tp_backward: bool = True  # backward TP all-reduce overlapped with wgrad GEMMs (Megatron-LM ≥ 2021-11)
    # SP all-gathers / reduce-scatters chunked and pipelined with their GEMMs: Megatron-LM's
    # --tp-comm-overlap (Transformer Engine userbuffers), torchtitan's async TP
    tp_comm_overlap: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "vpp", "cp"):
            _positive("parallel config", name, getattr(self, name))
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        object.__setattr__(self, "schedule", Schedule(self.schedule))
        if self.zero_stage not in (0, 1, 2, 3):
            raise PlannerError(f"parallel config: zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.distributed_optimizer and self.zero_stage > 1:
            raise PlannerError(
                f"parallel config: the distributed optimizer shards like ZeRO-1; it cannot be combined "
                f"with zero_stage {self.zero_stage}"
            )
        if self.sequence_parallel and self.tp == 1:
            raise PlannerError("parallel config: sequence_parallel needs tp > 1 (Megatron-LM turns it off at tp=1)")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise PlannerError(
                f"parallel config: tp_comm_overlap overlaps the sequence-parallel collectives and needs "
                f"sequence_parallel with tp > 1 (Megatron-LM asserts it), got tp={self.tp}, sequence_parallel=False"
            )
        schedule_of(self.schedule).check(self.pp, self.vpp)
        if self.zero_stage >= 2 and self.pp > 1:
            raise PlannerError(
                f"parallel config: ZeRO-{self.zero_stage} shards gradients across micro-batches and is not "
                "supported with pipeline parallelism (DeepSpeed asserts stage < 2 with PP); use zero 0/1"
            )
        if self.cp != 1:
            raise PlannerError("parallel config: context parallelism (cp > 1) is not modelled yet; use cp=1")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def num_virtual_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def optimizer_sharding(self) -> int:
        """0: replicated; 1: optimizer states sharded; 2: + grads; 3: + params (over dp)."""
        return max(self.zero_stage, 1 if self.distributed_optimizer else 0)

    def num_microbatches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per iteration; the global batch must divide evenly."""
        per_step = self.micro_batch * self.dp
        if global_batch % per_step:
            raise PlannerError(
                f"global batch {global_batch} is not divisible by micro_batch × dp = "
                f"{self.micro_batch} × {self.dp} = {per_step}"
            )
        return global_batch // per_step

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        parts += [f"mb={self.micro_batch}", f"recompute={self.recompute.value}"]
        if self.sequence_parallel:
            parts.append("sp")
        if self.tp_comm_overlap:
            parts.append("tp-overlap")
        if self.distributed_optimizer:
            parts.append("dist-opt")
        elif self.zero_stage:
            parts.append(f"zero{self.zero_stage}")
        parts.append(self.schedule.value)
        return " ".join(parts)


@dataclass(frozen=True)
class Partition:
    """Units per virtual stage, in virtual-pipeline order; together they cover every unit once, in order."""

    unit_counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.unit_counts or any(c < 1 for c in self.unit_counts):
            raise PlannerError(f"partition: every stage needs at least one unit, got {list(self.unit_counts)}")

    @property
    def num_stages(self) -> int:
        return len(self.unit_counts)

    @property
    def num_units(self) -> int:
        return sum(self.unit_counts)

    def bounds(self) -> list[tuple[int, int]]:
        """[start, end) unit indices per virtual stage."""
        out, start = [], 0
        for count in self.unit_counts:
            out.append((start, start + count))
            start += count
        return out

    def block_ranges(self) -> list[tuple[int, int]]:
        """[start, end) transformer-block indices per stage (units minus embedding and head)."""
        num_layers = self.num_units - 2
        return [(min(max(a - 1, 0), num_layers), min(max(b - 1, 0), num_layers)) for a, b in self.bounds()]

    def blocks_per_stage(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.block_ranges())

    @classmethod
    def from_blocks(cls, blocks_per_stage: tuple[int, ...] | list[int], num_layers: int) -> Partition:
        """Embedding joins the first stage and the head the last (Megatron-LM's default placement)."""
        counts = list(blocks_per_stage)
        text = ",".join(map(str, counts))
        if any(c < 0 for c in counts):
            raise PlannerError(f"partition {text}: block counts must be non-negative")
        if sum(counts) != num_layers:
            raise PlannerError(
                f"partition {text} must give block counts summing to {num_layers} (the model's layers), "
                f"got a sum of {sum(counts)}"
            )
        counts[0] += 1
        counts[-1] += 1
        return cls(tuple(counts))

    @classmethod
    def uniform(cls, num_layers: int, num_stages: int) -> Partition:
        """Blocks spread as evenly as possible, the earlier stages taking the remainder."""
        if num_stages > num_layers:
            raise PlannerError(f"cannot split {num_layers} layers into {num_stages} non-empty stages")
        base, extra = divmod(num_layers, num_stages)
        return cls.from_blocks([base + (1 if i < extra else 0) for i in range(num_stages)], num_layers)
