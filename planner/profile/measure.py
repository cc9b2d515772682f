"""Measured per-unit profile: build each distinct unit in PyTorch at one TP rank's shapes and time it.

The units are compact re-implementations with random weights (no download, no framework): the
embedding, one transformer block (norm, QKV with GQA and RoPE, attention core — SDPA for "flash",
explicit softmax for "unfused" — output projection, norm, SwiGLU/GeLU MLP or top-k MoE) and the
head (final norm, output projection, cross-entropy). A TP degree t gives each rank heads/t query
heads, max(kv/t, 1) KV heads, ffn/t MLP width and vocab/t output rows, as Megatron-LM shards them;
the TP collectives themselves are not run (the cost model adds them). Times are medians over
`iters` runs after `warmup` runs, synchronised with CUDA events on GPU and perf_counter on CPU.

torch is an optional extra (``pip install 'planner[profile]'``) and is imported only here.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError
from planner.model import ModelSpec, UnitKind

__all__ = ["PROFILE_DTYPES", "PROFILE_SCHEMA_VERSION", "ProfileRequest", "measure_layers"]

PROFILE_SCHEMA_VERSION = 1
PROFILE_DTYPES = ("bf16", "fp16", "fp32")
_DROPOUT_P = 0.1
_CPU_MEMORY_NOTE = "memory not measured on cpu (no allocator statistics); the estimate uses analytic memory"
_CUDA_MEMORY_NOTE = (
    "activation_bytes: torch.cuda.memory_allocated after forward minus before (saved tensors + output); "
    "peak_bytes: torch.cuda.max_memory_allocated during forward + backward minus before (weights excluded)"
)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise PlannerError(
            "profiling needs PyTorch, which is not installed; install it with: pip install 'planner[profile]'"
        ) from None
    return torch


@dataclass(frozen=True)
class ProfileRequest:
    """What to measure: TP degrees × micro-batch sizes at one sequence length, dtype and kernel."""

    tps: tuple[int, ...]
    micro_batches: tuple[int, ...]
    seq_len: int
    dtype: str = "bf16"
    attention: str = "flash"
    device: str = "cpu"
    warmup: int = 2
    iters: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("tps", "micro_batches"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise PlannerError(f"profile: {name} must be positive integers, got {list(values)}")
        if self.seq_len < 1 or self.iters < 1 or self.warmup < 0:
            raise PlannerError(
                f"profile: need seq_len >= 1, iters >= 1, warmup >= 0; "
                f"got {self.seq_len}, {self.iters}, {self.warmup}"
            )
        if self.dtype not in PROFILE_DTYPES:
            allowed = ", ".join(PROFILE_DTYPES)
            raise PlannerError(f"profile: dtype must be one of {allowed}, got {self.dtype!r}")
        if self.attention not in ("flash", "unfused"):
            raise PlannerError(f"profile: attention must be flash or unfused, got {self.attention!r}")
        if self.device not in ("cpu", "cuda"):
            raise PlannerError(f"profile: device must be cpu or cuda, got {self.device!r}")


@dataclass(frozen=True)
class RankShapes:
    """The widths one TP rank holds."""

    heads: int
    kv_heads: int
    ffn: int
    vocab: int


def rank_shapes(model: ModelSpec, tp: int) -> RankShapes:
    """Per-rank widths for TP degree `tp`; heads must split evenly, KV heads are replicated below tp."""
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    if heads % tp:
        raise PlannerError(f"--tp {tp} does not divide {model.name}'s {heads} attention heads")
    if kv >= tp and kv % tp:
        raise PlannerError(f"--tp {tp} does not divide {model.name}'s {kv} key-value heads")
    return RankShapes(heads // tp, max(kv // tp, 1), math.ceil(model.ffn_hidden_size / tp),
                      math.ceil(model.vocab_size / tp))


# ---- the units ---------------------------------------------------------------------------------

def _build_modules(torch: Any, model: ModelSpec, shapes: RankShapes, attention: str,
                   ) -> tuple[dict[UnitKind, Any], Callable[..., Any]]:
    """The three distinct units as torch modules (random initialisation), and the attention core."""
    nn, functional = torch.nn, torch.nn.functional
    h, d = model.hidden_size, model.head_dim
    bias = model.linear_bias
    dropout = _DROPOUT_P if model.dropout else 0.0

    def norm() -> Any:
        return nn.LayerNorm(h) if model.normalization == "layernorm" else nn.RMSNorm(h)

    def rope(x: Any) -> Any:
        """Rotate-half rotary embedding over the last dimension; x is (b, heads, s, d)."""
        s = x.shape[-2]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
        cos = torch.cat((angles.cos(), angles.cos()), -1).to(x.dtype)
        sin = torch.cat((angles.sin(), angles.sin()), -1).to(x.dtype)
        first, second = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat((-second, first), -1) * sin

    def attention_core(q: Any, k: Any, v: Any) -> Any:
        """Causal attention of (b, heads, s, d) tensors; KV heads are shared by query-head groups."""
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        if attention == "flash":
            return functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        s = q.shape[-2]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = functional.dropout(scores.masked_fill(mask, float("-inf")).softmax(-1), dropout)
        return probs @ v

    class Embedding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(shapes.vocab, h)
            learned = model.position_embedding == "learned"
            self.positions = nn.Embedding(model.max_position_embeddings, h) if learned else None

        def forward(self, ids: Any) -> Any:
            x = self.tokens(ids)
            if self.positions is not None:
                positions = torch.arange(ids.shape[1], device=ids.device) % model.max_position_embeddings
                x = x + self.positions(positions)
            return functional.dropout(x, dropout)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = norm(), norm()
            self.qkv = nn.Linear(h, (shapes.heads + 2 * shapes.kv_heads) * d, bias=bias or model.qkv_bias)
            self.proj = nn.Linear(shapes.heads * d, h, bias=bias)
            up = 2 * shapes.ffn if model.activation == "swiglu" else shapes.ffn
            experts = model.num_experts
            self.router = nn.Linear(h, experts, bias=False) if model.is_moe else None
            self.up = nn.ModuleList(nn.Linear(h, up, bias=bias) for _ in range(experts))
            self.down = nn.ModuleList(nn.Linear(shapes.ffn, h, bias=bias) for _ in range(experts))

        def qkv_heads(self, x: Any) -> tuple[Any, Any, Any]:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(
                [shapes.heads * d, shapes.kv_heads * d, shapes.kv_heads * d], -1)
            q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
            if model.position_embedding == "rope":
                q, k = rope(q), rope(k)
            return q, k, v

        def mlp(self, x: Any, expert: int) -> Any:
            up = self.up[expert](x)
            if model.activation == "swiglu":
                gate, value = up.chunk(2, -1)
                return self.down[expert](functional.silu(gate) * value)
            return self.down[expert](functional.gelu(up, approximate="tanh"))

        def moe(self, x: Any) -> Any:
            """Top-k routing: each expert runs on the tokens routed to it, outputs weighted and summed."""
            flat = x.reshape(-1, h)
            weights, chosen = self.router(flat).softmax(-1).topk(model.moe_top_k, -1)
            out = torch.zeros_like(flat)
            for expert in range(model.num_experts):
                token, slot = (chosen == expert).nonzero(as_tuple=True)
                if token.numel():
                    out = out.index_add(0, token, self.mlp(flat[token], expert) * weights[token, slot, None])
            return out.view_as(x)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            core = attention_core(*self.qkv_heads(x)).transpose(1, 2).reshape(b, s, -1)
            x = x + functional.dropout(self.proj(core), dropout)
            y = self.norm2(x)
            y = self.moe(y) if self.router is not None else self.mlp(y, 0)
            return x + functional.dropout(y, dropout)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = norm()
            self.output = nn.Linear(h, shapes.vocab, bias=False)

        def forward(self, x: Any, labels: Any) -> Any:
            logits = self.output(self.norm(x)).float()
            return functional.cross_entropy(logits.view(-1, shapes.vocab), labels.view(-1))

    return {UnitKind.EMBEDDING: Embedding(), UnitKind.BLOCK: Block(), UnitKind.HEAD: Head()}, attention_core


# ---- timing ------------------------------------------------------------------------------------

class _Clock:
    """Wall time of a callable: CUDA events on GPU (after a synchronise), perf_counter on CPU."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch, self.cuda = torch, device == "cuda"

    def time(self, run: Callable[..., Any], *args: Any) -> tuple[float, Any]:
        if self.cuda:
            start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.torch.cuda.synchronize()
            start.record()
            result = run(*args)
            end.record()
            self.torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3, result
        begin = time.perf_counter()
        result = run(*args)
        return time.perf_counter() - begin, result


def _unit_inputs(torch: Any, kind: UnitKind, model: ModelSpec, shapes: RankShapes, b: int, s: int,
                 dtype: Any, device: str) -> tuple[Any, ...]:
    if kind is UnitKind.EMBEDDING:
        return (torch.randint(0, shapes.vocab, (b, s), device=device),)
    x = torch.randn(b, s, model.hidden_size, dtype=dtype, device=device, requires_grad=True)
    if kind is UnitKind.BLOCK:
        return (x,)
    return x, torch.randint(0, shapes.vocab, (b, s), device=device)


def _measure_unit(torch: Any, clock: _Clock, module: Any, inputs: tuple[Any, ...], request: ProfileRequest,
                  ) -> dict[str, Any]:
    """Median forward and backward seconds of one unit (and CUDA memory), after warm-up."""
    cuda = request.device == "cuda"
    forwards, backwards, activations, peaks = [], [], [], []
    for step in range(request.warmup + request.iters):
        for param in module.parameters():
            param.grad = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        forward_s, out = clock.time(module, *inputs)
        after_forward = torch.cuda.memory_allocated() if cuda else 0
        grad = None if out.dim() == 0 else torch.randn_like(out)
        backward_s, _ = clock.time(out.backward, grad)
        if step >= request.warmup:
            forwards.append(forward_s)
            backwards.append(backward_s)
            if cuda:
                activations.append(after_forward - before)
                peaks.append(torch.cuda.max_memory_allocated() - before)
    return {
        "forward_s": statistics.median(forwards),
        "backward_s": statistics.median(backwards),
        "activation_bytes": max(activations) if cuda else None,
        "peak_bytes": max(peaks) if cuda else None,
    }


def _measure_core(torch: Any, clock: _Clock, core: Callable[..., Any], model: ModelSpec, shapes: RankShapes,
                  b: int, request: ProfileRequest, dtype: Any) -> float:
    """Median forward seconds of the attention core alone (what selective recompute repeats)."""
    s, d = request.seq_len, model.head_dim
    q = torch.randn(b, shapes.heads, s, d, dtype=dtype, device=request.device)
    k, v = (torch.randn(b, shapes.kv_heads, s, d, dtype=dtype, device=request.device) for _ in range(2))
    samples = []
    with torch.no_grad():
        for step in range(request.warmup + request.iters):
            elapsed, _ = clock.time(core, q, k, v)
            if step >= request.warmup:
                samples.append(elapsed)
    return statistics.median(samples)


def _device_description(torch: Any, device: str) -> dict[str, Any]:
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        return {"type": "cuda", "name": properties.name, "memory_bytes": properties.total_memory,
                "torch_version": torch.__version__}
    return {"type": "cpu", "name": "cpu", "threads": torch.get_num_threads(),
            "torch_version": torch.__version__}


def measure_layers(model: ModelSpec, request: ProfileRequest, gpu: str | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every unit kind at every (tp, micro-batch) of `request`; returns the PROFILE.json document.

    `gpu` is the catalog GPU type the device is (it lets `--profile` apply the times to that GPU
    only); `progress` receives one line per measurement.
    """
    torch = _torch()
    if request.device == "cuda" and not torch.cuda.is_available():
        raise PlannerError("--device cuda: PyTorch sees no CUDA device here; use --device cpu")
    shapes_by_tp = {tp: rank_shapes(model, tp) for tp in request.tps}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[request.dtype]
    torch.manual_seed(request.seed)
    clock = _Clock(torch, request.device)
    entries: list[dict[str, Any]] = []
    total = len(request.tps) * len(request.micro_batches) * len(UnitKind)
    for tp, shapes in shapes_by_tp.items():
        modules, core = _build_modules(torch, model, shapes, request.attention)
        for kind in UnitKind:
            modules[kind].to(device=request.device, dtype=dtype).train()
        for b in request.micro_batches:
            for kind in UnitKind:
                if progress:
                    progress(f"[{len(entries) + 1}/{total}] {kind.value} tp={tp} micro-batch={b}")
                inputs = _unit_inputs(torch, kind, model, shapes, b, request.seq_len, dtype, request.device)
                entry = {"kind": kind.value, "tp": tp, "micro_batch": b,
                         **_measure_unit(torch, clock, modules[kind], inputs, request),
                         "attention_core_forward_s": 0.0}
                if kind is UnitKind.BLOCK:
                    entry["attention_core_forward_s"] = _measure_core(
                        torch, clock, core, model, shapes, b, request, dtype)
                entries.append(entry)
    return {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "model": model.to_dict(),
        "gpu": gpu,
        "device": _device_description(torch, request.device),
        "settings": {"seq_len": request.seq_len, "dtype": request.dtype, "attention": request.attention,
                     "sequence_parallel": False, "warmup": request.warmup, "iters": request.iters,
                     "statistic": "median"},
        "memory_measured": request.device == "cuda",
        "memory_note": _CUDA_MEMORY_NOTE if request.device == "cuda" else _CPU_MEMORY_NOTE,
        "units": entries,
    }

