"""One run for `versus.py --scale-up`, from whichever source tree it is started in (cwd and
PYTHONPATH): the quickstart fabric (8 hosts, 4 leaves) with a ring all-reduce over the fabric
and, unless --fabric-only, four 2-GPU servers (h1+h3, h2+h4, h5+h7, h6+h8: GPUs on different
leaves, as rails are) whose GPUs exchange a chain of scale-up messages each way while the
all-reduce runs. The spec has no `servers:` yet (issue 22, spec side), so the plan's servers
and the scale-up transfers are set by patching the two functions that make them.

    python benchmarks/scale_up_run.py OUT [--size 8MB] [--fabric-only]

Prints the run folder on its last line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from fabric_emu.api import Experiment
from fabric_emu.run import prepare
from fabric_emu.spec.units import parse_size
from fabric_emu.topo.plan import Server
from fabric_emu.workloads import jobs
from fabric_emu.workloads.program import SCALE_UP

SERVERS = [("srv1", ("h1", "h3")), ("srv2", ("h2", "h4")), ("srv3", ("h5", "h7")), ("srv4", ("h6", "h8"))]
GBPS, LATENCY_S = 400.0, 2e-6  # scale-up per GPU and direction (modelled): 4x the host link
MESSAGES = 64  # per direction and server, one after the other


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", default="8MB", help="all-reduce size; each scale-up message is 1/8 of it")
    ap.add_argument("--fabric-only", action="store_true", help="no servers, no scale-up transfers")
    args = ap.parse_args()
    size = parse_size(args.size)
    build_plan, build_program = prepare.build_plan, jobs.build_program

    def with_servers(topo, dilation=None):
        plan = build_plan(topo, dilation)
        return dataclasses.replace(plan, servers=[Server(n, hs, GBPS, LATENCY_S) for n, hs in SERVERS])

    def with_scale_up(js):
        p = build_program(js)
        for _, (a, b) in SERVERS:
            for src, dst in ((a, b), (b, a)):
                prev: list[int] = []
                for _ in range(MESSAGES):
                    s, _r = p.transfer("gpu", f"{src}-{dst}", src, dst, size // 8, deps=prev, via=SCALE_UP)
                    prev = [s]
        return p

    if not args.fabric_only:
        prepare.build_plan, jobs.build_program = with_servers, with_scale_up
    exp = Experiment.from_dict({
        "name": "scale-up-bench", "topology": "topologies/ls-2x4x2.yaml", "load_balancing": "ecmp",
        "workloads": [{"name": "ar", "type": "allreduce", "size": args.size, "iterations": 2}], "seed": 1,
    }, base_dir=Path(os.getcwd()))
    results = exp.run(out=args.out, quiet=True)
    print(results.path)


if __name__ == "__main__":
    main()
