"""Full recompute of only the first N blocks of each model chunk (`ParallelConfig.recompute_num_layers`, Megatron-LM's
--recompute-method block): its cost, its plan-file field, its exports, the command line and the plan refinement."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export_plans import invoke, make_plan, parse_flags, plan_document

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.export.deepspeed import export_deepspeed
from planner.export.megatron import export_megatron
from planner.export.torchtitan import export_torchtitan
from planner.frameworks import framework_named
from planner.model import load_model
from planner.plan import parse_plan_document
from planner.search.planning import block_recompute, lighter_recompute, plan
from planner.search.search import search
from planner.search.space import FixedOptions

MODEL = load_model("llama3-70b")  # 80 blocks: 20 per stage at pp 4
CLUSTER = load_cluster("4x8xH100-80GB")
TRAINING = Training(global_batch=64, seq_len=4096)


def _config(layers: int | None = None, recompute: Recompute = Recompute.FULL) -> ParallelConfig:
    return ParallelConfig(dp=1, tp=8, pp=4, sequence_parallel=True, recompute=recompute, recompute_num_layers=layers)


def test_recompute_num_layers_is_a_positive_count_and_only_full_recompute_keeps_it():
    for bad in (0, -2, 2.5, "3"):
        with pytest.raises(PlannerError, match="recompute_num_layers must be a whole number"):
            _config(bad)
    assert _config(4, Recompute.SELECTIVE).recompute_num_layers is None  # reset, as recompute_modules is
    assert _config(4).describe().split()[4] == "recompute=full:4"
    assert _config(4).recomputed_blocks(20) == 4 and _config(40).recomputed_blocks(20) == 20
    assert _config().recomputed_blocks(20) == 20 and _config(None, Recompute.NONE).recomputed_blocks(20) == 0


def test_n_of_a_chunks_blocks_recompute_n_of_its_share_and_keep_the_rest():
    """Each stage holds 20 identical blocks: recomputing 5 of them repeats a quarter of full recompute's forward
    work; its time and memory lie between no recompute and full; 20 or more is full recompute exactly."""
    full, none = estimate(MODEL, CLUSTER, TRAINING, _config()), estimate(MODEL, CLUSTER, TRAINING, _config(None,
                                                                                                           Recompute.NONE))
    five = estimate(MODEL, CLUSTER, TRAINING, _config(5))
    assert five.breakdown_s["recompute"] == pytest.approx(full.breakdown_s["recompute"] / 4, rel=1e-9)
    assert none.iteration_time_s < five.iteration_time_s < full.iteration_time_s
    assert full.peak_memory_bytes < five.peak_memory_bytes < none.peak_memory_bytes
    everything = estimate(MODEL, CLUSTER, TRAINING, _config(20))
    assert everything.iteration_time_s == full.iteration_time_s
    assert everything.peak_memory_bytes == full.peak_memory_bytes
    more = [estimate(MODEL, CLUSTER, TRAINING, _config(n)).peak_memory_bytes for n in (1, 5, 10, 19)]
    assert more == sorted(more, reverse=True)  # fewer recomputed blocks, more memory


def test_the_plan_file_keeps_it_and_megatron_runs_the_block_method():
    plan_ = make_plan(model="llama3-8b", blocks=(8, 8, 8, 8), recompute="full", recompute_num_layers=3)
    assert plan_.parallel.recompute_num_layers == 3
    args = parse_flags(export_megatron(plan_).files["megatron_args.txt"])
    assert args["--recompute-granularity"] == ["full"] and args["--recompute-method"] == ["block"]
    assert args["--recompute-num-layers"] == ["3"]
    every = parse_flags(export_megatron(make_plan(model="llama3-8b", recompute="full")).files["megatron_args.txt"])
    assert every["--recompute-method"] == ["uniform"] and every["--recompute-num-layers"] == ["1"]


def test_deepspeed_runs_it_only_without_its_pipeline_engine():
    with pytest.raises(PlannerError, match="pipeline engine recomputes every layer"):
        export_deepspeed(make_plan(model="llama3-8b", blocks=(8, 8, 8, 8), recompute="full", recompute_num_layers=3))
    alone = make_plan(model="llama3-8b", blocks=(32,), tp=8, pp=1, recompute="full", recompute_num_layers=3)
    args = parse_flags(export_deepspeed(alone).files["megatron_deepspeed_args.txt"])
    assert args["--recompute-method"] == ["block"] and args["--recompute-num-layers"] == ["3"]
    assert framework_named("deepspeed").why_not(replace(_config(3), zero_stage=1))


def test_torchtitan_recomputes_every_kth_block_where_n_divides_a_stages_blocks():
    toml = export_torchtitan(make_plan(model="llama3-8b", blocks=(8, 8, 8, 8), tp=1, sequence_parallel=False,
                                       recompute="full", recompute_num_layers=2)).files["torchtitan.toml"]
    assert 'mode = "selective"' in toml and 'selective_ac_option = "4"' in toml
    with pytest.raises(PlannerError, match="must divide every stage's blocks"):
        export_torchtitan(make_plan(model="llama3-8b", blocks=(8, 8, 8, 8), tp=1, sequence_parallel=False,
                                    recompute="full", recompute_num_layers=3))
    titan = framework_named("torchtitan")
    assert titan.block_recompute_counts((8, 8, 8, 8)) == [1, 2, 4] and not titan.block_recompute_counts((7, 9))
    assert list(framework_named("megatron").block_recompute_counts((7, 9))) == list(range(1, 9))


def test_estimate_takes_it_with_full_recompute_only():
    common = ["estimate", "--model", "llama3-70b", "--cluster", "4x8xH100-80GB", "--tp", "8", "--pp", "4",
              "--global-batch", "64", "--seq-len", "4096"]
    result = invoke(*common, "--recompute", "full", "--recompute-num-layers", "5")
    assert result.exit_code == 0 and "recompute=full:5" in result.output
    for extra, named in ((["--recompute-num-layers", "5"], "needs --recompute full"),
                         (["--recompute", "full", "--recompute-num-layers", "0"], "--recompute-num-layers")):
        refused = invoke(*common, *extra)
        assert refused.exit_code == 2 and named in refused.output and "Traceback" not in refused.output


def test_the_refinement_recomputes_the_fewest_blocks_that_fit():
    """A full-recompute plan on 48 GB GPUs: the fewest blocks per chunk whose memory fits, one fewer does not,
    and the plan gets faster; a plan without full recompute is left alone."""
    cluster = load_cluster("4x8xL40S")
    fixed = FixedOptions(tp=8, pp=4, vpp=1, recompute=Recompute.FULL)
    refined = plan(MODEL, cluster, TRAINING, fixed, top_k=1).best
    planned = search(MODEL, cluster, TRAINING, fixed, top_k=1).plans[0]
    assert planned.config.recompute_num_layers is None  # the search costs every block
    framework = framework_named("any")
    assert lighter_recompute(MODEL, cluster, TRAINING, planned, framework) == refined
    layers = refined.config.recompute_num_layers
    assert layers is not None and 1 < layers < 20
    assert refined.estimate.fits and refined.estimate.iteration_time_s < planned.estimate.iteration_time_s
    fewer = estimate(MODEL, cluster, TRAINING, replace(planned.config, recompute_num_layers=layers - 1),
                     planned.partition, planned.placement)
    assert not fewer.fits
    kept = replace(planned, config=replace(planned.config, recompute=Recompute.NONE))
    assert lighter_recompute(MODEL, cluster, TRAINING, kept, framework) is kept


@settings(max_examples=12, deadline=None)
@given(layers=st.integers(min_value=1, max_value=19), pp=st.sampled_from([1, 2, 4]))
def test_more_recomputed_blocks_cost_time_and_save_memory(layers: int, pp: int):
    """Recomputing one more block per chunk never makes an iteration faster nor its peak memory larger."""
    model, cluster = load_model("llama3-8b"), load_cluster("1x8xH100-80GB")
    training = Training(global_batch=16, seq_len=4096)

    def run(n: int):
        config = ParallelConfig(dp=8 // pp, tp=1, pp=pp, recompute=Recompute.FULL, recompute_num_layers=n)
        return estimate(model, cluster, training, config)

    fewer, more = run(layers), run(layers + 1)
    assert fewer.iteration_time_s <= more.iteration_time_s
    assert fewer.peak_memory_bytes >= more.peak_memory_bytes


def test_a_plan_file_with_a_bad_block_count_is_refused():
    document = plan_document(model="llama3-8b", blocks=(8, 8, 8, 8), recompute="full", recompute_num_layers=3)
    document["parallelism"]["recompute_num_layers"] = "three"
    with pytest.raises(PlannerError, match="recompute_num_layers must be a whole number"):
        parse_plan_document(document)


def test_tight_memory_refines_more_full_recompute_layouts_than_the_top_k():
    """70B on 16 A100s: every layout that fits recomputes; refining only the top 5 of full recompute of every block
    keeps an interleaved micro-batch-2 layout (96.1 s), while the 1F1B micro-batch-1 layout that recomputes 28 of its
    40 blocks per stage (90.5 s, the best an exhaustive check of every full-recompute layout finds) ranked 17th of the
    27 that fit before refinement."""
    model, cluster = load_model("llama3-70b"), load_cluster("2x8xA100-80GB")
    training = Training(global_batch=128, seq_len=4096)
    framework = framework_named("any")
    top_five = block_recompute(model, cluster, training, search(model, cluster, training, top_k=5).plans, framework)
    planned = plan(model, cluster, training, top_k=5)
    assert planned.best.estimate.iteration_time_s < 0.97 * top_five[0].estimate.iteration_time_s
    assert planned.best.config.recompute_num_layers == 28 and planned.best.config.micro_batch == 1
    assert all(p.estimate.fits for p in planned.plans)
    assert [p.estimate.iteration_time_s for p in planned.plans] == sorted(p.estimate.iteration_time_s
                                                                         for p in planned.plans)


def test_the_plan_file_names_the_targets_that_run_its_block_recompute_on_its_split():
    """torchtitan runs 2 of each stage's 8 blocks (one in four) but not 3; DeepSpeed's pipeline engine neither."""
    def targets(layers: int) -> list[str]:
        return plan_document(model="llama3-8b", blocks=(8, 8, 8, 8), tp=1, sequence_parallel=False, recompute="full",
                             recompute_num_layers=layers)["runs_on"]

    assert targets(2) == ["megatron", "torchtitan"] and targets(3) == ["megatron"]
