"""`distval emulate`: run a distval command on N emulated nodes of this machine. torch is never
imported here (the nodes' workers import it in their own processes)."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from distval.cli.app import app, check_inner
from distval.cli.app import option as O  # noqa: N812


@app.command("emulate")
def emulate(
    command: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="The distval command to run on every node, after `--`, "
            "e.g. -- comm bench --ops all_reduce --json b.json",
            show_default=False,
        ),
    ] = None,
    nodes: Annotated[int, O("--nodes", help="Emulated nodes (network namespaces).")] = 2,
    nproc_per_node: Annotated[int, O("--nproc-per-node", help="Workers torchrun starts on each node.")] = 1,
    rate: Annotated[
        str,
        O(
            "--rate",
            help="Link rate per node and direction, tc units: 1gbit, 100mbit, 10gbit (bps = bytes/s); one for "
            "every node or a comma list, one per node (1gbit,1gbit,250mbit,1gbit: one slow link).",
        ),
    ] = "1gbit",
    cpu: Annotated[
        Optional[str],
        O(
            "--cpu",
            help="CPU per node in cores (a cgroup CPU quota on the node's torchrun and workers); one for every "
            "node or a comma list, one per node (1,1,0.25,1: one slow node). Default: no limit.",
        ),
    ] = None,
    latency: Annotated[
        str,
        O(
            "--latency",
            help="One-way latency added per link, e.g. 0.2ms "
            "(needs the netem qdisc; without it: not emulated, and said so).",
        ),
    ] = "0",
    decoy_nic: Annotated[
        bool,
        O(
            "--decoy-nic",
            help="Drill: a second NIC that leads nowhere, hostnames resolving to it, GLOO_SOCKET_IFNAME unset.",
        ),
    ] = False,
    keep_going: Annotated[
        bool,
        O(
            "--keep-going",
            help="Let the other nodes run on when one fails (default: stop them, as srun --kill-on-bad-exit).",
        ),
    ] = False,
    clean: Annotated[
        bool, O("--clean", help="Only remove namespaces and CPU cgroups left by crashed emulate runs, then exit.")
    ] = False,
) -> int:
    """N nodes on this machine (network namespaces, veth, bridge, tc shaping) running a distval command
    over torchrun."""
    from distval.emulate import launcher, netns
    from distval.emulate.rates import parse_cpus, parse_latency, parse_rates

    if clean:
        netns.require_environment()
        removed = netns.clean_leftovers()
        print(f"removed {', '.join(removed)}" if removed else "no leftover emulate namespaces or cgroups")
        return 0
    topo = netns.Topology(num_nodes=nodes, nproc_per_node=nproc_per_node, rates_bps=parse_rates(rate),
                          latency_s=parse_latency(latency), decoy=decoy_nic,
                          cpu_cores=parse_cpus(cpu, host_cores=os.cpu_count() or 1) if cpu is not None else ())
    inner = check_inner(command or [], where="distval emulate")
    return launcher.run(topo, inner, keep_going=keep_going)
