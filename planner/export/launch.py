"""Launch scripts every target shares: a multi-node `torchrun.sh` and a SLURM `slurm.sbatch` around it.

Both use torchrun's static rendezvous (`--node-rank`, `--master-addr`): node ranks then follow the host
order, which is what realises the plan's placement (`common.host_order`); c10d rendezvous would number
nodes in arrival order. `torchrun.sh` finds its node rank by looking this host up in the host list
(`NODE_HOSTS` from slurm.sbatch, else ./hostfile) or takes NODE_RANK and MASTER_ADDR from the
environment; it never guesses an address. Inputs the plan cannot know (data, tokenizer, checkpoints)
are `Placeholder`s: environment variables the script refuses to start without.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.export.common import HostOrder, hosts_named
from planner.plan import Plan

__all__ = ["SLURM", "TORCHRUN", "Placeholder", "Program", "slurm_script", "torchrun_script"]

TORCHRUN = "torchrun.sh"
SLURM = "slurm.sbatch"


@dataclass(frozen=True)
class Placeholder:
    """An environment variable the launcher must fill; `may_be_empty` lets a user opt out explicitly (`VAR=`)."""

    name: str
    what: str
    may_be_empty: bool = False

    def __post_init__(self) -> None:
        if set(self.what) & set("'\"`$}"):
            raise ValueError(f"placeholder {self.name}: its text goes inside ${{…}} and must not quote or expand")

    def check_line(self) -> str:
        """A bash line that stops the script, naming the variable, when it is unset (or empty)."""
        operator = "?" if self.may_be_empty else ":?"
        return f': "${{{self.name}{operator}PLACEHOLDER: set {self.name}: {self.what}}}"'


@dataclass(frozen=True)
class Program:
    """What torchrun starts on every node: bash lines that set it up, then the arguments after `torchrun …`."""

    setup: tuple[str, ...]
    command: str
    placeholders: tuple[Placeholder, ...] = ()
    about: tuple[str, ...] = ()


def _rank_lines(nnodes: int) -> list[str]:
    """NODE_RANK and MASTER_ADDR: from the environment, else by finding this host in the host list."""
    if nnodes == 1:
        return ['NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"']
    return [
        "# hosts in node-rank order: NODE_HOSTS (set by slurm.sbatch), else the first column of ./hostfile",
        'if [[ -n "${NODE_HOSTS:-}" ]]; then',
        '  read -r -a HOSTS <<< "$NODE_HOSTS"',
        'elif [[ -f "$HOSTFILE" ]]; then',
        "  mapfile -t HOSTS < <(awk '!/^#/ && NF {print $1}' \"$HOSTFILE\")",
        "else",
        "  HOSTS=()",
        "fi",
        'if [[ -z "${NODE_RANK:-}" ]]; then',
        '  for i in "${!HOSTS[@]}"; do',
        '    case "${HOSTS[$i]}" in',
        '      "${SLURMD_NODENAME:-}" | "$(hostname)" | "$(hostname -s)") NODE_RANK=$i ;;',
        "    esac",
        "  done",
        '  if [[ -n "${NODE_RANK:-}" ]]; then MASTER_ADDR="${MASTER_ADDR:-${HOSTS[0]}}"; fi',
        "fi",
        ': "${NODE_RANK:?this host is not in the host list: set NODE_RANK (0..NNODES-1) and MASTER_ADDR}"',
        ': "${MASTER_ADDR:?set MASTER_ADDR to an address of the host with NODE_RANK=0, reachable from every node}"',
        'if (( NODE_RANK < 0 || NODE_RANK >= NNODES )); then',
        '  echo "NODE_RANK=$NODE_RANK is outside 0..$((NNODES - 1))" >&2; exit 2',
        "fi",
    ]


def torchrun_script(order: HostOrder, header: list[str], program: Program, environment: tuple[str, ...] = ()) -> str:
    """`torchrun.sh`: run it once on every node; extra arguments go to the training program."""
    nnodes = len(order.hosts)
    usage = ("# Single node: ./torchrun.sh" if nnodes == 1 else
             f"# Run the same command on each of the {nnodes} nodes. NODE_RANK (0..{nnodes - 1}) and MASTER_ADDR (an "
             "address of the NODE_RANK=0 host)\n# default from ./hostfile when this host is listed there; else set "
             "both: NODE_RANK=1 MASTER_ADDR=10.0.0.1 ./torchrun.sh")
    lines = ["#!/usr/bin/env bash", *(f"# {line}" for line in header), usage,
             "# MASTER_PORT: a free TCP port, the same on every node (default 29500). Extra arguments go to the "
             "program.",
             *(f"# {line}" for line in program.about),
             *(f"# {p.name}: {p.what}" for p in program.placeholders),
             "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             'HOSTFILE="${HOSTFILE:-$HERE/hostfile}"',
             f"NNODES={nnodes}",
             *_rank_lines(nnodes),
             'MASTER_PORT="${MASTER_PORT:-29500}"',
             *(p.check_line() for p in program.placeholders)]
    if order.problem:
        lines.append(f"# WARNING: the plan's placement cannot be realised by host order: {order.problem}")
    lines += environment
    if any(order.device_order):
        lines.append('case "$NODE_RANK" in  # GPU order per host that realises the plan\'s placement')
        lines += [f"  {rank}) export CUDA_VISIBLE_DEVICES={','.join(map(str, devices))} ;;"
                  for rank, devices in enumerate(order.device_order) if devices]
        lines.append("esac")
    lines += [*program.setup,
              f'exec "${{TORCHRUN:-torchrun}}" --nnodes "$NNODES" --nproc-per-node {order.nproc_per_node} '
              '--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
              f'  {program.command} "$@"']
    return "\n".join(lines) + "\n"


def _domain_lines(order: HostOrder) -> list[str]:
    """Where NVLink domains span several hosts (an NVL72 rack of trays): each domain's hosts must be allocated
    together and in rank order, which SLURM's block topology guarantees with --segment."""
    if order.domain_hosts == 1:
        return []
    return [f"# Each NVLink domain spans {order.domain_hosts} hosts and the plan prices its groups on those domains:",
            "# allocate whole domains, each domain's hosts consecutive in rank order (with SLURM's topology/block",
            f"# plugin: sbatch --segment={order.domain_hosts} slurm.sbatch)."]


def slurm_script(plan: Plan, order: HostOrder, header: list[str]) -> str:
    """`slurm.sbatch`: one task per node runs torchrun.sh with its node rank and the rendezvous host."""
    nnodes = len(order.hosts)
    directives = [f"#SBATCH --job-name=planner-{re.sub(r'[^A-Za-z0-9._-]', '-', plan.model.name)}",
                  f"#SBATCH --nodes={nnodes}", "#SBATCH --ntasks-per-node=1",
                  f"#SBATCH --gpus-per-node={order.nproc_per_node}", "#SBATCH --exclusive"]
    if hosts_named(order):
        directives.append(f"#SBATCH --nodelist={','.join(order.hosts)}")
    lines = ["#!/usr/bin/env bash", *directives, *(f"# {line}" for line in header),
             "# Submit from this directory (or set EXPORT_DIR to it): sbatch [--partition=… --account=…] "
             f"{SLURM} [program args]",
             "# Node ranks follow the plan's host order when ./hostfile names exactly the allocated hosts (the plan's",
             "# placement depends on it), else the allocation's order; MASTER_ADDR is the node-rank-0 host.",
             *_domain_lines(order),
             "set -euo pipefail",
             'HERE="${EXPORT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"',
             f'if [[ ! -f "$HERE/{TORCHRUN}" ]]; then',
             f'  echo "no {TORCHRUN} in $HERE: submit from the export directory or set EXPORT_DIR" >&2; exit 2',
             "fi",
             'mapfile -t ALLOCATED < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
             f'if (( ${{#ALLOCATED[@]}} != {nnodes} )); then',
             f'  echo "the allocation has ${{#ALLOCATED[@]}} nodes; the plan needs {nnodes}" >&2; exit 2',
             "fi",
             "PLANNED=()",
             "if [[ -f \"$HERE/hostfile\" ]]; then mapfile -t PLANNED < <(awk '!/^#/ && NF {print $1}' "
             '"$HERE/hostfile"); fi',
             'if [[ "$(printf \'%s\\n\' "${PLANNED[@]}" | sort)" == "$(printf \'%s\\n\' "${ALLOCATED[@]}" | sort)" ]]; '
             "then",
             '  ORDER=("${PLANNED[@]}")',
             "else",
             '  ORDER=("${ALLOCATED[@]}")',
             "fi",
             'export NODE_HOSTS="${ORDER[*]}" MASTER_ADDR="${ORDER[0]}"',
             'export MASTER_PORT="${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}"',
             "unset NODE_RANK",
             f'srun --nodes={nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash "$HERE/{TORCHRUN}" "$@"']
    return "\n".join(lines) + "\n"
