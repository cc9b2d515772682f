"""FP8 sequence-parallel all-gathers (Training.fp8_tp_gather): Transformer Engine quantises a linear's input and its
output gradient before gathering them under every recipe, torchtitan only under tensorwise scaling."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from cli import main
from planner.cluster import parse_shorthand
from planner.config import ParallelConfig, Training
from planner.cost.comm import all_gather_time
from planner.cost.memory import block_type_activation_bytes
from planner.cost.time import tp_gather_element_bytes, unit_costs
from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS
from planner.model import UnitKind, load_model
from planner.placement import GroupLinks, default_placement
from planner.plan_sections import training_from_record
from planner.profile.analytic import AnalyticProfile
from planner.profile.calibration import default_calibration

CALIBRATION = default_calibration()
MODEL = load_model("llama3-70b")
CLUSTER = parse_shorthand("8x8xH100-80GB")
FP8 = Training(global_batch=128, seq_len=8192, dtype="fp8", fp8_recipe="tensorwise")
SP = ParallelConfig(dp=8, tp=8, pp=1, sequence_parallel=True)


def _block_and_link(training: Training, config: ParallelConfig = SP):
    links = GroupLinks.from_placement(CLUSTER, config, default_placement(CLUSTER, config))
    cost = unit_costs(MODEL, training, config, links.gpu[0], links.tp[0], AnalyticProfile(MODEL, CALIBRATION),
                      CALIBRATION)[UnitKind.BLOCK]
    return cost, links.tp[0]


def test_fp8_gathers_move_one_byte_an_element_only_where_the_framework_quantises_first() -> None:
    assert tp_gather_element_bytes(FP8) == 1
    assert tp_gather_element_bytes(replace(FP8, fp8_tp_gather=False)) == 2
    assert tp_gather_element_bytes(Training(dtype="bf16")) == 2  # nothing to quantise


def test_each_sequence_parallel_all_gather_halves_and_the_reduce_scatters_stay_16_bit() -> None:
    """Forward: the QKV and FC1 inputs' all-gathers (synchronous without TP overlap) move FP8; the projection's and
    FC2's reduce-scatters keep 16 bits. Backward (Megatron-LM re-gathers the column-parallel inputs): the two
    row-parallel output-gradient gathers and the two input re-gathers, the latter partly behind dgrad."""
    quantised, link = _block_and_link(FP8)
    whole, _ = _block_and_link(replace(FP8, fp8_tp_gather=False))
    activation = 8192 * MODEL.hidden_size
    saved = all_gather_time(2 * activation, 8, link, CALIBRATION) - all_gather_time(activation, 8, link, CALIBRATION)
    assert whole.tp_forward_s - quantised.tp_forward_s == pytest.approx(2 * saved)
    assert saved * 2 <= whole.tp_backward_s - quantised.tp_backward_s <= saved * 4
    assert (quantised.forward_s, quantised.backward_s) == (whole.forward_s, whole.backward_s)


def test_without_sequence_parallelism_nothing_is_gathered() -> None:
    plain = ParallelConfig(dp=8, tp=8, pp=1)
    quantised, _ = _block_and_link(FP8, plain)
    whole, _ = _block_and_link(replace(FP8, fp8_tp_gather=False), plain)
    assert (quantised.tp_forward_s, quantised.tp_backward_s) == (whole.tp_forward_s, whole.tp_backward_s)


def test_torchtitan_gathers_fp8_under_tensorwise_only_megatron_under_every_recipe() -> None:
    titan, megatron = FRAMEWORKS["torchtitan"], FRAMEWORKS["megatron"]
    assert titan.gathers_tp_in_fp8("tensorwise")
    assert not any(titan.gathers_tp_in_fp8(recipe) for recipe in ("rowwise", "rowwise_with_gw_hp", "mxfp8"))
    assert all(megatron.gathers_tp_in_fp8(recipe) for recipe in megatron.fp8_recipes)


ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--global-batch", "16", "--seq-len",
            "4096", "--dp", "2", "--tp", "4", "--pp", "1", "--micro-batch", "1", "--sequence-parallel",
            "--dtype", "fp8", "--json"]


@pytest.mark.parametrize(("framework", "recipe", "gathered"), [
    ("torchtitan", "tensorwise", True), ("torchtitan", "rowwise", False), ("megatron", "delayed", True),
    ("any", "tensorwise", True)])
def test_the_cli_sets_it_from_the_framework(framework: str, recipe: str, gathered: bool) -> None:
    result = CliRunner().invoke(main, [*ESTIMATE, "--framework", framework, "--fp8-recipe", recipe])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["training"]["fp8_tp_gather"] is gathered


def test_plan_files_without_it_read_as_gathering_and_a_bad_value_is_refused() -> None:
    record = {"global_batch": 16, "seq_len": 4096, "dtype": "fp8", "fp8_recipe": "delayed"}
    assert training_from_record(record, "plan.json").fp8_tp_gather is True
    with pytest.raises(PlannerError, match="fp8_tp_gather must be true or false, got 'yes'"):
        training_from_record({**record, "fp8_tp_gather": "yes"}, "plan.json")


def test_an_moe_layers_gathers_stay_16_bit() -> None:
    """An MoE layer's sequence-parallel collectives are its token dispatcher's, on the 16-bit hidden states: of
    Mixtral's two forward all-gathers per block only the attention's moves FP8."""
    model, config = load_model("mixtral-8x7b"), ParallelConfig(dp=8, tp=8, pp=1, ep=1, sequence_parallel=True)
    links = GroupLinks.from_placement(CLUSTER, config, default_placement(CLUSTER, config))

    def block(training: Training):
        return unit_costs(model, training, config, links.gpu[0], links.tp[0], AnalyticProfile(model, CALIBRATION),
                          CALIBRATION, ep_link=links.ep[0])[UnitKind.BLOCK]

    quantised, whole = block(FP8), block(replace(FP8, fp8_tp_gather=False))
    activation = 8192 * model.hidden_size
    saved = (all_gather_time(2 * activation, 8, links.tp[0], CALIBRATION)
             - all_gather_time(activation, 8, links.tp[0], CALIBRATION))
    assert whole.tp_forward_s - quantised.tp_forward_s == pytest.approx(saved)


def test_torchao_keeps_the_fp8_input_its_tp_plan_hands_it() -> None:
    """torchao's Float8Linear saves the input it is handed (save_for_backward(input_hp, ...)): under torchtitan's
    Float8 TP plans that is the already-quantised tensor, 1 byte an element; without TP, or under rowwise recipes,
    the BF16 one. Transformer Engine keeps its FP8 copy either way."""
    titan = replace(FP8, fp8_saved_input="bf16")
    assert titan.keeps_fp8_inputs(8) and not titan.keeps_fp8_inputs(1)
    assert not replace(titan, fp8_tp_gather=False).keeps_fp8_inputs(8)
    assert FP8.keeps_fp8_inputs(1) and not Training(dtype="bf16").keeps_fp8_inputs(8)
    config = ParallelConfig(dp=8, tp=8, pp=1, sequence_parallel=True, sp_saves_gathered_input=True)
    block = next(iter(MODEL.block_types()))
    quantised = block_type_activation_bytes(MODEL, block, titan, config)
    whole = block_type_activation_bytes(MODEL, block, replace(titan, fp8_tp_gather=False), config)
    # one byte less per element of each linear's kept input: QKV's and the MLP's gathered (whole) inputs, the
    # projection's and FC2's rank-local ones
    h, tokens = MODEL.hidden_size, 8192 * config.micro_batch
    inputs = tokens * (2 * h + MODEL.query_width / 8 + MODEL.ffn_hidden_size / 8)
    assert whole - quantised == pytest.approx(inputs)
    # and backward transposes the kept FP8 copy (2 B) instead of casting the BF16 input again (3 B)
    assert (_block_and_link(titan, config)[0].backward_s
            < _block_and_link(replace(titan, fp8_tp_gather=False), config)[0].backward_s)
