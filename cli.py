"""The `planner` command line: options, rendering and exit codes. No planning logic lives here.

Exit codes: 0 success; 1 no feasible plan / the estimated plan does not fit; 2 invalid usage or
input (one line naming the bad value, never a traceback).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import yaml

from planner import InfeasibleError, PlannerError, __version__
from planner.cluster import Cluster, catalog_cluster_names, load_cluster
from planner.compare import compare_plans
from planner.config import (
    ATTENTION_KERNELS,
    CUDA_GRAPH_MODES,
    CUDA_GRAPH_MODULES,
    DEFAULT_LOCAL_QUEUE_DEPTH,
    DEFAULT_LORA_RANK,
    DEFAULT_LORA_TARGETS,
    DTYPES,
    ELEMENTWISE_MODES,
    FINETUNE_MODES,
    FP8_RECIPES,
    FSDP_BACKWARD_PREFETCHES,
    LOCAL_HEADS,
    LORA_TARGETS,
    MOE_DISPATCHERS,
    OPTIMIZER_STATES,
    RECOMPUTE_MODULES,
    ZERO3_COLLECTIVES,
    ParallelConfig,
    Partition,
    Schedule,
    Training,
    parse_cuda_graph_modules,
)
from planner.cost.estimate import (
    TIGHT_MEMORY_EVIDENCE,
    TIGHT_MEMORY_SHARE,
    Estimate,
    estimate,
    fit_advice,
    mfu_convention,
    moe_load_headroom,
)
from planner.explain import explain
from planner.export import EXPORT_TARGETS, exporter, render_stdout, write_export
from planner.finetune import adapter_parameters
from planner.frameworks import FRAMEWORK_NAMES, framework_named
from planner.gpu import GIB, catalog_gpu_names, lookup_gpu
from planner.limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, decimal_digits
from planner.local_learning import local_learning_section
from planner.model import ModelSpec, catalog_model_names, load_model
from planner.placement import Placement, default_placement
from planner.plan import LISTED_RANKS_MAX, build_plan_document, load_plan, parse_plan_document, write_atomic
from planner.profile.calibration import Calibration, default_calibration, load_calibration
from planner.profile.fit import (
    PARAMETERS,
    calibration_document,
    fit_efficiencies,
    fit_problems,
    gpu_profile_document,
)
from planner.profile.links import apply_links, link_node_indices, load_links, slow_link_warnings, write_links
from planner.profile.links_nccl import import_nccl_tests
from planner.profile.links_probe import parse_sizes, run_link_probe
from planner.profile.measure import PROFILE_DTYPES, ProfileRequest, measure_layers
from planner.profile.measured import MeasuredProfile, bind_to_model, load_measured_profile
from planner.render import (
    describe_estimate,
    format_breakdown,
    format_comparison,
    format_explanation,
    format_memory,
    format_ranked,
    format_stages,
    format_sweep,
    format_table,
    node_list,
    ranked_frame,
    with_training_costs,
)
from planner.replay import problem_of
from planner.resources import check_output, write_all_atomic
from planner.search.placement import replan, replan_record
from planner.search.planning import MAX_MEMORY_HEADROOM, plan
from planner.search.search import RankedPlan
from planner.search.space import FixedOptions, complete_config
from planner.slowdown import apply_slowdowns, parse_slowdown
from planner.sweep import cheapest_by, fastest_within, parse_prices, sweep, sweep_frame, sweep_svg
from planner.timeline import chrome_trace, iteration_timeline, timeline_svg
from planner.training_cost import TrainingCost, parse_tokens, training_cost

DEFAULT_MODEL = "llama3-8b"
DEFAULT_CLUSTER = "1x8xH100-80GB"
DEFAULT_GLOBAL_BATCH = 128
DEFAULT_SEQ_LEN = 8192


class FiniteRange(click.FloatRange):
    """click's FloatRange, which lets NaN and infinity through its bounds, without them."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class PathOption(click.Path):
    """click's Path for a file (or with `directory`, a directory) planner reads or writes, refusing what click takes
    for the current directory or a file named after a directory: an empty value, and a file path ending in '/'."""

    def __init__(self, directory: bool = False) -> None:
        super().__init__(file_okay=not directory, dir_okay=directory, path_type=Path)
        self.directory = directory

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            kind = "directory" if self.directory else "file"
            if not value.strip():
                self.fail(f"is empty: name a {kind}", param, ctx)
            if not self.directory and value.endswith(("/", os.sep)):
                self.fail(f"{value!r} ends in '/': name a file, not a directory", param, ctx)
        return super().convert(value, param, ctx)


FILE = PathOption()
DIRECTORY = PathOption(directory=True)


# ---- shared options ---------------------------------------------------------------------------

def memory_headroom_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--memory-headroom PCT` of `plan` and `sweep` (`planner.search.planning.plan`'s memory_headroom, in percent)."""
    return click.option(
        "--memory-headroom", "headroom_pct", type=FiniteRange(0, 100 * MAX_MEMORY_HEADROOM, max_open=True),
        default=0.0, show_default=True, metavar="PCT",
        help=f"Percent of every GPU's memory the plans leave free: the search counts only the rest as capacity "
             f"({TIGHT_MEMORY_EVIDENCE}).")(command)


def problem_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Model, cluster and training options shared by `plan` and `estimate`."""
    options = [
        click.option("--model", "model_spec", default=DEFAULT_MODEL, show_default=True,
                     help="Catalog name, HF config.json, or planner model/plan file."),
        click.option("--cluster", "cluster_spec", default=DEFAULT_CLUSTER, show_default=True,
                     help="Preset name, YAML/JSON cluster file, NODESxGPUSxGPU (e.g. 16x8xH100-80GB, 2xNVL72xGB200) "
                          "or HOSTSxGPUSxGPU:nvlN (e.g. 36x4xGB200:nvl72: NVLink domains of N GPUs)."),
        click.option("--global-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), default=DEFAULT_GLOBAL_BATCH,
                     show_default=True, help="Sequences per iteration."),
        click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), default=DEFAULT_SEQ_LEN, show_default=True,
                     help="Tokens per sequence."),
        click.option("--dtype", type=click.Choice(DTYPES), default="bf16", show_default=True),
        click.option("--attention", type=click.Choice(ATTENTION_KERNELS), default="flash", show_default=True,
                     help="Attention kernel: the GPU's native fused attention (flash: cuDNN, FlashAttention-3 on "
                          "Hopper), FlashAttention-2 (flash2: flash-attn 2, PyTorch SDPA's flash backend; slower "
                          "on Hopper and Blackwell), or unfused softmax (pre-2022 Megatron runs)."),
        click.option("--elementwise", type=click.Choice(ELEMENTWISE_MODES), default="fused", show_default=True,
                     help="Norms, RoPE and activation: fused kernels (Megatron-LM/Transformer Engine, torch.compile) "
                          "or eager PyTorch's op-by-op kernels (torchtitan without torch.compile)."),
        click.option("--fp8-recipe", type=click.Choice(FP8_RECIPES),
                     help="How --dtype fp8 scales its GEMM operands: per tensor from the amax history (delayed) or "
                          "the tensor itself (tensorwise, current scaling), per row (rowwise; rowwise_with_gw_hp "
                          "keeps the weight-gradient GEMMs in BF16), per 1x128/128x128 tile (blockwise) or per 32 "
                          "elements (mxfp8, Blackwell).  [default: the --framework's own: megatron delayed, "
                          "torchtitan tensorwise]"),
        click.option("--cuda-graphs", type=click.Choice(CUDA_GRAPH_MODES), default="none", show_default=True,
                     help="Kernels launched one by one (none) or the whole iteration replayed as one CUDA graph "
                          "(full_iteration: Megatron-Core's --cuda-graph-impl, no host launch or MoE sync time)."),
        click.option("--cuda-graph-modules", metavar="M[,M...]",
                     help=f"Parts of every layer replayed from per-layer CUDA graphs, any of "
                          f"{', '.join(CUDA_GRAPH_MODULES)} (Megatron-Core's --cuda-graph-impl transformer_engine "
                          "--cuda-graph-scope; each part's launches become one replay, a dropless MoE layer's "
                          "dispatch still syncs; with --cuda-graphs none)."),
        click.option("--moe-load-imbalance", type=FiniteRange(min=1.0), default=1.0, show_default=True, metavar="F",
                     help="MoE router: the busiest expert-parallel rank's routed tokens over the mean (1: "
                          "force-balanced, as Megatron-Bridge's benchmarks run; a router left to itself runs "
                          "hotter). Expert GEMMs and memory are those of that rank, the one that runs out first."),
        click.option("--moe-capacity-factor", type=FiniteRange(min=1.0), metavar="F",
                     help="Drop the tokens beyond F times each expert's mean (Megatron-LM "
                          "--moe-expert-capacity-factor); caps --moe-load-imbalance.  [default: dropless]"),
        click.option("--finetune", type=click.Choice(FINETUNE_MODES), default="full", show_default=True,
                     help="What trains: every parameter (full), or LoRA adapters on frozen 16-bit (lora) or 4-bit "
                          "NF4 (qlora) base weights."),
        click.option("--lora-rank", type=int, metavar="R",
                     help=f"LoRA rank (with --finetune lora|qlora)  [default: {DEFAULT_LORA_RANK}]"),
        click.option("--lora-targets", type=click.Choice(LORA_TARGETS),
                     help=f"Linears that get adapters (with --finetune lora|qlora)  [default: {DEFAULT_LORA_TARGETS}]"),
        click.option("--optimizer-states", type=click.Choice(("auto", *OPTIMIZER_STATES)), default="auto",
                     show_default=True,
                     help="Adam states: fp32 on the GPU, 8bit (bitsandbytes) or cpu (ZeRO-Offload); auto: fp32, and "
                          "on plan the faster of 8bit and cpu when nothing fits with fp32."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def parallel_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Parallel-configuration options; on `plan` each one fixes that dimension of the search."""
    options = [
        click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel degree."),
        click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel degree."),
        click.option("--dp", type=click.IntRange(min=1), help="Data-parallel degree."),
        click.option("--micro-batch", type=click.IntRange(min=1), help="Micro-batch size (sequences)."),
        click.option("--vpp", type=click.IntRange(min=1),
                     help="Model chunks per pipeline rank (interleaved and interleaved-zb schedules; zb-v and "
                          "dualpipe-v: 2)."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"])),
        click.option("--cpu-offload-layers", type=click.IntRange(min=0), metavar="N",
                     help="Move the first N blocks' activations to host memory in the forward and back in the "
                          "backward, over the GPU's host link (Megatron-LM --cpu-offloading-num-layers N; pp 1, no "
                          "recompute; on plan, only such layouts are searched)  [default: 0]"),
        click.option("--recompute-modules", metavar="M[,M...]",
                     help=f"Megatron-LM's selective recompute targets, any of {', '.join(RECOMPUTE_MODULES)} "
                          "(--recompute-modules; implies --recompute selective)  [default: core_attn]"),
        click.option("--schedule", type=click.Choice([schedule.value for schedule in Schedule]),
                     help="Pipeline schedule; zb-h1, zb-h2, zb-1p, zb-2p, interleaved-zb, zb-v and dualpipe-v "
                          "split each backward into input- and weight-gradient passes (zero bubble, Qi et al. 2024; "
                          "zb-1p/zb-2p: its automatic schedule, ordered from the stage times under 1F1B's or twice "
                          "its activation memory; DeepSeek-V3's DualPipeV); searched only where the --framework runs "
                          "them (torchtitan: interleaved-zb, zb-v, dualpipe-v) or when named here. local: local "
                          "learning (PPLL), "
                          "each stage trains on its own auxiliary loss, no end-to-end backward; it changes the "
                          "training algorithm and is used only when named."),
        click.option("--local-queue-depth", type=int, metavar="N",
                     help="With --schedule local: boundary tensors a stage may send ahead of the next one "
                          f"(a bounded queue)  [default: {DEFAULT_LOCAL_QUEUE_DEPTH}]"),
        click.option("--local-head", metavar="|".join(LOCAL_HEADS),
                     help="With --schedule local: each stage's auxiliary head, linear (norm + linear to the "
                          "vocabulary or classes) or mlp (norm + hidden linear + GELU + that linear)  "
                          "[default: linear]"),
        click.option("--zero", "zero_stage", type=click.IntRange(0, 3), help="ZeRO stage (DeepSpeed semantics)."),
        click.option("--distributed-optimizer", is_flag=True, default=None,
                     help="Megatron-LM distributed optimizer (shards optimizer states like ZeRO-1)."),
        click.option("--sequence-parallel/--no-sequence-parallel", default=None,
                     help="Megatron-LM sequence parallelism (needs tp > 1)."),
        click.option("--fp8-param-gather/--no-fp8-param-gather", default=None,
                     help="With --dtype fp8 and sharded weights (ZeRO / distributed optimizer): keep and gather the "
                          "linear weights in FP8, one byte each (torchao's FSDP float8 all-gather, Megatron-LM "
                          "--fp8-param-gather)  [plan: on wherever the target can; estimate: off]"),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
                     help="Overlap the sequence-parallel collectives with their GEMMs (Megatron-LM "
                          "--tp-comm-overlap, torchtitan async TP; needs sequence parallelism)."),
        click.option("--framework", type=click.Choice(FRAMEWORK_NAMES),
                     help="Only what this framework runs, estimated as its engine runs it  [default: any, or "
                          "plan's --export target]"),
        click.option("--cp", type=click.IntRange(min=1),
                     help="Context-parallel degree: each sequence split over cp ranks (sequence divisible by 2·cp)."),
        click.option("--cp-comm", type=click.Choice(["p2p", "all-gather", "a2a"]),
                     help="How CP exchanges keys/values: p2p ring (Megatron-LM), all-gather (Llama 3), a2a "
                          "(Ulysses)  [default: searched; p2p for estimate]"),
        click.option("--hsdp", "hsdp_replicas", type=click.IntRange(min=1), metavar="R",
                     help="HSDP: ZeRO-3/FSDP sharded within dp·cp/R ranks, R replicas all-reduce (needs --zero 3)."),
        click.option("--ep", type=click.IntRange(min=1),
                     help="Expert-parallel degree (MoE): divides the routed experts; folded over tp·cp·dp."),
        click.option("--etp", type=click.IntRange(min=1),
                     help="Expert tensor-parallel degree (MoE; default: tp, Megatron-LM's default)."),
        click.option("--moe-dispatcher", type=click.Choice(MOE_DISPATCHERS),
                     help="MoE token dispatcher: alltoall (one copy per routed expert) or flex (DeepEP/HybridEP: "
                          "once per destination node, then NVLink)  [default: searched, flex where the framework "
                          "runs it; alltoall for estimate]"),
        click.option("--moe-ep-overlap/--no-moe-ep-overlap", default=None,
                     help="Overlap EP all-to-alls with another micro-batch's compute (Megatron-LM "
                          "--overlap-moe-expert-parallel-comm; needs ep > 1, no full recompute, vpp > 1 with pp > 1)  "
                          "[default: searched, on where allowed; off for estimate]"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class TokenCount(click.ParamType):
    """A number of training tokens: 15T, 300B, 2e12 (planner.training_cost.parse_tokens)."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return value if isinstance(value, int) else parse_tokens(str(value))
        except PlannerError as exc:
            self.fail(str(exc), param, ctx)


def training_cost_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--tokens N` and `--gpu-hour-price USD` (plan and estimate): time-to-train, GPU-hours, cost, energy."""
    command = click.option("--gpu-hour-price", "gpu_hour_price", type=FiniteRange(min=0), metavar="USD",
                           help="Price of one GPU-hour; with --tokens the run's cost.")(command)
    return click.option("--tokens", type=TokenCount(),
                        help="Training tokens (15T, 300B, 2e12): time-to-train, GPU-hours, cost and energy "
                             "at the GPUs' TDP.")(command)


def check_cost_options(tokens: int | None, gpu_hour_price: float | None) -> None:
    """A price prices a run: refuse `--gpu-hour-price` without `--tokens` before any search runs."""
    if tokens is None and gpu_hour_price is not None:
        raise PlannerError("--gpu-hour-price needs --tokens N (the number of training tokens to price)")


def run_cost(tokens: int | None, gpu_hour_price: float | None, cluster: Cluster, training: Training,
             placement: Placement, result: Estimate) -> TrainingCost | None:
    """The training run's cost for `--tokens` on the plan's GPUs; None without --tokens."""
    if tokens is None:
        return None
    return training_cost(tokens, training.tokens_per_iteration, result.iteration_time_s,
                         [cluster.gpu_spec(gpu) for gpu in placement.gpus], gpu_hour_price)


def profile_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--profile PROFILE.json`: measured unit times instead of analytic ones (`plan` and `estimate`)."""
    return click.option("--profile", "profile_path", type=FILE,
                        help="Measured layer profile from `planner profile layers` (its model is the default "
                             "--model).")(command)


def calibration_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--calibration FILE`: cost-model constants (e.g. from `planner calibrate --calibration-out`)."""
    return click.option("--calibration", "calibration_path", type=FILE,
                        help="Cost-model constants to use instead of profiles/calibration.yaml "
                             "(e.g. written by `planner calibrate --calibration-out`).")(command)


def load_profile_and_model(profile_path: Path, model_spec: str, training: Training, calibration: Calibration,
                           ) -> tuple[ModelSpec, Training, MeasuredProfile]:
    """The profile bound to the model, with the model, sequence length, dtype and attention kernel
    taken from the profile wherever the user left that option at its default."""
    profile = load_measured_profile(profile_path)
    context = click.get_current_context()

    def given(name: str) -> bool:
        return context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT

    model = load_model(model_spec) if given("model_spec") else profile.model
    training = replace(training, **{name: getattr(profile, name)
                                    for name in ("seq_len", "dtype", "attention") if not given(name)})
    return model, training, bind_to_model(profile, model, calibration)


def echo_local_learning(document: dict[str, Any]) -> None:
    """A local-schedule plan's comparison with 1F1B and the note that it changes the training algorithm."""
    section = document.get("local_learning")
    if section:
        peak, baseline = section["peak_memory_bytes"] / GIB, section["one_f_one_b_peak_memory_bytes"] / GIB
        click.echo(f"vs 1F1B         {section['one_f_one_b_iteration_time_s']:.4f} s per iteration on the same plan "
                   f"(local learning: {section['speedup_over_1f1b']:.2f}x its speed); peak memory {peak:.1f} GiB vs "
                   f"{baseline:.1f} GiB{'' if section['one_f_one_b_fits'] else ' (1F1B does not fit)'}")
    for note in document.get("notes", ()):
        click.echo(f"note: {note}")


def echo_profile_notes(timer: MeasuredProfile | None) -> None:
    for note in timer.notes if timer else ():
        click.echo(note, err=True)


def handle_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn user errors into one line and the documented exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except PlannerError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except InfeasibleError as exc:
            click.echo(f"infeasible: {exc}", err=True)
            sys.exit(1)

    return wrapper


@dataclass(frozen=True)
class Problem:
    """Everything `plan` and `estimate` read from their options, loaded and checked; `warnings` are
    implausible measured inputs (already printed on stderr) that the output should repeat."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    calibration: Calibration
    timer: MeasuredProfile | None
    warnings: tuple[str, ...] = ()
    profile_path: Path | None = None  # the timer's file when it came from a plan file (`estimate --plan`)


@dataclass(frozen=True)
class TuningOptions:
    """The fine-tuning and element-wise kernel options of `plan` and `estimate` as given (`problem_options`)."""

    finetune: str = "full"
    lora_rank: int | None = None
    lora_targets: str | None = None
    optimizer_states: str = "auto"
    elementwise: str = "fused"
    fp8_recipe: str | None = None  # as given; None: the target framework's (`fp8_default`)
    cuda_graphs: str = "none"
    cuda_graph_modules: str | None = None  # as given, comma-separated (parse_cuda_graph_modules)
    moe_load_imbalance: float = 1.0
    moe_capacity_factor: float | None = None
    cross_entropy: str = "fused"  # set by the target framework (`for_framework`), not an option of its own
    fp8_default: str = FP8_RECIPES[0]  # likewise
    fp8_saved_input: str = "fp8"  # likewise
    target: str = "any"  # the framework that runs it, which decides the FP8 all-gathers (Training.fp8_tp_gather)

    @classmethod
    def pop_from(cls, options: dict[str, Any]) -> TuningOptions:
        """Take these options out of a command's keyword options."""
        return cls(*(options.pop(name) for name in ("finetune", "lora_rank", "lora_targets", "optimizer_states",
                                                     "elementwise", "fp8_recipe", "cuda_graphs", "cuda_graph_modules",
                                                     "moe_load_imbalance", "moe_capacity_factor")))

    def for_framework(self, framework: str | None) -> TuningOptions:
        """These options with the loss kernel `framework` runs at their element-wise setting, its default FP8 recipe
        and what its FP8 linears keep for backward (and gather in FP8)."""
        target = framework_named(framework or "any")
        return replace(self, cross_entropy=target.loss_kernel(self.elementwise), fp8_default=target.fp8_recipes[0],
                       fp8_saved_input=target.fp8_saved_input, target=target.name)

    def training_fields(self, dtype: str) -> dict[str, Any]:
        """Training's fields at `dtype`; "auto" optimizer states start as fp32 (plan may choose others)."""
        recipe = self.fp8_recipe or (self.fp8_default if dtype == "fp8" else None)
        return {"finetune": self.finetune, "lora_rank": self.lora_rank, "lora_targets": self.lora_targets,
                "optimizer_states": "fp32" if self.optimizer_states == "auto" else self.optimizer_states,
                "elementwise": self.elementwise, "cross_entropy": self.cross_entropy, "fp8_recipe": recipe,
                "cuda_graphs": self.cuda_graphs, "fp8_saved_input": self.fp8_saved_input,
                "cuda_graph_modules": (parse_cuda_graph_modules(self.cuda_graph_modules)
                                       if self.cuda_graph_modules is not None else ()),
                "fp8_tp_gather": dtype != "fp8" or framework_named(self.target).gathers_tp_in_fp8(recipe),
                "moe_load_imbalance": self.moe_load_imbalance, "moe_capacity_factor": self.moe_capacity_factor}


def load_problem(model_spec: str, cluster_spec: str, global_batch: int, seq_len: int, dtype: str, attention: str,
                 profile_path: Path | None, calibration_path: Path | None, links_path: Path | None,
                 slowdowns: tuple[str, ...], tuning: TuningOptions | None = None) -> Problem:
    """Model, cluster (with measured links and slowdowns), training, calibration and measured profile;
    warnings about implausibly slow measured links go to stderr and into the Problem."""
    model, nominal = load_model(model_spec), load_cluster(cluster_spec)
    warnings = slow_link_warnings(nominal, load_links(links_path), str(links_path)) if links_path else ()
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    cluster = condition_cluster(nominal, links_path, slowdowns)
    training = Training(global_batch=global_batch, seq_len=seq_len, dtype=dtype, attention=attention,
                        **(tuning or TuningOptions()).training_fields(dtype))
    calibration = load_calibration(calibration_path) if calibration_path else default_calibration()
    timer = None
    if profile_path:
        model, training, timer = load_profile_and_model(profile_path, model_spec, training, calibration)
    adapter_parameters(model, training)  # a rank or target the model cannot take fails here, before any search
    if model.num_experts == 1 and (training.moe_load_imbalance != 1.0 or training.moe_capacity_factor is not None):
        raise PlannerError(f"--moe-load-imbalance and --moe-capacity-factor shape an MoE router; {model.name} has "
                           f"no routed experts")
    return Problem(model, cluster, training, calibration, timer, warnings)


def echo_memory(training: Training, result: Estimate) -> None:
    """The memory breakdown term by term, for fine-tuning, non-default optimizer states and FP8 weight copies."""
    copies = any(stage.memory.fp8_weight_copies for stage in result.stages)
    if training.finetune != "full" or training.optimizer_states != "fp32" or copies:
        click.echo("\nmemory per GPU (frozen base weights apart from the trainable states"
                   + (", FP8 linears' weight copies apart from the 16-bit weights)" if copies else ")"))
        click.echo(format_memory(result))


def router_headroom(document: dict[str, Any], training: Training, config: ParallelConfig, result: Estimate,
                    estimate_at: Callable[[Training], Estimate]) -> float | None:
    """`moe_load_headroom` of a plan, recorded in its document's estimate section when there is one."""
    headroom = moe_load_headroom(training, config, result, estimate_at)
    if headroom is not None:
        document["estimate"]["moe_load_headroom"] = headroom
    return headroom


def echo_tight_memory(ranked: Sequence[Estimate]) -> None:
    """A warning when the first of the `ranked` estimates needs more than TIGHT_MEMORY_SHARE of its GPUs' memory,
    naming the fastest of the others that leaves more room, if one does."""
    first = ranked[0]
    if not TIGHT_MEMORY_SHARE < first.memory_share <= 1:
        return
    click.echo(f"memory margin   needs {100 * first.memory_share:.1f} % of its GPUs' memory; {TIGHT_MEMORY_EVIDENCE}")
    roomy = [(number, result) for number, result in enumerate(ranked, 1) if result.memory_share <= TIGHT_MEMORY_SHARE]
    if len(ranked) > 1 and roomy:
        number, result = roomy[0]
        slower = result.iteration_time_s / first.iteration_time_s - 1
        click.echo(f"                plan {number} is {100 * slower:.1f} % slower and needs "
                   f"{100 * result.memory_share:.1f} %; --memory-headroom plans with room left")
    elif len(ranked) > 1:
        click.echo(f"                --memory-headroom {100 - 100 * TIGHT_MEMORY_SHARE:g} plans with that much left "
                   f"free")


TIGHT_ROUTER_HEADROOM = 1.1
"""A plan planned for a balanced router whose busiest expert rank may take less than this many times the mean routed
tokens before it runs out of memory gets a warning: routers that are not force-balanced run hotter (the
Megatron-Bridge recompute study's Nemotron-3-Nano ranks, about 1.8x in its first iterations: docs/accuracy.md)."""


def echo_router_headroom(headroom: float | None, training: Training) -> None:
    if headroom is None:
        return
    click.echo(f"router headroom fits while the busiest expert rank gets up to {headroom:.2f}x the mean "
               f"routed tokens (dropless; --moe-load-imbalance)")
    if headroom < TIGHT_ROUTER_HEADROOM and training.moe_load_imbalance == 1.0:
        click.echo("                only a nearly balanced router fits: unless the router is force-balanced, plan "
                   "with --moe-load-imbalance (e.g. 1.2) to leave room")


def describe_tuning(model: ModelSpec, training: Training) -> str:
    """', LoRA r=16 all-linear (207.1 M trainable, 0.29 %)', the FP8 recipe, the optimizer states when not fp32 and
    eager element-wise kernels; '' otherwise."""
    text = f" ({training.fp8_recipe} scaling)" if training.fp8_recipe else ""
    if training.finetune != "full":
        trainable = adapter_parameters(model, training)
        text += (f", {training.finetune.replace('q', 'Q', 1).replace('lora', 'LoRA')} r={training.lora_rank} "
                 f"{training.lora_targets} ({trainable / 1e6:,.1f} M trainable, "
                 f"{100 * trainable / model.num_parameters:.2f} %)")
    if training.optimizer_states != "fp32":
        text += f", optimizer states {training.optimizer_states}"
    if training.elementwise != "fused":
        text += f", {training.elementwise} element-wise kernels"
    if training.cuda_graphs != "none":
        text += f", {training.cuda_graphs.replace('_', '-')} CUDA graphs"
    if training.cuda_graph_modules:
        text += f", per-layer CUDA graphs of {','.join(training.cuda_graph_modules)}"
    if training.moe_expert_load != 1.0:
        text += f", busiest expert rank at {training.moe_expert_load:g}x the mean routed tokens"
    return text


def shortfall_message(config: ParallelConfig, result: Estimate, training: Training | None = None,
                      framework: str = "any") -> str:
    """What the tightest stage needs and lacks, and what would make it fit on `framework` (`fit_advice`)."""
    stage = result.tightest_stage()
    gatherable = training is None or framework_named(framework).gathers_weights_in_fp8(training.fp8_recipe)
    short = stage.memory.required - stage.memory.capacity
    return (
        f"stage {stage.index} (pipeline rank {stage.pp_rank}) needs {stage.memory.required / GIB:.1f} GiB, "
        f"{stage.gpu} has {stage.memory.capacity / GIB:.1f} GiB (short by {short / GIB:.1f} GiB); "
        f"{fit_advice(config, result, training, gatherable)}"
    )


# ---- commands ---------------------------------------------------------------------------------

class OneLineErrors(click.Group):
    """The root group: click's usage errors (bad option, missing argument, bad value) become one line
    `error: ...` with exit 2, like every other input error, instead of click's three-line usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("standalone_mode", None)
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help is the answer
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message(), err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(2)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(130)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
def main() -> None:
    """planner: find the parallel layout for training a large model on a GPU cluster."""


def placement_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--placement auto|full`: whether the plan JSON lists every rank even above LISTED_RANKS_MAX ranks."""
    return click.option("--placement", "placement_detail", type=click.Choice(["auto", "full"]), default="auto",
                        show_default=True, help=f"Plan JSON placement: per-rank table up to {LISTED_RANKS_MAX} "
                                                "ranks and runs of ranks always (auto), or every rank (full).")(command)


def cluster_condition_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--links` (measured per-node-pair links) and `--slowdown` (known slow devices), for plan and estimate."""
    command = click.option(
        "--slowdown", "slowdowns", multiple=True, metavar="NODE[:GPU]=FACTOR",
        help="A known slow node or GPU, FACTOR times slower than nominal (2 = half speed); repeatable.",
    )(command)
    return click.option("--links", "links_path", type=FILE,
                        help="LINKS.json with measured per-node-pair bandwidth and latency.")(command)


def condition_cluster(cluster: Cluster, links_path: Path | None, slowdowns: tuple[str, ...]) -> Cluster:
    """The cluster with measured links and slowdowns applied (notes about matching go to stderr)."""
    if links_path:
        table = load_links(links_path)
        if link_node_indices(cluster, table)[1]:
            click.echo(f"note: {links_path} node names are not the cluster's; matched by position", err=True)
        cluster = apply_links(cluster, table)
    return apply_slowdowns(cluster, [parse_slowdown(text) for text in slowdowns])


def echo_replan(record: dict[str, Any]) -> None:
    before, after = record["iteration_time_s_without_replan"], record["iteration_time_s_with_replan"]
    click.echo("\nre-planned around the slow devices (placement and stage split)")
    click.echo(f"  without re-plan  {before:.4f} s (rank-order placement, given split)")
    click.echo(f"  with re-plan     {after:.4f} s ({100 * record['gain']:.1f} % faster; blocks per stage "
               f"{','.join(map(str, record['blocks_per_stage']))}; {record['placement_method']} placement)")
    for rank, names in enumerate(record["stage_nodes"]):
        click.echo(f"  pipeline rank {rank}: {node_list(names)}")


def echo_heterogeneity(record: dict[str, Any]) -> None:
    """The `plan` section on placement, stragglers and mixed GPU types (see heterogeneity_record)."""
    click.echo(f"\nplacement on this cluster's links and devices ({record['placement_method']}, "
               f"{record['placement_evaluations']} estimates): {record['placed_time_s']:.4f} s, rank order "
               f"{record['rank_order_time_s']:.4f} s ({100 * record['placement_gain']:.1f} % gained)")
    for rank, names in enumerate(record["stage_nodes"]):
        click.echo(f"  pipeline rank {rank}: {node_list(names)}")
    if "without_replan_time_s" in record:
        click.echo(f"slow devices: {record['without_replan_time_s']:.4f} s without re-plan (the plan made ignoring "
                   f"--slowdown, rank order), {record['placed_time_s']:.4f} s with re-plan")
    for note in record["notes"]:
        click.echo(f"note: {note}")
    subset = record.get("homogeneous_subset")
    if subset:
        time_text = f"{subset['iteration_time_s']:.4f} s ({subset['parallelism']})" if subset["iteration_time_s"] \
            else "no plan fits"
        click.echo(f"largest single-type subset {subset['cluster']} ({subset['num_gpus']} GPUs): {time_text}")


@main.command("estimate")
@problem_options
@parallel_options
@click.option("--partition", help="Transformer blocks per (virtual) stage, e.g. 5,6,7,6 (default: uniform).")
@click.option("--zero3-collectives", type=click.Choice(ZERO3_COLLECTIVES),
              help="How ZeRO-3 issues its collectives: per-unit (PyTorch FSDP, DeepSpeed >= 0.6.0: one per block, "
                   "prefetched) or per-tensor (DeepSpeed <= 0.5.10: one per parameter tensor, synchronous)  "
                   "[default: per-unit]")
@click.option("--fsdp-backward-prefetch", type=click.Choice(FSDP_BACKWARD_PREFETCHES),
              help="When per-unit ZeRO-3 gathers the next unit's weights in backward: pre (before the current "
                   "unit's gradients, hidden behind them: PyTorch FSDP's default, FSDP2, Megatron-FSDP, DeepSpeed) "
                   "or post (after them, waiting in full: FSDP1 BACKWARD_POST, MosaicML Composer's default)  "
                   "[default: pre]")
@click.option("--recompute-num-layers", type=click.IntRange(min=1), metavar="N",
              help="With --recompute full: each model chunk recomputes only its first N blocks and keeps the "
                   "others' activations (Megatron-LM --recompute-method block --recompute-num-layers N)  "
                   "[default: every block]")
@profile_option
@calibration_option
@cluster_condition_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan JSON document only.")
@click.option("--out", type=FILE, help="Write the plan JSON here.")
@click.option("--plan", "plan_path", type=FILE,
              help="Re-estimate a plan file exactly as written: model, cluster, training, calibration, "
                   "configuration, split and placement all come from it (only --framework may change how it runs); "
                   "PLAN.json#N: its N-th plan as `planner plan` numbered them.")
@placement_option
@training_cost_options
@handle_errors
def estimate_command(model_spec: str, cluster_spec: str, global_batch: int, seq_len: int, dtype: str,
                     attention: str, partition: str | None, profile_path: Path | None,
                     calibration_path: Path | None, links_path: Path | None,
                     slowdowns: tuple[str, ...], as_json: bool, out: Path | None, plan_path: Path | None,
                     placement_detail: str, tokens: int | None, gpu_hour_price: float | None,
                     **parallel: Any) -> None:
    """Estimate time and memory of one fully given configuration, with its breakdown.

    With --slowdown it also re-plans placement (and, unless --partition is given, the stage split)
    around the slow devices and shows the time with and without that re-plan. With --plan it
    re-estimates a plan file and says whether it reproduces the file's estimate.
    """
    check_cost_options(tokens, gpu_hour_price)
    tuning = TuningOptions.pop_from(parallel)
    fixed = FixedOptions.from_options(parallel)
    tuning = tuning.for_framework(fixed.framework)
    if plan_path:
        problem, config, split, placement, framework = plan_file_problem(plan_path, fixed.framework)
    else:
        problem = load_problem(model_spec, cluster_spec, global_batch, seq_len, dtype, attention, profile_path,
                               calibration_path, links_path, slowdowns, tuning)
        config = complete_config(fixed, problem.model, problem.cluster, problem.training)
        if fixed.framework:
            framework_named(fixed.framework).for_model(problem.model).require_training(problem.training, config)
        split = parse_partition(partition, problem.model) if partition is not None else None
        placement, framework = default_placement(problem.cluster, config), fixed.framework or "any"
    model, cluster, training, calibration, timer = (problem.model, problem.cluster, problem.training,
                                                    problem.calibration, problem.timer)
    result = estimate(model, cluster, training, config, split, placement, timer=timer, calibration=calibration)
    echo_profile_notes(timer)
    profile_source = problem.profile_path or profile_path
    extra: dict[str, Any] = {"profile": {"path": str(profile_source), "notes": list(timer.notes)}} if timer else {}
    if problem.warnings:
        extra["warnings"] = list(problem.warnings)
    extra.update(local_learning_section(model, cluster, training, config, result, placement, timer, calibration))
    if slowdowns:
        replanned = replan(model, cluster, training, config, split, fixed_partition=split is not None, timer=timer,
                           calibration=calibration, framework=fixed.framework)
        extra["replan"] = {"slowdowns": list(slowdowns), **replan_record(cluster, config, replanned)}
    document = build_plan_document(model, cluster, training, config, placement, result, extra,
                                   full_placement=placement_detail == "full", framework=framework,
                                   calibration=calibration)
    cost = run_cost(tokens, gpu_hour_price, cluster, training, placement, result)
    if cost:
        document["estimate"].update(cost.as_dict())
    headroom = router_headroom(document, training, config, result, lambda at: estimate(
        model, cluster, at, config, split, placement, timer=timer, calibration=calibration))
    text = json.dumps(document, indent=2)
    if out:
        write_atomic(out, text + "\n")
    if as_json:
        click.echo(text)
    else:
        click.echo(f"{model.name} on {cluster.name} ({cluster.num_gpus} GPUs), global batch {global_batch}, "
                   f"sequence {training.seq_len}, {training.dtype}{describe_tuning(model, training)}")
        click.echo(describe_estimate(config, result, config.num_gpus, mfu_convention(training)))
        echo_tight_memory([result])
        echo_router_headroom(headroom, training)
        echo_local_learning(document)
        if cost:
            click.echo(f"time to train   {cost.describe()}")
        if plan_path:
            click.echo(reproduction_line(plan_path, load_plan(plan_path).document, document))
        click.echo("\nbreakdown of one iteration")
        click.echo(format_breakdown(result))
        click.echo("\nstages (times per micro-batch; memory per GPU of that pipeline rank)")
        click.echo(format_stages(result))
        echo_memory(training, result)
        if "replan" in extra:
            echo_replan(extra["replan"])
    if not result.fits:
        click.echo(f"does not fit: {shortfall_message(config, result, training, framework)}", err=True)
        sys.exit(1)


# estimate options that may accompany --plan: all others would change what the file states
_WITH_PLAN = {"plan_path", "framework", "as_json", "out", "placement_detail", "tokens", "gpu_hour_price"}


def split_quality(best: RankedPlan) -> str:
    """How good the best plan's stage split is known to be: proven optimal, within a gap of the search's lower
    bound, or searched under full recompute of every block before the plan kept some blocks' activations."""
    if best.optimal:
        return "the split is proven optimal: its estimate meets the lower bound over every split"
    if best.lower_bound_s is None:
        return (f"the split was searched under full recompute of every block; recomputing "
                f"{best.config.recompute_num_layers} per model chunk fits and is faster (no bound over splits for it)")
    gap = best.estimate.iteration_time_s / best.lower_bound_s - 1
    return f"the split is within {100 * gap:.2f} % of the lower bound over every split (not proven optimal)"


def plan_file_problem(plan_path: Path, framework: str | None,
                      ) -> tuple[Problem, ParallelConfig, Partition, Placement, str]:
    """A plan file's problem, configuration, split, placement and framework for `estimate --plan`: as written,
    or run by `framework` when given (its execution semantics; exit 2 if it cannot run the plan)."""
    context = click.get_current_context()
    options = {param.name: max(param.opts, key=len) for param in context.command.params}
    given = [options[name] for name, value in context.params.items()
             if name not in _WITH_PLAN and context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
             and value not in (None, ())]
    if given:
        raise PlannerError(f"--plan takes the model, cluster, training and configuration from {plan_path}; "
                           f"drop {', '.join(given)}")
    source = load_plan(plan_path)
    inputs = problem_of(source)
    calibration = inputs.calibration
    profile = source.document.get("profile")
    timer, profile_path = None, None
    if isinstance(profile, dict) and isinstance(profile.get("path"), str):
        profile_path = Path(profile["path"])
        timer = bind_to_model(load_measured_profile(profile_path), inputs.model, calibration)
    config = inputs.config if framework is None else framework_named(framework).require(inputs.config)
    problem = Problem(inputs.model, inputs.cluster, inputs.training, calibration, timer, profile_path=profile_path)
    return problem, config, inputs.partition, inputs.placement, framework or source.framework


def reproduction_line(plan_path: Path, written: dict[str, Any], now: dict[str, Any]) -> str:
    """Whether re-estimating a plan file gave the file's iteration time and per-stage memory, or how far off."""
    before, after = written["estimate"]["iteration_time_s"], now["estimate"]["iteration_time_s"]
    same_memory = [s["memory_bytes"] for s in written["stages"]] == [s["memory_bytes"] for s in now["stages"]]
    if before == after and same_memory:
        return f"plan file       {plan_path}: estimate reproduced exactly (iteration time, per-stage memory)"
    return (f"plan file       {plan_path}: estimated {before:.4f} s when written, now {after:.4f} s"
            f"{'' if same_memory else '; per-stage memory differs'} (cost model changed, or --framework)")


def parse_partition(text: str, model: ModelSpec) -> Partition:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise PlannerError(f"--partition {text!r} must be comma-separated block counts, e.g. 5,6,7,6") from None
    return Partition.from_blocks(counts, model.num_layers)


@main.command("export")
@click.argument("plan_path", metavar="PLAN.json[#N]", type=FILE)
@click.option("--to", "target", required=True, metavar="|".join(EXPORT_TARGETS),
              help="Framework to export to: " + ", ".join(EXPORT_TARGETS[:-1]) + "; or pytorch-local, a runnable "
                   "PyTorch reference of a --schedule local plan (no framework runs local learning).")
@click.option("--out", type=DIRECTORY,
              help="Directory to write the files into (created if missing); default: print them.")
@click.option("--force", is_flag=True,
              help="Overwrite files in --out that an earlier export did not write or that were edited since.")
@handle_errors
def export_command(plan_path: Path, target: str, out: Path | None, force: bool) -> None:
    """Turn a plan file into launch files: framework flags or config, torchrun.sh and slurm.sbatch for its cluster.
    PLAN.json#N: the file's N-th plan as `planner plan` numbered it (#2 onwards: its alternatives)."""
    result = exporter(target)(load_plan(plan_path))
    if out:
        for path in write_export(result, out, force):
            click.echo(f"wrote {path}")
    else:
        click.echo(render_stdout(result), nl=False)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


def export_document(document: dict[str, Any], target: str, out: Path | None) -> None:
    """`plan --export`: write the new plan's launch files into `out` (default ./TARGET-launch);
    messages go to stderr so that `--json` output stays one document."""
    result = exporter(target)(parse_plan_document(document, "new plan"))
    for path in write_export(result, out or Path(f"{target}-launch")):
        click.echo(f"wrote {path}", err=True)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


@main.command("plan")
@problem_options
@parallel_options
@click.option("--top", "top_k", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="How many plans to list: distinct layouts, each with its fastest way to shard the states.")
@click.option("--time-limit", "time_limit_s", type=FiniteRange(0, 3600, min_open=True), default=1.0,
              show_default=True,
              help="Seconds per stage-partition ILP; on expiry the best split found so far is used.")
@click.option("--json", "as_json", is_flag=True, help="Print the best plan JSON (with alternatives) only.")
@click.option("--out", type=FILE, help="Write the best plan JSON here.")
@click.option("--csv", "csv_out", type=FILE,
              help="Write the ranked plans (one row each, SI units, breakdown included) as CSV here.")
@click.option("--export", "export_target", type=click.Choice(EXPORT_TARGETS),
              help="Also export the best plan's launch files.")
@click.option("--export-out", type=DIRECTORY,
              help="Directory for the --export files  [default: ./TARGET-launch]")
@memory_headroom_option
@profile_option
@calibration_option
@cluster_condition_options
@placement_option
@training_cost_options
@handle_errors
def plan_command(model_spec: str, cluster_spec: str, global_batch: int, seq_len: int, dtype: str, attention: str,
                 top_k: int, time_limit_s: float, as_json: bool, out: Path | None, csv_out: Path | None,
                 export_target: str | None, export_out: Path | None, headroom_pct: float,
                 profile_path: Path | None, calibration_path: Path | None,
                 links_path: Path | None, slowdowns: tuple[str, ...], placement_detail: str,
                 tokens: int | None, gpu_hour_price: float | None, **parallel: Any) -> None:
    """Search the best parallel layouts (fixed options constrain the search) and rank them."""
    check_cost_options(tokens, gpu_hour_price)
    tuning = TuningOptions.pop_from(parallel)
    target_framework = export_target if export_target in FRAMEWORK_NAMES else None  # pytorch-local: no framework
    fixed = FixedOptions.from_options({**parallel, "framework": parallel["framework"] or target_framework})
    tuning = tuning.for_framework(fixed.framework)
    problem = load_problem(model_spec, cluster_spec, global_batch, seq_len, dtype, attention, profile_path,
                           calibration_path, links_path, slowdowns, tuning)
    model, cluster, training, calibration, timer = (problem.model, problem.cluster, problem.training,
                                                    problem.calibration, problem.timer)
    if timer is not None and fixed.tp is None:  # search only the TP degrees the profile measured
        fixed = replace(fixed, tp_degrees=tuple(timer.measured_tps()))
    unslowed = condition_cluster(load_cluster(cluster_spec), links_path, ()) if slowdowns else None
    found = plan(model, cluster, training, fixed, top_k, time_limit_s, unslowed=unslowed, timer=timer,
                 calibration=calibration, choose_optimizer_states=tuning.optimizer_states == "auto",
                 memory_headroom=headroom_pct / 100)
    training = found.training or training
    echo_profile_notes(timer)
    heterogeneity = found.heterogeneity
    documents = [build_plan_document(model, cluster, training, p.config, p.placement, p.estimate,
                                     {"split": {"optimal": p.optimal, "lower_bound_s": p.lower_bound_s},
                                      **local_learning_section(model, cluster, training, p.config, p.estimate,
                                                               p.placement, timer, calibration)},
                                     full_placement=placement_detail == "full", framework=fixed.framework or "any",
                                     calibration=calibration)
                 for p in found.plans]
    costs = [run_cost(tokens, gpu_hour_price, cluster, training, p.placement, p.estimate) for p in found.plans]
    for plan_document, cost in zip(documents, costs, strict=True):
        if cost:
            plan_document["estimate"].update(cost.as_dict())
    best = found.plans[0]
    headroom = router_headroom(documents[0], training, best.config, best.estimate, lambda at: estimate(
        model, cluster, at, best.config, best.partition, best.placement, timer=timer, calibration=calibration))
    document = {**documents[0], "alternatives": documents[1:],
                "search": {**found.stats.as_dict(), "memory_headroom": headroom_pct / 100}}
    if timer:
        document["profile"] = {"path": str(profile_path), "notes": list(timer.notes)}
    if problem.warnings:
        document["warnings"] = list(problem.warnings)
    if heterogeneity:
        document["heterogeneity"] = heterogeneity
    text = json.dumps(document, indent=2)
    frame = ranked_frame(found.plans)
    if tokens is not None:
        frame = with_training_costs(frame, [cost for cost in costs if cost])
    write_all_atomic([(path, content) for path, content in ((out, text + "\n"), (csv_out, frame.to_csv(index=False)))
                      if path])
    if export_target:
        export_document(document, export_target, export_out)
    if as_json:
        click.echo(text)
        return
    click.echo(f"{model.name} on {cluster.name} ({cluster.num_gpus} GPUs), global batch {global_batch}, "
               f"sequence {training.seq_len}, {training.dtype}{describe_tuning(model, training)}")
    click.echo(format_ranked(frame))
    stats = found.stats
    click.echo(f"\nsearched {stats.configurations} configurations in {stats.wall_s:.2f} s: "
               f"{stats.pruned_memory} pruned by the memory bound, {stats.pruned_time} by the time bound, "
               f"{stats.infeasible} without a fitting split; {stats.proven_by_bound} splits proven optimal by "
               f"the rank-load bound, {stats.ilps_solved} ILPs ({stats.solver}), "
               f"{stats.cache_hits} cache hits, {stats.time_limited} hit the time limit")
    gain = best.uniform.iteration_time_s / best.estimate.iteration_time_s - 1
    click.echo(f"\nbest plan: {best.config.describe()}; its stage split is {100 * gain:.1f} % faster than the "
               f"uniform split ({best.uniform.iteration_time_s:.3f} s"
               f"{'' if best.uniform.fits else ', which does not fit'})")
    click.echo(split_quality(best))
    click.echo(describe_estimate(best.config, best.estimate, best.config.num_gpus, mfu_convention(training)))
    echo_tight_memory([p.estimate for p in found.plans])
    echo_router_headroom(headroom, training)
    echo_local_learning(documents[0])
    if costs[0]:
        click.echo(f"time to train   {costs[0].describe()}")
    click.echo("\nbreakdown of one iteration")
    click.echo(format_breakdown(best.estimate))
    click.echo("\nstages (times per micro-batch; memory per GPU of that pipeline rank)")
    click.echo(format_stages(best.estimate))
    echo_memory(training, best.estimate)
    if heterogeneity:
        echo_heterogeneity(heterogeneity)
    if out:
        click.echo(f"\n{plan_file_line(out, documents)}")


def plan_file_line(out: Path, documents: Sequence[dict[str, Any]]) -> str:
    """What `plan --out` wrote, and how to name its alternatives (`PLAN.json#N`, planner/plan.py `load_plan`),
    exporting plan #2 to a target it runs on."""
    if len(documents) == 1:
        return f"wrote {out}: plan #1"
    listed = "#2" if len(documents) == 2 else f"#2 to #{len(documents)}"
    targets = documents[1].get("runs_on") or []
    example = f" (e.g. planner export {out}#2 --to {targets[0]})" if targets else ""
    return f"wrote {out}: plan #1 and its alternatives {listed}{example}"


@main.command("list")
@click.argument("what", type=click.Choice(["models", "gpus", "clusters"]))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handle_errors
def list_command(what: str, as_json: bool) -> None:
    """List catalog models, GPU types or cluster presets."""
    if what == "models":
        models = [load_model(name) for name in catalog_model_names()]
        records = [{**m.to_dict(), "num_parameters": m.num_parameters} for m in models]
        headers = ("name", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "experts", "parameters")
        rows = [(m.name, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads,
                 m.ffn_hidden_size, m.vocab_size, m.num_experts, f"{m.num_parameters / 1e9:.2f} B") for m in models]
    elif what == "gpus":
        gpus = [lookup_gpu(name) for name in catalog_gpu_names()]
        records = [{"name": g.name, "peak_flops_per_s": dict(g.peak_flops_per_s), "memory_bytes": g.memory_bytes,
                    "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s,
                    "matmul_efficiency": g.matmul_efficiency, "intra_node_link": g.intra_node_link,
                    "intra_node_bandwidth_bytes_per_s": g.intra_node_bandwidth_bytes_per_s,
                    "gpus_per_node": g.gpus_per_node, "nic_bandwidth_bytes_per_s": g.nic_bandwidth_bytes_per_s,
                    "source": g.source} for g in gpus]
        headers = ("name", "peak TFLOP/s", "memory", "HBM GB/s", "intra-node", "NIC GB/s")
        rows = [(g.name, " ".join(f"{k}:{v / 1e12:g}" for k, v in g.peak_flops_per_s),
                 f"{g.memory_bytes / GIB:.0f} GiB", f"{g.hbm_bandwidth_bytes_per_s / 1e9:.0f}",
                 f"{g.intra_node_link} {g.intra_node_bandwidth_bytes_per_s / 1e9:.0f} GB/s",
                 f"{g.nic_bandwidth_bytes_per_s / 1e9:g}") for g in gpus]
    else:
        clusters = [load_cluster(name) for name in catalog_cluster_names()]
        records = [{"name": c.name, "num_nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node,
                    "gpu": c.gpu_label, "num_gpus": c.num_gpus} for c in clusters]
        headers = ("name", "nodes", "GPUs/node", "GPU", "GPUs")
        rows = [(c.name, c.num_nodes, c.gpus_per_node, c.gpu_label, c.num_gpus) for c in clusters]
    if as_json:
        click.echo(json.dumps(records, indent=2))
    else:
        click.echo(format_table(headers, rows))


@main.group("profile")
def profile_group() -> None:
    """Measure the hardware: per-layer compute and memory, links."""


@profile_group.command("layers")
@click.option("--model", "model_spec", required=True, help="Catalog name, HF config.json, or planner model file.")
@click.option("--tp", "tps", type=click.IntRange(min=1), multiple=True,
              help="TP degree(s) to measure at  [default: 1]")
@click.option("--micro-batch", "micro_batches", type=click.IntRange(min=1), multiple=True,
              help="Micro-batch size(s) to measure (repeat the option)  [default: 1]")
@click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), default=2048, show_default=True,
              help="Tokens per sequence.")
@click.option("--dtype", type=click.Choice(PROFILE_DTYPES), default="bf16", show_default=True)
@click.option("--attention", type=click.Choice(["flash", "unfused"]), default="flash", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--gpu", help="Catalog GPU type of the device (then --profile applies the times to that GPU only).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed runs first.")
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs (median).")
@click.option("--out", type=FILE, required=True, help="PROFILE.json to write.")
@handle_errors
def profile_layers_command(model_spec: str, tps: tuple[int, ...], micro_batches: tuple[int, ...], seq_len: int,
                           dtype: str, attention: str, device: str, gpu: str | None, warmup: int, iters: int,
                           out: Path) -> None:
    """Time forward/backward of each distinct unit in PyTorch (random weights) and write PROFILE.json."""
    check_output(out)
    model = load_model(model_spec)
    gpu_name = lookup_gpu(gpu).name if gpu else None
    request = ProfileRequest(tps=tps or (1,), micro_batches=micro_batches or (1,), seq_len=seq_len, dtype=dtype,
                             attention=attention, device=device, warmup=warmup, iters=iters)
    document = measure_layers(model, request, gpu_name, progress=lambda line: click.echo(line, err=True))
    write_atomic(out, json.dumps(document, indent=2) + "\n")
    click.echo(f"wrote {out}: {len(document['units'])} measurements of {model.name} on {document['device']['name']}")


@profile_group.command("links")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="nccl", show_default=True,
              help="torch.distributed backend: nccl on GPUs, gloo on CPUs.")
@click.option("--sizes", default="4K,64K,1M,16M,64M", show_default=True,
              help="Message sizes to fit latency + size/bandwidth over (K/M/G = 1024^n).")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--simulate-nodes", type=click.IntRange(min=1),
              help="Testing aid: split one machine's ranks into K pseudo-nodes node0..nodeK-1.")
@click.option("--out", type=FILE, required=True, help="LINKS.json to write.")
@handle_errors
def profile_links_command(backend: str, sizes: str, iters: int, warmup: int, simulate_nodes: int | None,
                          out: Path) -> None:
    """Measure per-node-pair p2p and in-node all-reduce bandwidth; run under torchrun, one process per GPU."""
    check_output(out)
    table = run_link_probe(backend, parse_sizes(sizes), iters=iters, warmup=warmup,
                           simulate_nodes=simulate_nodes, out=out)
    if os.environ.get("RANK", "0") == "0":  # torchrun: only rank 0 reports
        click.echo(f"wrote {out}: {len(table.nodes)} node(s)")


@profile_group.command("import-nccl-tests")
@click.argument("logs", nargs=-1, required=True, type=FILE)
@click.option("--collective", help="Collective of the logs when neither the log nor the file name says "
                                   "(all_reduce, all_gather, reduce_scatter, alltoall, sendrecv, ...).")
@click.option("--out", type=FILE, required=True, help="LINKS.json to write.")
@handle_errors
def import_nccl_tests_command(logs: tuple[Path, ...], collective: str | None, out: Path) -> None:
    """Read nccl-tests logs, fit bus bandwidth and latency, and write LINKS.json."""
    table = import_nccl_tests(list(logs), collective)
    write_links(out, table)
    rows = [(name, *(f"{bw / 1e9:.1f}" if bw else "-" for bw in row))
            for name, row in zip(table.nodes, table.bandwidth_bytes_per_s, strict=True)]
    click.echo(f"wrote {out}: bandwidth in GB/s (diagonal: inside a node)")
    click.echo(format_table(("node", *table.nodes), rows))


@main.command("calibrate")
@click.argument("profile_path", metavar="PROFILE.json", type=FILE)
@click.option("--gpu", help="Catalog GPU type whose peaks the efficiencies are fitted against "
                            "[default: the profile's gpu]")
@click.option("--name", help="Name of the calibrated GPU type  [default: GPU-calibrated]")
@click.option("--out", type=FILE, default=Path("gpu_profile.yaml"),
              show_default=True, help="GPU profile to write (a gpus.yaml-style entry; cluster files take it "
                                      "as gpu_profile).")
@click.option("--calibration-out", type=FILE,
              help="calibration.yaml-style file for the other fitted constants  [default: OUT.calibration.yaml]")
@click.option("--force", is_flag=True, help="Write a fit that breaks the plausibility bounds (rms error, "
                                            "efficiency range), with warnings in the files.")
@handle_errors
def calibrate_command(profile_path: Path, gpu: str | None, name: str | None, out: Path,
                      calibration_out: Path | None, force: bool) -> None:
    """Fit the analytic model's efficiencies for one GPU to a measured profile; write a GPU profile.

    A fit outside the stated bounds (planner.profile.fit.fit_problems) is refused unless --force.
    """
    profile = load_measured_profile(profile_path)
    if not (gpu or profile.gpu):
        raise PlannerError(f"{profile_path} does not name its GPU type (measured on {profile.device}); "
                           "give --gpu NAME, e.g. --gpu H100-80GB")
    base = lookup_gpu(gpu or profile.gpu)
    calibration = default_calibration()
    fit = fit_efficiencies(profile, base, calibration)
    problems = fit_problems(fit)
    if problems and not force:
        raise PlannerError(f"{profile_path}: {'; '.join(problems)}; nothing written (--force writes it anyway)")
    for problem in problems:
        click.echo(f"warning: {problem}; written anyway (--force)", err=True)
    name = name or f"{base.name}-calibrated"
    calibration_out = calibration_out or out.with_suffix(".calibration.yaml")
    write_all_atomic([
        (out, yaml.safe_dump(gpu_profile_document(base, name, fit, str(profile_path), problems), sort_keys=False)),
        (calibration_out, yaml.safe_dump(calibration_document(calibration, fit, str(profile_path), problems),
                                         sort_keys=False))])
    rows = [(parameter, f"{getattr(fit, parameter):.4f}", "fitted" if parameter in fit.fitted else "default")
            for parameter in PARAMETERS]
    click.echo(format_table(("constant", "value", ""), rows))
    click.echo(f"{fit.observations} measurements, rms relative error {100 * fit.rms_relative_error:.1f} %")
    click.echo(f"wrote {out} (GPU {name}) and {calibration_out}")



# ---- explain, compare, timeline, sweep (issue 14) ---------------------------------------------

@main.command("timeline")
@click.argument("plan_path", metavar="PLAN.json[#N]", type=FILE)
@click.option("--out", type=FILE, required=True,
              help="Chrome/Perfetto trace JSON to write (open in ui.perfetto.dev or chrome://tracing).")
@click.option("--svg", "svg_out", type=FILE,
              help="Also draw the iteration as a static SVG picture here.")
@handle_errors
def timeline_command(plan_path: Path, out: Path, svg_out: Path | None) -> None:
    """The simulated schedule of one iteration: a track per pipeline rank, memory per rank over time."""
    plan_file = load_plan(plan_path)
    problem = problem_of(plan_file)
    result = problem.estimate()
    timeline = iteration_timeline(problem, result)
    title = f"{problem.model.name} on {problem.cluster.name}: {problem.config.describe()}"
    write_all_atomic([(out, json.dumps(chrome_trace(timeline, title)) + "\n")]
                     + ([(svg_out, timeline_svg(timeline, title))] if svg_out else []))
    click.echo(f"wrote {out}: {len(timeline.slices)} slices on {timeline.pp} pipeline ranks, "
               f"{timeline.iteration_s:.4f} s per iteration" + (f"; and {svg_out}" if svg_out else ""))



@main.command("explain")
@click.argument("plan_path", metavar="PLAN.json[#N]", type=FILE)
@click.option("--top", "top_k", type=click.IntRange(1, 50), default=5, show_default=True,
              help="How many of the search's plans (distinct layouts) to list as alternatives.")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as one JSON document.")
@handle_errors
def explain_command(plan_path: Path, top_k: int, as_json: bool) -> None:
    """Why this plan: its bottleneck, breakdown, one step of each knob, the search's alternatives."""
    loaded = load_plan(plan_path)
    problem = problem_of(loaded)
    explanation = explain(problem, problem.estimate(), top_k, framework=loaded.framework)
    click.echo(json.dumps(explanation.as_dict(), indent=2) if as_json else format_explanation(explanation))


@main.command("compare")
@click.argument("plan_paths", metavar="A.json[#N] B.json[#N] [...]", nargs=-1, required=True, type=FILE)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON document.")
@handle_errors
def compare_command(plan_paths: tuple[Path, ...], as_json: bool) -> None:
    """Plans side by side: differing fields marked, which is faster and why, term by term."""
    comparison = compare_plans([str(path) for path in plan_paths], [load_plan(path).document for path in plan_paths])
    click.echo(json.dumps(comparison.as_dict(), indent=2) if as_json else format_comparison(comparison))



def sweep_progress(done: int, total: int, name: str) -> None:
    """`sweep` progress on stderr, only when stderr is a terminal (a pipe or file gets nothing)."""
    if sys.stderr.isatty():
        click.echo(f"\rsweep {done + 1}/{total}: {name}\033[K", err=True, nl=done + 1 == total)


@main.command("sweep")
@click.option("--model", "model_spec", default=DEFAULT_MODEL, show_default=True,
              help="Catalog name, HF config.json, or planner model/plan file.")
@click.option("--gpus", "sizes_text", required=True, help="Cluster sizes in GPUs, e.g. 64,128,256,512.")
@click.option("--gpu", "gpus_text", default="H100-80GB", show_default=True,
              help="GPU types to size (catalog names), e.g. H100-80GB,B200.")
@click.option("--global-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), default=DEFAULT_GLOBAL_BATCH,
              show_default=True, help="Sequences per iteration.")
@click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), default=DEFAULT_SEQ_LEN, show_default=True,
              help="Tokens per sequence.")
@click.option("--dtype", type=click.Choice(DTYPES), default="bf16", show_default=True)
@click.option("--tokens", type=TokenCount(), required=True, help="Training tokens (15T, 300B, 2e12).")
@click.option("--gpu-hour-price", "prices_text", metavar="USD|GPU=USD,...",
              help="USD per GPU-hour, one for all types or per type (H100-80GB=2.5,B200=4); else cost is GPU-hours.")
@click.option("--budget", type=FiniteRange(min=0), help="Also name the fastest cluster within this cost.")
@click.option("--deadline-days", type=FiniteRange(min=0, min_open=True),
              help="Also name the cheapest cluster that trains within this many days.")
@click.option("--time-limit", "time_limit_s", type=FiniteRange(0, 3600, min_open=True), default=1.0,
              show_default=True, help="Seconds per stage-partition ILP.")
@click.option("--csv", "csv_out", type=FILE, help="Write the table as CSV.")
@click.option("--svg", "svg_out", type=FILE,
              help="Draw time-to-train against cost (the Pareto front joined) as SVG.")
@click.option("--json", "as_json", is_flag=True, help="Print the sweep as one JSON document.")
@memory_headroom_option
@handle_errors
def sweep_command(model_spec: str, sizes_text: str, gpus_text: str, global_batch: int, seq_len: int, dtype: str,
                  tokens: int, prices_text: str | None, budget: float | None, deadline_days: float | None,
                  time_limit_s: float, csv_out: Path | None, svg_out: Path | None, as_json: bool,
                  headroom_pct: float) -> None:
    """The best plan per cluster size and GPU type, with time-to-train, cost and the Pareto front."""
    parts = [size.strip() for size in sizes_text.split(",")]
    if not all(decimal_digits(part) for part in parts):
        raise PlannerError(f"--gpus {sizes_text!r} must be comma-separated GPU counts, e.g. 64,128,256")
    sizes = [int(part) for part in parts]
    if any(size < 1 for size in sizes):
        raise PlannerError(f"--gpus {sizes_text!r}: every cluster needs at least one GPU")
    gpus = [lookup_gpu(name.strip()).name for name in gpus_text.split(",")]
    for option, text, values in (("--gpus", sizes_text, sizes), ("--gpu", gpus_text, gpus)):
        if len(set(values)) < len(values):
            raise PlannerError(f"{option} {text!r} lists a value twice")
    prices = parse_prices(prices_text, gpus)
    points = sweep(load_model(model_spec), Training(global_batch=global_batch, seq_len=seq_len, dtype=dtype), gpus,
                   sizes, tokens, prices, time_limit_s=time_limit_s, progress=sweep_progress,
                   memory_headroom=headroom_pct / 100)
    unit = "USD" if all(gpu in prices for gpu in gpus) else "GPU-hours"
    frame = sweep_frame(points)
    picks = {"fastest_within_budget": fastest_within(points, budget) if budget is not None else None,
             "cheapest_by_deadline": cheapest_by(points, 86400 * deadline_days) if deadline_days else None}
    fitting = any(point.config is not None for point in points)
    if fitting:
        write_all_atomic(([(csv_out, frame.to_csv(index=False))] if csv_out else [])
                         + ([(svg_out, sweep_svg(points, unit))] if svg_out else []))
    if as_json:
        document = {"cost_unit": unit, "memory_headroom": headroom_pct / 100,
                    "points": json.loads(frame.to_json(orient="records")),
                    **{key: pick.cluster if pick else None for key, pick in picks.items()}}
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(format_sweep(frame, unit))
        for key, pick in picks.items():
            if (key == "fastest_within_budget" and budget is not None) or (key == "cheapest_by_deadline"
                                                                           and deadline_days):
                click.echo(f"{key.replace('_', ' ')}: {pick.cluster if pick else 'none'}")
    if not fitting:
        largest = max(points, key=lambda point: point.num_gpus)
        raise InfeasibleError(f"no swept cluster fits {model_spec}, nothing written; on the largest, "
                              f"{largest.cluster}: {largest.note}")


if __name__ == "__main__":
    main()
