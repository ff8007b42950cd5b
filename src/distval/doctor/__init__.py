"""`distval doctor`: the facts a distributed job depends on, and what is wrong with them.

Torch-free modules other code may import (the launcher's pre-flight, `distval emulate`):
  net.py       interfaces, routes, the interface a destination leaves by (`interface_for`),
               hostname resolution, GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME grammar and checks
               (`check_socket_ifname`), decoy interfaces, TCP port reachability
  system.py    versions, devices, /dev/shm, memlock and open-file limits
  topo.py      `nvidia-smi topo -m` parsed into a matrix; GPU pair paths and NIC affinity
  nccl_log.py  an NCCL_DEBUG=INFO log: transports per channel, rings/trees, GDR, chosen interface,
               and the P2P-over-SYS hang pattern (P2P between GPUs whose path is SYS)
Torch-backed, used by the command only:
  ranks.py     the per-rank probe (facts, bound addresses) and the comparison across ranks
  report.py    one Report from all of the above
  run.py       `run_doctor`: the whole command as one call (mode, world check, probe or host checks,
               topology and NCCL log)
"""
