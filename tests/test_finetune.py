"""Fine-tuning (planner/finetune.py, planner/cost/adapters.py): trainable parameters against Hugging Face PEFT's
printed counts and the LoRA / QLoRA papers, frozen-base memory and time, optimizer states, the CLI and exports."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.finetune_facts import facts
from cli import main
from planner.cluster import parse_shorthand
from planner.config import LORA_TARGETS, ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.memory import model_state_bytes, parameter_model_states
from planner.cost.time import CPU_ADAM_S_PER_PARAM, optimizer_step_time
from planner.errors import InfeasibleError, PlannerError
from planner.finetune import NF4_BITS_PER_PARAM, adapter_linears, adapter_parameters, parameter_states
from planner.gpu import GIB, PCIE4_HOST_LINK_BYTES_PER_S, lookup_gpu
from planner.model import load_model
from planner.profile.calibration import default_calibration
from planner.search.planning import plan

LLAMA3_8B, LLAMA2_7B = load_model("llama3-8b"), load_model("llama2-7b")
FACTS = {fact.name: fact for fact in facts()}


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def lora(**fields) -> Training:
    return Training(**{"global_batch": 8, "seq_len": 2048, "finetune": "lora", **fields})


# ---- trainable parameters ----------------------------------------------------------------------------

def test_peft_llama2_7b_q_v_rank_8_prints_4_194_304_trainable_of_6_742_609_920() -> None:
    """PEFT's print_trainable_parameters() on Llama-2-7B with its default LoraConfig(r=8) (target_modules q_proj,
    v_proj): "trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622"."""
    trainable = adapter_parameters(LLAMA2_7B, lora(lora_rank=8, lora_targets="qv"))
    assert trainable == 4_194_304
    assert LLAMA2_7B.num_parameters + trainable == 6_742_609_920


def test_peft_llama3_8b_all_linear_rank_16_has_41_943_040_trainable() -> None:
    """PEFT on Llama-3-8B, r = 16 on q, k, v, o, gate, up, down (GQA: k and v are 1024 wide): 41,943,040."""
    assert adapter_parameters(LLAMA3_8B, lora(lora_rank=16)) == 41_943_040


def test_lora_paper_gpt3_trainable_parameters_table_4() -> None:
    """Hu et al. 2021 Table 4: LoRA on Wq, Wv of GPT-3 175B, 4.7 M (r = 1) and 37.7 M (r = 8) parameters."""
    assert FACTS["GPT-3 LoRA Wq,Wv r=1 trainable"].error == pytest.approx(0, abs=0.01)
    assert FACTS["GPT-3 LoRA Wq,Wv r=8 trainable"].error == pytest.approx(0, abs=0.01)
    # "reduce the number of trainable parameters by 10,000 times" (r = 4, Wq, Wv: 9,251x; the paper rounds)
    assert FACTS["GPT-3 trainable reduction r=4 Wq,Wv"].error == pytest.approx(0, abs=0.1)


def test_every_routed_expert_gets_adapters_when_the_mlp_is_targeted() -> None:
    mixtral = load_model("mixtral-8x7b")
    attention = adapter_parameters(mixtral, lora(lora_targets="attention"))
    mlp = adapter_parameters(mixtral, lora(lora_targets="mlp"))
    per_expert = 16 * (3 * 4096 + 3 * 14336)  # gate, up (4096 → 14336) and down, r = 16
    assert mlp == mixtral.num_layers * 8 * per_expert
    assert adapter_parameters(mixtral, lora()) == attention + mlp


def test_qv_adapts_the_attention_blocks_of_a_hybrid_and_refuses_a_model_without_q_and_v() -> None:
    """PEFT skips modules its target names do not match: Mamba mixers have no q_proj / v_proj; MLA has no v_proj."""
    hybrid = load_model("nemotron-h-8b")
    attention_blocks = sum(count for block, count in hybrid.block_types().items() if block.attention is not None)
    width = hybrid.hidden_size
    kv = next(block.attention.kv_width for block in hybrid.block_types() if block.attention is not None)
    assert adapter_parameters(hybrid, lora(lora_targets="qv")) == attention_blocks * 16 * (2 * width + width + kv)
    with pytest.raises(PlannerError, match="qv adapt no linear of deepseek-v3"):
        adapter_parameters(load_model("deepseek-v3"), lora(lora_targets="qv"))


@settings(max_examples=25, deadline=None)
@given(rank=st.integers(1, 256), targets=st.sampled_from(LORA_TARGETS),
       name=st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "gpt3-1.3b", "gemma3-27b"]))
def test_trainable_parameters_are_r_times_the_adapted_widths(rank, targets, name) -> None:
    """Property: the count is exactly r·(d_in + d_out) over every adapted linear of every block."""
    model = load_model(name)
    training = lora(lora_rank=rank, lora_targets=targets)
    expected = sum(count * sum(copies * rank * (d_in + d_out) for d_in, d_out, copies
                               in adapter_linears(block, targets))
                   for block, count in model.block_types().items())
    assert adapter_parameters(model, training) == expected > 0
    assert parameter_states(model, training).trainable == pytest.approx(expected / model.num_parameters)


# ---- states and memory -------------------------------------------------------------------------------

def test_qlora_double_quantisation_costs_0_127_bits_per_parameter() -> None:
    """Dettmers et al. 2023 §3: 8/64 + 32/(64·256) = 0.127 bits of constants per parameter."""
    assert pytest.approx(0.127, abs=5e-4) == NF4_BITS_PER_PARAM - 4


def test_lora_paper_gpt3_vram_350_gb_and_qlora_65b_full_fine_tuning_over_780_gb() -> None:
    """Hu et al. §4.2: LoRA's training VRAM on GPT-3 is 350 GB (its frozen 16-bit weights); Dettmers et al. §1:
    16-bit full fine-tuning of a 65B model needs more than 780 GB. (The LoRA paper's 1.2 TB for GPT-3 full
    fine-tuning is below even 16-bit weights, gradients and fp32 m, v (12 B/param = 2.1 TB) and is not reproduced;
    benchmarks/finetune_facts.py reports that error.)"""
    assert FACTS["GPT-3 LoRA training VRAM (model states)"].error == pytest.approx(0, abs=0.01)
    assert FACTS["65B 16-bit full fine-tuning memory (>780 GB)"].planner > 780e9


def test_qlora_fits_a_65b_model_on_one_48_gb_gpu() -> None:
    """Dettmers et al. 2023 §1: Guanaco 65B fine-tuned with QLoRA on a single 48 GB GPU."""
    fact = FACTS["65B QLoRA peak on one 48 GB GPU (fits)"]
    assert fact.planner <= fact.published
    assert fact.planner > 0.8 * fact.published  # and not by an implausible margin: 4-bit weights alone are 33 GB


def test_lora_trains_faster_than_full_fine_tuning_of_gpt3() -> None:
    """Hu et al. §4.2: 25 % faster training than full fine-tuning on GPT-3 175B (planner: no weight gradients)."""
    assert 0.1 < FACTS["GPT-3 LoRA training speed-up over full"].planner < 0.4


def test_full_training_states_are_the_pre_training_accounting() -> None:
    full = parameter_states(LLAMA3_8B, Training())
    for sharding in range(4):
        assert parameter_model_states(1.0, 8, sharding, 4, full) == model_state_bytes(1.0, 8, sharding, 4)


def test_frozen_weights_take_no_gradients_or_optimizer_states() -> None:
    states = parameter_states(LLAMA3_8B, lora())
    per_param = parameter_model_states(1.0, 1, 0, 4, states)
    assert per_param.frozen_weights == 2.0
    assert per_param.weights == pytest.approx(2 + 2 * states.trainable)
    assert per_param.gradients == pytest.approx(4 * states.trainable)
    assert per_param.optimizer == pytest.approx(12 * states.trainable)


def test_qlora_keeps_the_embedding_and_head_in_16_bits() -> None:
    states = parameter_states(LLAMA3_8B, Training(finetune="qlora"))
    ends = LLAMA3_8B.embedding_parameters() + LLAMA3_8B.head_parameters()
    total = LLAMA3_8B.num_parameters
    assert states.frozen_bytes * total > (total - ends) * NF4_BITS_PER_PARAM / 8 + ends * 2 - 1e6 * 2


CLUSTER = parse_shorthand("1x8xA100-80GB")


@settings(max_examples=12, deadline=None)
@given(finetune=st.sampled_from(["lora", "qlora"]), rank=st.sampled_from([4, 16, 64]),
       targets=st.sampled_from(LORA_TARGETS), tp=st.sampled_from([1, 2, 8]), zero=st.sampled_from([0, 1, 3]),
       recompute=st.sampled_from(list(Recompute)))
def test_frozen_base_needs_less_memory_and_time_than_full_training(finetune, rank, targets, tp, zero,
                                                                   recompute) -> None:
    """Property: with the same layout, LoRA / QLoRA never need more memory per GPU than full fine-tuning, and
    their compute is shorter (no weight gradients: the adapters and de-quantisation add far less). Their backward
    as a whole need not be: at tp = 8 the TP collectives the weight gradients hid are exposed."""
    config = ParallelConfig(dp=8 // tp, tp=tp, pp=1, zero_stage=zero, recompute=recompute)
    full = estimate(LLAMA3_8B, CLUSTER, Training(global_batch=8, seq_len=2048), config)
    tuned = estimate(LLAMA3_8B, CLUSTER, lora(finetune=finetune, lora_rank=rank, lora_targets=targets), config)
    assert tuned.peak_memory_bytes < full.peak_memory_bytes
    assert tuned.breakdown_s["compute"] < full.breakdown_s["compute"]
    assert tuned.breakdown_s["dp_comm"] <= full.breakdown_s["dp_comm"]
    assert tuned.breakdown_s["optimizer"] < full.breakdown_s["optimizer"]


def test_qlora_pays_a_de_quantisation_per_pass() -> None:
    config = ParallelConfig(dp=8, tp=1, pp=1)
    plain = estimate(LLAMA3_8B, CLUSTER, lora(), config).stages[0]
    quantised = estimate(LLAMA3_8B, CLUSTER, lora(finetune="qlora"), config).stages[0]
    assert quantised.forward_s > plain.forward_s and quantised.backward_s > plain.backward_s


# ---- optimizer states --------------------------------------------------------------------------------

def test_8bit_adam_holds_6_bytes_per_parameter_and_offload_none() -> None:
    assert parameter_states(LLAMA3_8B, Training(optimizer_states="8bit")).optimizer_bytes == pytest.approx(6, abs=0.01)
    assert parameter_states(LLAMA3_8B, Training(optimizer_states="cpu")).optimizer_bytes == 0


def test_offloaded_step_is_priced_by_the_host_link_and_cpu_adam() -> None:
    states = parameter_states(LLAMA3_8B, Training(optimizer_states="cpu"))
    config = ParallelConfig(dp=1, tp=1, pp=1)
    seconds = optimizer_step_time(1e9, config, lookup_gpu("A100-80GB"), default_calibration(), states, 4)
    assert seconds == pytest.approx(1e9 * 6 / PCIE4_HOST_LINK_BYTES_PER_S + 1e9 * CPU_ADAM_S_PER_PARAM)


def test_plan_chooses_memory_saving_optimizer_states_only_when_nothing_fits() -> None:
    training = Training(global_batch=32, seq_len=4096)
    fits = plan(LLAMA3_8B, CLUSTER, training, top_k=1, time_limit_s=1.0, choose_optimizer_states=True)
    assert fits.training == training
    big = load_model("llama3-70b")
    with pytest.raises(InfeasibleError):
        plan(big, CLUSTER, training, top_k=1, time_limit_s=1.0)
    chosen = plan(big, CLUSTER, training, top_k=1, time_limit_s=1.0, choose_optimizer_states=True)
    assert chosen.training.optimizer_states in ("8bit", "cpu") and chosen.best.estimate.fits


# ---- CLI -----------------------------------------------------------------------------------------------

def test_issue_example_lora_70b_on_8_a100_fits_with_frozen_and_trainable_states(tmp_path) -> None:
    out = tmp_path / "plan.json"
    result = run("plan", "--model", "llama3-70b", "--cluster", "1x8xA100-80GB", "--finetune", "lora",
                 "--global-batch", "32", "--seq-len", "4096", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "LoRA r=16 all-linear (207.1 M trainable" in result.output
    assert "frozen weights  trainable weights" in result.output and "(fits)" in result.output
    document = json.loads(out.read_text())
    assert document["training"]["finetune"] == "lora" and document["training"]["lora_rank"] == 16
    assert document["stages"][0]["memory_bytes"]["frozen_weights"] > 0
    again = run("estimate", "--plan", str(out))
    assert again.exit_code == 0 and "estimate reproduced exactly" in again.output


def test_issue_example_qlora_70b_fits_one_a100() -> None:
    result = run("plan", "--model", "llama3-70b", "--cluster", "1x1xA100-80GB", "--finetune", "qlora",
                 "--global-batch", "32", "--seq-len", "4096")
    assert result.exit_code == 0, result.output
    assert "QLoRA r=16" in result.output and "(fits)" in result.output and "frozen weights" in result.output


@pytest.mark.parametrize("args, message", [
    (["--finetune", "lora", "--lora-rank", "0"], "lora_rank must be a positive integer, got 0"),
    (["--lora-rank", "8"], "lora-rank only shape LoRA adapters: use finetune lora or qlora"),
    (["--lora-targets", "mlp"], "lora-targets only shape LoRA adapters"),
    (["--finetune", "qlora", "--dtype", "fp8"], "use dtype bf16 or fp16, got fp8"),
    (["--finetune", "lora", "--lora-rank", "4096"], "lora rank 4096 must be below 1024"),
    (["--finetune", "partial"], "'partial' is not one of 'full', 'lora', 'qlora'"),
    (["--finetune", "lora", "--framework", "torchtitan"], "torchtitan 0.2.2's llama3 cannot fine-tune with lora"),
    (["--optimizer-states", "8bit", "--framework", "megatron"], "has no 8bit optimizer states"),
])
def test_bad_fine_tuning_options_exit_2_with_one_line(args, message) -> None:
    for command in ("plan", "estimate"):
        result = run(command, "--model", "llama3-8b", "--cluster", "1x8xA100-80GB", "--global-batch", "8",
                     *(["--tp", "1", "--pp", "1"] if command == "estimate" else []), *args)
        assert result.exit_code == 2, (command, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_measured_profile_refuses_fine_tuning() -> None:
    with pytest.raises(PlannerError, match="needs the analytic profile"):
        from planner.cost.adapters import adapter_block_times
        block = next(iter(LLAMA3_8B.block_types()))
        adapter_block_times(block, None, lora(), None, None, object())  # type: ignore[arg-type]


@pytest.mark.parametrize("target, missing", [
    ("megatron", "pretrain_gpt.py has no LoRA/PEFT"), ("deepspeed", "Megatron-DeepSpeed's pretrain_gpt.py has no"),
    ("torchtitan", "0.2.2 has no LoRA model converter"),
])
def test_exports_refuse_adapters_naming_what_is_missing(tmp_path, target, missing) -> None:
    out = tmp_path / "plan.json"
    assert run("estimate", "--model", "llama3-8b", "--cluster", "1x8xA100-80GB", "--global-batch", "8", "--tp", "1",
               "--finetune", "lora", "--out", str(out)).exit_code == 0
    result = run("export", str(out), "--to", target)
    assert result.exit_code == 2 and missing in result.output and len(result.output.strip().splitlines()) == 1


def test_deepspeed_export_offloads_the_optimizer_to_the_cpu(tmp_path) -> None:
    out = tmp_path / "plan.json"
    assert run("estimate", "--model", "llama3-8b", "--cluster", "1x8xA100-80GB", "--global-batch", "8", "--tp", "1",
               "--zero", "1", "--framework", "deepspeed", "--optimizer-states", "cpu", "--seq-len", "2048",
               "--recompute", "full", "--out", str(out)).exit_code == 0
    result = run("export", str(out), "--to", "deepspeed")
    assert result.exit_code == 0, result.output
    assert '"offload_optimizer": {\n      "device": "cpu"' in result.output
    unsharded = run("estimate", "--model", "llama3-8b", "--cluster", "1x8xA100-80GB", "--global-batch", "8",
                    "--tp", "1", "--framework", "deepspeed", "--optimizer-states", "cpu")
    assert unsharded.exit_code == 2 and "keeps cpu optimizer states only with ZeRO-1 or ZeRO-2 or ZeRO-3" in (
        unsharded.output)


def test_full_fine_tuning_memory_in_gib_matches_the_states_rule() -> None:
    """Sanity of the breakdown: the frozen part is 0 for full training and the states add up."""
    result = estimate(LLAMA3_8B, CLUSTER, Training(global_batch=8, seq_len=2048), ParallelConfig(dp=8, tp=1, pp=1))
    memory = result.stages[0].memory
    assert memory.frozen_weights == 0 and "frozen_weights" not in memory.as_dict()
    assert memory.weights == pytest.approx(2 * LLAMA3_8B.num_parameters) and memory.total < 80 * GIB * 2


def test_compare_shows_the_fine_tuning_mode_and_optimizer_states(tmp_path) -> None:
    paths = [tmp_path / "lora.json", tmp_path / "full.json"]
    common = ("estimate", "--model", "llama3-8b", "--cluster", "1x8xA100-80GB", "--global-batch", "8", "--tp", "1",
              "--seq-len", "2048", "--recompute", "full")
    assert run(*common, "--finetune", "lora", "--out", str(paths[0])).exit_code == 0
    assert run(*common, "--optimizer-states", "8bit", "--zero", "3", "--out", str(paths[1])).exit_code == 0
    result = run("compare", *map(str, paths))
    assert result.exit_code == 0, result.output
    assert "lora r=16 all-linear" in result.output and "8bit" in result.output
