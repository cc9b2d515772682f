"""A measured PROFILE.json as the cost model's unit timer: validation, micro-batch interpolation,
and `estimate --profile` using the measured numbers."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

import cli
from planner.errors import PlannerError
from planner.gpu import lookup_gpu
from planner.model import UnitKind, load_model
from planner.profile.analytic import UnitSetting
from planner.profile.measure import ProfileRequest, measure_layers
from planner.profile.measured import load_measured_profile, parse_profile_document

H100 = lookup_gpu("H100-80GB")
# Synthetic measurements (seconds): forward, backward, attention core forward per (kind, micro-batch).
TIMES = {
    ("embedding", 1): (1e-4, 2e-4, 0.0), ("embedding", 4): (4e-4, 8e-4, 0.0),
    ("block", 1): (1e-3, 2e-3, 3e-4), ("block", 4): (3.4e-3, 6.8e-3, 1.2e-3),
    ("head", 1): (5e-4, 1e-3, 0.0), ("head", 4): (2e-3, 4e-3, 0.0),
}


def profile_document(gpu: str | None = None) -> dict:
    return {
        "schema_version": 1,
        "model": load_model("tiny-llama").to_dict(),
        "gpu": gpu,
        "device": {"type": "cpu", "name": "cpu"},
        "settings": {"seq_len": 128, "dtype": "bf16", "attention": "flash"},
        "memory_measured": False,
        "units": [{"kind": kind, "tp": 1, "micro_batch": b, "forward_s": f, "backward_s": bw,
                   "attention_core_forward_s": core} for (kind, b), (f, bw, core) in TIMES.items()],
    }


def setting(micro_batch: int, tp: int = 1, seq_len: int = 128, sequence_parallel: bool = False) -> UnitSetting:
    return UnitSetting(tp, micro_batch, seq_len, sequence_parallel, "bf16", "flash")


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "PROFILE.json"
    path.write_text(json.dumps(profile_document()))
    return path


def test_measured_micro_batch_is_returned_as_is() -> None:
    profile = parse_profile_document(profile_document(), "p.json")
    times = profile.times(UnitKind.BLOCK, setting(4), H100)
    assert (times.forward_s, times.backward_s, times.attention_core_forward_s) == TIMES[("block", 4)]
    assert profile.notes == ("profile: times measured on cpu applied to every GPU (H100-80GB)",)


def test_interpolation_is_linear_in_micro_batch_and_noted() -> None:
    profile = parse_profile_document(profile_document(), "p.json")
    times = profile.times(UnitKind.BLOCK, setting(2), H100)
    # block forward 1.0 ms at b=1, 3.4 ms at b=4 → 1.8 ms at b=2
    assert times.forward_s == pytest.approx(1.8e-3)
    assert times.backward_s == pytest.approx(3.6e-3)
    assert times.attention_core_forward_s == pytest.approx(6e-4)
    assert "profile: micro-batch 2 interpolated between 1 and 4" in profile.notes


def test_extrapolation_above_the_measured_range() -> None:
    profile = parse_profile_document(profile_document(), "p.json")
    assert profile.times(UnitKind.BLOCK, setting(7), H100).forward_s == pytest.approx(5.8e-3)
    assert "profile: micro-batch 7 extrapolated from 1 and 4" in profile.notes


def test_unmeasured_tp_or_sequence_is_refused_naming_what_is_measured() -> None:
    profile = parse_profile_document(profile_document(), "p.json")
    with pytest.raises(PlannerError, match="measured tp: 1"):
        profile.times(UnitKind.BLOCK, setting(1, tp=2), H100)
    with pytest.raises(PlannerError, match="--seq-len 128"):
        profile.times(UnitKind.BLOCK, setting(1, seq_len=256), H100)


def test_profile_for_another_gpu_falls_back_to_the_fallback_timer() -> None:
    from planner.profile.calibration import default_calibration
    from planner.profile.measured import bind_to_model

    model = load_model("tiny-llama")
    profile = bind_to_model(parse_profile_document(profile_document("A100-80GB"), "p.json"), model,
                            default_calibration())
    a100 = lookup_gpu("A100-80GB")
    assert profile.times(UnitKind.HEAD, setting(1), a100).forward_s == TIMES[("head", 1)][0]
    analytic = profile.fallback.times(UnitKind.HEAD, setting(1), H100)
    assert profile.times(UnitKind.HEAD, setting(1), H100) == analytic
    assert "profile: measured on A100-80GB; H100-80GB uses analytic times" in profile.notes


def _broken(mutate) -> dict:
    document = profile_document()
    mutate(document)
    return document


@pytest.mark.parametrize("document, message", [
    (_broken(lambda d: d.update(schema_version=2)), "schema_version 2 is not supported"),
    (_broken(lambda d: d.pop("settings")), "'settings' is missing"),
    (_broken(lambda d: d["units"][0].update(kind="mlp")), "kind must be embedding, block or head"),
    (_broken(lambda d: d["units"][1].update(forward_s="fast")), "'forward_s' is missing or not a number"),
    (_broken(lambda d: d["units"][1].update(backward_s=-1.0)), "times non-negative"),
    (_broken(lambda d: d["units"].pop()), "embedding, block and head at the same micro-batches"),
    (_broken(lambda d: d.update(units=[])), "'units' is empty"),
])
def test_bad_profile_documents_are_refused(document, message) -> None:
    with pytest.raises(PlannerError, match=message):
        parse_profile_document(document, "p.json")


@pytest.mark.parametrize("text, message", [
    ('{"schema_version": 1, "model": ', "is not valid JSON"),
    (json.dumps({**profile_document(), "schema_version": 0}), "schema_version 0"),
])
def test_estimate_with_a_bad_profile_exits_2_with_one_line(tmp_path, text, message) -> None:
    path = tmp_path / "PROFILE.json"
    path.write_text(text)
    result = CliRunner().invoke(cli.main, ["estimate", "--profile", str(path)])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_estimate_uses_measured_times(profile_file) -> None:
    """tiny-llama, pp=1 tp=1 micro-batch 4: the one stage runs embedding + 4 blocks + head."""
    result = CliRunner().invoke(cli.main, ["estimate", "--profile", str(profile_file), "--cluster", "1x8xH100-80GB",
                                           "--micro-batch", "4", "--global-batch", "64", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    stage = document["stages"][0]
    assert stage["time_s"]["forward"] == pytest.approx(4e-4 + 4 * 3.4e-3 + 2e-3)
    assert stage["time_s"]["backward"] == pytest.approx(8e-4 + 4 * 6.8e-3 + 4e-3)
    assert document["training"]["seq_len"] == 128  # taken from the profile, as was the model
    assert document["model"]["name"] == "tiny-llama"
    assert document["profile"]["notes"] == ["profile: times measured on cpu applied to every GPU (H100-80GB)",
                                            "profile: memory not measured on cpu; activations are analytic"]


def test_estimate_prints_interpolation_notes_and_selective_recompute_uses_core_time(profile_file) -> None:
    base = ["estimate", "--profile", str(profile_file), "--micro-batch", "2", "--global-batch", "16", "--json"]
    plain = CliRunner().invoke(cli.main, base)
    selective = CliRunner().invoke(cli.main, [*base, "--recompute", "selective"])
    assert plain.exit_code == 0 and selective.exit_code == 0, plain.output + selective.output
    assert "profile: micro-batch 2 interpolated between 1 and 4" in plain.stderr
    extra = json.loads(selective.stdout)["stages"][0]["time_s"]["backward"] - \
        json.loads(plain.stdout)["stages"][0]["time_s"]["backward"]
    assert extra == pytest.approx(4 * 6e-4)


def test_estimate_refuses_a_profile_of_another_model(profile_file) -> None:
    result = CliRunner().invoke(cli.main, ["estimate", "--profile", str(profile_file), "--model", "llama3-8b"])
    assert result.exit_code == 2
    assert "measured for model 'tiny-llama'" in result.stderr


def test_model_may_be_the_profile_file_itself(profile_file) -> None:
    result = CliRunner().invoke(cli.main, ["estimate", "--profile", str(profile_file), "--model", str(profile_file),
                                           "--global-batch", "8"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("tiny-llama on")


def test_missing_torch_names_the_install_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(PlannerError, match=r"pip install 'planner\[profile\]'"):
        measure_layers(load_model("tiny-llama"), ProfileRequest(tps=(1,), micro_batches=(1,), seq_len=8))


def test_loading_a_missing_profile_is_a_planner_error(tmp_path) -> None:
    with pytest.raises(PlannerError, match="file not found"):
        load_measured_profile(tmp_path / "nope.json")


# Synthetic CUDA measurements: activation bytes per (kind, micro-batch), allocated after forward.
ACTIVATIONS = {("embedding", 1): 1e6, ("embedding", 4): 4e6, ("block", 1): 3e7, ("block", 4): 1.2e8,
               ("head", 1): 5e7, ("head", 4): 2e8}


def cuda_profile_document(sequence_parallel: bool = False) -> dict:
    document = profile_document()
    document["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}
    document["settings"]["sequence_parallel"] = sequence_parallel
    document["memory_measured"] = True
    for unit in document["units"]:
        unit["activation_bytes"] = ACTIVATIONS[(unit["kind"], unit["micro_batch"])]
    return document


COMMON = ("--cluster", "1x8xH100-80GB", "--pp", "2", "--global-batch", "64", "--micro-batch", "4", "--json")


def _estimate_json(tmp_path, document: dict | None, *options: str) -> dict:
    """`estimate` with the profile `document`, or analytic with the profile's model and settings when None."""
    if document is None:
        source = ["--model", "tiny-llama", "--seq-len", "128", "--dtype", "bf16", "--attention", "flash"]
    else:
        path = tmp_path / "PROFILE.json"
        path.write_text(json.dumps(document))
        source = ["--profile", str(path)]
    result = CliRunner().invoke(cli.main, ["estimate", *source, *COMMON, *options])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _activations(document: dict) -> list[float]:
    return [stage["memory_bytes"]["activations"] for stage in document["stages"]]


@pytest.mark.parametrize("micro_batch, block_bytes", [(4, 1.2e8), (2, 6e7)])
def test_measured_cuda_memory_is_the_stage_activation_memory(tmp_path, micro_batch, block_bytes) -> None:
    """tiny-llama pp=2: stage 0 holds embedding + 2 blocks, stage 1 2 blocks + head; 1F1B keeps 2 and 1
    micro-batches in flight. Micro-batch 2 is interpolated between the measured 1 and 4."""
    document = _estimate_json(tmp_path, cuda_profile_document(), "--micro-batch", str(micro_batch))
    scale = micro_batch / 4
    first, last = _activations(document)
    assert first == pytest.approx(2 * (scale * 4e6 + 2 * block_bytes))
    assert last == pytest.approx(1 * (2 * block_bytes + scale * 2e8))
    assert "profile: activation memory measured on NVIDIA H100 80GB HBM3 (allocated after forward, per unit)" \
        in document["profile"]["notes"]


@pytest.mark.parametrize("document, options, note", [
    (cuda_profile_document(), ("--recompute", "selective"),
     "profile: memory measured without recompute; selective recompute uses analytic activations"),
    (cuda_profile_document(), ("--recompute", "full"),
     "profile: memory measured without recompute; full recompute uses analytic activations"),
    (cuda_profile_document(sequence_parallel=True), (),
     "profile: memory measured with sequence parallelism; activations are analytic"),
    (profile_document(), (), "profile: memory not measured on cpu; activations are analytic"),
])
def test_analytic_memory_where_the_profile_did_not_measure_these_tensors(tmp_path, document, options, note) -> None:
    measured = _estimate_json(tmp_path, document, *options)
    assert _activations(measured) == pytest.approx(_activations(_estimate_json(tmp_path, None, *options)))
    assert note in measured["profile"]["notes"]
    assert not any("activation memory measured" in n for n in measured["profile"]["notes"])


def test_measured_memory_needs_activation_bytes_per_unit() -> None:
    document = cuda_profile_document()
    document["units"][2]["activation_bytes"] = None
    with pytest.raises(PlannerError, match="'activation_bytes' is missing or not a number"):
        parse_profile_document(document, "p.json")
