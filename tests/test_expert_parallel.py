"""Expert parallelism: degrees checked against the experts and GPUs, the dispatch/combine all-to-all priced
on the links it crosses, expert states sharded over EP (and reduced over EDP), MoE compute per rank."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.estimate import estimate
from planner.cost.time import expert_all_to_all_s
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import load_model
from planner.placement import ExpertLink, GroupLinks, default_placement
from planner.profile.analytic import AnalyticProfile, block_forward_flops
from planner.profile.calibration import default_calibration
from planner.search.space import FixedOptions, complete_config

MIXTRAL = load_model("mixtral-8x7b")
TRAINING = Training(global_batch=256, seq_len=4096)


@pytest.mark.parametrize(("fixed", "match"), [
    (FixedOptions(ep=3), "--ep 3 must divide mixtral-8x7b's 8 routed experts"),
    (FixedOptions(ep=16), "group of 16 ranks is larger than mixtral-8x7b's 8 routed experts"),
    (FixedOptions(ep=8, etp=2), "does not divide the cluster's 8 GPUs"),
])
def test_bad_expert_degrees_name_the_value_and_what_is_allowed(fixed: FixedOptions, match: str) -> None:
    with pytest.raises(PlannerError, match=match):
        complete_config(fixed, MIXTRAL, parse_shorthand("1x8xH100-80GB"), TRAINING)


_MIXTRAL_ESTIMATE = ["estimate", "--model", "mixtral-8x7b", "--cluster", "8x8xH100-80GB", "--global-batch", "1024",
                     "--seq-len", "4096"]


@pytest.mark.parametrize(("options", "message"), [
    (["--ep", "16"], "--ep 16: an expert-parallel group of 16 ranks is larger than mixtral-8x7b's 8 routed experts "
                     "(allowed: 1, 2, 4, 8)"),
    (["--ep", "3"], "--ep 3 must divide mixtral-8x7b's 8 routed experts (allowed: 1, 2, 4, 8)"),
    (["--etp", "3"], "--etp 3 = 3 does not divide the cluster's 64 GPUs (with --ep 1, --etp may be 1, 2, 4, 8, 16"),
    (["--cp", "3"], "--cp 3 is not allowed: cp must divide the sequence length 4096 into 2·cp chunks (causal load "
                    "balancing; allowed: 1, 2, 4, 8,"),
    (["--dp", "7"], "--dp 7 does not divide the cluster's 64 GPUs (allowed: 1, 2, 4, 8, 16, 32, 64)"),
    (["--tp", "3"], "--tp 3 is not allowed: tp must be a power of two dividing the 8 GPUs per node"),
    (["--tp", "8", "--pp", "8", "--ep", "8", "--etp", "2"],
     "ep·etp = 8·2 must divide tp·cp·dp = 8, the ranks of one pipeline stage (allowed ep·etp: 1, 2, 4, 8)"),
])
def test_cli_bad_degree_exits_2_naming_the_value_and_what_is_allowed(options: list[str], message: str) -> None:
    result = CliRunner().invoke(main, _MIXTRAL_ESTIMATE + options)
    assert result.exit_code == 2 and message in result.output, result.output


def test_cli_tp_not_dividing_the_heads_exits_2() -> None:
    result = CliRunner().invoke(main, ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100-80GB",
                                       "--tp", "8", "--ep", "8", "--seq-len", "4096"])
    assert result.exit_code == 2 and "--tp 8 is not allowed: tp must divide the attention heads (32) and KV heads (4)" \
        in result.output, result.output


def test_expert_grid_larger_than_a_stage_is_refused() -> None:
    with pytest.raises(PlannerError, match=r"ep·etp = 8·2 must divide tp·cp·dp = 8"):
        complete_config(FixedOptions(tp=8, pp=2, ep=8, etp=2), MIXTRAL, parse_shorthand("2x8xH100-80GB"), TRAINING)


def test_ep_on_a_dense_model_is_refused() -> None:
    with pytest.raises(PlannerError, match="no routed experts"):
        complete_config(FixedOptions(ep=2), load_model("llama3-8b"), parse_shorthand("1x8xH100-80GB"), TRAINING)


def test_etp_defaults_to_tp_as_in_megatron() -> None:
    config = complete_config(FixedOptions(tp=2, ep=4), MIXTRAL, parse_shorthand("1x8xH100-80GB"), TRAINING)
    assert (config.ep, config.etp, config.edp) == (4, 2, 1)


def test_expert_groups_follow_parallel_folding() -> None:
    """etp·ep·edp = tp·cp·dp: tp=2, dp=8 on 16 GPUs with ep=8, etp=1 gives edp=2, EP groups of 8
    consecutive ranks, each inside one 8-GPU node."""
    cluster = parse_shorthand("2x8xH100-80GB")
    config = ParallelConfig(dp=8, tp=2, pp=1, ep=8, etp=1)
    links = GroupLinks.from_placement(cluster, config, default_placement(cluster, config))
    assert config.edp == 2 and links.ep[0].ranks_per_node == 8 and links.ep[0].intra.kind == "intra"


def test_all_to_all_crossing_nodes_is_priced_on_the_nic() -> None:
    """Inside a node the all-to-all moves (ep−1)/ep of the bytes over NVLink; across two nodes half the
    bytes leave through the GPU's own NIC, which is ~9x slower on a DGX H100 (450 vs 50 GB/s). Both run at the
    point-to-point efficiency (NCCL's all-to-all is grouped sends and receives, not a ring)."""
    cluster, cal = parse_shorthand("2x8xH100-80GB"), default_calibration()
    intra, inter = cluster.link(0, 0), cluster.link(0, 1)
    size = 64e6
    inside = expert_all_to_all_s(size, 8, ExpertLink(intra, inter, 8), cal)
    across = expert_all_to_all_s(size, 16, ExpertLink(intra, inter, 8), cal)
    assert inside == pytest.approx(size * 7 / 8 / (intra.bandwidth_bytes_per_s * cal.p2p_efficiency("intra"))
                                   + intra.latency_s)
    nic = size * 8 / 16 / (inter.bandwidth_bytes_per_s * cal.p2p_efficiency("inter"))
    assert across == pytest.approx(nic + intra.latency_s + inter.latency_s)
    assert across > 3 * inside


def test_expert_states_shard_over_ep() -> None:
    """Mixtral on 8 GPUs (dp=8): with ep=8 each GPU holds one expert per layer instead of eight, so the
    model states shrink by about the experts' 7/8 share of 96 % of the parameters."""
    cluster = parse_shorthand("1x8xH100-80GB")
    replicated = estimate(MIXTRAL, cluster, TRAINING, ParallelConfig(dp=8, tp=1, pp=1, micro_batch=1,
                                                                     distributed_optimizer=True))
    sharded = estimate(MIXTRAL, cluster, TRAINING, ParallelConfig(dp=8, tp=1, pp=1, ep=8, micro_batch=1,
                                                                  distributed_optimizer=True))
    weights = [e.stages[0].memory.weights for e in (replicated, sharded)]
    assert weights[0] == pytest.approx(2 * MIXTRAL.num_parameters)
    experts = MIXTRAL.num_layers * 8 * MIXTRAL.expert_parameters()
    held = MIXTRAL.num_parameters - experts * 7 / 8
    states = sum(getattr(sharded.stages[0].memory, k) for k in ("weights", "gradients", "optimizer"))
    # weights 2 B + fp32 grads 4 B on what the GPU holds; Adam's 12 B sharded over dp (dense) / edp = 1 (experts)
    dense = MIXTRAL.num_parameters - experts
    assert states == pytest.approx(6 * held + 12 * (dense / 8 + experts / 8))
    assert sharded.breakdown_detail_s["ep_alltoall"] > 0 and replicated.breakdown_detail_s["ep_alltoall"] == 0


def test_load_imbalance_slows_the_experts() -> None:
    cluster = parse_shorthand("1x8xH100-80GB")
    config = ParallelConfig(dp=8, tp=1, pp=1, ep=8, distributed_optimizer=True)
    balanced = estimate(MIXTRAL, cluster, TRAINING, config)
    skewed = estimate(MIXTRAL, cluster, Training(global_batch=256, seq_len=4096, moe_load_imbalance=1.5), config)
    capped = estimate(MIXTRAL, cluster, Training(global_batch=256, seq_len=4096, moe_load_imbalance=1.5,
                                                 moe_capacity_factor=1.0), config)
    assert skewed.iteration_time_s > 1.2 * balanced.iteration_time_s
    assert capped.iteration_time_s == pytest.approx(balanced.iteration_time_s)


def test_mla_and_moe_model_flops_count_active_parameters() -> None:
    """Forward GEMM FLOPs per token ≈ 2 × the active non-embedding parameters (DeepSeek-V3: dense first
    layers, top-8 of 256 experts plus the shared one, MLA projections)."""
    model = load_model("deepseek-v3")
    tokens = 1000
    attention_core = 2 * tokens * 1 * model.num_attention_heads * (model.qk_head_dim + model.value_head_dim)
    gemm = model.num_layers * (block_forward_flops(model, tokens, 1) - attention_core)
    active_blocks = model.active_parameters - model.embedding_parameters() - model.head_parameters()
    assert gemm / tokens == pytest.approx(2 * active_blocks, rel=1e-3)  # norms are the difference


def test_expert_gradients_reduce_over_their_own_group_and_its_ring() -> None:
    """With EP 8 filling each node of 8 × 8 GPUs, an expert data-parallel group is 8 ranks one per node: its ring
    runs over one NIC per GPU (50 GB/s on DGX H100), while the dense dp = 64 ring spreads over 8 NICs a node.
    The routed experts' gradients go over that group (distributed optimizer: reduce-scatter + all-gather of
    experts/ep parameters over edp ranks), the rest over dp."""
    from dataclasses import replace as dc_replace

    from planner.cost.comm import all_gather_time, reduce_scatter_time
    from planner.cost.time import UnitCost, data_parallel_time
    from planner.finetune import full_parameter_states

    cluster = parse_shorthand("8x8xH100-80GB")
    config = ParallelConfig(dp=64, tp=1, pp=1, ep=8, distributed_optimizer=True)
    links = GroupLinks.from_placement(cluster, config, default_placement(cluster, config))
    assert config.edp == 8
    assert links.edp[0].bandwidth_bytes_per_s == pytest.approx(cluster.nodes[0].nic_bandwidth_bytes_per_s)
    assert links.dp[0].bandwidth_bytes_per_s == pytest.approx(8 * links.edp[0].bandwidth_bytes_per_s)
    calibration = default_calibration()
    unit = UnitCost(1.0, 2.0, 0.0, 0.0, 0.0, 0.0, params=1e9 + 1.2e9, expert_params=1e9, expert_state_params=1.2e9)
    training = Training(global_batch=64, seq_len=4096)
    apart = data_parallel_time([unit], training, config, links.dp[0], calibration, 1, states=full_parameter_states(
        training), expert_link=links.edp[0])
    dense_bytes, expert_bytes = 1e9, 1e9
    expected = (reduce_scatter_time(dense_bytes * training.grad_bytes, 64, links.dp[0], calibration)
                + reduce_scatter_time(expert_bytes * training.grad_bytes, 8, links.edp[0], calibration)
                + all_gather_time(dense_bytes * 2, 64, links.dp[0], calibration)
                + all_gather_time(expert_bytes * 2, 8, links.edp[0], calibration))
    assert apart.total_s == pytest.approx(expected)
    together = data_parallel_time([dc_replace(unit)], training, config, links.dp[0], calibration, 1)
    assert apart.total_s > 3 * together.total_s  # the old charge: every parameter over the dense 64-rank ring


def test_zero3_gathers_and_reduces_experts_over_their_own_group_per_unit() -> None:
    """Under ZeRO-3 (torchtitan's FSDP over dp_shard_mod_ep, Megatron-FSDP over the expert DP group) a unit's
    routed experts are gathered before each pass and reduce-scattered after its backward over the edp ranks on
    their ring, the rest over dp: per micro-batch two gathers (forward, backward) and one reduce-scatter each."""
    from planner.cost.comm import all_gather_time, reduce_scatter_time
    from planner.cost.time import UnitCost, data_parallel_time
    from planner.finetune import full_parameter_states

    cluster = parse_shorthand("8x8xH100-80GB")
    config = ParallelConfig(dp=64, tp=1, pp=1, ep=8, zero_stage=3)
    links = GroupLinks.from_placement(cluster, config, default_placement(cluster, config))
    calibration = default_calibration()
    unit = UnitCost(1.0, 2.0, 0.0, 0.0, 0.0, 0.0, params=1e9 + 1.2e9, expert_params=1e9, expert_state_params=1.2e9)
    training = Training(global_batch=64, seq_len=4096)
    apart = data_parallel_time([unit], training, config, links.dp[0], calibration, 1, states=full_parameter_states(
        training), expert_link=links.edp[0])
    expected = (2 * all_gather_time(1e9 * 2, 64, links.dp[0], calibration)
                + 2 * all_gather_time(1e9 * 2, 8, links.edp[0], calibration)
                + reduce_scatter_time(1e9 * training.grad_bytes, 64, links.dp[0], calibration)
                + reduce_scatter_time(1e9 * training.grad_bytes, 8, links.edp[0], calibration))
    assert apart.total_s == pytest.approx(expected)
    together = data_parallel_time([unit], training, config, links.dp[0], calibration, 1)
    assert apart.total_s > 3 * together.total_s  # the old charge: every parameter over the dense 64-rank ring


def test_separate_expert_gemms_on_four_streams_quantise_per_round() -> None:
    """Transformer Engine's GroupedLinear runs one GEMM per expert over 4 streams: 16 experts of 384 tokens and
    45 tiles each fill 180 of 264 SM slots per round (2 waves of 132 SMs) where one batched kernel would pack all
    720 tiles into 6 waves; a lone GEMM and a batched one keep their old costs."""
    profile = AnalyticProfile(load_model("qwen3-30b-a3b"), default_calibration())
    gpu = lookup_gpu("H100-80GB")
    launch = default_calibration().kernel_launch_s
    batched = profile.gemm_time(gpu, "bf16", 384, 1856, 2688, 16) - launch
    streamed = profile.gemm_time(gpu, "bf16", 384, 1856, 2688, 16, concurrent=4) - launch
    assert streamed / batched == pytest.approx((8 * 132 / 720) / (6 * 132 / 720))
    assert profile.gemm_time(gpu, "bf16", 384, 1856, 2688, 1, concurrent=4) == profile.gemm_time(
        gpu, "bf16", 384, 1856, 2688)
