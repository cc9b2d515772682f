"""Published fine-tuning facts against planner's fine-tuning model (planner/finetune.py), one row per fact with the
error of planner's figure. tests/test_finetune.py checks the same facts.

    python -m benchmarks.finetune_facts

Sources:
* Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models" (arXiv:2106.09685): Table 4 (GPT-3 175B,
  LoRA on Wq and Wv: 4.7 M trainable parameters at r = 1, 37.7 M at r = 8), §4.2 ("reduce the number of trainable
  parameters by 10,000 times"; "from 1.2TB to 350GB" of VRAM during training with r = 4 on Wq, Wv), §4.2
  ("25% speedup during training on GPT-3 175B compared to full fine-tuning").
* Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs" (arXiv:2305.14314): abstract and §1
  ("finetune a 65B parameter model on a single 48GB GPU"; "from >780GB of GPU memory to <48GB"), §3 (double
  quantisation: 0.127 bits per parameter of constants), Appendix (Guanaco 65B: r = 64 on every linear layer,
  paged AdamW, gradient checkpointing, batch size 16, sources up to 512 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import load_cluster
from planner.config import ParallelConfig, Recompute, Training
from planner.cost.estimate import estimate
from planner.cost.memory import parameter_model_states
from planner.finetune import NF4_BITS_PER_PARAM, adapter_parameters, parameter_states
from planner.model import ModelSpec, load_model

__all__ = ["LLAMA_65B", "Fact", "facts", "qlora_65b_on_48gb"]

GB = 1e9  # the papers quote decimal gigabytes

LLAMA_65B = ModelSpec(name="llama-65b", num_layers=80, hidden_size=8192, num_attention_heads=64,
                      ffn_hidden_size=22016, vocab_size=32000, max_position_embeddings=2048)
"""LLaMA 65B (Touvron et al. 2023, Table 2: 80 layers, d = 8192, 64 heads; HF config: ffn 22016, vocab 32000)."""


@dataclass(frozen=True)
class Fact:
    """One published figure, planner's figure for the same setting, and its source."""

    name: str
    published: float
    planner: float
    unit: str
    source: str

    @property
    def error(self) -> float:
        """planner / published − 1."""
        return self.planner / self.published - 1


def _state_bytes(model: ModelSpec, training: Training) -> float:
    """Model-state bytes of the whole model on one replica (unsharded): weights, gradients, optimizer states."""
    return parameter_model_states(model.num_parameters, 1, 0, training.grad_bytes,
                                  parameter_states(model, training)).total


def qlora_65b_on_48gb() -> tuple[float, float]:
    """(planner's peak bytes, capacity) of Guanaco 65B's QLoRA run on one 48 GB GPU (L40S, the catalog's 48 GB
    card): r = 64 on all linears, one 512-token sequence per micro-batch, 16 per step, full recompute."""
    training = Training(global_batch=16, seq_len=512, finetune="qlora", lora_rank=64, lora_targets="all-linear")
    config = ParallelConfig(dp=1, tp=1, pp=1, micro_batch=1, recompute=Recompute.FULL)
    result = estimate(LLAMA_65B, load_cluster("1x1xL40S"), training, config)
    return result.peak_memory_bytes, result.stages[0].memory.capacity


def _gpt3_speedup() -> float:
    """Full fine-tuning over LoRA (r = 4, Wq and Wv) iteration time of GPT-3 175B at one fixed layout
    (96 A100s as 12 × 8: tp 8, pp 12, 64 sequences of 2048, full recompute for both), minus one."""
    gpt3, cluster = load_model("gpt3-175b"), load_cluster("12x8xA100-80GB")
    config = ParallelConfig(dp=1, tp=8, pp=12, micro_batch=1, sequence_parallel=True, recompute=Recompute.FULL)
    full = estimate(gpt3, cluster, Training(global_batch=64, seq_len=2048), config)
    lora = estimate(gpt3, cluster, Training(global_batch=64, seq_len=2048, finetune="lora", lora_rank=4,
                                            lora_targets="qv"), config)
    return full.iteration_time_s / lora.iteration_time_s - 1


def facts() -> list[Fact]:
    """Every fact, computed now."""
    gpt3 = load_model("gpt3-175b")
    qv = {r: Training(finetune="lora", lora_rank=r, lora_targets="qv") for r in (1, 4, 8)}
    full16 = Training(dtype="fp16")
    llama65_full = Training(dtype="fp16")
    peak, capacity = qlora_65b_on_48gb()
    hu, dettmers = "Hu et al. 2021", "Dettmers et al. 2023"
    return [
        Fact("GPT-3 LoRA Wq,Wv r=1 trainable", 4.7e6, adapter_parameters(gpt3, qv[1]), "params", f"{hu}, Table 4"),
        Fact("GPT-3 LoRA Wq,Wv r=8 trainable", 37.7e6, adapter_parameters(gpt3, qv[8]), "params", f"{hu}, Table 4"),
        Fact("GPT-3 trainable reduction r=4 Wq,Wv", 10_000, gpt3.num_parameters / adapter_parameters(gpt3, qv[4]),
             "x", f"{hu}, §4.2"),
        Fact("GPT-3 LoRA training VRAM (model states)", 350e9, _state_bytes(gpt3, qv[4]), "bytes", f"{hu}, §4.2"),
        Fact("GPT-3 full fine-tuning VRAM (model states)", 1.2e12, _state_bytes(gpt3, full16), "bytes",
             f"{hu}, §4.2"),
        Fact("GPT-3 LoRA training speed-up over full", 0.25, _gpt3_speedup(), "fraction", f"{hu}, §4.2"),
        Fact("QLoRA double-quantisation constants", 0.127, NF4_BITS_PER_PARAM - 4, "bits/param", f"{dettmers}, §3"),
        Fact("65B 16-bit full fine-tuning memory (>780 GB)", 780e9, _state_bytes(LLAMA_65B, llama65_full),
             "bytes", f"{dettmers}, §1"),
        Fact("65B QLoRA peak on one 48 GB GPU (fits)", capacity, peak, "GiB", f"{dettmers}, §1 (the bound: a "
             f"48 GiB card)"),
    ]




def _shown(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / GB:,.1f} GB"
    if unit == "GiB":
        return f"{value / 2**30:,.1f} GiB"
    if unit == "params":
        return f"{value / 1e6:,.2f} M"
    if unit == "x":
        return f"{value:,.0f}x"
    if unit == "fraction":
        return f"{100 * value:.0f} %"
    return f"{value:.3f} {unit}"


def main() -> None:
    rows = [(f.name, _shown(f.published, f.unit), _shown(f.planner, f.unit), f"{100 * f.error:+.1f} %", f.source)
            for f in facts()]
    headers = ("fact", "published", "planner", "error", "source")
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]
    for row in (headers, tuple("-" * w for w in widths), *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
