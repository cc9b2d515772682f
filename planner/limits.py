"""Scale limits every input is held to: beyond them planner exits 2 naming the limit instead of running
for minutes or exhausting memory. Within them `plan` and `estimate` finish in the times README states
(measured by tests/test_hardening.py)."""

from __future__ import annotations

__all__ = ["MAX_GLOBAL_BATCH", "MAX_GPUS", "MAX_LAYERS", "MAX_MODEL_WIDTH", "MAX_PER_GPU_QUANTITY", "MAX_SECONDS",
           "MAX_SEQ_LEN"]

MAX_GPUS = 131_072
"""GPUs in one cluster (nodes × GPUs per node): 16,384 nodes of 8, the size `plan` was measured at."""
MAX_GLOBAL_BATCH = 10**9
"""Sequences per iteration."""
MAX_SEQ_LEN = 2**24
"""Tokens per sequence (16 Mi); also the largest max_position_embeddings."""
MAX_LAYERS = 4096
"""Transformer blocks; the largest published models have a few hundred."""
MAX_MODEL_WIDTH = 2**24
"""Any other model dimension: hidden and FFN sizes, heads, head_dim, vocabulary, experts."""

MAX_PER_GPU_QUANTITY = 1e18
"""Any size or rate of one GPU or link (bytes, bytes/s, FLOP/s, watts): an exabyte or an exaFLOP/s per GPU is a
typo, not hardware."""
MAX_SECONDS = 3600.0
"""Any latency, per-kernel or per-iteration constant: an hour is a typo, not a cost."""
