"""torchrun for one emulated node, without the traceback torchrun prints when its workers fail.

A failed rank has already said why in one line (`distval: error: ...`) and `distval emulate`
names the node that failed first; torchrun's own ChildFailedError / SignalException tracebacks
(a screen of agent internals per node) add nothing, so this runs torchrun's `main` and turns them
into its exit codes: 1 for failed workers (as torchrun), 128 + N when stopped by signal N.
"""

from __future__ import annotations

import sys


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(sys.argv[1:])
    except ChildFailedError:
        sys.exit(1)
    except SignalException as e:
        sys.exit(128 + int(e.sigval))


if __name__ == "__main__":
    main()
