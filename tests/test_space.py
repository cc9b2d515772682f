"""Configuration space rules (Megatron-LM's, ../shared/REFERENCE.md) and fixed options."""

from __future__ import annotations

import pytest

from planner.cluster import load_cluster
from planner.config import Schedule, Training
from planner.errors import PlannerError
from planner.model import load_model
from planner.search.space import FixedOptions, _divisors, enumerate_configs, require_nonempty


def _space(fixed: FixedOptions | None = None, batch: int = 32):
    model, cluster = load_model("llama3-8b"), load_cluster("2x8xH100-80GB")
    return list(enumerate_configs(model, cluster, Training(batch, 4096), fixed or FixedOptions()))


def test_every_configuration_is_valid() -> None:
    configs = _space()
    assert configs
    for c in configs:
        assert c.num_gpus == 16 and c.tp <= 8 and 8 % c.tp == 0 and 32 % (c.micro_batch * c.dp) == 0
        assert c.sequence_parallel == (c.tp > 1)
        if c.schedule is Schedule.INTERLEAVED:
            assert c.pp >= 2 and c.vpp >= 2 and c.num_microbatches(32) % c.pp == 0 and c.pp * c.vpp <= 32
        assert c.num_gpus == c.dp * c.tp * c.pp * c.cp and c.replicas % c.hsdp_replicas == 0


@pytest.mark.parametrize(("model", "shape", "fixed"), [
    ("llama3-8b", "2x8xH100-80GB", FixedOptions()),
    ("qwen3-30b-a3b", "2x8xH100-80GB", FixedOptions()),  # MoE: EP degrees, dispatchers, EP overlap
    ("qwen3-30b-a3b", "2x8xH100-80GB", FixedOptions(framework="torchtitan")),
    ("llama3-8b", "2x8xH100-80GB", FixedOptions(framework="deepspeed")),
    ("llama3-8b", "2x8xH100-80GB", FixedOptions(recompute_modules=("mlp", "core_attn"))),
    ("llama3-8b", "2x8xH100-80GB", FixedOptions(cp=2, hsdp_replicas=2)),
])
def test_the_space_s_unchecked_layouts_equal_their_checked_configurations(model, shape, fixed) -> None:
    """The space builds its 10⁵ layouts without ParallelConfig's checks (`ParallelConfig.unchecked`): each must pass
    them and equal, field by field, the configuration they build (normalised alike)."""
    configs = list(enumerate_configs(load_model(model), load_cluster(shape), Training(64, 4096), fixed))
    assert configs
    for config in configs:
        checked = config.checked()
        assert checked == config and vars(checked) == vars(config) and hash(checked) == hash(config)


def test_fixed_options_constrain_the_space() -> None:
    fixed = FixedOptions(tp=2, pp=2, micro_batch=2, schedule=Schedule.ONE_F_ONE_B)
    configs = _space(fixed)
    assert configs and all((c.tp, c.pp, c.dp * c.cp, c.micro_batch) == (2, 2, 4, 2) for c in configs)


@pytest.mark.parametrize("fixed, text", [
    (FixedOptions(tp=3), "--tp 3"), (FixedOptions(dp=5), "--dp 5"), (FixedOptions(pp=64), "--pp 64"),
    (FixedOptions(micro_batch=5), "--micro-batch 5"), (FixedOptions(tp=16), "--tp 16"),
])
def test_bad_fixed_values_name_the_value(fixed: FixedOptions, text: str) -> None:
    with pytest.raises(PlannerError, match=text):
        _space(fixed)


def test_nothing_left_names_the_fixed_options() -> None:
    fixed = FixedOptions(dp=16, micro_batch=4)
    assert _space(fixed) == []
    with pytest.raises(PlannerError, match="fixed options: dp=16, micro_batch=4"):
        require_nonempty([], load_model("llama3-8b"), load_cluster("2x8xH100-80GB"), Training(32, 4096), fixed)


def test_a_global_batch_of_a_hundred_million_enumerates_its_divisors_quickly() -> None:
    """Micro-batch sizes are the divisors of the per-replica batch, found in O(√n) (10⁸ used to hang)."""
    divisors = _divisors(100_000_000)
    assert divisors == sorted(divisors) and len(divisors) == 81
    assert all(100_000_000 % d == 0 for d in divisors) and divisors[0] == 1 and divisors[-1] == 100_000_000
