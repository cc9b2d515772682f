"""Memory model against the published tables: Korthikanti et al. 2022 Table 2 and eqs. 5–6,
ZeRO (Rajbhandari et al. 2020) Table 1, Megatron-LM's bytes-per-parameter table."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.config import ParallelConfig, Recompute, Schedule
from planner.cost.memory import block_activation_bytes, in_flight_microbatches, model_state_bytes
from planner.model import ModelSpec

DATA = Path(__file__).parent / "data"


def gpt_block(hidden: int, heads: int) -> ModelSpec:
    """A GPT-3-style block as Korthikanti et al. assume it: MHA, 4h GeLU MLP, LayerNorm, dropout."""
    return ModelSpec("gpt", 1, hidden, heads, 4 * hidden, 51200, activation="gelu", normalization="layernorm",
                     position_embedding="learned", tie_embeddings=True, linear_bias=True, dropout=True)


# Korthikanti et al. 2022, Table 2 (bytes per transformer layer), keyed by the CSV's configuration column.
TABLE2 = {
    "no parallelism": (1, False, Recompute.NONE, lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    "tensor parallel (baseline)": (
        None, False, Recompute.NONE, lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    "tensor + sequence parallel": (
        None, True, Recompute.NONE, lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t))),
    "tensor parallel + selective activation recomputation": (
        None, False, Recompute.SELECTIVE, lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    "tensor parallel + sequence parallel + selective activation recomputation": (
        None, True, Recompute.SELECTIVE, lambda s, b, h, a, t: s * b * h * 34 / t),
    "full activation recomputation": (None, False, Recompute.FULL, lambda s, b, h, a, t: s * b * h * 2),
}

SHAPES = [  # (s, b, h, a, t): GPT-3 175B, MT-NLG 530B, 22B, 1T settings of Korthikanti Table 3, plus small ones
    (2048, 1, 12288, 96, 8), (2048, 1, 20480, 128, 8), (2048, 4, 6144, 64, 8), (2048, 1, 25600, 160, 8),
    (1024, 2, 1024, 16, 2), (4096, 1, 4096, 32, 4),
]


def test_table2_csv_rows_are_all_covered() -> None:
    with (DATA / "korthikanti2022_table2_activation_memory_per_layer.csv").open() as handle:
        rows = {row["configuration"] for row in csv.DictReader(handle)}
    assert rows == set(TABLE2)


@pytest.mark.parametrize("configuration", TABLE2)
@pytest.mark.parametrize(("s", "b", "h", "a", "t"), SHAPES)
def test_activation_bytes_reproduce_korthikanti_table2(configuration: str, s: int, b: int, h: int, a: int,
                                                       t: int) -> None:
    forced_tp, sequence_parallel, recompute, formula = TABLE2[configuration]
    tp = forced_tp or t
    got = block_activation_bytes(gpt_block(h, a), s, b, tp, sequence_parallel, recompute, attention="unfused")
    assert got == pytest.approx(formula(s, b, h, a, tp), rel=1e-12)


@pytest.mark.parametrize(("p", "m", "v"), [(8, 64, 1), (8, 64, 2), (12, 96, 3), (4, 8, 4), (35, 280, 1)])
def test_first_stage_holds_korthikanti_eq5_worth_of_layers(p: int, m: int, v: int) -> None:
    """Eq. 5: rank 0 of 1F1B holds p micro-batches of L/p layers = L layers' worth; interleaving
    multiplies that by 1 + (p − 1)/(p·v)."""
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    config = ParallelConfig(dp=1, tp=1, pp=p, vpp=v, schedule=schedule)
    layers_worth = in_flight_microbatches(config, 0, m) * (1 / p)  # per chunk of L/(p·v) layers × v chunks
    expected = 1 + (p - 1) / (p * v) if v > 1 else 1.0
    assert layers_worth == pytest.approx(expected)


@given(p=st.integers(1, 16), m=st.integers(1, 64), rank=st.integers(0, 15))
def test_1f1b_in_flight_is_min_of_remaining_stages_and_microbatches(p: int, m: int, rank: int) -> None:
    rank %= p
    config = ParallelConfig(dp=1, tp=1, pp=p)
    assert in_flight_microbatches(config, rank, m) == min(p - rank, m)
    gpipe = ParallelConfig(dp=1, tp=1, pp=p, schedule=Schedule.GPIPE)
    assert in_flight_microbatches(gpipe, rank, m) == m


ZERO_STAGES = {"Pos": 1, "Pos+g": 2, "Pos+g+p": 3}
PSI = {"7.5B": 7.5e9, "128B": 128e9, "1T": 1e12}


def zero_table1_rows() -> list[dict[str, str]]:
    with (DATA / "zero2020_table1_model_state_memory.csv").open() as handle:
        return list(csv.DictReader(handle))


def row_id(row: dict[str, str]) -> str:
    return f"{row['model']}-{row['zero_dp_stage']}-{row['dp_degree_Nd']}"


@pytest.mark.parametrize("row", zero_table1_rows(), ids=row_id)
def test_model_states_reproduce_zero_table1(row: dict[str, str]) -> None:
    """ZeRO Table 1: fp16 params + fp16 grads + K = 12 bytes of optimizer state per parameter."""
    states = model_state_bytes(PSI[row["model"]], int(row["dp_degree_Nd"]), ZERO_STAGES[row["zero_dp_stage"]],
                               grad_bytes=2)
    gigabytes = states.total / 1e9
    formula_value = float(row["formula_value_GB (Psi in B params x bytes; K=12)"])
    assert gigabytes == pytest.approx(formula_value, abs=5.001e-4)  # the CSV rounds to 3 decimals
    published = float(row["per_device_model_state_GB_published"])
    assert gigabytes == pytest.approx(published, rel=0.005, abs=0.006)  # the paper rounds to 3 digits


@pytest.mark.parametrize(
    ("param_bytes", "grad_bytes", "optimizer_bytes", "replicated", "distributed"),
    [  # Megatron-LM docs/user-guide/features/dist_optimizer.md: bytes per parameter
        (2, 2, 16, 20, lambda d: 4 + 16 / d),  # fp16 params / fp16 grads
        (2, 4, 12, 18, lambda d: 6 + 12 / d),  # bf16 params / fp32 grads (Megatron's default for bf16)
        (4, 4, 8, 16, lambda d: 8 + 8 / d),  # fp32 / fp32
    ],
)
@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_megatron_bytes_per_parameter(param_bytes, grad_bytes, optimizer_bytes, replicated, distributed, dp) -> None:
    plain = model_state_bytes(1.0, dp, 0, grad_bytes, optimizer_bytes, param_bytes)
    sharded = model_state_bytes(1.0, dp, 1, grad_bytes, optimizer_bytes, param_bytes)
    assert plain.total == pytest.approx(replicated)
    assert sharded.total == pytest.approx(distributed(dp))


@given(hidden_per_head=st.sampled_from([64, 128]), heads=st.sampled_from([8, 16, 32]), tp=st.sampled_from([1, 2, 4, 8]),
       s=st.sampled_from([512, 2048]), b=st.integers(1, 4))
def test_activation_memory_orders(hidden_per_head: int, heads: int, tp: int, s: int, b: int) -> None:
    """Invariants: full < selective < none; sequence parallelism never adds memory."""
    model = gpt_block(hidden_per_head * heads, heads)
    def act(sp: bool, recompute: Recompute) -> float:
        return block_activation_bytes(model, s, b, tp, sp, recompute, attention="unfused")
    for sp in (False, True):
        assert act(sp, Recompute.FULL) < act(sp, Recompute.SELECTIVE) < act(sp, Recompute.NONE)
        assert act(True, Recompute.NONE) <= act(False, Recompute.NONE)


@pytest.mark.parametrize(("schedule", "vpp"),
                         [(Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED, 3)])
@pytest.mark.parametrize("m", [1, 4, 6, 8, 24])
def test_in_flight_microbatches_never_grow_with_the_rank(schedule, vpp, m) -> None:
    """The search's memory bound takes the last rank's in-flight count as the least (search._bound)."""
    config = ParallelConfig(dp=1, tp=1, pp=4, vpp=vpp, schedule=schedule)
    if schedule is Schedule.INTERLEAVED and m % 4:
        return
    counts = [in_flight_microbatches(config, r, m) for r in range(4)]
    assert counts == sorted(counts, reverse=True)


def test_fp8_training_keeps_the_linear_layers_saved_inputs_in_one_byte() -> None:
    """Transformer Engine's FP8 linears keep the quantized input for their weight gradient (Micikevicius et al. 2022
    §4): for a Qwen3-30B-A3B MoE block (top-8 of 128 experts, SwiGLU, flash attention, tp 1) the FP8 activations
    are the BF16 ones less one byte per element of the attention's normed input, the 8 routed copies and the 8
    routed expert outputs the second matrix reads, plus one byte per element of the attention output the
    projection quantizes (its 16-bit copy stays for the fused attention backward unless selective recompute
    reruns it). The MoE sub-layer's normed input stays in BF16 for the router."""
    from planner.config import Training
    from planner.cost.memory import block_type_activation_bytes
    from planner.model import load_model

    model = load_model("qwen3-30b-a3b")
    block, config = next(iter(model.block_types())), ParallelConfig(dp=1, tp=1, pp=1)
    s, h, k = 4096, model.hidden_size, 8
    f, query = block.mlp.ffn_hidden_size, block.attention.num_attention_heads * block.attention.value_head_dim
    bf16 = block_type_activation_bytes(model, block, Training(seq_len=s, dtype="bf16", attention="flash"), config)
    fp8 = block_type_activation_bytes(model, block, Training(seq_len=s, dtype="fp8", attention="flash"), config)
    assert bf16 - fp8 == pytest.approx(s * (h + k * h + k * f - query))
    # with the attention core recomputed (selective) no 16-bit copy of its output is kept: one byte less each
    selective = ParallelConfig(dp=1, tp=1, pp=1, recompute=Recompute.SELECTIVE)
    bf16 = block_type_activation_bytes(model, block, Training(seq_len=s, dtype="bf16", attention="flash"), selective)
    fp8 = block_type_activation_bytes(model, block, Training(seq_len=s, dtype="fp8", attention="flash"), selective)
    assert bf16 - fp8 == pytest.approx(s * (h + k * h + k * f + query))
