"""planner: an automatic parallelism planner for large-model training.

Data flows one way: model + cluster + training → profile → cost model → search → Plan → exports.
"""

from planner.errors import InfeasibleError, PlannerError

__version__ = "0.1.0"
__all__ = ["InfeasibleError", "PlannerError", "__version__"]
