"""`distval emulate`: a multi-node cluster on one Linux machine (network namespaces, veth pairs, a
bridge, tc shaping) running any distval command under real torchrun with c10d rendezvous.

rates.py (tc rate and time parsing), netns.py (the namespaces), launcher.py (torchrun per node,
output, exit codes, clean-up), worker.py (torchrun's entry point on a node), command.py (the CLI).
"""
