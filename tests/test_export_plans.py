"""Plans for the export tests (`make_plan`), and the export CLI: files, host order, bad input → exit 2."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from planner.cluster import load_cluster
from planner.config import ParallelConfig, Partition, Training
from planner.cost.estimate import estimate
from planner.errors import PlannerError
from planner.export import MANIFEST, TARGETS, export_plan
from planner.export.common import host_order
from planner.model import load_model
from planner.placement import default_placement
from planner.plan import Plan, build_plan_document, parse_plan_document


def plan_document(model: str = "llama3-8b", cluster: str = "2x8xH100-80GB", blocks: tuple[int, ...] = (7, 8, 9, 8),
                  global_batch: int = 128, seq_len: int = 4096, dtype: str = "bf16", **parallel) -> dict:
    """A plan document as `planner estimate --out` writes it (dp defaults to the GPUs left over)."""
    spec, machines = load_model(model), load_cluster(cluster)
    parallel.setdefault("tp", 2)
    parallel.setdefault("pp", 4)
    parallel.setdefault("dp", machines.num_gpus // (parallel["tp"] * parallel["pp"]))
    parallel.setdefault("sequence_parallel", parallel["tp"] > 1)  # as planner estimate does
    if parallel.get("vpp", 1) > 1:
        parallel.setdefault("schedule", "interleaved")
    config = ParallelConfig(**parallel)
    training = Training(global_batch=global_batch, seq_len=seq_len, dtype=dtype)
    partition = Partition.from_blocks(list(blocks), spec.num_layers)
    placement = default_placement(machines, config)
    result = estimate(spec, machines, training, config, partition, placement)
    return json.loads(json.dumps(build_plan_document(spec, machines, training, config, placement, result)))


def make_plan(**kwargs) -> Plan:
    return parse_plan_document(plan_document(**kwargs))


def parse_flags(text: str) -> dict[str, list[str]]:
    """An args file (megatron_args.txt, megatron_deepspeed_args.txt) → {flag: values}; [] for a switch."""
    tokens = shlex.split("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    args: dict[str, list[str]] = {}
    flag = None
    for token in tokens:
        if token.startswith("--"):
            assert token not in args, f"{token} given twice"
            flag = token
            args[flag] = []
        else:
            args[flag].append(token)
    return args


def write_plan(tmp_path: Path, document: dict, name: str = "plan.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli.main, list(args))


# ---- host order: the launch realises the plan's placement ------------------------------------

def realised(document: dict) -> list[tuple[str, int]]:
    """(node, gpu) of each global rank under the exported host order and per-host GPU order."""
    order = host_order(parse_plan_document(document))
    nproc = order.nproc_per_node
    world = len(document["placement"]["ranks"])
    return [(order.hosts[r // nproc], (order.device_order[r // nproc] or tuple(range(nproc)))[r % nproc])
            for r in range(world)]


def placed(document: dict) -> list[tuple[str, int]]:
    return [(r["node"], r["gpu_index"]) for r in sorted(document["placement"]["ranks"], key=lambda r: r["rank"])]


def test_default_placement_is_hosts_in_node_order():
    document = plan_document()
    order = host_order(parse_plan_document(document))
    assert order.hosts == ("node0", "node1") and order.nproc_per_node == 8 and order.problem is None
    assert realised(document) == placed(document)


def test_swapped_nodes_and_permuted_gpus_are_realised_by_host_order_and_visible_devices():
    document = plan_document()
    for entry in document["placement"]["ranks"]:
        entry["node"] = "node1" if entry["node"] == "node0" else "node0"
        entry["gpu_index"] = 7 - entry["gpu_index"]
    order = host_order(parse_plan_document(document))
    assert order.hosts == ("node1", "node0") and order.problem is None
    assert order.device_order[0] == (7, 6, 5, 4, 3, 2, 1, 0)
    assert realised(document) == placed(document)
    launch = export_plan(parse_plan_document(document), "megatron").files["torchrun.sh"]
    assert "0) export CUDA_VISIBLE_DEVICES=7,6,5,4,3,2,1,0 ;;" in launch


def test_interleaved_nodes_cannot_be_realised_and_the_output_says_so():
    document = plan_document()
    for entry in document["placement"]["ranks"]:
        entry["node"], entry["gpu_index"] = f"node{entry['rank'] % 2}", entry["rank"] // 2
    plan = parse_plan_document(document)
    assert host_order(plan).problem is not None
    result = export_plan(plan, "megatron")
    assert any("placement not realisable" in note for note in result.notes)
    assert "WARNING" in result.files["hostfile"] and "WARNING" in result.files["torchrun.sh"]


# ---- CLI --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_export_writes_every_file_into_the_directory(tmp_path, target):
    plan_path = write_plan(tmp_path, plan_document())
    out = tmp_path / "launch"
    result = invoke("export", str(plan_path), "--to", target, "--out", str(out))
    assert result.exit_code == 0, result.output
    expected = export_plan(parse_plan_document(json.loads(plan_path.read_text())), target).files
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, MANIFEST])
    for name, text in expected.items():
        assert (out / name).read_text() == text
        assert bool((out / name).stat().st_mode & 0o111) == name.endswith((".sh", ".sbatch"))


def test_export_without_out_prints_the_files(tmp_path):
    plan_path = write_plan(tmp_path, plan_document())
    result = invoke("export", str(plan_path), "--to", "megatron")
    assert result.exit_code == 0
    assert "# ==> megatron_args.txt <==" in result.output and "--pipeline-model-parallel-size 4" in result.output


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    good = plan_document()
    text = json.dumps(good)
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "truncated.json").write_text(text[: len(text) // 2])
    write_plan(tmp_path, {**good, "schema_version": 3}, "future.json")
    write_plan(tmp_path, {k: v for k, v in good.items() if k != "stages"}, "nostages.json")
    write_plan(tmp_path, [1, 2], "list.json")
    write_plan(tmp_path, good, "good.json")
    zero2 = json.loads(text)
    zero2["parallelism"]["zero_stage"] = 2
    write_plan(tmp_path, zero2, "zero2pp.json")
    return {
        "missing": (["export", str(tmp_path / "absent.json"), "--to", "megatron"], "cannot read plan file"),
        "empty": (["export", str(tmp_path / "empty.json"), "--to", "megatron"], "is empty"),
        "truncated": (["export", str(tmp_path / "truncated.json"), "--to", "deepspeed"], "not valid JSON"),
        "schema": (["export", str(tmp_path / "future.json"), "--to", "torchtitan"], "schema_version 3"),
        "no stages": (["export", str(tmp_path / "nostages.json"), "--to", "megatron"], "missing 'stages'"),
        "not an object": (["export", str(tmp_path / "list.json"), "--to", "megatron"], "expected a JSON object"),
        "unknown target": (["export", str(tmp_path / "good.json"), "--to", "jax"], "unknown export target 'jax'"),
        "zero2 with pp": (["export", str(tmp_path / "zero2pp.json"), "--to", "deepspeed"], "ZeRO-2"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "truncated", "schema", "no stages", "not an object",
                                  "unknown target", "zero2 with pp"])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, case):
    args, message = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    result = CliRunner().invoke(cli.main, [*args, "--out", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not out.exists()


def test_a_failing_export_leaves_no_partial_output(tmp_path):
    """ALiBi has no Megatron-LM flag: the export fails before any file is written."""
    plan_path = write_plan(tmp_path, plan_document(model="bloom-176b", cluster="8x8xH100-80GB", tp=8, pp=7,
                                                   blocks=(10,) * 7, global_batch=64))
    out = tmp_path / "out"
    result = invoke("export", str(plan_path), "--to", "megatron", "--out", str(out))
    assert result.exit_code == 2 and "ALiBi" in result.output
    assert not out.exists()


def _plan_has_export() -> bool:
    command = cli.main.commands.get("plan")
    return command is not None and any(param.name == "export_target" for param in command.params)


@pytest.mark.skipif(not _plan_has_export(), reason="`planner plan --export` is not in this cli.py")
def test_plan_export_writes_the_best_plans_files_and_keeps_json_stdout_clean(tmp_path):
    out = tmp_path / "megatron"
    result = CliRunner().invoke(cli.main, ["plan", "--model", "tiny-llama", "--cluster", "1x4xH100-80GB",
                                           "--global-batch", "16", "--seq-len", "512", "--export", "megatron",
                                           "--export-out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    expected = export_plan(parse_plan_document(document), "megatron").files
    assert {p.name: p.read_text() for p in out.iterdir() if p.name != MANIFEST} == expected


def test_tp_comm_overlap_is_exported_by_the_targets_that_run_it_and_refused_by_deepspeed():
    """Plan = launch: Megatron-LM gets --tp-comm-overlap, torchtitan async TP under compile, and
    Megatron-DeepSpeed (no such overlap) refuses rather than dropping it."""
    plan = make_plan(sequence_parallel=True, tp_comm_overlap=True)
    assert plan.parallel.tp_comm_overlap  # the plan file keeps it
    args = parse_flags(export_plan(plan, "megatron").files["megatron_args.txt"])
    assert "--tp-comm-overlap" in args and "--sequence-parallel" in args
    toml = export_plan(plan, "torchtitan").files["torchtitan.toml"]
    assert "enable_async_tensor_parallel = true" in toml and "[compile]" in toml
    with pytest.raises(PlannerError, match=r"cannot overlap TP communication.*--framework deepspeed"):
        export_plan(plan, "deepspeed")
    plain = make_plan(sequence_parallel=True)
    assert "--tp-comm-overlap" not in parse_flags(export_plan(plain, "megatron").files["megatron_args.txt"])


def test_plan_export_deepspeed_plans_only_what_megatron_deepspeed_runs(tmp_path):
    result = CliRunner().invoke(cli.main, ["plan", "--model", "tiny-llama", "--cluster", "1x4xH100-80GB",
                                           "--global-batch", "16", "--seq-len", "512", "--tp", "2", "--export",
                                           "deepspeed", "--export-out", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["parallelism"]["tp_comm_overlap"] is False
