"""The two kinds of failure a user can cause: bad input (exit 2) and an infeasible problem (exit 1)."""

from __future__ import annotations

__all__ = ["InfeasibleError", "PlannerError"]


class PlannerError(Exception):
    """Invalid usage or input. The message is one line naming the bad value and what is allowed."""


class InfeasibleError(Exception):
    """A well-formed problem with no feasible answer: the message says what is short and by how much."""
