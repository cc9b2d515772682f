"""torchtitan export: a job TOML for the last TOML release, v0.2.2 (`torchtitan/config/job_config.py`).

Keys and rules from ../shared/REFERENCE.md §3: world = dp_replicate · dp_shard · cp · tp · pp;
`module_fqns_per_model_part` lists each stage's modules (tok_embeddings, layers.N, norm, output) in
stage order, stage s on pipeline rank s mod pp (loop style), or under ZBVZeroBubble/DualPipeV on rank s for
s < pp and 2pp − 1 − s after (torchtitan's "v" style, picked by the schedule class), the plan's `stage_ranks`;
n_microbatches = local_batch_size / pipeline_parallel_microbatch_size.
"""

from __future__ import annotations

import json

from planner.config import Recompute, Schedule
from planner.cost.schedule import schedule_of
from planner.errors import PlannerError
from planner.export.common import (
    ExportResult,
    export_header,
    host_files,
    host_order,
    placement_notes,
    slower_attention_notes,
    stage_units,
)
from planner.export.launch import SLURM, TORCHRUN, Placeholder, Program, slurm_script, torchrun_script
from planner.frameworks import FRAMEWORKS
from planner.model import ModelSpec
from planner.plan import Plan
from planner.titan_models import FLAVORS, Flavor, model_flavor

__all__ = ["FLAVORS", "SCHEDULE_NAMES", "Flavor", "export_torchtitan", "flavor_notes", "model_flavor", "module_fqns",
           "torchtitan_program", "torchtitan_toml"]

SCHEDULE_NAMES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.GPIPE: "GPipe", Schedule.INTERLEAVED: "Interleaved1F1B",
                  Schedule.INTERLEAVED_ZB: "InterleavedZeroBubble", Schedule.ZB_V: "ZBVZeroBubble",
                  Schedule.DUALPIPE_V: "DualPipeV"}
TOML = "torchtitan.toml"
_PLACEHOLDER = "PLACEHOLDER: set {} (torchrun.sh passes it)"


def flavor_notes(model: ModelSpec) -> tuple[str, ...]:
    """Where torchtitan's flavor differs from the plan's model in ways that change the weights, not the cost."""
    flavor = model_flavor(model)
    notes = []
    if flavor.rope_theta != model.rope_theta:
        notes.append(f"torchtitan's {flavor.name} {flavor.flavor} sets rope_theta {flavor.rope_theta:g}; "
                     f"{model.name} has {model.rope_theta:g} (same cost; set it to match the weights)")
    if flavor.name == "llama3" and not (model.rope_scaling == "llama3" and model.rope_scaling_factor == 8):
        scaling = "none" if model.rope_scaling is None else f"{model.rope_scaling} x{model.rope_scaling_factor:g}"
        notes.append(f"torchtitan's llama3 applies Llama 3.1's RoPE scaling (factor 8); {model.name} has "
                     f"{scaling} (same cost; load matching weights)")
    return tuple(notes)


def module_fqns(plan: Plan) -> list[list[str]]:
    """Module names per model part (virtual stage), in stage order."""
    parts = []
    for embedding, start, end, head in stage_units(plan):
        names = ["tok_embeddings"] if embedding else []
        names += [f"layers.{i}" for i in range(start, end)]
        names += ["norm", "output"] if head else []
        parts.append(names)
    return parts


def _value(value: object) -> str:
    """A TOML value (strings, ints, booleans and lists of those; JSON spells them the same way)."""
    return json.dumps(value)


ROTATE_METHODS = {"all-gather": "allgather", "p2p": "alltoall"}
"""torchtitan's context_parallel_rotate_method per planner cp_comm: "allgather" gathers K/V before attention,
"alltoall" passes K/V shards between ranks step by step (the ring); Ulysses has none (frameworks.py refuses it)."""


def _fp8_kind(plan: Plan) -> str | None:
    """torchtitan's quantisation converter family for the plan's FP8 recipe ("float8", "mx"), None without FP8."""
    if plan.training.dtype != "fp8":
        return None
    return "mx" if plan.training.fp8_recipe == "mxfp8" else "float8"


def _fp8_converters(plan: Plan) -> list[str]:
    """[model] converters of an FP8 plan: torchao on the linear layers and, for MoE, on the routed experts'
    grouped GEMMs (one quantisation family for both, as torchtitan requires)."""
    kind = _fp8_kind(plan)
    if kind is None:
        return []
    names = [f"quantize.linear.{kind}"] + ([f"quantize.grouped_mm.{kind}"] if plan.model.is_moe else [])
    return [f"converters = {_value(names)}  # the plan's FP8 GEMMs (torchao)"]


def _fp8_sections(plan: Plan) -> list[str]:
    """The torchao recipe of an FP8 plan: [quantize.linear.float8] — tensorwise as its default config, the one that
    gathers FSDP weights in FP8 (torchtitan refuses a recipe name beside `enable_fsdp_float8_all_gather`), any other
    by recipe name — or [quantize.linear.mx] (MXFP8 through cuBLAS); for MoE the experts' grouped GEMMs' section."""
    kind = _fp8_kind(plan)
    if kind is None:
        return []
    if kind == "mx":
        lines = ["", "[quantize.linear.mx]", 'recipe_name = "mxfp8_cublas"']
        grouped = ["", "[quantize.grouped_mm.mx]", 'recipe_name = "mxfp8"', 'fqns = ["experts"]']
    else:
        lines = ["", "[quantize.linear.float8]"]
        if plan.training.fp8_recipe == "tensorwise":
            gather = _value(plan.parallel.fp8_param_gather)
            lines += [f"enable_fsdp_float8_all_gather = {gather}",
                      f"precompute_float8_dynamic_scale_for_fsdp = {gather}"]
        else:
            lines.append(f"recipe_name = {_value(plan.training.fp8_recipe)}")
        grouped = ["", "[quantize.grouped_mm.float8]", 'fqns = ["experts"]']
    return lines + (grouped if plan.model.is_moe else [])


def torchtitan_toml(plan: Plan, notes: tuple[str, ...] = ()) -> str:
    """The [job]/[model]/[training]/[parallelism]/[activation_checkpoint] TOML for the plan, notes in its header."""
    config, training = plan.parallel, plan.training
    m = config.num_microbatches(training.global_batch)
    if config.schedule is Schedule.DUALPIPE_V and not schedule_of(config.schedule).runnable(config.pp, m):
        raise PlannerError(f"torchtitan's DualPipeV needs at least 2·pp = {2 * config.pp} micro-batches, the plan "
                           f"has {m}; use a larger global batch or a smaller micro-batch")
    sharded = config.optimizer_sharding >= 1
    flavor = model_flavor(plan.model)
    lines = [*(f"# {line}" for line in export_header("torchtitan (v0.2.2 TOML)", plan, notes)),
             f"# run: ./{TORCHRUN} or sbatch {SLURM} (they fill the PLACEHOLDER values below), or",
             "# CONFIG_FILE=this.toml ./run_train.sh --model.hf_assets_path … --training.dataset … (any key can be "
             "overridden as --section.key)",
             "", "[job]", f"description = {_value(f'planner plan: {plan.model.name}')}",
             "# dump_folder: outputs and checkpoints; torchrun.sh sets it from OUTPUT_DIR", "",
             "[model]", f"name = {_value(flavor.name)}", f"flavor = {_value(flavor.flavor)}",
             *_fp8_converters(plan),
             f"hf_assets_path = {_value(_PLACEHOLDER.format('TOKENIZER_PATH'))}  # the tokenizer's directory", "",
             "[training]", f"dataset = {_value(_PLACEHOLDER.format('DATASET'))}  # a name registered in "
             "torchtitan.hf_datasets"]
    if config.pp > 1:
        lines += ["# per DP rank: all the plan's micro-batches pass the pipeline in one step (no grad accumulation)",
                  f"local_batch_size = {config.micro_batch * m}"]
    else:
        lines += ["# per DP rank: one micro-batch; torchtitan accumulates global/(local*dp) = "
                  f"{m} steps", f"local_batch_size = {config.micro_batch}"]
    lines += [f"global_batch_size = {training.global_batch}", f"seq_len = {training.seq_len}",
              f"mixed_precision_param = {_value('float16' if training.dtype == 'fp16' else 'bfloat16')}",
              'mixed_precision_reduce = "float32"']
    lines += _fp8_sections(plan)
    lines += ["", "[parallelism]",
              "# ZeRO-2/3 run as FSDP2 (data_parallel_shard_degree): FSDP shards",
              "# parameters, gradients and optimizer states; without sharding the plan's dp is plain DDP (replicate).",
              "# HSDP: FSDP within dp/R ranks (times cp: torchtitan shards over dp_shard·cp), R replicas",
              f"data_parallel_replicate_degree = {config.hsdp_replicas if sharded else config.dp}",
              f"data_parallel_shard_degree = {config.dp // config.hsdp_replicas if sharded else 1}"]
    if config.dp % config.hsdp_replicas:
        raise PlannerError(f"torchtitan replicates over data_parallel_replicate_degree, which must divide dp = "
                           f"{config.dp}; the plan has hsdp_replicas {config.hsdp_replicas}")
    if config.optimizer_sharding == 3 and config.reshard_after_forward != (config.pp == 1):
        # torchtitan's "default" reshards after forward without PP and not with it, as planner's default does
        lines.append(f"fsdp_reshard_after_forward = {_value('always' if config.reshard_after_forward else 'never')}")
    if sharded and config.optimizer_sharding < 3:
        lines.append('fsdp_reshard_after_forward = "never"  # keep parameters gathered between forward and '
                     "backward, like ZeRO-2")
    lines += [f"tensor_parallel_degree = {config.tp}",
              f"enable_async_tensor_parallel = {_value(config.tp_comm_overlap)}",
              f"disable_loss_parallel = {_value(False)}",
              f"context_parallel_degree = {config.cp}",
              *([f"context_parallel_rotate_method = {_value(ROTATE_METHODS[config.cp_comm])}"]
                if config.cp > 1 else []),
              f"pipeline_parallel_degree = {config.pp}"]
    if plan.model.is_moe:
        lines += ["# routed experts over ep ranks carved from dp_shard·cp (·tp when etp = 1); etp is 1 or tp",
                  f"expert_parallel_degree = {config.ep}", f"expert_tensor_parallel_degree = {config.etp}"]
        if config.ep > 1 and config.moe_dispatcher == "flex":
            lines.append('expert_parallel_comm_backend = "deepep"  # the flex dispatcher (needs DeepEP installed)')
    if config.pp > 1:
        lines += [f"pipeline_parallel_schedule = {_value(SCHEDULE_NAMES[config.schedule])}",
                  f"pipeline_parallel_microbatch_size = {config.micro_batch}  # n_microbatches = {m}",
                  *([f"pipeline_parallel_expert_parallel_overlap = {_value(config.moe_ep_overlap)}"]
                    if config.schedule is Schedule.DUALPIPE_V else []),
                  "# one list per stage; stage s runs on pipeline rank " + ("s for s < pp, else 2·pp − 1 − s (v style)"
                                                                              if config.stage_ranks[-1] == 0
                                                                              else "s mod pp"),
                  "module_fqns_per_model_part = ["]
        lines += [f"  {_value(part)}," for part in module_fqns(plan)]
        lines.append("]")
    mode = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[config.recompute]
    every = _layer_ac_interval(plan)
    if every is not None:
        mode = "selective"  # torchtitan's per-layer option: full AC on every k-th block
    if _compiles(plan):
        # fused element-wise kernels, as costed, come from torch.compile; async TP only takes effect under it too
        lines += ["", "[compile]", f"enable = {_value(True)}", f"components = {_value(['model', 'loss'])}"]
    elif plan.training.elementwise == "eager":
        lines += ["", "# [compile] left off: the plan was costed with eager element-wise kernels (--elementwise eager)"]
    else:
        lines += ["", "# [compile] left off: a split backward (zero-bubble schedule) does not run compiled blocks"]
    lines += ["", "[checkpoint]", f"enable = {_value(True)}", '# folder = "checkpoint" under the dump folder']
    lines += ["", "[activation_checkpoint]", f"mode = {_value(mode)}"]
    if config.recompute is Recompute.SELECTIVE:
        lines.append('selective_ac_option = "op"  # keeps every other matmul output and the attention output, '
                     "as planner costed it")
    elif every is not None:
        lines.append(f'selective_ac_option = "{every}"  # one block in {every} recomputed in full: '
                     f"{config.recompute_num_layers} of each stage's blocks, as planned")
    return "\n".join(lines) + "\n"


def _layer_ac_interval(plan: Plan) -> int | None:
    """torchtitan's per-layer activation checkpointing (selective_ac_option = k: full AC on every k-th block) for a
    plan that recomputes N of each model chunk's blocks (`ParallelConfig.recompute_num_layers`): k = blocks / N,
    which torchtitan runs only where every chunk holds the same multiple of N blocks
    (`Framework.block_recompute_why_not`); None for a plan that recomputes every block (mode "full") or none."""
    layers, blocks = plan.parallel.recompute_num_layers, plan.blocks_per_stage
    if layers is None or layers >= max(blocks):
        return None
    if why := FRAMEWORKS["torchtitan"].block_recompute_why_not(plan.parallel, blocks):
        raise PlannerError(why)
    return blocks[0] // layers


def torchtitan_program() -> Program:
    """`torchtitan.train` with the exported TOML and the tokenizer, data set and output folder it must be given."""
    placeholders = (Placeholder("TOKENIZER_PATH", "directory of the tokenizer (HF assets, e.g. from "
                                "python scripts/download_hf_assets.py --assets tokenizer)"),
                    Placeholder("DATASET", "a data set name registered in torchtitan.hf_datasets, e.g. c4 "
                                "(add --training.dataset_path DIR for a local copy)"),
                    Placeholder("OUTPUT_DIR", "outputs and checkpoints (OUTPUT_DIR/checkpoint)"))
    setup = ("TITAN_ARGS=(", f'  --job.config_file "$HERE/{TOML}"', '  --model.hf_assets_path "$TOKENIZER_PATH"',
             '  --training.dataset "$DATASET"', '  --job.dump_folder "$OUTPUT_DIR"', ")")
    return Program(setup, '-m torchtitan.train "${TITAN_ARGS[@]}"', placeholders,
                   ("Needs torchtitan 0.2.2 importable by this Python.",))


def _compiles(plan: Plan) -> bool:
    """Whether the export turns torch.compile on: for the fused element-wise kernels the plan was costed with, and
    for async TP, which takes effect only compiled; not under a zero-bubble schedule, whose backward split into input
    and weight passes needs each block's own autograd graph, which a compiled block's single backward node is not."""
    if schedule_of(plan.parallel.schedule).splits_backward and plan.parallel.pp > 1:
        return False
    return plan.training.elementwise == "fused" or plan.parallel.tp_comm_overlap


def _compile_notes(plan: Plan) -> tuple[str, ...]:
    """A zero-bubble plan costed with fused element-wise kernels runs them eager under torchtitan."""
    if _compiles(plan) or plan.training.elementwise == "eager":
        return ()
    return ("torchtitan runs a zero-bubble schedule's blocks uncompiled, so its norms, RoPE and activations run "
            "eager, not fused as the plan was costed: estimate it with --elementwise eager",)


def _attention_notes(plan: Plan) -> tuple[str, ...]:
    """torchtitan calls PyTorch SDPA (cuDNN first on NVIDIA GPUs since pytorch/torchtitan 6a3a9da95, the native
    kernel), whose flash backend on ROCm is AOTriton, slower than the Composable Kernel rate a "flash" plan assumed."""
    return slower_attention_notes(plan, "torchtitan calls PyTorch SDPA, whose flash backend is AOTriton on ROCm",
                                  lambda gpu: gpu.flash_attn_native and gpu.flash_attention_2_share < 1)


def export_torchtitan(plan: Plan) -> ExportResult:
    """torchtitan.toml, torchrun.sh, slurm.sbatch and (several nodes) hostfile for the plan."""
    notes = flavor_notes(plan.model) + _compile_notes(plan) + _attention_notes(plan)
    if plan.parallel.sequence_parallel is False and plan.parallel.tp > 1:
        notes += ("torchtitan's tensor parallelism always shards activations along the sequence "
                  "(sequence parallel); the plan has it off",)
    order = host_order(plan)
    notes += placement_notes(order)
    header = export_header("torchtitan", plan, notes,
                           "rank order: torchtitan's mesh (pp, dp_replicate, dp_shard, cp, tp), tp fastest")
    files = {TOML: torchtitan_toml(plan, notes), TORCHRUN: torchrun_script(order, header, torchtitan_program()),
             SLURM: slurm_script(plan, order, header)}
    return ExportResult(files=files | host_files(order), notes=notes)
