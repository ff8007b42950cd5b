"""What torchrun starts on an emulated node (`python -m distval.cli.node ARGS`): the distval CLI,
plus a note of this rank's exit code.

torchrun folds every worker failure into its own exit code 1, so `distval emulate` would otherwise
not know whether a rank reported a FAIL (1), bad input (2) or could not run (3). Each rank writes
`exit.<rank>.json` into DISTVAL_EMULATE_DIR (a folder of the host's file system, which every
namespace shares) when it ends by itself; a rank killed by a signal leaves none. A rank whose
report holds a FAIL (exit code 1, the report written) exits 0 with its note saying 1: torchrun
would otherwise take its node's job as failed, close the rendezvous store on node 0, and every
other node's agent would fail its exit barrier with pages of tracebacks; `distval emulate` reads
the 1 from the note.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from distval import envvars


def main() -> None:
    from distval import cli

    code: int = 1  # an exception that escapes cli.main ends the process with 1
    try:
        cli.main(sys.argv[1:])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code != 1:
            raise
    finally:
        folder = os.environ.get(envvars.EMULATE_DIR.name)
        if folder:
            rank = os.environ.get("RANK", "x")
            note = {"rank": int(rank) if rank.isdigit() else None, "code": code, "host": socket.gethostname()}
            path = os.path.join(folder, f"exit.{rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(note, f)
            os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
