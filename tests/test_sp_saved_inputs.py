"""What a column-parallel linear keeps of its input under sequence parallelism: Megatron-LM keeps its sequence shard
and all-gathers it again in backward; DTensor's colwise TP (torchtitan) keeps the all-gathered input, and backward
gathers nothing more."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.memory import activation_bytes, block_type_activation_bytes
from planner.cost.time import unit_costs
from planner.frameworks import FRAMEWORKS
from planner.model import UnitKind, load_model
from planner.placement import GroupLinks, default_placement
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

MODEL = load_model("llama3-70b")
BLOCK = next(iter(MODEL.block_types()))
TRAINING = Training(global_batch=64, seq_len=8192)
MEGATRON = ParallelConfig(dp=8, tp=8, pp=1, micro_batch=2, sequence_parallel=True)
GATHERED = replace(MEGATRON, sp_saves_gathered_input=True)


def test_only_torchtitan_keeps_the_gathered_input() -> None:
    assert FRAMEWORKS["torchtitan"].runs(MEGATRON).sp_saves_gathered_input
    assert not FRAMEWORKS["megatron"].runs(GATHERED).sp_saves_gathered_input
    assert not FRAMEWORKS["deepspeed"].runs(GATHERED).sp_saves_gathered_input


def test_column_input_shards() -> None:
    """tp under Megatron-LM's sequence parallelism; the whole input when gathered or without SP."""
    assert MEGATRON.column_input_shards() == 8
    assert GATHERED.column_input_shards() == 1
    assert replace(MEGATRON, sequence_parallel=False).column_input_shards() == 1


def test_a_block_keeps_the_gathered_inputs_of_its_two_column_parallel_linears() -> None:
    """Attention's QKV and the MLP's gate/up read the normed input, gathered once each: under DTensor the block keeps
    two whole s·b·h tensors (2 bytes each) where Megatron-LM keeps their 1/tp shards."""
    sbh = 8192 * 2 * MODEL.hidden_size
    extra = block_type_activation_bytes(MODEL, BLOCK, TRAINING, GATHERED) - block_type_activation_bytes(
        MODEL, BLOCK, TRAINING, MEGATRON)
    assert extra == pytest.approx(2 * 2 * sbh * (1 - 1 / 8))


def test_full_recompute_keeps_the_block_input_shard_either_way() -> None:
    full_megatron, full_gathered = (replace(c, recompute=Recompute.FULL) for c in (MEGATRON, GATHERED))
    assert block_type_activation_bytes(MODEL, BLOCK, TRAINING, full_gathered) == block_type_activation_bytes(
        MODEL, BLOCK, TRAINING, full_megatron)


def test_the_output_layer_keeps_its_whole_input_without_sp_or_when_gathered() -> None:
    """The head's output projection is column-parallel: 1/tp of its input kept under Megatron-LM's SP, all of it
    without SP (replicated) or under DTensor's."""
    tokens = 8192 * 2 * MODEL.hidden_size
    sharded = activation_bytes(MODEL, UnitKind.HEAD, TRAINING, MEGATRON)
    assert activation_bytes(MODEL, UnitKind.HEAD, TRAINING, GATHERED) - sharded == pytest.approx(
        2 * tokens * (1 - 1 / 8))
    no_sp = replace(MEGATRON, sequence_parallel=False)
    # without SP the final norm's input is whole too: both tensors grow
    assert activation_bytes(MODEL, UnitKind.HEAD, TRAINING, no_sp) - sharded == pytest.approx(
        2 * 2 * tokens * (1 - 1 / 8))


def test_the_plan_file_records_it_and_estimate_plan_reproduces_it(tmp_path) -> None:
    out = tmp_path / "plan.json"
    run = CliRunner().invoke(main, ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--tp", "2",
                                    "--dp", "4", "--micro-batch", "1", "--framework", "torchtitan", "--zero", "3",
                                    "--json", "--out", str(out)])
    assert run.exit_code == 0, run.output
    document = json.loads(out.read_text())
    assert document["parallelism"]["sp_saves_gathered_input"] is True
    again = json.loads(CliRunner().invoke(main, ["estimate", "--plan", str(out), "--json"]).stdout)
    assert again["estimate"]["peak_memory_bytes"] == pytest.approx(document["estimate"]["peak_memory_bytes"])


def _tp_block(config: ParallelConfig):
    cluster, calibration = parse_shorthand("8x8xH100-80GB"), default_calibration()
    links = GroupLinks.from_placement(cluster, config, default_placement(cluster, config))
    return unit_costs(MODEL, TRAINING, config, links.gpu[0], links.tp[0], AnalyticProfile(MODEL, calibration),
                      calibration)[UnitKind.BLOCK]


@pytest.mark.parametrize(("recompute", "selective", "regathers"), [
    (Recompute.NONE, "attention", False), (Recompute.FULL, "attention", False), (Recompute.SELECTIVE, "op", True)])
def test_a_kept_gathered_input_is_not_gathered_again_in_backward_unless_per_op_sac_drops_it(
        recompute: Recompute, selective: str, regathers: bool) -> None:
    """Megatron-LM all-gathers each column-parallel input again for its weight gradient; DTensor keeps the gathered
    input, so backward gathers nothing more (a full recompute re-runs the forward's gathers, charged as such),
    except under torchtitan's per-op SAC, whose save list leaves the all-gather out: backward re-runs it."""
    megatron = replace(MEGATRON, overlap_tp_backward=False, recompute=recompute, selective_recompute=selective)
    titan = replace(megatron, sp_saves_gathered_input=True)
    sharded, gathered = _tp_block(megatron), _tp_block(titan)
    assert gathered.tp_forward_s == sharded.tp_forward_s
    assert (gathered.tp_backward_s == pytest.approx(sharded.tp_backward_s)) is regathers
    assert gathered.tp_backward_s <= sharded.tp_backward_s
