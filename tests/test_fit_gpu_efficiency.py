"""The per-GPU matmul-efficiency fit (benchmarks/fit_gpu_efficiency.py) and the value it put in the catalog."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.fit_gpu_efficiency import fitting_runs, main, run_errors, with_efficiency
from planner.cluster import load_cluster
from planner.gpu import lookup_gpu


def test_with_efficiency_sets_every_nodes_gpu():
    cluster = with_efficiency(load_cluster("2x8xH100-80GB"), 0.5)
    assert {node.gpu.matmul_efficiency for node in cluster.nodes} == {0.5}
    assert cluster.gpu.name == "H100-80GB"


def test_gb300s_catalog_efficiency_is_the_fit_on_its_validation_rows():
    """The shipped GB300 value minimises the time MAPE of the long-context file's 7 GB300 runs: a step either
    way does worse, and B200's borrowed value (what GB300 had before) does much worse."""
    runs = fitting_runs("GB300")
    assert len(runs) == 7

    def mape(efficiency: float) -> float:
        return statistics.mean(map(abs, run_errors(runs, efficiency)))

    shipped = lookup_gpu("GB300").matmul_efficiency
    assert mape(shipped) < 0.04
    assert mape(shipped) <= min(mape(shipped - 0.02), mape(shipped + 0.02))
    assert mape(lookup_gpu("B200").matmul_efficiency) > 3 * mape(shipped)


def test_a_gpu_without_validation_runs_is_refused_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["A100-80GB"])
    assert exit_info.value.code == 2 and "no dense runs" in capsys.readouterr().err
