"""What `distval doctor` checks (`DoctorConfig`): each knob a flag of the command; torch-free."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from distval.doctor import net
from distval.knobs import FieldError, knob, normalise


@dataclass(frozen=True)
class DoctorConfig:
    """What `distval doctor` checks; each knob is a flag of the command (cli/flags.py). The master's
    address and port default to MASTER_ADDR/MASTER_PORT (else the address the host name resolves
    to); the socket-interface values, when given, are checked instead of the environment's."""

    master_addr: str | None = knob(None, help="Address the job rendezvouses at (default: "
                                   "MASTER_ADDR, else the address this host name resolves to, else 127.0.0.1).")
    master_port: int | None = knob(None, help="Check TCP reachability of MASTER_ADDR:PORT "
                                   "(default: MASTER_PORT when set).")
    gloo_ifname: str | None = knob(None, "--gloo-socket-ifname", help="Check this GLOO_SOCKET_IFNAME value instead "
                                   "of the environment's (nothing is set).")
    nccl_ifname: str | None = knob(None, "--nccl-socket-ifname", help="Check this NCCL_SOCKET_IFNAME value instead "
                                   "of the environment's (nothing is set).")
    expect_world: int | None = knob(None, help="FAIL unless the world has exactly N ranks "
                                    "(catches every process running alone).")
    under_launcher: bool = False  # a worker of torchrun/srun/mpirun: the store on MASTER_PORT must be up

    def __post_init__(self) -> None:
        if self.master_addr is None:
            normalise(self, master_addr=default_master_addr())
        if self.master_port is None and os.environ.get("MASTER_PORT", "").isdigit():
            normalise(self, master_port=int(os.environ["MASTER_PORT"]))
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise FieldError("master_port", f"{self.master_port} is not a TCP port (1-65535)")
        if self.expect_world is not None and self.expect_world < 1:
            raise FieldError("expect_world", f"must be at least 1 (got {self.expect_world})")
        for var, value in self.ifname_overrides.items():
            # a flag is input: bad grammar is a usage error here, a FAIL check when it comes from the environment
            try:
                (net.parse_gloo_ifname if var.startswith("GLOO") else net.parse_nccl_ifname)(value)
            except ValueError as e:
                flag = "--" + var.lower().replace("_", "-")
                raise ValueError(str(e).replace(f"{var}={value!r}", f"{flag} {value!r}", 1)) from None

    @property
    def ifname_overrides(self) -> dict[str, str]:
        """GLOO_/NCCL_SOCKET_IFNAME to check instead of the environment's."""
        return {k: v for k, v in (("GLOO_SOCKET_IFNAME", self.gloo_ifname), ("NCCL_SOCKET_IFNAME", self.nccl_ifname))
                if v is not None}

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.ifname_overrides}


def default_master_addr() -> str:
    """MASTER_ADDR, else the address the host name resolves to, else 127.0.0.1."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    addrs = net.resolve(socket.gethostname())
    return addrs[0] if addrs else "127.0.0.1"
