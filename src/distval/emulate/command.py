"""`distval emulate`: parse the flags, validate the inner command, run it on an emulated cluster.

cli.py adds the command with `register(app)`; torch is never imported here (the nodes' workers
import it in their own processes).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

O = typer.Option  # noqa: E741

# Commands that make no sense inside an emulated cluster: they launch nothing or launch it elsewhere.
_NOT_INSIDE = ("emulate", "slurm", "plan")


def register(app: typer.Typer) -> None:
    """Add the `emulate` command to a Typer app (once: a second call changes nothing)."""
    if any(info.name == "emulate" for info in app.registered_commands):
        return

    @app.command("emulate")
    def emulate(
        command: Annotated[Optional[list[str]], typer.Argument(help="The distval command to run on every node, after `--`, e.g. -- comm bench --ops all_reduce --json b.json", show_default=False)] = None,
        nodes: Annotated[int, O("--nodes", help="Emulated nodes (network namespaces).")] = 2,
        nproc_per_node: Annotated[int, O("--nproc-per-node", help="Workers torchrun starts on each node.")] = 1,
        rate: Annotated[str, O("--rate", help="Link rate per node and direction, tc units: 1gbit, 100mbit, 10gbit (bps = bytes/s).")] = "1gbit",
        latency: Annotated[str, O("--latency", help="One-way latency added per link, e.g. 0.2ms (needs the netem qdisc; without it: not emulated, and said so).")] = "0",
        decoy_nic: Annotated[bool, O("--decoy-nic", help="Drill: a second NIC that leads nowhere, hostnames resolving to it, GLOO_SOCKET_IFNAME unset.")] = False,
        keep_going: Annotated[bool, O("--keep-going", help="Let the other nodes run on when one fails (default: stop them, as srun --kill-on-bad-exit).")] = False,
        clean: Annotated[bool, O("--clean", help="Only remove namespaces left by crashed emulate runs, then exit.")] = False,
    ) -> int:
        """N nodes on this machine (network namespaces, veth, bridge, tc shaping) running a distval command over torchrun."""
        from distval.emulate import launcher, netns
        from distval.emulate.rates import parse_latency, parse_rate

        if clean:
            netns.require_environment()
            removed = netns.clean_leftovers()
            print(f"removed {', '.join(removed)}" if removed else "no leftover emulate namespaces")
            return 0
        topo = netns.Topology(num_nodes=nodes, nproc_per_node=nproc_per_node, rate_bps=parse_rate(rate),
                              latency_s=parse_latency(latency), decoy=decoy_nic)
        inner = check_inner(command or [], app, where="distval emulate")
        return launcher.run(topo, inner, keep_going=keep_going)


def check_inner(argv: list[str], app: typer.Typer, where: str) -> list[str]:
    """The inner command of `where` (distval emulate or distval slurm) must be a distval command
    that launches ranks (one line, exit 2, if not); a leading "distval" is dropped."""
    if not argv:
        raise ValueError(f"{where} needs a distval command after `--`, e.g. {where} --nodes 2 -- comm bench --ops all_reduce")
    first = argv[1] if argv[0] == "distval" and len(argv) > 1 else argv[0]
    if argv[0] == "distval":
        argv = argv[1:]
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    if first in _NOT_INSIDE:
        raise ValueError(f"`distval {first}` cannot run inside {where}; give a command that launches ranks "
                         f"(comm check, comm bench, run, train, compare)")
    if first not in names:
        raise ValueError(f"{first!r} after `--` is not a distval command (known: {', '.join(sorted(n for n in names if n))})")
    return argv
