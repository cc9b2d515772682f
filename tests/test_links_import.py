"""nccl-tests log import, the α-β fit and LINKS.json (schema_version 1) read/write/apply.

Fixture logs in tests/fixtures/nccl/ are written by its generate.py in the layouts of nccl-tests
`src/util.cu` (REFERENCE.md §4) from known latency α and bus bandwidth β; the import must recover
them within 5 %.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from planner.cluster import cluster_from_dict, parse_shorthand
from planner.errors import PlannerError
from planner.profile.links import (
    LinksTable,
    apply_links,
    bus_factor,
    fit_latency_bandwidth,
    link_node_indices,
    load_links,
    normalize_collective,
    slow_link_warnings,
    write_links,
)
from planner.profile.links_nccl import import_nccl_tests, parse_nccl_tests_log, read_nccl_tests_log
from tests.fixtures.nccl.generate import KNOWN  # the values the fixture logs were written from

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"



def one_line(error: pytest.ExceptionInfo[PlannerError]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# ---- nccl-tests logs -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(KNOWN))
def test_fixture_recovers_known_latency_and_bandwidth(name: str) -> None:
    test, hosts, alpha_s, beta = KNOWN[name]
    [result] = read_nccl_tests_log(FIXTURES / name)
    assert result.name == test
    assert result.nranks == len(hosts)
    assert list(result.hosts) == hosts
    fit = result.fit()
    assert fit.bandwidth_bytes_per_s == pytest.approx(beta, rel=0.05)
    assert fit.latency_s == pytest.approx(alpha_s, rel=0.05)
    # The large-size plateau approaches β from below (α still costs a little at 128 MiB–1 GiB).
    assert 0.9 * beta < result.busbw_plateau_bytes_per_s <= 1.03 * beta


def test_out_of_place_columns_are_read_by_header_name() -> None:
    """The fixtures' in-place times are 15 % slower: reading them would miss β by 13 %."""
    [result] = read_nccl_tests_log(FIXTURES / "all_gather_perf_8gpu_iter.log")
    assert result.times_s[0] == pytest.approx(19.70e-6)  # first row, out-of-place `time`, not i_min
    [result] = read_nccl_tests_log(FIXTURES / "reduce_scatter_perf_8gpu_cputime.log")
    assert result.times_s[-1] == pytest.approx(2658.64e-6)  # `cputime` column, timestamp ignored


def test_rank_count_is_inferred_from_busbw_over_algbw_without_device_lines() -> None:
    text = (FIXTURES / "all_reduce_perf_8gpu_v2.19.log").read_text()
    stripped = "\n".join(line for line in text.splitlines() if "Rank" not in line)
    [result] = parse_nccl_tests_log(stripped, "pasted.txt")
    assert (result.name, result.nranks, result.hosts) == ("all_reduce", 8, ())
    table = import_links_from_text(stripped, "pasted.txt")
    assert table.nodes == ("node0",)  # documented: no host lines → one node called node0
    assert table.bandwidth_bytes_per_s[0][0] == pytest.approx(360e9, rel=0.05)


def import_links_from_text(text: str, origin: str) -> LinksTable:
    from planner.profile.links import links_from_results

    return links_from_results(parse_nccl_tests_log(text, origin), {"kind": "test"})


def test_collective_name_from_footer_argument_or_file_name(tmp_path: Path) -> None:
    # Old builds print no "Collective test" lines: the file name says all_reduce.
    [old] = read_nccl_tests_log(FIXTURES / "all_reduce_perf_old_8gpu.log")
    assert old.name == "all_reduce"
    anonymous = tmp_path / "run1.txt"
    shutil.copy(FIXTURES / "all_reduce_perf_old_8gpu.log", anonymous)
    with pytest.raises(PlannerError) as error:
        read_nccl_tests_log(anonymous)
    assert "cannot tell which collective" in one_line(error)
    [named] = read_nccl_tests_log(anonymous, collective="all_reduce_perf")
    assert named.name == "all_reduce"
    # New builds name the test; an argument that disagrees is an error, not a silent override.
    renamed = tmp_path / "sendrecv_perf.log"
    shutil.copy(FIXTURES / "all_reduce_perf_8gpu_v2.19.log", renamed)
    assert read_nccl_tests_log(renamed)[0].name == "all_reduce"
    with pytest.raises(PlannerError) as error:
        read_nccl_tests_log(renamed, collective="all_gather")
    assert "all_reduce, not all_gather" in one_line(error)


def test_concatenated_logs_give_one_result_per_table() -> None:
    text = "".join((FIXTURES / name).read_text() for name in
                   ("all_reduce_perf_8gpu_v2.19.log", "sendrecv_perf_2hosts.log"))
    results = parse_nccl_tests_log(text, "both.log")
    assert [(r.name, r.unique_hosts) for r in results] == [
        ("all_reduce", ("hostA",)), ("sendrecv", ("hostA", "hostB"))]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "log is empty"),
        ("hello\nworld\n", "no nccl-tests result rows found (is this nccl-tests output?)"),
        ("# nThread 1 nGpus 1\n#  size count type time algbw busbw\n# Avg bus bandwidth : 0\n",
         "result table has no rows"),
    ],
)
def test_bad_logs_raise_one_line(text: str, expected: str) -> None:
    with pytest.raises(PlannerError) as error:
        parse_nccl_tests_log(text, "LOG.txt", "all_reduce")
    assert expected in one_line(error)
    assert one_line(error).startswith("LOG.txt")


def test_truncated_logs_raise(tmp_path: Path) -> None:
    with pytest.raises(PlannerError) as error:
        read_nccl_tests_log(FIXTURES / "all_reduce_perf_truncated.log")
    assert "truncated log?" in one_line(error)
    text = (FIXTURES / "sendrecv_perf_2hosts.log").read_text()
    cut = tmp_path / "sendrecv_perf_cut.log"
    cut.write_text(text[: text.index("  33554432") + 30])  # mid-row
    with pytest.raises(PlannerError) as error:
        read_nccl_tests_log(cut)
    assert "fields" in one_line(error)
    garbled = tmp_path / "all_reduce_perf_garbled.log"
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:1] == ["33554432"])
    tokens = lines[row].split()
    tokens[5] = "1.2.3"  # the out-of-place time
    lines[row] = "  ".join(tokens)
    garbled.write_text("\n".join(lines))
    with pytest.raises(PlannerError, match="is not a number"):
        read_nccl_tests_log(garbled)
    empty = tmp_path / "all_reduce_perf_empty.log"
    empty.write_text("")
    with pytest.raises(PlannerError, match="log is empty"):
        read_nccl_tests_log(empty)
    with pytest.raises(PlannerError, match="not found"):
        read_nccl_tests_log(tmp_path / "missing.log")


def test_import_fills_diagonal_from_one_host_and_pair_from_two_host_sendrecv() -> None:
    table = import_nccl_tests([FIXTURES / name for name in sorted(KNOWN)])
    assert set(table.nodes) == {"hostA", "hostB", "gpu-v100"}
    a, b, v = (table.nodes.index(n) for n in ("hostA", "hostB", "gpu-v100"))
    bw, lat = table.bandwidth_bytes_per_s, table.latency_s
    assert bw[a][a] == pytest.approx(360e9, rel=0.05)  # all_reduce on hostA
    assert bw[b][b] == pytest.approx(350e9, rel=0.05)  # reduce_scatter beats all_gather (340) on hostB
    assert bw[v][v] == pytest.approx(150e9, rel=0.05)
    assert bw[a][b] == bw[b][a] == pytest.approx(24e9, rel=0.05)  # sendrecv hostA↔hostB
    assert lat[a][b] == pytest.approx(12e-6, rel=0.05)
    assert bw[a][v] is None and lat[v][b] is None  # never measured
    used = {c["name"]: c["used_for"] for c in table.collectives}
    assert used["alltoall"] is None  # 16 ranks on two hosts mixes NVLink and network hops
    assert used["sendrecv"] in ("pair hostA-hostB", "pair hostB-hostA")
    assert table.source["kind"] == "nccl-tests"


def test_bus_factors_and_names() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == bus_factor("alltoall", 8) == pytest.approx(0.875)
    assert bus_factor("sendrecv", None) == 1.0
    assert normalize_collective("all-reduce") == normalize_collective("allreduce_perf") == "all_reduce"
    with pytest.raises(PlannerError, match="unknown collective 'hypercube'"):
        normalize_collective("hypercube")


def test_fit_recovers_exact_alpha_beta_and_handles_one_size() -> None:
    sizes = np.array([2.0 ** k for k in range(3, 31)])
    fit = fit_latency_bandwidth(sizes, 7e-6 + sizes / 123e9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(123e9, rel=1e-9)
    assert fit.latency_s == pytest.approx(7e-6, rel=1e-6)
    single = fit_latency_bandwidth([1e9], [0.01])
    assert single.latency_s is None and single.bandwidth_bytes_per_s == pytest.approx(1e11)


# ---- LINKS.json ----------------------------------------------------------------------------------

def sample_table() -> LinksTable:
    return LinksTable(
        nodes=("node0", "node1"),
        bandwidth_bytes_per_s=((300e9, 20e9), (20e9, None)),
        latency_s=((5e-6, 15e-6), (15e-6, None)),
        collectives=({"name": "sendrecv", "used_for": "pair node0-node1"},),
        source={"kind": "test"},
    )


def test_links_round_trip_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "LINKS.json"
    write_links(path, sample_table())
    assert load_links(path) == sample_table()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LINKS.json"]  # no temp file left
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1 and data["bandwidth_bytes_per_s"][1][1] is None
    with pytest.raises(PlannerError, match="does not exist"):
        write_links(tmp_path / "no" / "LINKS.json", sample_table())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"schema_version": 2}, "schema_version must be 1, got 2"),
        ({"nodes": "node0"}, "'nodes' must be a list"),
        ({"nodes": []}, "'nodes' is empty"),
        ({"nodes": ["a", "a"]}, "node 'a' is listed twice"),
        ({"bandwidth_bytes_per_s": [[1.0, 2.0]]}, "'bandwidth_bytes_per_s' must be a 2×2 matrix"),
        ({"latency_s": [[1.0], [1.0, 1.0]]}, "'latency_s' row 0 must have 2 entries"),
        ({"bandwidth_bytes_per_s": [[1.0, -3.0], [1.0, None]]}, "bandwidth_bytes_per_s[0][1] must be a "
                                                                 "positive number or null, got -3.0"),
        ({"latency_s": [[True, None], [None, None]]}, "latency_s[0][0] must be a positive number or null"),
        ({"latency_s": [["5us", None], [None, None]]}, "got '5us'"),
        ({"collectives": {"a": 1}}, "'collectives' must be a list of objects"),
    ],
)
def test_load_links_rejects_bad_documents(tmp_path: Path, change: dict, expected: str) -> None:
    data = {**sample_table().to_dict(), **change}
    path = tmp_path / "LINKS.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlannerError) as error:
        load_links(path)
    assert expected in one_line(error)
    assert str(path) in one_line(error)


def test_load_links_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PlannerError, match="links file not found"):
        load_links(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{ nope")
    with pytest.raises(PlannerError, match="is not valid JSON"):
        load_links(broken)


def test_apply_links_changes_cluster_links_by_name() -> None:
    cluster = parse_shorthand("2x8xH100-80GB")
    before = cluster.link(0, 1)
    applied = apply_links(cluster, sample_table())
    assert applied.link(0, 1).bandwidth_bytes_per_s == 20e9 != before.bandwidth_bytes_per_s
    assert applied.link(1, 0).latency_s == 15e-6 and applied.link(0, 1).kind == "inter"
    assert applied.link(0, 0).bandwidth_bytes_per_s == 300e9 and applied.link(0, 0).kind == "intra"
    assert applied.link(1, 1) == cluster.link(1, 1)  # not measured: unchanged
    assert link_node_indices(cluster, sample_table()) == ((0, 1), False)


def test_apply_links_maps_hosts_by_position_only_on_default_names() -> None:
    table = import_nccl_tests([FIXTURES / "sendrecv_perf_2hosts.log"])
    assert table.nodes == ("hostA", "hostB")
    default = parse_shorthand("4x8xH100-80GB")
    assert link_node_indices(default, table) == ((0, 1), True)
    assert apply_links(default, table).link(0, 1).bandwidth_bytes_per_s == pytest.approx(24e9, rel=0.05)
    named = cluster_from_dict({"gpu": "H100-80GB", "nodes": 2, "names": ["hostA", "hostC"]}, "c.yaml")
    with pytest.raises(PlannerError) as error:
        apply_links(named, table)
    assert "links node 'hostB' is not a node of cluster" in one_line(error)
    with pytest.raises(PlannerError, match=r"measures 2 nodes but cluster .* has 1"):
        apply_links(parse_shorthand("1x8xH100-80GB"), table)


# ---- plausibility of measured links --------------------------------------------------------------

def gloo_cpu_table() -> LinksTable:
    """What `planner profile links --backend gloo` measures on CPUs: 0.31 GB/s where NVLink is nominal."""
    return LinksTable(nodes=("node0", "node1"), bandwidth_bytes_per_s=((0.31e9, 1.2e9), (1.2e9, None)),
                      latency_s=((5e-5, 9e-5), (9e-5, None)))


def test_slow_measured_links_are_flagged_against_nvlink_and_nic_line_rate() -> None:
    warnings = slow_link_warnings(parse_shorthand("2x8xH100-80GB"), gloo_cpu_table(), "LINKS.json")
    inside, between = warnings
    assert "inside node node0 measured 0.31 GB/s" in inside and "H100-80GB nvlink4 (450 GB/s)" in inside
    assert "0.069 % of the nominal" in inside and "below 10 %" in inside
    assert "between node0 and node1 measured 1.2 GB/s" in between and "NIC line rate (50 GB/s)" in between
    assert all(w.startswith("LINKS.json: ") and "\n" not in w for w in warnings)


def test_plausible_measured_links_give_no_warning() -> None:
    """The nccl-tests fixtures (NVLink all_reduce 357 GB/s, sendrecv 24 GB/s) on A100 nodes (300, 25 GB/s)."""
    table = import_nccl_tests([FIXTURES / "sendrecv_perf_2hosts.log", FIXTURES / "all_reduce_perf_8gpu_v2.19.log"])
    assert slow_link_warnings(parse_shorthand("2x8xA100-80GB"), table, "LINKS.json") == ()
    assert slow_link_warnings(parse_shorthand("2x8xH100-80GB"), sample_table(), "LINKS.json") == ()
