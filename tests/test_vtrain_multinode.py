"""The held-out vTrain multi-node check (benchmarks/vtrain_multinode.py): what it reads, the runs and clusters it
builds (as the single-node sweep's runs are built), the groups it ranks and its command line's refusals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.ranking import VTrainRun, group_scores, vtrain_time
from benchmarks.vtrain_multinode import NIC_GBPS_PER_GPU, _cluster, main, multinode_runs, multinode_times
from planner.errors import PlannerError
from planner.profile.calibration import default_calibration

HEADER = ("\ufeffParameters (billion),# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
          "sequence length,tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")
TABLE = HEADER + """3.6,64,512,8,3072,32,30,2048,1,64,1,3566.5
3.6,64,512,8,3072,32,30,2048,2,32,1,3975.2
3.6,64,512,4,3072,32,30,2048,1,32,2,4382.1
3.6,64,512,16,3072,32,30,2048,8,8,1,5017.8
18.4,256,1024,8,6144,48,40,2048,8,32,1,9604
18.4,256,1024,8,6144,48,40,2048,8,4,8,11026
"""


def test_the_table_reads_as_runs_with_its_byte_order_mark():
    table = multinode_runs(TABLE)
    assert len(table) == 6
    assert table.iloc[0].to_dict() == {"params": 3.6, "gpus": 64, "global_batch": 512, "micro_batch": 8,
                                       "hidden": 3072, "heads": 32, "layers": 30, "seq_len": 2048, "tp": 1, "dp": 64,
                                       "pp": 1, "time_ms": 3566.5}


def test_nodes_of_eight_a100_at_the_configs_inter_node_bandwidth():
    cluster = _cluster(64)
    assert cluster.num_gpus == 64 and len(cluster.nodes) == 8
    assert {node.gpu.name for node in cluster.nodes} == {"A100-80GB"}
    assert NIC_GBPS_PER_GPU == 12.5  # 800 Gbps per node over 8 GPUs
    assert all(node.nic_bandwidth_bytes_per_s == 12.5e9 for node in cluster.nodes)


def test_runs_are_costed_as_the_single_node_sweep_and_grouped_by_model():
    calibration = default_calibration()
    times = multinode_times(multinode_runs(TABLE), calibration)
    assert list(times["group"].unique()) == ["vtrain-multi-3.6B-64gpu-gbs512", "vtrain-multi-18.4B-256gpu-gbs1024"]
    assert times["measured"].iloc[0] == pytest.approx(3.5665)
    same = VTrainRun("gpt-18.4B", 40, 6144, 48, 2048, 1024, 4, 8, 8, 8)
    assert times["predicted"].iloc[5] == vtrain_time(same, _cluster(256), calibration)
    scores = group_scores(times)
    assert list(scores["layouts"]) == [4, 2]
    assert ((scores["regret"] >= 1) & (scores["spearman"].abs() <= 1)).all()


@pytest.mark.parametrize(("text", "message"), [
    ("a,b\n1,2\n", re.escape("no column 'Parameters (billion)'")),
    (HEADER + "3.6,64,512,8,3072,32,30,2048,1,64,1,fast\n", "row 2: iteration time .ms. 'fast' is not a positive"),
    (HEADER, "holds no runs"),
    (HEADER + "3.6,64,512,8,3072,32,30,2048,2,64,1,3566.5\n", "row 2: tp 2 × dp 64 × pp 1 is not its 64 GPUs"),
])
def test_bad_tables_are_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(PlannerError, match=message):
        multinode_runs(text)


def test_gpu_counts_off_whole_nodes_are_refused() -> None:
    with pytest.raises(PlannerError, match="12 GPUs is not a whole number of 8-GPU nodes"):
        _cluster(12)


def test_cli_prints_groups_and_summary(tmp_path: Path, capsys) -> None:
    page = tmp_path / "ground_truth_multi.csv"
    page.write_text(TABLE)
    main([str(page), "--runs"])
    out = capsys.readouterr().out
    assert "vtrain-multi-18.4B-256gpu-gbs1024   2 layouts" in out
    assert "tp8 dp4 pp8 mb8" in out
    assert "| vTrain multi-node (A100, held out) | 2 | 6 |" in out


@pytest.mark.parametrize(("text", "message"), [("a,b\n1,2\n", "no column"), (None, "cannot read")])
def test_cli_refuses_bad_or_missing_files_with_exit_2(tmp_path: Path, capsys, text: str | None,
                                                      message: str) -> None:
    page = tmp_path / "table.csv"
    if text is not None:
        page.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main([str(page)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
