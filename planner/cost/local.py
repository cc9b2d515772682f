"""Local learning's extra costs (the `local` schedule, PPLL): the auxiliary head every stage but the last trains its
own loss with, and the queue of boundary tensors a stage receives ahead of use.

The head reuses the model's own head unit (final norm, linear to the vocabulary or a ViT's classes, loss): "linear"
is that head with its own output matrix (never tied to the embedding); "mlp" puts a hidden linear of the model's
width with a GELU in front, costed as that head with h more outputs (the same GEMM FLOPs, h·(h + V) per token, and
the same parameters, h·(h + V) + norm; its hidden activation is counted as fp32 logits, 4 bytes where 2 + 2 are
kept). The last stage keeps the model's head and its loss.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cluster import Link
from planner.config import ParallelConfig, Training
from planner.cost.time import UnitCost, boundary_tensor_bytes, unit_costs
from planner.gpu import GPUSpec
from planner.model import ModelSpec, UnitKind
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import Calibration

__all__ = ["aux_head_cost", "aux_head_model", "local_queue_bytes"]


def aux_head_model(model: ModelSpec, head: str) -> ModelSpec:
    """The model whose head unit is the auxiliary head `head` (one of config.LOCAL_HEADS)."""
    width = model.hidden_size if head == "mlp" else 0
    return replace(model, tie_embeddings=False, vocab_size=model.vocab_size + width)


def aux_head_cost(model: ModelSpec, training: Training, config: ParallelConfig, gpu: GPUSpec, tp_link: Link,
                  calibration: Calibration, model_head: UnitCost) -> UnitCost:
    """One auxiliary head per micro-batch on one TP rank: the model's head cost `model_head` with the head's own
    output matrix (linear), or the MLP head's, costed analytically (it has no measured profile)."""
    aux = aux_head_model(model, config.local_head)
    if config.local_head == "linear":
        return replace(model_head, params=aux.head_parameters() / config.tp)
    return unit_costs(aux, training, config, gpu, tp_link, AnalyticProfile(aux, calibration), calibration)[
        UnitKind.HEAD]


def local_queue_bytes(model: ModelSpec, training: Training, config: ParallelConfig) -> float:
    """Bytes a receiving stage holds for its queue: `local_queue_depth` boundary tensors as they arrive."""
    return config.local_queue_depth * boundary_tensor_bytes(model, training, config)
