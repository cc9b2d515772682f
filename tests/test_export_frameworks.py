"""Every catalog model on every target, checked by the frameworks' own code (issue 12 item 5): torchtitan 0.2.2's
ConfigManager and ParallelDims at the plan's world size, DeepSpeed's DeepSpeedConfig with the plan's data-parallel
size; the degrees and batch sizes they parse must equal the plan's. Models a target cannot run must be refused
(PlannerError, exit 2), never exported half-done. Each framework runs in one subprocess (it loads torch); a check
whose framework is not installed is skipped (.ci/run installs both)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from test_export_plans import make_plan

from planner.errors import PlannerError
from planner.export import TARGETS, export_plan
from planner.model import catalog_model_names, load_model
from planner.plan import Plan

# Configurations cycled over the catalog, each as the target runs it (export never substitutes): plain 1F1B;
# optimizer states sharded with PP (Megatron's distributed optimizer, DeepSpeed's ZeRO-1; torchtitan has no
# such sharding, so DDP); no pipeline with ZeRO-3 (Megatron-FSDP, DeepSpeed ZeRO-3, FSDP2).
SHARDED_WITH_PP = {"megatron": dict(distributed_optimizer=True), "deepspeed": dict(zero_stage=1), "torchtitan": {}}
VARIANTS = (lambda _t: dict(pp=2), lambda t: dict(pp=2, micro_batch=2, **SHARDED_WITH_PP[t]),
            lambda _t: dict(pp=1, zero_stage=3))
# What each target refuses: ALiBi and vision encoders (LLaVA's, the ViT classifiers) in both Megatron parsers, Mamba
# layers in Megatron-DeepSpeed; torchtitan 0.2.2 has only llama3's, qwen3's and DeepSeek-V3's architectures, and
# qwen3 without pipelines (qwen3-235b-a22b's variant below has pp=2).
VITS = {"vit-b-16", "vit-l-16", "vit-h-14"}
REFUSED = {"megatron": {"bloom-176b", "llava-1.5-7b", *VITS},
           "deepspeed": {"bloom-176b", "llava-1.5-7b", "nemotron-h-8b", "nemotron-3-nano-30b-a3b", *VITS},
           "torchtitan": set(catalog_model_names()) - {"llama3-8b", "llama3-70b", "llama3-405b", "qwen3-30b-a3b",
                                                       "deepseek-v3"}}


def catalog_plan(index: int, name: str, target: str) -> Plan:
    """A plan for catalog model `name` on 2×8 H100 with TP 2 (fits or not: only the export is checked); MoE
    models with EP 2 and their experts split over TP (etp = tp, Megatron-LM's default)."""
    variant = VARIANTS[index % len(VARIANTS)](target)
    model = load_model(name)
    layers, pp = model.num_layers, variant["pp"]
    blocks = tuple(layers // pp + (s < layers % pp) for s in range(pp))
    experts = dict(ep=2, etp=2) if model.is_moe else {}
    return make_plan(model=name, blocks=blocks, global_batch=64, seq_len=2048, **variant, **experts)


@cache
def exports() -> dict[str, dict[str, tuple[Plan, dict[str, str]]]]:
    """target → model → (plan, files) for every catalog model the target accepts."""
    result: dict[str, dict[str, tuple[Plan, dict[str, str]]]] = {target: {} for target in TARGETS}
    for index, name in enumerate(catalog_model_names()):
        for target in TARGETS:
            plan = catalog_plan(index, name, target)
            try:
                result[target][name] = (plan, export_plan(plan, target).files)
            except PlannerError as error:
                assert name in REFUSED[target], f"{target} refused {name}: {error}"
                assert "\n" not in str(error)
    return result


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_exports_every_catalog_model_it_can_run_and_refuses_the_rest(target):
    assert set(exports()[target]) == set(catalog_model_names()) - REFUSED[target]


def run_script(script: str, cases: list) -> list:
    """Run a framework check in its own Python (it loads torch) on JSON `cases`; its last line of output, parsed."""
    run = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


TORCHTITAN_CHECK = """
import importlib.util, json, sys, types
# torchtitan/__init__ pulls in tokenizers and datasets; the config classes need only torch and tyro.
package = types.ModuleType("torchtitan")
package.__path__ = list(importlib.util.find_spec("torchtitan").submodule_search_locations)
sys.modules["torchtitan"] = package
from torchtitan.config import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
out = []
for path, world in json.loads(sys.argv[1]):
    c = ConfigManager().parse_args(["--job.config_file", path])
    p, t = c.parallelism, c.training
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world)
    parts = p.module_fqns_per_model_part or []
    out.append({"dp": dims.dp_replicate * dims.dp_shard, "fsdp": dims.dp_shard, "tp": dims.tp, "pp": dims.pp,
                "cp": dims.cp, "local": t.local_batch_size, "global": t.global_batch_size, "seq": t.seq_len,
                "micro": p.pipeline_parallel_microbatch_size, "ep": dims.ep, "etp": dims.etp,
                "blocks": [sum(n.startswith("layers.") for n in part)
                for part in parts], "parts": parts, "model": [c.model.name, c.model.flavor]})
print(json.dumps(out))
"""


needs_torchtitan = pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("tyro") is None,
    reason="torchtitan 0.2.2 not installed (pip install --no-deps torchtitan==0.2.2 tyro)")


@needs_torchtitan
def test_torchtitans_own_config_manager_and_parallel_dims_read_the_plans_degrees_and_batches(tmp_path):
    cases, plans = [], []
    for name, (plan, files) in exports()["torchtitan"].items():
        path = tmp_path / f"{name}.toml"
        path.write_text(files["torchtitan.toml"])
        cases.append((str(path), plan.parallel.num_gpus))
        plans.append(plan)
    for plan, parsed in zip(plans, run_script(TORCHTITAN_CHECK, cases), strict=True):
        config, m = plan.parallel, plan.parallel.num_microbatches(plan.training.global_batch)
        assert (parsed["dp"], parsed["tp"], parsed["pp"], parsed["cp"]) == (config.dp, config.tp, config.pp, config.cp)
        assert parsed["fsdp"] == (config.dp if config.optimizer_sharding else 1)
        assert (parsed["global"], parsed["seq"]) == (plan.training.global_batch, plan.training.seq_len)
        if config.pp > 1:
            assert parsed["micro"] == config.micro_batch and parsed["local"] == config.micro_batch * m
            assert parsed["blocks"] == list(plan.blocks_per_stage)
        else:
            assert parsed["local"] * config.dp * m == plan.training.global_batch
        assert parsed["model"][0] in ("llama3", "qwen3", "deepseek_v3")
        assert (parsed["ep"], parsed["etp"]) == (config.ep, config.etp)


_DEEPSPEED = """
import json, sys
import deepspeed.runtime.config as config
config.dist.get_rank = lambda: 0  # no process group here; the data-parallel size comes from the mpu below
class DataParallel:
    def __init__(self, size): self.size = size
    def get_data_parallel_world_size(self): return self.size
out = []
for path, dp in json.loads(sys.argv[1]):
    c = config.DeepSpeedConfig(path, mpu=DataParallel(dp))
    out.append({"train": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
                "gas": c.gradient_accumulation_steps, "zero": int(c.zero_optimization_stage),
                "bf16": c.bfloat16_config.enabled, "fp16": c.float16_config.enabled})
print(json.dumps(out))
"""


def _has_deepspeed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


@pytest.mark.skipif(not _has_deepspeed(), reason="DeepSpeed not installed (DS_BUILD_OPS=0 pip install deepspeed)")
def test_deepspeeds_own_config_class_reads_the_plans_batches_and_zero_stage(tmp_path):
    cases, plans = [], []
    for name, (plan, files) in exports()["deepspeed"].items():
        path = Path(tmp_path / f"{name}.json")
        path.write_text(files["ds_config.json"])
        cases.append((str(path), plan.parallel.dp))
        plans.append(plan)
    for plan, parsed in zip(plans, run_script(_DEEPSPEED, cases), strict=True):
        config = plan.parallel
        assert parsed["train"] == plan.training.global_batch and parsed["micro"] == config.micro_batch
        assert parsed["gas"] == config.num_microbatches(plan.training.global_batch)
        assert parsed["zero"] == config.optimizer_sharding
        assert (parsed["bf16"], parsed["fp16"]) == (plan.training.dtype != "fp16", plan.training.dtype == "fp16")
