"""Live OpenMetrics from the launcher (`--metrics-port`): what the monitor loop sees, served with
prometheus_client for Prometheus to scrape and Grafana to draw, the same names and labels for
every command that launches ranks (docs/health.md, "Live metrics").

A monitor-loop watcher (`MetricsExporter`, launch/monitor.py) builds a snapshot at most once a
second from the rank channel and from the other watchers that know more (`metrics()`: the
launched script's monitor, health/script.py); a scrape renders the last snapshot, so a scrape
never reads the store and never waits on the loop.

Sources: every rank's heartbeat (its age, its step); `distval train`'s rank 0 `step` payload
(the step's per-rank rows, tokens/s, findings by kind) or, for a launched script, its monitor's
aligned step rows; both fill the same families.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from distval.protocol import Kind

PREFIX = "distval"
RANK_FIELDS = {  # per-rank gauge: (field of a rank row, help)
    "step_seconds": ("step_s", "The rank's last optimizer step, wall time (s)"),
    "compute_share": ("compute_share", "Share of the rank's last step spent outside collectives' waits"),
    "wait_share": ("wait_share", "Share of the rank's last step spent waiting for its peers in collectives"),
    "straggler_score": ("straggler_score", "The rank's compute time over its peers' median (window median; "
                        "a straggler at --straggler-ratio)"),
}


def rank_row(row: dict[str, float], score: float | None = None) -> dict[str, float]:
    """A per-rank row of the monitor (step_s, compute_s, blocked_s, mem_current, mem_peak) as the
    exporter's fields."""
    step_s = max(row["step_s"], 1e-12)
    out = {"step_s": row["step_s"], "compute_share": row["compute_s"] / step_s, "wait_share": row["blocked_s"] / step_s,
           "mem_current": row.get("mem_current", 0.0),
           "mem_peak": max(row.get("mem_peak", 0.0), row.get("mem_current", 0.0))}  # RSS's peak is sampled apart
    if score is not None:
        out["straggler_score"] = score
    return out


class MetricsExporter:
    """Serves http://ADDR:PORT/metrics from `start` to `close`."""

    def __init__(self, world_size: int, port: int, command: str, sources: list[Any] = (), addr: str = "0.0.0.0",
                 every_s: float = 1.0):
        self.world_size, self.port, self.command, self.addr, self.every_s = world_size, port, command, addr, every_s
        self.sources = list(sources)
        self._snapshot: dict[str, Any] = {"ranks": {}, "findings": {}, "tokens_per_s": None, "step": None}
        self._lock = threading.Lock()
        self._built = 0.0
        self._server: Any = None

    def start(self) -> MetricsExporter:
        """Listen now (before any rank starts): a port in use is a one-line error (ValueError)."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        try:
            self._server, _ = start_http_server(self.port, addr=self.addr, registry=registry)
        except OSError as e:
            raise ValueError(f"--metrics-port {self.port}: cannot listen ({e.strerror}); choose a free port, or 0 "
                             "for any") from None
        self.port = self._server.server_port
        print(f"distval: metrics at http://{_host(self.addr)}:{self.port}/metrics", file=sys.stderr, flush=True)
        return self

    def tick(self, reader: Any) -> None:
        now = time.monotonic()
        if now - self._built < self.every_s:
            return
        self._built = now
        snap: dict[str, Any] = {"ranks": {r: {} for r in range(self.world_size)}, "findings": {},
                                "tokens_per_s": None, "step": None}
        wall = time.time()
        for r, beat in reader.all(self.world_size, Kind.HEARTBEAT).items():
            if beat:
                snap["ranks"][r]["heartbeat_age"] = max(0.0, wall - beat.get("time", wall))
        row = reader.latest(0, Kind.STEP)  # distval train: rank 0's finished step
        if row:
            snap["step"], snap["tokens_per_s"] = row.get("step"), row.get("tokens_per_s")
            for r, fields in enumerate(row.get("ranks") or []):
                snap["ranks"].setdefault(r, {}).update(fields)
            snap["findings"].update({tuple(k.split("/")): n for k, n in (row.get("findings") or {}).items()})
        for source in self.sources:
            extra = source.metrics()
            for r, fields in extra.get("ranks", {}).items():
                snap["ranks"].setdefault(r, {}).update(fields)
            for key, n in extra.get("findings", {}).items():
                snap["findings"][key] = snap["findings"].get(key, 0) + n
            snap["step"] = extra.get("step", snap["step"])
        with self._lock:
            self._snapshot = snap

    def collect(self) -> Any:
        """prometheus_client's collector: the families of the last snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            snap = self._snapshot
        info = GaugeMetricFamily(f"{PREFIX}_job_info", "The job distval watches", labels=["command", "world_size"])
        info.add_metric([self.command, str(self.world_size)], 1)
        yield info
        if snap["step"] is not None:
            yield GaugeMetricFamily(f"{PREFIX}_step", "The last optimizer step every rank finished", value=snap["step"])
        if snap["tokens_per_s"] is not None:
            yield GaugeMetricFamily(f"{PREFIX}_tokens_per_second", "Tokens per second of the last step (every rank's)",
                                    value=snap["tokens_per_s"])
        age = GaugeMetricFamily(f"{PREFIX}_heartbeat_age_seconds", "Seconds since the rank's last heartbeat",
                                labels=["rank"])
        for r, fields in sorted(snap["ranks"].items()):
            if "heartbeat_age" in fields:
                age.add_metric([str(r)], fields["heartbeat_age"])
        yield age
        for name, (field, text) in RANK_FIELDS.items():
            family = GaugeMetricFamily(f"{PREFIX}_rank_{name}", text, labels=["rank"])
            for r, fields in sorted(snap["ranks"].items()):
                if field in fields:
                    family.add_metric([str(r)], fields[field])
            yield family
        memory = GaugeMetricFamily(f"{PREFIX}_rank_memory_bytes", "The rank's device memory (host RSS on CPU) at its "
                                   "last step: current and peak", labels=["rank", "kind"])
        for r, fields in sorted(snap["ranks"].items()):
            for kind in ("current", "peak"):
                if f"mem_{kind}" in fields:
                    memory.add_metric([str(r), kind], fields[f"mem_{kind}"])
        yield memory
        findings = CounterMetricFamily(f"{PREFIX}_findings", "Health findings so far, by kind and status",
                                       labels=["kind", "status"])
        for (kind, status), n in sorted(snap["findings"].items()):
            findings.add_metric([kind, status], n)
        yield findings

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def exporter_for(port: int | None, world_size: int, watchers: list[Any]) -> MetricsExporter | None:
    """The exporter `--metrics-port` asks for, listening, fed by the watchers that know more; None
    without the flag. ValueError (one line) when the port cannot be had."""
    if port is None:
        return None
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "distval")
    return MetricsExporter(world_size, port, command, [w for w in watchers if hasattr(w, "metrics")]).start()


def finding_counts(findings: list[Any]) -> dict[tuple[str, str], int]:
    """Findings by (kind, status)."""
    counts: dict[tuple[str, str], int] = {}
    for f in findings:
        counts[(f.kind, f.status)] = counts.get((f.kind, f.status), 0) + 1
    return counts


def _host(addr: str) -> str:
    import socket

    return socket.gethostname() if addr in ("0.0.0.0", "") else addr
