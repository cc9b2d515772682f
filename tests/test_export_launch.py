"""Launchers for real clusters (issue 12 item 4) and complete exports (item 3): every target's torchrun.sh and
slurm.sbatch pass `bash -n`, start the plan's nodes × GPUs, and pick node ranks and MASTER_ADDR from SLURM's
allocation (run here with stand-ins for scontrol, srun and torchrun); placeholders stop a launch instead of
training on mock data; model hyperparameters reach every target; `--out` keeps files it did not write."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import tomllib
from test_export_plans import invoke, make_plan, parse_flags, plan_document, write_plan

from planner.errors import PlannerError
from planner.export import MANIFEST, TARGETS, export_plan, write_export
from planner.export.torchtitan import model_flavor
from planner.model import catalog_model_names, load_model
from planner.plan import parse_plan_document

FILL = {"DATA_ARGS": "--data-path /data/x", "CHECKPOINT_ARGS": "", "TOKENIZER_PATH": "/tok", "DATASET": "c4",
        "OUTPUT_DIR": "/out"}
FAKE_SLURM = {
    "scontrol": '[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" $FAKE_ALLOCATION',
    # one task per node, in allocation order, each with the variables slurmd sets
    "srun": 'while [[ "$1" == --* ]]; do shift; done\ni=0\nfor h in $FAKE_ALLOCATION; do\n'
            '  SLURMD_NODENAME=$h SLURM_NODEID=$i "$@"; i=$((i + 1))\ndone',
    "torchrun": 'echo "${SLURMD_NODENAME:-local} $*" >> "$FAKE_LOG"',
    "deepspeed": 'echo "deepspeed $*" >> "$FAKE_LOG"',
}


def scripts(files: dict[str, str]) -> dict[str, str]:
    return {name: text for name, text in files.items() if name.endswith((".sh", ".sbatch"))}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cluster", ["2x8xH100-80GB", "1x8xH100-80GB"])
def test_every_script_parses_and_starts_the_plans_nodes_and_gpus(target, cluster):
    plan = make_plan(cluster=cluster)
    files = export_plan(plan, target).files
    nnodes = plan.document["cluster"]["num_nodes"]
    assert {"torchrun.sh", "slurm.sbatch"} <= set(files)
    assert ("hostfile" in files) == (nnodes > 1), "one node needs no hostfile"
    for name, text in scripts(files).items():
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        assert "--mock-data" not in text and "NullTokenizer" not in text, f"{name} trains on mock data"
    assert f"NNODES={nnodes}" in files["torchrun.sh"] and "--nproc-per-node 8" in files["torchrun.sh"]
    assert f"#SBATCH --nodes={nnodes}" in files["slurm.sbatch"] and "#SBATCH --gpus-per-node=8" in files["slurm.sbatch"]
    if target == "deepspeed":
        assert ("--hostfile" in files["deepspeed.sh"]) == (nnodes > 1)
        assert f"--num_nodes {nnodes} " in files["deepspeed.sh"] and "--num_gpus 8 " in files["deepspeed.sh"]


def _bin(tmp_path: Path) -> dict[str, str]:
    """A PATH whose scontrol, srun, torchrun and deepspeed are the stand-ins above; their calls go to FAKE_LOG."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for name, body in FAKE_SLURM.items():
        (directory / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (directory / name).chmod(0o755)
    return {"PATH": f"{directory}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "log")}


def _run(tmp_path: Path, out: Path, script: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NODE_", "MASTER_"))}
    (tmp_path / "log").unlink(missing_ok=True)
    run = subprocess.run(["bash", str(out / script)], capture_output=True, text=True, timeout=60,
                         env={**environment, **_bin(tmp_path), **env})
    log = tmp_path / "log"
    return run, [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _export(tmp_path: Path, document: dict, target: str) -> Path:
    out = tmp_path / target
    write_export(export_plan(parse_plan_document(document), target), out)
    return out


def _value(call: list[str], flag: str) -> str:
    return call[call.index(flag) + 1]


@pytest.mark.parametrize("target", TARGETS)
def test_sbatch_runs_one_torchrun_per_node_with_ranks_in_allocation_order(tmp_path, target):
    """Generated node names (node0, node1): the allocation's order; MASTER_ADDR its first host."""
    out = _export(tmp_path, plan_document(), target)
    run, calls = _run(tmp_path, out, "slurm.sbatch", FAKE_ALLOCATION="gpu-a gpu-b", SLURM_JOB_NODELIST="gpu-[a-b]",
                      SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(out), **FILL)
    assert run.returncode == 0, run.stderr
    assert [(c[0], _value(c, "--node-rank"), _value(c, "--master-addr")) for c in calls] == [
        ("gpu-a", "0", "gpu-a"), ("gpu-b", "1", "gpu-a")]
    for call in calls:
        assert _value(call, "--nnodes") == "2" and _value(call, "--nproc-per-node") == "8"
        assert _value(call, "--master-port") == str(20000 + 4242 % 20000)


def test_sbatch_keeps_the_plans_host_order_when_the_cluster_names_its_hosts(tmp_path):
    """A cluster file's host names: the plan puts node rank 0 on gpu-b; SLURM lists gpu-a first."""
    document = plan_document()
    rename = {"node0": "gpu-b", "node1": "gpu-a"}
    document["cluster"]["node_groups"][0]["names"] = ["gpu-b", "gpu-a"]
    for entry in document["placement"]["ranks"]:
        entry["node"] = rename[entry["node"]]
    out = _export(tmp_path, document, "torchtitan")
    assert "#SBATCH --nodelist=gpu-b,gpu-a" in (out / "slurm.sbatch").read_text()
    run, calls = _run(tmp_path, out, "slurm.sbatch", FAKE_ALLOCATION="gpu-a gpu-b", SLURM_JOB_NODELIST="gpu-[a-b]",
                      SLURM_JOB_ID="7", SLURM_SUBMIT_DIR=str(out), **FILL)
    assert run.returncode == 0, run.stderr
    assert sorted((c[0], _value(c, "--node-rank"), _value(c, "--master-addr")) for c in calls) == [
        ("gpu-a", "1", "gpu-b"), ("gpu-b", "0", "gpu-b")]


def test_sbatch_refuses_an_allocation_of_the_wrong_size(tmp_path):
    out = _export(tmp_path, plan_document(), "megatron")
    run, calls = _run(tmp_path, out, "slurm.sbatch", FAKE_ALLOCATION="gpu-a", SLURM_JOB_NODELIST="gpu-a",
                      SLURM_JOB_ID="1", SLURM_SUBMIT_DIR=str(out), **FILL)
    assert run.returncode == 2 and "the plan needs 2" in run.stderr and not calls


def test_torchrun_sh_needs_node_rank_and_master_addr_on_unlisted_hosts_instead_of_hanging(tmp_path):
    out = _export(tmp_path, plan_document(), "megatron")
    run, calls = _run(tmp_path, out, "torchrun.sh", **FILL)
    assert run.returncode != 0 and "set NODE_RANK" in run.stderr and not calls
    run, calls = _run(tmp_path, out, "torchrun.sh", NODE_RANK="1", **FILL)
    assert run.returncode != 0 and "MASTER_ADDR" in run.stderr and not calls
    run, calls = _run(tmp_path, out, "torchrun.sh", NODE_RANK="1", MASTER_ADDR="10.0.0.1", **FILL)
    assert run.returncode == 0, run.stderr
    assert _value(calls[0], "--node-rank") == "1" and _value(calls[0], "--master-addr") == "10.0.0.1"
    assert _value(calls[0], "--data-path") == "/data/x"


@pytest.mark.parametrize("target", TARGETS)
def test_placeholders_stop_the_launch_and_name_the_variable(tmp_path, target):
    out = _export(tmp_path, plan_document(cluster="1x8xH100-80GB", dp=1), target)
    name = "DATA_ARGS" if target != "torchtitan" else "DATASET"
    run, calls = _run(tmp_path, out, "torchrun.sh", **{k: v for k, v in FILL.items() if k != name})
    assert run.returncode != 0 and f"PLACEHOLDER: set {name}" in run.stderr and not calls
    run, calls = _run(tmp_path, out, "torchrun.sh", **FILL)
    assert run.returncode == 0, run.stderr
    assert (_value(calls[0], "--nnodes"), _value(calls[0], "--node-rank"), _value(calls[0], "--master-addr")) == (
        "1", "0", "127.0.0.1")


def test_deepspeed_on_one_node_runs_its_launcher_without_a_hostfile(tmp_path):
    out = _export(tmp_path, plan_document(cluster="1x8xH100-80GB", dp=1), "deepspeed")
    run, calls = _run(tmp_path, out, "deepspeed.sh", **FILL)
    assert run.returncode == 0, run.stderr
    assert calls[0][0] == "deepspeed" and "--hostfile" not in calls[0] and _value(calls[0], "--num_gpus") == "8"
    assert calls[0][calls[0].index("--deepspeed_config") + 1] == str(out / "ds_config.json")


def test_torchtitan_toml_marks_what_the_launcher_must_fill_and_enables_checkpoints():
    config = tomllib.loads(export_plan(make_plan(), "torchtitan").files["torchtitan.toml"])
    assert config["model"]["hf_assets_path"].startswith("PLACEHOLDER")
    assert config["training"]["dataset"].startswith("PLACEHOLDER")
    assert config["checkpoint"]["enable"] is True


# ---- model hyperparameters ----------------------------------------------------------------------

def test_torchtitan_names_its_flavor_or_refuses_for_every_catalog_model():
    named = {}
    for name in catalog_model_names():
        try:
            flavor = model_flavor(load_model(name))
        except PlannerError as error:
            assert "torchtitan 0.2.2 has no model" in str(error) and "\n" not in str(error)
            continue
        named[name] = (flavor.name, flavor.flavor)
    assert named == {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
                     "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
                     "deepseek-v3": ("deepseek_v3", "671B")}


@pytest.mark.parametrize("model", ["mixtral-8x7b", "llama2-7b", "gpt3-1.3b", "qwen2.5-7b", "tiny-llama"])
def test_torchtitan_export_of_a_model_it_lacks_exits_2_in_one_line(tmp_path, model):
    plan_path = write_plan(tmp_path, plan_document(model=model, blocks=_even(model, 4)))
    result = invoke("export", str(plan_path), "--to", "torchtitan", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "torchtitan 0.2.2 has no model" in result.output and not (tmp_path / "out").exists()


def _even(model: str, stages: int) -> tuple[int, ...]:
    layers = load_model(model).num_layers
    return tuple(layers // stages + (s < layers % stages) for s in range(stages))


def test_rope_base_scaling_and_sliding_window_reach_both_megatron_parsers():
    """Llama 3's rope_theta 500000, Llama 3.1's RoPE scaling and Mistral's 4096-token window (HF config.json)."""
    lm = parse_flags(export_plan(make_plan(), "megatron").files["megatron_args.txt"])
    ds = parse_flags(export_plan(make_plan(), "deepspeed").files["megatron_deepspeed_args.txt"])
    assert lm["--rotary-base"] == ["500000"] and ds["--rotary-position-embeddings-theta"] == ["500000"]
    big = make_plan(model="llama3-405b", cluster="16x8xH100-80GB", tp=8, pp=8, blocks=_even("llama3-405b", 8))
    lm = parse_flags(export_plan(big, "megatron").files["megatron_args.txt"])
    assert "--use-rope-scaling" in lm and lm["--rope-scaling-factor"] == ["8"]
    assert any("RoPE scaling" in note for note in export_plan(big, "deepspeed").notes)
    mistral = make_plan(model="mistral-7b", blocks=(8, 8, 8, 8))
    assert parse_flags(export_plan(mistral, "megatron").files["megatron_args.txt"])["--window-size"] == ["4095,0"]
    assert any("sliding-window" in note for note in export_plan(mistral, "deepspeed").notes)


def test_hf_config_import_keeps_rope_theta_scaling_and_window(tmp_path):
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 100, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path / "config.json"))
    assert (model.rope_theta, model.rope_scaling, model.rope_scaling_factor, model.sliding_window) == (
        500000.0, "llama3", 8.0, None)
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mistral", "sliding_window": 4096,
                                                      "rope_scaling": None}))
    assert load_model(str(tmp_path / "config.json")).sliding_window == 4096
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen2", "sliding_window": 4096,
                                                      "use_sliding_window": False}))
    assert load_model(str(tmp_path / "config.json")).sliding_window is None


# ---- --out keeps what export did not write ---------------------------------------------------------

def test_reexport_replaces_its_own_files_but_not_yours_unless_forced(tmp_path):
    plan_path = write_plan(tmp_path, plan_document())
    out = tmp_path / "launch"
    assert invoke("export", str(plan_path), "--to", "megatron", "--out", str(out)).exit_code == 0
    assert json.loads((out / MANIFEST).read_text())["files"].keys() == set(export_plan(make_plan(), "megatron").files)
    assert invoke("export", str(plan_path), "--to", "megatron", "--out", str(out)).exit_code == 0, "its own files"
    (out / "hostfile").write_text("gpu-a slots=8\ngpu-b slots=8\n")  # the user names the hosts
    result = invoke("export", str(plan_path), "--to", "megatron", "--out", str(out))
    assert result.exit_code == 2 and str(out / "hostfile") in result.output and "--force" in result.output
    assert (out / "hostfile").read_text().startswith("gpu-a"), "refused before writing anything"
    assert invoke("export", str(plan_path), "--to", "megatron", "--out", str(out), "--force").exit_code == 0
    assert (out / "hostfile").read_text().startswith("# hosts")


def test_export_refuses_a_file_it_never_wrote_and_removes_its_own_stale_files(tmp_path):
    out = tmp_path / "launch"
    out.mkdir()
    (out / "torchrun.sh").write_text("#!/bin/sh\necho mine\n")
    plan_path = write_plan(tmp_path, plan_document())
    result = invoke("export", str(plan_path), "--to", "megatron", "--out", str(out))
    assert result.exit_code == 2 and "torchrun.sh exists and was not written by planner export" in result.output
    (out / "torchrun.sh").unlink()
    assert invoke("export", str(plan_path), "--to", "megatron", "--out", str(out)).exit_code == 0
    one_node = write_plan(tmp_path, plan_document(cluster="1x8xH100-80GB", dp=1), "one.json")
    assert invoke("export", str(one_node), "--to", "megatron", "--out", str(out)).exit_code == 0
    assert not (out / "hostfile").exists(), "a one-node export leaves no stale hostfile"
