"""Scale limits every input is held to: beyond them planner exits 2 naming the limit instead of running
for minutes or exhausting memory; and what a name may hold. Within them `plan` and `estimate` finish in the
times README states (measured by tests/test_hardening.py)."""

from __future__ import annotations

import math
import re

__all__ = [
    "HOSTNAME",
    "MAX_GLOBAL_BATCH",
    "MAX_GPUS",
    "MAX_LAYERS",
    "MAX_MODEL_WIDTH",
    "MAX_NAME_LENGTH",
    "MAX_PER_GPU_QUANTITY",
    "MAX_SECONDS",
    "MAX_SEQ_LEN",
    "MIN_BANDWIDTH",
    "MIN_POWER_SHARE",
    "bandwidth_problem",
    "decimal_digits",
    "finite_number",
    "name_problem",
]

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
MIN_BANDWIDTH = 1e6
"""The least bandwidth of any link or memory (bytes/s): below a megabyte per second a plan's times are typos."""
MIN_POWER_SHARE = 0.1
"""The lowest board power limit, as a share of the power a GPU's rates hold at (nvidia-smi refuses far less)."""
MAX_SECONDS = 3600.0
"""Any latency, per-kernel or per-iteration constant: an hour is a typo, not a cost."""
MAX_NAME_LENGTH = 200
"""Characters in a model's or cluster's name."""
HOSTNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}", re.ASCII)
"""A node's name: a host name as launchers write it into hostfiles and `--nodelist` (letters, digits, '.', '-', '_')."""


def name_problem(name: object, host: bool = False) -> str | None:
    """Why `name` cannot name a model or cluster (or with `host`, a node), or None: launch files and printouts carry
    names verbatim, so a line break or a shell metacharacter in one would change what a launch script runs."""
    if not isinstance(name, str):
        return f"must be a string, got {name!r:.60}"
    if host and not HOSTNAME.fullmatch(name):
        return f"must be a host name (letters, digits, '.', '-', '_'), got {name!r:.60}"
    if not host and (not name or len(name) > MAX_NAME_LENGTH or not name.isprintable()):
        return f"must be 1 to {MAX_NAME_LENGTH} printable characters on one line, got {name!r:.60}"
    return None


def finite_number(value: object) -> bool:
    """Whether `value` as read from a file is a finite int or float (true and false are not numbers)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def bandwidth_problem(name: str, value: object) -> str | None:
    """Why `value` cannot be the bandwidth `name` of a GPU, node or link, or None: a number of bytes/s in
    [MIN_BANDWIDTH, MAX_PER_GPU_QUANTITY)."""
    if finite_number(value) and MIN_BANDWIDTH <= value < MAX_PER_GPU_QUANTITY:
        return None
    return f"{name} must be a number of bytes/s from {MIN_BANDWIDTH:g} to below {MAX_PER_GPU_QUANTITY:g}, got {value!r}"


def decimal_digits(text: str) -> bool:
    """Whether `text` is a whole number written in ASCII digits: str.isdigit also takes '²' and other scripts'
    digits, which int() refuses or reads as another number."""
    return text.isascii() and text.isdigit()
