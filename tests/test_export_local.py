"""Exporting a local-learning plan: the frameworks refuse it in one line (exit 2); `--to pytorch-local` writes a
reference script that compiles and, with torch installed, trains two steps on CPU (gloo, one process per stage)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli import main
from planner.export.pytorch_local import SCRIPT

# a ViT small enough for a CPU: 16 px images in 4 px patches (17 tokens), two blocks of width 64
TINY_VIT = {
    "name": "tiny-vit", "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128, "vocab_size": 10,
    "activation": "gelu", "normalization": "layernorm", "position_embedding": "learned", "linear_bias": True,
    "token_embedding": False, "max_position_embeddings": 17,
    "block_types": {
        "stem": {"role": "vision", "hidden_size": 64, "tokens": 17, "attention": "none", "mlp": "none",
                 "linears": [[48, 64, True]], "extra_parameters": 64 + 17 * 64},
        "vit": {"role": "vision", "hidden_size": 64, "tokens": 17, "normalization": "layernorm",
                "attention": {"kind": "bidirectional", "num_attention_heads": 4, "num_key_value_heads": 4,
                              "qkv_bias": True, "out_bias": True, "rope": False},
                "mlp": {"ffn_hidden_size": 128, "activation": "gelu", "bias": True}}},
    "layers": ["stem", {"type": "vit", "repeat": 2}],
}


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def local_plan(tmp_path: Path, model: str, seq_len: str, *extra: str) -> Path:
    out = tmp_path / "local.json"
    result = run("estimate", "--model", model, "--cluster", "1x2xA100-80GB", "--global-batch", "4", "--seq-len",
                 seq_len, "--pp", "2", "--schedule", "local", *extra, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_frameworks_refuse_local_learning_in_one_line(tmp_path: Path, target: str) -> None:
    result = run("export", str(local_plan(tmp_path, "tiny-llama", "32")), "--to", target)
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "changes the training algorithm" in line and "--to pytorch-local" in line


def test_pytorch_local_refuses_other_schedules_and_layouts(tmp_path: Path) -> None:
    plan = tmp_path / "1f1b.json"
    assert run("estimate", "--model", "tiny-llama", "--cluster", "1x2xA100-80GB", "--global-batch", "4",
               "--seq-len", "32", "--pp", "2", "--out", str(plan)).exit_code == 0
    result = run("export", str(plan), "--to", "pytorch-local")
    assert result.exit_code == 2 and "schedule is 1f1b" in result.output
    wide = tmp_path / "wide.json"
    assert run("estimate", "--model", "tiny-llama", "--cluster", "1x4xA100-80GB", "--global-batch", "4",
               "--seq-len", "32", "--pp", "2", "--tp", "2", "--schedule", "local", "--out", str(wide)).exit_code == 0
    result = run("export", str(wide), "--to", "pytorch-local")
    assert result.exit_code == 2 and "needs dp=tp=cp=ep=1, got tp=2" in result.output


@pytest.mark.parametrize("model", ["vit-b-16", "llama2-7b"])
def test_reference_script_compiles_with_the_plan_settings(tmp_path: Path, model: str) -> None:
    seq_len = "197" if model.startswith("vit") else "4096"
    out = tmp_path / "export"
    result = run("export", str(local_plan(tmp_path, model, seq_len, "--local-queue-depth", "3")), "--to",
                 "pytorch-local", "--out", str(out))
    assert result.exit_code == 0, result.output
    text = (out / SCRIPT).read_text()
    compile(text, SCRIPT, "exec")
    assert "'queue_depth': 3" in text and "'num_microbatches': 4" in text
    assert f'"$HERE/{SCRIPT}"' in (out / "torchrun.sh").read_text()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-vit"])
def test_reference_script_trains_two_steps_on_cpu(tmp_path: Path, model: str) -> None:
    if model == "tiny-vit":
        model = str(tmp_path / "tiny-vit.yaml")
        Path(model).write_text(yaml.safe_dump(TINY_VIT))
    seq_len = "17" if model.endswith(".yaml") else "32"
    out = tmp_path / "export"
    plan = local_plan(tmp_path, model, seq_len, "--local-head", "mlp", "--local-queue-depth", "1")
    assert run("export", str(plan), "--to", "pytorch-local", "--out", str(out)).exit_code == 0
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(29500 + os.getpid() % 1000), SCRIPT, "--steps", "2"],
                          cwd=out, env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for stage in (0, 1):
        assert f"stage {stage} step 1: local loss" in done.stdout
