"""ViT image classifiers in the catalog (Dosovitskiy et al. 2021, arXiv:2010.11929, Table 1) and planning them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import main
from planner.config import ParallelConfig, Training
from planner.cost.memory import activation_bytes
from planner.model import UnitKind, load_model

# Table 1's parameter counts; timm's vit_*_224 with 1,000 classes, exact (the catalog leaves out the head's 1,000
# biases, as the planner's head has no bias)
PUBLISHED = {"vit-b-16": (86e6, 86_567_656), "vit-l-16": (307e6, 304_326_632), "vit-h-14": (632e6, 632_045_800)}


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_counts_match_table_1(name: str) -> None:
    model = load_model(name)
    table, timm = PUBLISHED[name]
    assert model.num_parameters == pytest.approx(table, rel=0.01)
    assert model.num_parameters == timm - 1000


@pytest.mark.parametrize(("name", "patch", "width"), [("vit-b-16", 16, 768), ("vit-h-14", 14, 1280)])
def test_patch_stem_then_bidirectional_blocks_over_patches_plus_class_token(name: str, patch: int, width: int) -> None:
    model = load_model(name)
    tokens = (224 // patch) ** 2 + 1
    stem, *blocks = model.blocks
    assert stem.linears == ((3 * patch * patch, width, True),) and stem.attention is None and stem.tokens == tokens
    assert all(b.tokens == tokens and b.attention.kind == "bidirectional" for b in blocks)
    assert model.embedding_parameters() == 0 and model.vocab_size == 1000  # no token embedding; 1,000 classes
    assert next(u for u in model.units() if u.kind is UnitKind.EMBEDDING).num_parameters == 0


def test_vit_on_four_gpus_plans_with_its_token_count() -> None:
    """PPLL's 4-GPU setting: 197 tokens (odd: no context parallelism needed to split it) over 4 pipeline stages."""
    result = CliRunner().invoke(main, ["plan", "--model", "vit-b-16", "--cluster", "1x4xA100-80GB", "--global-batch",
                                       "256", "--seq-len", "197", "--pp", "4", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["parallelism"]["pp"] == 4 and document["estimate"]["fits"]
    assert document["stages"][0]["time_s"]["forward"] > 0


def test_the_head_reads_the_class_token_alone() -> None:
    """A classifier's head normalises and projects one token per image: its kept inputs (2 × 2 bytes × h) and fp32
    logits (4 bytes × 1,000 classes) per sample, not per token; a language model's head reads every token."""
    vit, llama = load_model("vit-b-16"), load_model("tiny-llama")
    config, training = ParallelConfig(dp=1, tp=1, pp=1, micro_batch=8), Training(seq_len=197)
    assert activation_bytes(vit, UnitKind.HEAD, training, config) == 8 * (4 * 768 + 4 * 1000)
    assert activation_bytes(llama, UnitKind.HEAD, training, config) == 8 * 197 * (4 * 256 + 4 * 1024)
