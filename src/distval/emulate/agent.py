"""torchrun for one emulated node, without the traceback torchrun prints when its workers fail.

A failed rank has already said why in one line (`distval: error: ...`) and `distval emulate`
names the node that failed first; torchrun's own ChildFailedError / SignalException tracebacks
(a screen of agent internals per node) add nothing, so this runs torchrun's `main` and turns them
into its exit codes: 1 for failed workers (as torchrun), 128 + N when stopped by signal N.

`--cgroup-fd FD` first (a node with a CPU limit; FD is its cgroup's cgroup.procs, opened by the
launcher): this process moves itself into that cgroup before it imports torch or starts
torchrun, so the agent and every worker it forks run under the node's CPU quota, with no moment
in which a child could start outside it.
"""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--cgroup-fd"]:
        _join_cgroup(int(argv[1]))
        argv = argv[2:]

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError:
        sys.exit(1)
    except SignalException as e:
        sys.exit(128 + int(e.sigval))


def _join_cgroup(fd: int) -> None:
    from distval.emulate import cgroup

    try:
        cgroup.join_fd(fd)
    except OSError as e:
        print(f"distval: error: cannot join the node's CPU cgroup (its cgroup.procs, fd {fd}): {e.strerror or e}",
              file=sys.stderr, flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
