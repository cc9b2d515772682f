"""The torch.distributed links probe: its schedule and options, and real gloo runs under torchrun.

The torchrun runs use tiny messages (a few seconds in all on a 2-core box); they check structure
and plumbing (which entries get measured, LINKS.json on disk, apply_links), not bandwidth values.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cluster import parse_shorthand
from planner.errors import PlannerError
from planner.profile import links_main
from planner.profile.links import apply_links, load_links
from planner.profile.links_probe import assign_probe_nodes, parse_sizes, round_robin_rounds, run_link_probe

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("count", range(1, 9))
def test_round_robin_plays_every_pair_once_and_each_node_once_per_round(count: int) -> None:
    rounds = round_robin_rounds(count)
    played = [pair for pairs in rounds for pair in pairs]
    assert sorted(played) == list(itertools.combinations(range(count), 2))
    for pairs in rounds:
        nodes = [n for pair in pairs for n in pair]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (0 if count == 1 else count - 1 if count % 2 == 0 else count)


def test_simulated_nodes_split_ranks_in_contiguous_blocks() -> None:
    assert assign_probe_nodes(["h"] * 4, 2) == ("node0", "node0", "node1", "node1")
    assert assign_probe_nodes(["a", "a", "b"]) == ("a", "a", "b")
    assert assign_probe_nodes(["h"] * 5, 2) == ("node0", "node0", "node0", "node1", "node1")
    with pytest.raises(PlannerError, match="--simulate-nodes 3 must be between 1 and the 2 ranks"):
        assign_probe_nodes(["h"] * 2, 3)


def test_parse_sizes() -> None:
    assert parse_sizes("4K, 1M,64KiB,4096") == (4096, 65536, 1 << 20)
    with pytest.raises(PlannerError, match="size '12Q' is not a byte count"):
        parse_sizes("4K,12Q")
    with pytest.raises(PlannerError, match="at least two different sizes"):
        parse_sizes("4K,4096")


def test_probe_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(PlannerError) as error:
        run_link_probe("gloo", (4096, 65536))
    assert str(error.value) == "planner profile links needs PyTorch: pip install 'planner[profile]'"


def test_probe_outside_torchrun_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(PlannerError, match="must run under torchrun"):
        run_link_probe("gloo", (4096, 65536))
    with pytest.raises(PlannerError, match="backend 'mpi' is not gloo or nccl"):
        run_link_probe("mpi", (4096, 65536))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "planner.profile.links_main", "--backend", "gloo", "--sizes", "4K,64K",
        "--iters", "3", "--warmup", "1", "--out", str(out), *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_gloo_probe_two_ranks_one_node(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "LINKS.json"
    run = torchrun(2, out)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "links probe: 2 ranks on 1 node(s)" in run.stderr
    table = load_links(out)
    assert table.nodes == (socket.gethostname(),)
    assert table.bandwidth_bytes_per_s[0][0] > 0
    assert table.source["backend"] == "gloo" and table.source["world_size"] == 2
    names = sorted((c["name"], c["used_for"] is not None) for c in table.collectives)
    assert names == [("all_reduce", True), ("sendrecv", False)]  # the diagonal prefers the all_reduce


def test_gloo_probe_three_ranks_two_pseudo_nodes(tmp_path: Path) -> None:
    """Ranks 0,1 form node0 and rank 2 node1: one pair round, and node1 has no intra-node link."""
    pytest.importorskip("torch")
    out = tmp_path / "LINKS.json"
    run = torchrun(3, out, "--simulate-nodes", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "round 1/1: node0<->node1" in run.stderr
    table = load_links(out)
    assert table.nodes == ("node0", "node1")
    bandwidth = table.bandwidth_bytes_per_s
    assert bandwidth[0][0] > 0 and bandwidth[0][1] == bandwidth[1][0] > 0
    assert bandwidth[1][1] is None and table.latency_s[1][1] is None  # one rank: nothing to measure
    pair = [c for c in table.collectives if c["used_for"] == "pair node0-node1"]
    assert len(pair) == 1 and pair[0]["nranks"] == 2 and pair[0]["hosts"] == ["node0", "node1"]
    cluster = parse_shorthand("2x2xH100-80GB")  # default names node0/node1 match by name
    applied = apply_links(cluster, table)
    assert applied.link(0, 1).bandwidth_bytes_per_s == bandwidth[0][1]
    assert applied.link(1, 1) == cluster.link(1, 1)


def test_probe_entry_point_reports_user_errors_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("RANK", raising=False)
    assert links_main.main(["--out", str(tmp_path / "L.json")]) == 2
    assert capsys.readouterr().err.startswith("error: planner profile links must run under torchrun")
    assert links_main.main(["--sizes", "4K,huge", "--out", str(tmp_path / "L.json")]) == 2
    assert "size 'huge' is not a byte count" in capsys.readouterr().err
