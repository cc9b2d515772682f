"""`python -m planner.profile.links_main`: the links probe as a torchrun entry point.

The same probe as `planner profile links`, without the click application, so that torchrun can
start it as a module: ``torchrun --nproc-per-node 8 -m planner.profile.links_main --out LINKS.json``.
User errors print one line on stderr and exit 2, like the CLI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from planner.errors import PlannerError
from planner.profile.links_probe import DEFAULT_PROBE_SIZES_BYTES, parse_sizes, run_link_probe

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the probe's options, run it in this rank, return the exit code."""
    parser = argparse.ArgumentParser(prog="planner-links-probe", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_PROBE_SIZES_BYTES),
                        help="message sizes in bytes, comma-separated; K/M/G = 1024^1..3 (e.g. 4K,1M,64M)")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions per size")
    parser.add_argument("--simulate-nodes", type=int, default=None, metavar="K",
                        help="testing aid: split the ranks into K pseudo-nodes node0..nodeK-1")
    parser.add_argument("--out", required=True, help="LINKS.json to write (rank 0)")
    args = parser.parse_args(argv)
    try:
        run_link_probe(args.backend, parse_sizes(args.sizes), iters=args.iters, warmup=args.warmup,
                       simulate_nodes=args.simulate_nodes, out=args.out)
    except PlannerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
