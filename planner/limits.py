"""Scale limits every input is held to: beyond them planner exits 2 naming the limit instead of running
for minutes or exhausting memory. Within them `plan` and `estimate` finish in the times README states
(measured by tests/test_hardening.py)."""

from __future__ import annotations

__all__ = ["MAX_GLOBAL_BATCH", "MAX_GPUS", "MAX_LAYERS", "MAX_MODEL_WIDTH", "MAX_SEQ_LEN"]

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

