"""`distval comm pairs`: bandwidth between every pair of nodes and of ranks within a node, a compute
probe on every rank, and the node, link or rank that holds the others back named by a stated rule.

Schedule (`round_robin`): the circle method. With n participants (a bye added when n is odd),
n-1 rounds of n/2 disjoint pairs; every pair meets exactly once, and all pairs of a round run at
once: 63 rounds for 64 nodes, not 2,016 pairs one after the other. Between nodes the pairs are the
nodes' first ranks; within a node its ranks, every node at the same time.

One pair and direction: after a barrier of the whole job, `warmup` untimed messages of S bytes,
then `iters` timed ones, sent with torch.distributed's point-to-point send/recv through the
instrumented layer; both ends time the timed messages with the host clock, and the direction's
bandwidth is S x iters / the slower end's time (decimal GB/s). Each pair's two directions are timed
one after the other (a link shaped or broken one way shows), all pairs of a round together.

Per node: its ranks' all_reduce bus bandwidth among themselves (nccl-tests' factor 2(n-1)/n;
only with 2+ ranks a node). Per rank, last (the job's start-up is over, no transfer in flight): a
fixed matmul (CPU: 8 products of 1024x1024 fp32 on one thread, ~0.15 s a core, longer than a CFS
period so a CPU quota shows, few products so that another thread of the process holding the GIL
hardly delays it; GPU: 50 of 4096x4096), GFLOP/s, the best of three passes, and of up to nine
more for a rank still under the share of the median. Ranks sharing one machine's cores (CPU ranks with the
same boot id: emulated nodes, or several CPU ranks of a host) take turns, each pass through every
turn; GPUs probe at once, each its own.

Confirmation: every pair a link rule would name is measured again alone, twice (no other pair in
flight, at most MAX_RETRIES pairs), and each direction keeps the best of its three figures
(`retried`): a pair slowed by its round's neighbours or a busy moment on a shared host or switch is
not a bad link; a bad link is slow every time. The better figures move the medians, so the rules run
again (up to three times) until they name no pair not yet measured again.

The rules (`findings`), each against the median of its peers with the share `--outlier-share`
(0.7) stated in the output:
  compute   a node whose slowest rank's matmul rate is under share x the median over nodes: its
            compute is named ("not a link"), and its links are not, even when they are slow too:
            a starved host sends slowly.
  node      a node whose median pair bandwidth (every direction of its pairs) is under share x the
            median over nodes: its link.
  link      a pair direction under share x the lower of its two nodes' medians, neither node
            named: that path alone (cable, port, switch route).
  rank      the same three within a node, over its ranks (GPU pairs: NVLink, PCIe, xGMI).
  all_reduce a node whose own all_reduce bus bandwidth is under share x the median over nodes.
A node is its host name; nodes are numbered in the order of their first rank.

Bisection (`--bisect`, for thousands of nodes): the candidates (all nodes) are split into two
halves that each all_reduce S bytes among their ranks at the same time; when the slower half's bus
bandwidth is under share x the faster's, the slower half becomes the candidates, else the search
stops. log2(nodes) rounds: one slow node among 1,024 in 10. It finds one node whose slowness shows
in an all_reduce (a slow link or host); two slow nodes in opposite halves stop it at that round,
which it says.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from distval import device as devices
from distval import meta
from distval.comm.names import bus_factor
from distval.results import Check, Report, Status, Table
from distval.scale.config import PairsConfig

if TYPE_CHECKING:
    from distval.rank import RankContext
    from distval.results import JobResult

PAIR_COLUMNS = ["level", "node_a", "node_b", "host_a", "host_b", "rank_a", "rank_b", "round", "bytes",
                "a_to_b_gbps", "b_to_a_gbps", "retried"]
NODE_COLUMNS = ["node", "host", "ranks", "pair_gbps", "pair_share", "allreduce_busbw_gbps", "compute_gflops",
                "compute_share"]
RANK_COLUMNS = ["rank", "node", "host", "local", "compute_gflops", "pair_gbps"]
BISECT_COLUMNS = ["round", "half_a", "half_b", "busbw_a_gbps", "busbw_b_gbps", "slower"]
COMPUTE_SHAPE = {"cpu": (1024, 8), "cuda": (4096, 50)}  # (n, products): few, long products (the GIL is free)


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs of 0..n-1, every pair once (the circle method): player 0 stays,
    the others rotate; a bye (n when n is odd) sits a player out each round."""
    players = list(range(n + n % 2))
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if n not in (a, b)])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


# -- per rank ----------------------------------------------------------------------------------------


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def placement(ctx: RankContext) -> tuple[list[str], list[str]]:
    """Every rank's host name and machine (boot id: emulated nodes share one machine's cores), in
    rank order, on every rank."""
    where: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(where, (ctx.hostname, _boot_id()), group=ctx.control)
    return [h for h, _ in where], [b for _, b in where]


def pairs_rank(ctx: RankContext, cfg: PairsConfig) -> dict[str, Any]:
    """Every rank's part: who is where, the pair rounds (or the bisection), the node all_reduce
    and the compute probe. Returns this rank's own timings; rank 0's report joins them."""
    hosts, machines = placement(ctx)
    nodes = list(dict.fromkeys(hosts))
    members = [[r for r in range(ctx.world_size) if hosts[r] == host] for host in nodes]
    size = cfg.message_bytes(ctx.device.type)
    out: dict[str, Any] = {"hosts": hosts, "device_type": ctx.device.type, "times": [], "allreduce": None,
                           "compute": None, "bisect": []}
    if cfg.bisect:
        out["bisect"] = _bisect(ctx, cfg, members, size)
    else:
        leaders = [m[0] for m in members]
        for index, pairs in enumerate(round_robin(len(nodes))):
            ctx.status(f"comm pairs nodes round {index + 1}")
            out["times"] += _round(ctx, cfg, [(leaders[a], leaders[b]) for a, b in pairs], size, "node", index)
        width = max(len(m) for m in members)
        for index, pairs in enumerate(round_robin(width) if width > 1 else []):
            ctx.status(f"comm pairs ranks round {index + 1}")
            mine = [(m[a], m[b]) for m in members for a, b in pairs if b < len(m)]
            out["times"] += _round(ctx, cfg, mine, size, "rank", index)
        out["times"] += _confirm(ctx, cfg, out, size)
    out["allreduce"] = _node_allreduce(ctx, cfg, members, size)
    if cfg.compute:  # last: the job's start-up (rendezvous, the store's host, the launcher's threads) is over
        out["compute"] = _compute_turns(ctx, machines, cfg.outlier_share)
    return out


MAX_RETRIES = 64  # pairs measured again, alone, before a link is named
AGAIN = 2  # times each such pair is measured again: a link is named when all 1 + AGAIN figures are slow


def _confirm(ctx: RankContext, cfg: PairsConfig, out: dict[str, Any], size: int,
             rounds: int = 3) -> list[dict[str, Any]]:
    """Every pair a link finding would name, measured again alone (no other pair in flight) AGAIN
    times, each direction's best figure kept: a pair slowed by its round's neighbours or by a busy
    moment on a shared host or switch is not a bad link; a bad link is slow every time. Pairs
    measured again change the medians the rules compare with, so the rules run again on the new
    figures, up to `rounds` times, until they name no pair not yet measured again. Every rank
    decides the same pairs from every rank's times."""
    records: list[dict[str, Any]] = []
    done: set[tuple[str, int, int, int]] = set()
    for _ in range(rounds):
        views: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(views, {"times": out["times"] + records, "compute": out["compute"]}, group=ctx.control)
        results = [{"hosts": out["hosts"], "allreduce": None, **v} for v in views]
        rows = pair_rows(results)
        found = findings(rows, node_rows(results, rows), rank_rows(results, rows), cfg.outlier_share)
        suspects = [s for s in suspect_pairs(found, rows) if s not in done][:MAX_RETRIES - len(done)]
        if not suspects:
            break
        for level, a, b, index in suspects:
            ctx.status(f"comm pairs again {a}-{b}")
            for attempt in range(1, AGAIN + 1):
                records += [{**t, "attempt": attempt} for t in _round(ctx, cfg, [(a, b)], size, level, index)]
        done.update(suspects)
    return records


def suspect_pairs(found: list[Check], rows: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    """(level, rank_a, rank_b, round) of every pair a link finding implicates: all pairs of a node or
    rank named for its link, or the one pair named."""
    out = []
    for check in found:
        if not check.name.endswith(" link"):
            continue
        unit = "node" if "node" in check.where else "rank"
        named = check.where[unit]
        level = "node" if unit == "node" else "rank"
        for row in rows:
            ends = (row["node_a"], row["node_b"]) if unit == "node" else (row["rank_a"], row["rank_b"])
            hit = set(ends) == set(named) if isinstance(named, list) else named in ends
            key = (level, row["rank_a"], row["rank_b"], row["round"])
            if row["level"] == level and hit and key not in out:
                out.append(key)
    return out


def _round(ctx: RankContext, cfg: PairsConfig, pairs: list[tuple[int, int]], size: int, level: str,
           index: int) -> list[dict[str, Any]]:
    """One round: every pair's a->b at once, then every pair's b->a. Every rank joins the barriers;
    a rank in a pair records its end's time of each direction."""
    mine = next(((a, b) for a, b in pairs if ctx.rank in (a, b)), None)
    buf = torch.empty(size // 4, dtype=torch.float32, device=ctx.device)
    records = []
    for src_first in (True, False):
        ctx.control_comm.barrier()
        if mine is None:
            continue
        a, b = mine
        src, dst = (a, b) if src_first else (b, a)
        seconds = _transfer(ctx, buf, src, dst, cfg.warmup, cfg.iters)
        records.append({"level": level, "round": index, "rank_a": a, "rank_b": b, "src": src, "dst": dst,
                        "bytes": buf.numel() * 4, "iters": cfg.iters, "seconds": seconds, "attempt": 0})
    return records


def _transfer(ctx: RankContext, buf: torch.Tensor, src: int, dst: int, warmup: int, iters: int) -> float:
    """`warmup` then `iters` messages from src to dst; this end's time of the timed ones."""
    def one() -> None:
        if ctx.rank == src:
            dist.send(buf, dst)
        else:
            dist.recv(buf, src)

    for _ in range(warmup):
        one()
    devices.synchronize(ctx.device)
    start = time.perf_counter()
    for _ in range(iters):
        one()
    devices.synchronize(ctx.device)
    return time.perf_counter() - start


def _node_allreduce(ctx: RankContext, cfg: PairsConfig, members: list[list[int]], size: int) -> float | None:
    """This rank's node's all_reduce bus bandwidth among its own ranks, every node at once (every
    rank creates every node's group, as torch requires); None with one rank a node."""
    if max(len(m) for m in members) < 2:
        return None
    groups = [dist.new_group(m) for m in members]
    mine = next(i for i, m in enumerate(members) if ctx.rank in m)
    buf = torch.ones(size // 4, dtype=torch.float32, device=ctx.device)
    ctx.status("comm pairs node all_reduce")
    ctx.control_comm.barrier()
    n = len(members[mine])
    seconds = _allreduce_seconds(ctx, cfg, buf, groups[mine]) if n > 1 else None
    ctx.control_comm.barrier()
    return allreduce_busbw(buf, cfg.iters, seconds, n) if seconds else None


def _allreduce_seconds(ctx: RankContext, cfg: PairsConfig, buf: torch.Tensor, group: Any) -> float:
    """This rank's time of `cfg.iters` all_reduces of `buf` in `group`, after `cfg.warmup` untimed."""
    for _ in range(cfg.warmup):
        dist.all_reduce(buf, group=group)
    devices.synchronize(ctx.device)
    start = time.perf_counter()
    for _ in range(cfg.iters):
        dist.all_reduce(buf, group=group)
    devices.synchronize(ctx.device)
    return time.perf_counter() - start


def allreduce_busbw(buf: torch.Tensor, iters: int, seconds: float, n: int) -> float:
    """nccl-tests' all_reduce bus bandwidth of `iters` calls on `buf` in `seconds` among n ranks, GB/s."""
    return buf.numel() * buf.element_size() * iters / seconds * bus_factor("all_reduce", n) / 1e9


def _compute_turns(ctx: RankContext, boot_ids: list[str], share: float, passes: int = 3,
                   attempts: int = 4) -> float:
    """The fixed matmul on this rank, GFLOP/s: the best of `passes` passes, and of `passes` more, up
    to `attempts` times in all, for a rank still under `share` x the median after them (a slow rank
    is slow every time, and a CPU quota caps every probe; a healthy rank slowed by a moment's load
    on a shared host reaches its speed in one of them). CPU ranks of one machine take turns (else
    they would measure their share of its cores), each pass through every turn; GPU ranks probe at
    once."""
    same = [r for r in range(ctx.world_size) if boot_ids[r] == boot_ids[ctx.rank]]
    turns = max(sum(1 for r in range(ctx.world_size) if boot_ids[r] == b) for b in set(boot_ids)) \
        if ctx.device.type == "cpu" else 1
    mine = same.index(ctx.rank) if ctx.device.type == "cpu" else 0
    ctx.status("comm pairs compute probe")
    rate, again = 0.0, True
    for _ in range(attempts):
        for _ in range(passes):
            for turn in range(turns):
                ctx.control_comm.barrier()
                if turn == mine and again:
                    rate = max(rate, compute_probe(ctx.device))
        rates: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(rates, rate, group=ctx.control)
        slow = [r for r in range(ctx.world_size) if rates[r] < share * statistics.median(rates)]
        if not slow:
            break
        again = ctx.rank in slow
    return rate


def compute_probe(device: torch.device, repeats: int = 1) -> float:
    """GFLOP/s of a fixed amount of matmul work (COMPUTE_SHAPE), each repeat timed as a whole (on a
    CPU with a CFS quota a short product would run inside the quota at full speed); the best of
    `repeats`."""
    n, products = COMPUTE_SHAPE["cuda" if device.type == "cuda" else "cpu"]
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core: what one rank of a CPU job has
    try:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            devices.synchronize(device)
            start = time.perf_counter()
            for _ in range(products):
                torch.mm(a, b)
            devices.synchronize(device)
            best = min(best, time.perf_counter() - start)
        return 2 * n**3 * products / best / 1e9
    finally:
        torch.set_num_threads(threads)


def _bisect(ctx: RankContext, cfg: PairsConfig, members: list[list[int]], size: int) -> list[dict[str, Any]]:
    """Halve the candidate nodes while one half's all_reduce is slower than share x the other's.
    A half of one node takes a witness (a node already cleared) so that its all_reduce crosses
    the network; the halves run one after the other (they may share the witness)."""
    candidates, rounds = list(range(len(members))), []
    buf = torch.ones(size // 4, dtype=torch.float32, device=ctx.device)
    while len(candidates) > 1:
        halves = [candidates[:len(candidates) // 2], candidates[len(candidates) // 2:]]
        cleared = [n for n in range(len(members)) if n not in candidates]
        groups = [[*half, *cleared[:1]] if len(half) == 1 else half for half in halves]
        ranks = [[r for node in nodes for r in members[node]] for nodes in groups]
        if any(len(g) < 2 for g in groups):  # two nodes and nothing cleared: a pair cannot say which end is slow
            break
        ctx.status(f"comm pairs bisection round {len(rounds) + 1}")
        busbw = [_group_busbw(ctx, cfg, group_ranks, buf) for group_ranks in ranks]
        a, b = busbw
        row = {"round": len(rounds), "half_a": halves[0], "half_b": halves[1], "busbw_a_gbps": a, "busbw_b_gbps": b,
               "slower": None}
        if min(a, b) < cfg.outlier_share * max(a, b):
            row["slower"] = 0 if a < b else 1
            candidates = halves[row["slower"]]
        rounds.append(row)
        if row["slower"] is None:
            break
    return rounds


def _group_busbw(ctx: RankContext, cfg: PairsConfig, ranks: list[int], buf: torch.Tensor) -> float:
    """all_reduce bus bandwidth among `ranks` (the others wait), known on every rank afterwards."""
    group = dist.new_group(ranks)  # every rank creates every group, as torch requires
    ctx.control_comm.barrier()
    seconds = torch.zeros(1, dtype=torch.float64)
    if ctx.rank in ranks:
        seconds[0] = _allreduce_seconds(ctx, cfg, buf, group)
    ctx.control_comm.all_reduce(seconds, op="max")  # the group's time: its slowest rank's
    return allreduce_busbw(buf, cfg.iters, seconds.item(), len(ranks))


# -- the report (rank 0) -------------------------------------------------------------------------------


def pair_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per pair measured: each direction's bandwidth from its two ends' times (the slower
    end's), of its best attempt where the pair was measured again (`_confirm`)."""
    hosts = results[0]["hosts"]
    nodes = list(dict.fromkeys(hosts))
    seconds: dict[tuple, float] = {}
    info: dict[tuple, dict[str, Any]] = {}
    for result in results:
        for t in result["times"]:
            key = (t["level"], t["rank_a"], t["rank_b"])
            attempt = (*key, t["src"], t.get("attempt", 0))
            seconds[attempt] = max(seconds.get(attempt, 0.0), t["seconds"])
            info.setdefault(key, t)
    rows = []
    for (level, a, b), t in sorted(info.items(), key=lambda kv: (kv[0][0] != "node", kv[1]["round"], kv[0][1:])):
        def gbps(src: int) -> float | None:
            tried = [s for (lv, x, y, d, _), s in seconds.items() if (lv, x, y, d) == (level, a, b, src) and s]
            return t["bytes"] * t["iters"] / min(tried) / 1e9 if tried else None

        retried = any(k[:3] == (level, a, b) and k[4] > 0 for k in seconds)
        rows.append({"level": level, "node_a": nodes.index(hosts[a]), "node_b": nodes.index(hosts[b]),
                     "host_a": hosts[a], "host_b": hosts[b], "rank_a": a, "rank_b": b, "round": t["round"],
                     "bytes": t["bytes"], "a_to_b_gbps": gbps(a), "b_to_a_gbps": gbps(b), "retried": retried})
    return rows


def node_rows(results: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hosts = results[0]["hosts"]
    nodes = list(dict.fromkeys(hosts))
    per_node = _medians(pairs, "node", nodes=len(nodes))
    pair_median = _median([v for v in per_node.values() if v is not None])
    rows = []
    for i, host in enumerate(nodes):
        ranks = [r for r in range(len(hosts)) if hosts[r] == host]
        computes = [results[r]["compute"] for r in ranks if results[r]["compute"]]
        allreduce = results[ranks[0]]["allreduce"]
        rows.append({"node": i, "host": host, "ranks": len(ranks), "pair_gbps": per_node.get(i),
                     "pair_share": None, "allreduce_busbw_gbps": allreduce,
                     "compute_gflops": min(computes) if computes else None, "compute_share": None})
    compute_median = _median([r["compute_gflops"] for r in rows if r["compute_gflops"]])
    for r in rows:
        r["pair_share"] = r["pair_gbps"] / pair_median if r["pair_gbps"] and pair_median else None
        r["compute_share"] = r["compute_gflops"] / compute_median if r["compute_gflops"] and compute_median else None
    return rows


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _directions(row: dict[str, Any]) -> list[tuple[int, int, float]]:
    """(from, to, GB/s) of a pair row's measured directions, by the row's level's unit (node or rank)."""
    a, b = (row["node_a"], row["node_b"]) if row["level"] == "node" else (row["rank_a"], row["rank_b"])
    return [(x, y, v) for x, y, v in ((a, b, row["a_to_b_gbps"]), (b, a, row["b_to_a_gbps"])) if v is not None]


def _medians(pairs: list[dict[str, Any]], level: str, nodes: int | None = None) -> dict[int, float | None]:
    """Each unit's (node's or rank's) median over every direction of its pairs at `level`."""
    seen: dict[int, list[float]] = {i: [] for i in range(nodes or 0)}
    for row in pairs:
        if row["level"] != level:
            continue
        for x, y, v in _directions(row):
            seen.setdefault(x, []).append(v)
            seen.setdefault(y, []).append(v)
    return {unit: _median(values) for unit, values in seen.items()}


def findings(pairs: list[dict[str, Any]], nodes: list[dict[str, Any]], ranks: list[dict[str, Any]],
             share: float) -> list[Check]:
    """The named outliers (module docstring: the rules), most telling first; empty when none."""
    out: list[Check] = []
    slow_compute = _compute_findings(nodes, share, out)
    out += _link_findings(pairs, "node", {n["node"]: n for n in nodes}, slow_compute, share)
    for node in nodes:  # within each node: its ranks
        mine = [r for r in ranks if r["node"] == node["node"]]
        if len(mine) < 2:
            continue
        slow_ranks = _compute_findings(mine, share, out, unit="rank")
        inside = [p for p in pairs if p["level"] == "rank" and p["node_a"] == node["node"]]
        out += _link_findings(inside, "rank", {r["rank"]: r for r in mine}, slow_ranks, share)
    reduced = [n for n in nodes if n["allreduce_busbw_gbps"]]
    med = _median([n["allreduce_busbw_gbps"] for n in reduced])
    for n in reduced:
        if len(reduced) > 1 and n["allreduce_busbw_gbps"] < share * med:
            out.append(Check(f"comm.pairs node {n['node']} all_reduce", Status.FAIL,
                             f"node {n['node']} ({n['host']}): all_reduce among its {n['ranks']} ranks "
                             f"{n['allreduce_busbw_gbps']:.3g} GB/s busbw against a median of {med:.3g} over nodes "
                             f"({n['allreduce_busbw_gbps'] / med:.2f}x < {share:g}x): its internal fabric",
                             hint="check the node's GPU links (nvidia-smi topo -m / nvidia-smi nvlink -s, amd-smi "
                                  "xgmi) and `distval doctor` on it; the rank pairs above say which",
                             where={"node": n["node"], "host": n["host"]}))
    return out


def _label(unit: str, row: dict[str, Any]) -> str:
    if unit == "node":
        return f"node {row['node']} ({row['host']})"
    return f"rank {row['rank']} (node {row['node']}, local {row['local']})"


def _compute_findings(units: list[dict[str, Any]], share: float, out: list[Check], unit: str = "node") -> set[int]:
    rated = [u for u in units if u.get("compute_gflops")]
    med = _median([u["compute_gflops"] for u in rated])
    slow = set()
    for u in rated:
        if len(rated) > 1 and u["compute_gflops"] < share * med:
            key = u[unit]
            slow.add(key)
            out.append(Check(f"comm.pairs {unit} {key} compute", Status.FAIL,
                             f"{_label(unit, u)}: compute {u['compute_gflops'] / med:.2f}x its peers "
                             f"({u['compute_gflops']:.3g} GFLOP/s against a median of {med:.3g}; < {share:g}x): "
                             "not a link",
                             hint="a slow host or device: check its clocks, power and thermal state, CPU limits "
                                  "(cgroup quota, other jobs) and `distval doctor` on it",
                             where={unit: key}, details={"compute_gflops": u["compute_gflops"], "median": med}))
    return slow


def _link_findings(pairs: list[dict[str, Any]], level: str, units: dict[int, dict[str, Any]],
                   slow_compute: set[int], share: float) -> list[Check]:
    """A unit whose pairs are slow all round (its link), then single slow paths between units
    that are otherwise fine. A unit already named for its compute is not named for its links."""
    unit = "node" if level == "node" else "rank"
    medians = {k: v for k, v in _medians(pairs, level).items() if v is not None and k in units}
    if len(medians) < 2:
        return []
    med = _median(list(medians.values()))
    out, named = [], set(slow_compute)
    for key, value in sorted(medians.items()):
        if value < share * med and key not in slow_compute:
            named.add(key)
            hint = ("check its NIC, cable and switch port (ethtool, ibstat, link speed and errors) and its "
                    "NCCL/Gloo interface with `distval doctor` on it") if level == "node" else \
                ("check this GPU's links (nvidia-smi topo -m, nvidia-smi nvlink -s; amd-smi xgmi): a GPU on PCIe "
                 "or a degraded NVLink")
            out.append(Check(f"comm.pairs {unit} {key} link", Status.FAIL,
                             f"{_label(unit, units[key])}: {value:.3g} GB/s to every peer against a median of "
                             f"{med:.3g} ({value / med:.2f}x < {share:g}x): its link",
                             hint=hint, where={unit: key}, details={"pair_gbps": value, "median": med}))
    for row in pairs:
        if row["level"] != level:
            continue
        for x, y, v in _directions(row):
            if x in named or y in named or x not in medians or y not in medians:
                continue
            expected = min(medians[x], medians[y])
            if v < share * expected:
                out.append(Check(f"comm.pairs {unit} {x}-{y} link", Status.FAIL,
                                 f"link {unit} {x} -> {unit} {y} only: {v:.3g} GB/s against {expected:.3g} "
                                 f"(the lower of the two {unit}s' medians; {v / expected:.2f}x < {share:g}x)",
                                 hint="the path between these two alone: a cable, a port or a switch route (both "
                                      "ends are fast with their other peers)",
                                 where={unit: [x, y]}, details={"gbps": v, "expected": expected}))
    return out


def rank_rows(results: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: its node, local index, compute and median pair bandwidth within its node."""
    hosts = results[0]["hosts"]
    nodes = list(dict.fromkeys(hosts))
    medians = _medians(pairs, "rank")
    rows = []
    for rank, host in enumerate(hosts):
        local = [r for r in range(len(hosts)) if hosts[r] == host].index(rank)
        rows.append({"rank": rank, "node": nodes.index(host), "host": host, "local": local,
                     "compute_gflops": results[rank]["compute"] or None, "pair_gbps": medians.get(rank)})
    return rows


def build_report(job: JobResult, cfg: PairsConfig) -> Report:
    results = job.results
    device_type = results[0]["device_type"]
    report = Report("comm pairs", meta=meta.collect(job, cfg, method=cfg.describe(device_type),
                                                    outlier_rule=f"named under {cfg.outlier_share:g}x the median of "
                                                                 "its peers"))
    pairs = pair_rows(results)
    nodes = node_rows(results, pairs)
    ranks = rank_rows(results, pairs)
    report.tables.append(Table("pairs", PAIR_COLUMNS, rows=pairs, title=f"pair bandwidth, {cfg.describe(device_type)}",
                               units={"bytes": "B", "a_to_b_gbps": "GB/s", "b_to_a_gbps": "GB/s"}))
    report.tables.append(Table("pair_nodes", NODE_COLUMNS, rows=nodes,
                               title="per node: median pair bandwidth, own all_reduce, compute probe",
                               units={"pair_gbps": "GB/s", "allreduce_busbw_gbps": "GB/s",
                                      "compute_gflops": "GFLOP/s"}))
    report.tables.append(Table("pair_ranks", RANK_COLUMNS, rows=ranks,
                               title="per rank: compute probe, median pair bandwidth within its node",
                               units={"compute_gflops": "GFLOP/s", "pair_gbps": "GB/s"}))
    found = findings(pairs, nodes, ranks, cfg.outlier_share)  # with --bisect: no pairs, the compute rules
    if cfg.bisect:
        found += _bisect_report(report, results[0]["bisect"], nodes, cfg)
    report.checks += found
    if not found:
        report.add(_summary(pairs, nodes, cfg, len(results)))
    return report


def _summary(pairs: list[dict[str, Any]], nodes: list[dict[str, Any]], cfg: PairsConfig, world: int) -> Check:
    values = [v for row in pairs if row["level"] == "node" for _, _, v in _directions(row)]
    rounds = len({row["round"] for row in pairs if row["level"] == "node"})
    parts = [f"{len(nodes)} nodes, {world} ranks"]
    if values:
        parts.append(f"{len(values) // 2} node pairs in {rounds} rounds: {statistics.median(values):.3g} GB/s median "
                     f"({min(values):.3g}-{max(values):.3g})")
    inside = [v for row in pairs if row["level"] == "rank" for _, _, v in _directions(row)]
    if inside:
        parts.append(f"rank pairs within nodes {statistics.median(inside):.3g} GB/s median "
                     f"({min(inside):.3g}-{max(inside):.3g})")
    computes = [n["compute_gflops"] for n in nodes if n["compute_gflops"]]
    if computes:
        parts.append(f"compute {min(computes):.3g}-{max(computes):.3g} GFLOP/s")
    return Check("comm.pairs", Status.OK, "; ".join(parts) + f"; no node, link or rank under {cfg.outlier_share:g}x "
                 "the median of its peers", details={"outlier_share": cfg.outlier_share})


def _bisect_report(report: Report, rounds: list[dict[str, Any]], nodes: list[dict[str, Any]],
                   cfg: PairsConfig) -> list[Check]:
    def names(half: list[int]) -> str:
        return ",".join(map(str, half))

    report.tables.append(Table("pair_bisect", BISECT_COLUMNS, title="bisection: all_reduce on halves",
                               rows=[{**r, "half_a": names(r["half_a"]), "half_b": names(r["half_b"])} for r in rounds],
                               units={"busbw_a_gbps": "GB/s", "busbw_b_gbps": "GB/s"}))
    if not rounds:
        return [Check("comm.pairs bisect", Status.SKIP, "one node: nothing to bisect")]
    last = rounds[-1]
    path = " -> ".join(f"{min(r['busbw_a_gbps'], r['busbw_b_gbps']):.3g} vs "
                       f"{max(r['busbw_a_gbps'], r['busbw_b_gbps']):.3g}" for r in rounds)
    if last["slower"] is not None:
        node = (last["half_a"], last["half_b"])[last["slower"]][0]
        host = nodes[node]["host"]
        return [Check(f"comm.pairs node {node} bisect", Status.FAIL,
                      f"node {node} ({host}): the slower half at every one of {len(rounds)} rounds of all_reduce on "
                      f"halves (busbw GB/s, slower vs faster: {path}; slower under {cfg.outlier_share:g}x): its link "
                      "or host",
                      hint=f"run `distval comm pairs` on node {node} and two healthy nodes to tell its link from its "
                           "compute", where={"node": node, "host": host})]
    if len(rounds) == 1:
        return [Check("comm.pairs bisect", Status.OK,
                      f"{len(nodes)} nodes: the two halves' all_reduce within {cfg.outlier_share:g}x of each other "
                      f"({last['busbw_a_gbps']:.3g} and {last['busbw_b_gbps']:.3g} GB/s busbw): no slow node shows")]
    left = (rounds[-2]["half_a"], rounds[-2]["half_b"])[rounds[-2]["slower"]]
    return [Check("comm.pairs bisect", Status.FAIL,
                  f"nodes {names(left)} are slower than the rest (busbw GB/s by round: {path}), but their halves are "
                  f"alike: more than one slow node among them",
                  hint=f"run `distval comm pairs` (every pair) on nodes {names(left)}", where={"nodes": left})]
