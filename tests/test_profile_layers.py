"""`planner profile layers`: a tiny model measured on CPU end to end, and the per-rank TP shapes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cli
from planner.errors import PlannerError
from planner.model import load_model
from planner.profile.measure import ProfileRequest, rank_shapes
from planner.profile.measured import load_measured_profile

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory):
    """tiny-llama (profiles/models.yaml) at tp 1 and 2, micro-batches 1 and 2, sequence 32."""
    out = tmp_path_factory.mktemp("profile") / "PROFILE.json"
    result = CliRunner().invoke(cli.main, [
        "profile", "layers", "--model", "tiny-llama", "--tp", "1", "--tp", "2", "--micro-batch", "1",
        "--micro-batch", "2", "--seq-len", "32", "--dtype", "fp32", "--warmup", "1", "--iters", "2",
        "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    return out


def test_profile_layers_writes_every_unit_setting(profile_path) -> None:
    document = json.loads(profile_path.read_text())
    assert document["schema_version"] == 1
    assert document["model"]["name"] == "tiny-llama"
    assert document["device"]["type"] == "cpu"
    assert document["memory_measured"] is False and "not measured" in document["memory_note"]
    keys = {(e["kind"], e["tp"], e["micro_batch"]) for e in document["units"]}
    assert keys == {(k, t, b) for k in ("embedding", "block", "head") for t in (1, 2) for b in (1, 2)}
    for entry in document["units"]:
        assert entry["forward_s"] > 0 and entry["backward_s"] > 0
        assert entry["peak_bytes"] is None
        assert (entry["attention_core_forward_s"] > 0) == (entry["kind"] == "block")
    assert load_measured_profile(profile_path).measured_tps() == [1, 2]


def test_profile_layers_shows_progress_on_stderr(tmp_path) -> None:
    result = CliRunner().invoke(cli.main, ["profile", "layers", "--model", "tiny-llama", "--seq-len", "16",
                                           "--dtype", "fp32", "--warmup", "0", "--iters", "1",
                                           "--attention", "unfused", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert "[3/3] head tp=1 micro-batch=1" in result.stderr
    assert "[1/3]" not in result.stdout


def test_rank_shapes_follow_megatron_sharding() -> None:
    """tiny-llama: 8 heads, 4 KV heads, ffn 688, vocab 1024; KV heads are replicated when tp > kv."""
    model = load_model("tiny-llama")
    shapes = rank_shapes(model, 8)
    assert (shapes.heads, shapes.kv_heads, shapes.ffn, shapes.vocab) == (1, 1, 86, 128)
    assert rank_shapes(model, 2).kv_heads == 2
    with pytest.raises(PlannerError, match="--tp 3"):
        rank_shapes(model, 3)


def test_profile_request_rejects_bad_values() -> None:
    with pytest.raises(PlannerError, match="micro_batches"):
        ProfileRequest(tps=(1,), micro_batches=(0,), seq_len=8)
    with pytest.raises(PlannerError, match="dtype"):
        ProfileRequest(tps=(1,), micro_batches=(1,), seq_len=8, dtype="fp8")


def test_cuda_request_without_cuda_is_one_line_error(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = CliRunner().invoke(cli.main, ["profile", "layers", "--model", "tiny-llama", "--device", "cuda",
                                           "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output
