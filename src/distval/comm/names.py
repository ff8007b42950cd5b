"""The collectives' names, importable without torch (the CLI's help text and flag checks)."""

CHECK_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_list", "reduce_scatter",
             "all_to_all", "gather", "scatter", "sendrecv", "barrier")
BENCH_OPS = CHECK_OPS[:-1]  # every op with a payload
