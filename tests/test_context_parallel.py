"""Context parallelism (issue 11, item 1): work and activations per CP rank, the three KV exchanges,
rank order tp-cp-dp-pp, the search taking CP for long sequences, errors and exports; FSDP with PP and HSDP."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import load_cluster
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.memory import activation_bytes, sharded_state_bytes
from planner.errors import PlannerError
from planner.model import UnitKind, load_model
from planner.placement import GroupLinks, default_placement, rank_coordinates, rank_of
from planner.search.search import search
from planner.search.space import FixedOptions, enumerate_configs

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("4x8xH100-80GB")
LONG = Training(global_batch=8, seq_len=131072)


def _config(**fields) -> ParallelConfig:
    base = {"dp": 1, "tp": 8, "pp": 1, "cp": 4, "sequence_parallel": True, "recompute": Recompute.SELECTIVE}
    return ParallelConfig(**(base | fields))


def test_activations_per_rank_are_divided_by_cp() -> None:
    """Each CP rank keeps seq_len / cp tokens (FlashAttention: no s² term), so block activations scale as 1/cp."""
    one = activation_bytes(MODEL, UnitKind.BLOCK, LONG, _config(cp=1, dp=4))
    four = activation_bytes(MODEL, UnitKind.BLOCK, LONG, _config(cp=4))
    assert four == pytest.approx(one / 4)


def test_compute_per_rank_is_one_cpth_and_the_ring_hides_behind_attention() -> None:
    """Causal load balancing gives each rank 1/cp of the work; inside a node Megatron's ring (p2p) hides behind
    the per-step attention, while all-gather and all-to-all stay exposed."""
    cluster = load_cluster("1x8xH100-80GB")
    training = Training(global_batch=4, seq_len=65536)
    base = estimate(MODEL, cluster, training, _config(tp=2, cp=1, dp=4))
    results = {comm: estimate(MODEL, cluster, training, _config(tp=2, cp=4, dp=1, cp_comm=comm))
               for comm in ("p2p", "all-gather", "a2a")}
    ring = results["p2p"]
    assert ring.breakdown_s["compute"] == pytest.approx(base.breakdown_s["compute"], rel=0.05)  # same work per rank
    assert ring.breakdown_s["cp_comm"] == pytest.approx(0.0, abs=1e-9)
    assert results["all-gather"].breakdown_s["cp_comm"] > 0 and results["a2a"].breakdown_s["cp_comm"] > 0


def test_ring_across_nodes_shows_what_the_attention_cannot_hide() -> None:
    """A slow inter-node link leaves ring steps exposed; the same group inside the node hides them."""
    training = Training(global_batch=4, seq_len=16384)
    slow = load_cluster("4x8xH100-80GB")
    slow = slow.with_nodes(replace(node, nic_bandwidth_bytes_per_s=1e8) for node in slow.nodes)
    config = _config(tp=8, cp=4, dp=1)
    assert estimate(MODEL, slow, training, config).breakdown_s["cp_comm"] > 0


def test_rank_order_is_tp_cp_dp_pp_and_cp_groups_use_their_links() -> None:
    """Megatron-LM's order: rank = tp + tp·(cp + cp·(dp + dp·pp)); CP groups are cp ranks at stride tp."""
    config = ParallelConfig(dp=2, tp=2, pp=2, cp=4)
    assert rank_of(config, dp=1, pp=1, tp=1, cp=3) == 1 + 2 * (3 + 4 * (1 + 2 * 1))
    for rank in range(config.num_gpus):
        dp, pp, tp, cp = rank_coordinates(config, rank)
        assert rank_of(config, dp, pp, tp, cp) == rank
    links = GroupLinks.from_placement(CLUSTER, config, default_placement(CLUSTER, config))
    assert all(link.kind == "intra" for link in links.cp)  # 8 consecutive ranks: one node
    assert all(link.kind == "inter" for link in links.dp)  # dp·cp = 8 ranks at stride 2: two nodes


def test_sequence_must_divide_by_two_cp_and_a2a_needs_heads() -> None:
    with pytest.raises(PlannerError, match=r"divisible by 2·cp = 8"):
        estimate(MODEL, CLUSTER, Training(global_batch=8, seq_len=4100), _config(cp=4, dp=1))
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8xH100-80GB",
                                       "--global-batch", "8", "--seq-len", "4100", "--cp", "4"])
    assert result.exit_code == 2 and "--cp 4 is not allowed" in result.output
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8xH100-80GB",
                                       "--global-batch", "8", "--seq-len", "8192", "--tp", "8", "--cp", "4",
                                       "--cp-comm", "a2a"])
    assert result.exit_code == 2 and "tp·cp must divide the attention heads" in result.output


def test_space_covers_cp_and_every_config_uses_every_gpu() -> None:
    configs = list(enumerate_configs(MODEL, CLUSTER, LONG, FixedOptions(tp=8, micro_batch=1)))
    assert {c.cp for c in configs} >= {1, 2, 4}
    assert {c.cp_comm for c in configs if c.cp > 1} == {"p2p", "all-gather", "a2a"} - {"a2a"}  # kv heads 8 = tp
    assert all(c.dp * c.tp * c.pp * c.cp == CLUSTER.num_gpus for c in configs)


def test_search_takes_context_parallelism_for_a_long_sequence() -> None:
    """Llama-3-8B at 128K on 32 H100: without CP every layout is a poor fit; the search picks cp > 1."""
    best = search(MODEL, CLUSTER, LONG, FixedOptions(tp=8), top_k=1).plans[0]
    assert best.config.cp > 1 and best.estimate.fits


def test_fsdp_with_pipelines_and_hsdp() -> None:
    """FSDP under a pipeline (torch.distributed.pipelining): gradients unsharded until the last backward, the
    gathered weights kept; HSDP shards over dp·cp/R ranks only."""
    piped = ParallelConfig(dp=4, tp=2, pp=4, zero_stage=3)
    assert piped.reshard_after_forward is False
    states = sharded_state_bytes(piped, 4)
    assert (states.weights, states.gradients, states.optimizer) == (2, 4, 12 / 4)
    hsdp = ParallelConfig(dp=8, tp=1, pp=1, cp=2, zero_stage=3, hsdp_replicas=4)
    assert hsdp.shard_group == 4 and sharded_state_bytes(hsdp, 4).optimizer == 12 / 4
    result = estimate(MODEL, CLUSTER, Training(global_batch=64, seq_len=4096), replace(piped, dp=2, tp=4))
    assert result.breakdown_s["dp_comm"] > 0
    with pytest.raises(PlannerError, match="hsdp_replicas 3 must divide dp·cp = 16"):
        ParallelConfig(dp=8, tp=1, pp=1, cp=2, zero_stage=3, hsdp_replicas=3)


def test_exports_carry_cp() -> None:
    from planner.export.megatron import megatron_arguments
    from planner.export.torchtitan import torchtitan_toml
    from planner.plan import build_plan_document, parse_plan_document

    config = _config(cp=4, dp=1, cp_comm="all-gather")
    placement = default_placement(CLUSTER, config)
    result = estimate(MODEL, CLUSTER, LONG, config, placement=placement)
    plan = parse_plan_document(build_plan_document(MODEL, CLUSTER, LONG, config, placement, result))
    flags = [flag for _, group in megatron_arguments(plan)[0] for flag in group]
    assert ("--context-parallel-size", "4") in flags and ("--cp-comm-type", "allgather") in flags
    toml = torchtitan_toml(plan)
    assert "context_parallel_degree = 4" in toml and 'context_parallel_rotate_method = "allgather"' in toml
