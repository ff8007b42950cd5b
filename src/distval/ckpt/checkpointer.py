"""The checkpointer the training loop calls: resume, periodic saves (sync or async), a final save
on SIGTERM, and the run journal (rank 0's record on disk, written when an attempt starts and ends
and at each save; the step an attempt is in goes on the rank channel, and the next attempt reads
it from there if this one dies without a word).

    ckpt = Checkpointer(ctx, cfg.ckpt, cfg.steps, fields, strategy, optimizer, loader)  # every rank
    start, history = ckpt.resume()         # step to start at, metrics so far
    for step in range(start, cfg.steps):
        ckpt.before_step(step)             # rank 0's position on the channel; SIGTERM seen on any rank
                                           # -> final save, Preempted
        history.append(train_step(...))
        ckpt.after_step(step + 1)          # every --ckpt-every steps and at the end: save
    ckpt.close(ok=True)                    # finish a save still in flight

Model and optimizer state go only through the strategy's portable full form
(`strategy.state_dict(optimizer)` / `load_state_dict`, collective for sharded strategies, so they
are called on every rank from the main thread). Async saves: the main thread takes the snapshot
(the full form is a copy; on GPU it is moved to host memory) and hands it to one writer thread; a
second save first waits for the first (at most one in flight). The writer's own collectives (file
lists, commit outcome) go over a dedicated Gloo group, so they never interleave with the main
thread's control-group traffic. A save running when training ends is finished; one running when a
rank fails is abandoned: its files stay in a `.tmp-*` directory that is never loaded and is
removed when the next attempt starts.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distval.ckpt import state as ckpt_state
from distval.ckpt import store
from distval.ckpt.config import CheckpointConfig
from distval.health.faults import attempt_number
from distval.protocol import Kind
from distval.results import atomic_write_text

GRACE_S = 20.0  # after SIGTERM, a rank that reaches no step boundary in this time exits as before
MODEL_FILE = "model.safetensors"
DCP_DIR = "dcp"  # the sharded form: torch.distributed.checkpoint's files, each rank its own shards


class Preempted(RuntimeError):
    """SIGTERM was received and a final checkpoint saved: the job stops, a restart resumes."""


class CrashLoop(RuntimeError):
    """Two attempts in a row resumed from the same checkpoint and failed at the same step."""


@dataclass
class _Job:
    step: int
    state: dict[str, Any] | None  # rank 0: the full form on the host; others: None
    trainer: dict[str, Any] | None
    rank_state: dict[str, Any]
    sharded: dict[str, Any] | None = None  # every rank: the strategy's sharded form (live shards) for DCP
    started: float = field(default_factory=time.perf_counter)


def run_id() -> str:
    """The run journal's name: the elastic agent's run id, which distval's local launcher takes
    from LaunchOptions.run_id and torchrun from --rdzv-id, the same on every worker and every
    restart of one run."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or "run"


class Journal:
    """Rank 0's record of one run (all its restart attempts), DIR/runs/<run id>.json."""

    def __init__(self, path: Path, run_id: str):
        self.path = path
        self.path.parent.mkdir(exist_ok=True)
        try:
            self.doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.doc = {"run_id": run_id, "attempts": [], "saves": [], "warnings": []}

    def write(self) -> None:
        with contextlib.suppress(OSError):  # a full disk must not stop training; the journal catches up next write
            atomic_write_text(self.path, json.dumps(self.doc), fsync=False)

    @property
    def current(self) -> dict[str, Any]:
        return self.doc["attempts"][-1]


class Checkpointer:
    """`cfg`: what the user asked of checkpoints; `steps`: the run's length (the last step saves);
    `fields`: what a checkpoint must agree on to be resumed (ckpt/state.py's fingerprint_fields);
    `strategy`, `optimizer`, `loader`: what a checkpoint holds; `settle`: called before each save
    (the loop's: every finished step's record into history). Creates a Gloo group: every rank."""

    def __init__(self, ctx: Any, cfg: CheckpointConfig, steps: int, fields: dict[str, Any], strategy: Any,
                 optimizer: torch.optim.Optimizer, loader: Any, timeout_s: float = 120.0,
                 settle: Callable[[], None] = lambda: None):
        self.ctx, self.cfg, self.steps, self.strategy, self.optimizer, self.loader = \
            ctx, cfg, steps, strategy, optimizer, loader
        self.rank = ctx.rank
        self.dir = Path(cfg.dir) if cfg.dir else None
        self.fields = fields
        self.layout = strategy.layout(strategy.cfg)
        self.fingerprint = ckpt_state.fingerprint(self.fields)
        self.attempt = attempt_number()
        self.history: list[dict[str, Any]] = []
        self.settle = settle
        self.stop_requested = False
        self._step: int | None = None  # the step this attempt is in, and when it started
        self._step_time: float | None = None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.journal = Journal(cfg.journal_path(run_id()), run_id()) if self.dir and self.rank == 0 else None
        if self.dir and self.rank == 0:
            store.clean_temporary(self.dir)
        dist.barrier(group=self.group)  # nobody writes into a .tmp directory before the clean-up
        self._remove_handler = ctx.signals.on(signal.SIGTERM, self._on_sigterm)

    # -- SIGTERM: a final save at the next step boundary -----------------------------------------

    def _on_sigterm(self, signum: int) -> bool:
        """Claim SIGTERM: stop at the next step boundary with a final save."""
        if self.stop_requested:  # the launcher forwards the job's SIGTERM too: one notice, one grace
            return True
        self.stop_requested = True
        # a rank stuck in a collective never reaches the boundary: after the grace, the worker's
        # default (note where this rank was, then exit)
        timer = threading.Timer(GRACE_S, self.ctx.signals.default, args=(signum,))
        timer.daemon = True
        timer.start()
        return True

    # -- resume ------------------------------------------------------------------------------------

    def resume(self) -> tuple[int, list[dict[str, Any]]]:
        """Load the checkpoint --resume names (auto: the newest valid one); returns the step to
        start at and the per-step metrics of the steps already done. Every rank calls this."""
        box: list[Any] = [self._choose() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        choice = box[0]
        if choice["error"]:
            self._no_restart(choice["error"], 2)
            raise ValueError(choice["error"])
        if choice["crash_loop"]:
            self._no_restart(choice["crash_loop"], 3)
            raise CrashLoop(choice["crash_loop"])
        step = 0
        if choice["path"]:
            step = self._load(Path(choice["path"]))
        if self.journal:
            self.journal.doc["attempts"].append({
                "attempt": self.attempt, "resumed_from_step": step if choice["path"] else None,
                "checkpoint": Path(choice["path"]).name if choice["path"] else None, "start_time": time.time(),
                "first_step_time": None, "last_step": None, "last_step_time": None, "outcome": "running"})
            self.journal.doc["warnings"] += choice["warnings"]
            self.journal.write()
        return step, self.history

    def _choose(self) -> dict[str, Any]:
        """Rank 0: which checkpoint, or why not (a usage error, a crash loop)."""
        self._close_previous_attempt()
        out: dict[str, Any] = {"path": None, "error": None, "crash_loop": None, "warnings": []}
        try:
            found = None
            if self.cfg.resume == "auto":
                found = store.find_latest(self.dir, out["warnings"]) if self.dir else None
            elif self.cfg.resume:
                found = store.load_found(Path(self.cfg.resume))
            if found is not None:
                check_compatible(found, self.fields, self.layout)
                out["path"] = str(found.path)
        except ValueError as e:
            out["error"] = str(e)
            return out
        out["crash_loop"] = self._crash_loop(found.step if found else 0)
        return out

    def _crash_loop(self, resume_step: int) -> str | None:
        """No progress across restarts: the last two attempts resumed from this same step and
        both failed at the same step."""
        if self.journal is None:
            return None
        failed = [a for a in self.journal.doc["attempts"] if a["outcome"] == "running"]
        if len(failed) < 2:
            return None
        a, b = failed[-2], failed[-1]
        if (a["resumed_from_step"] or 0) == (b["resumed_from_step"] or 0) == resume_step and a["last_step"] == b[
            "last_step"
        ]:
            return (f"no progress across restarts: attempts {a['attempt']} and {b['attempt']} both resumed from step "
                    f"{resume_step} and failed at step {b['last_step']}; not restarting again (fix the cause, then "
                    f"rerun with --resume auto)")
        return None

    def _close_previous_attempt(self) -> None:
        """The step the previous attempt was in when it died, and when it started that step: from
        the channel, where rank 0 put it at every step (the journal is written on attempts and
        saves, not on every step). The channel's store outlives a restart: the local launcher's,
        or torchrun's agent store."""
        if self.journal is None or not self.journal.doc["attempts"]:
            return
        last = self.journal.current
        reader = self.ctx.channel.reader()
        position = reader.latest(0, Kind.POSITION) if reader is not None else None
        if position and position.get("attempt") == last["attempt"] and last["outcome"] == "running":
            last.update(last_step=position["step"], last_step_time=position["time"])

    def _end_attempt(self, outcome: str) -> None:
        """Rank 0 records how this attempt ended (once: a stop's "preempted" stands) and the step
        it ended in. A failed attempt stays "running"; the next attempt marks it failed."""
        if self.journal is None or not self.journal.doc["attempts"] or self.journal.current["outcome"] != "running":
            return
        self.journal.current.update(outcome=outcome, last_step=self._step, last_step_time=self._step_time)
        self.journal.write()

    def _no_restart(self, message: str, exit_code: int) -> None:
        """Ask distval's agent (local mode) to stop instead of restarting into the same error."""
        if self.rank == 0:
            self.ctx.channel.publish(Kind.NOTE, {"no_restart": message, "exit_code": exit_code}, flush=True)

    def _load(self, path: Path) -> int:
        self.ctx.status(f"loading checkpoint {path.name}", busy=True)
        trainer = json.loads((path / "trainer.json").read_text())
        if (path / DCP_DIR).is_dir():  # DCP reshards to this world size; same strategy (checked)
            import torch.distributed.checkpoint as dcp

            state = self.strategy.sharded_state_dict(self.optimizer)
            dcp.load(state, checkpoint_id=str(path / DCP_DIR), process_group=self.group)
            self.strategy.finish_sharded_load(self.optimizer, state)
        else:
            self.strategy.load_state_dict(self.optimizer, store.load_tensors(path, MODEL_FILE))
        mine = path / f"rank-{self.rank}.json"
        if mine.exists():
            rank_state = json.loads(mine.read_text())
            ckpt_state.set_rng_state(rank_state["rng"], self.ctx.device)
        else:  # saved with fewer ranks: data positions are global, RNG streams are not
            rank_state = json.loads((path / "rank-0.json").read_text())
        self.loader.load_state_dict(rank_state["data"])
        self.history = list(trainer["steps"])
        return int(trainer["step"])

    # -- per step ------------------------------------------------------------------------------------

    def before_step(self, step: int) -> None:
        self._step, self._step_time = step, time.time()
        if self.rank == 0:  # where this attempt is: on the channel, at once (a killed rank cannot flush)
            self.ctx.channel.publish(Kind.POSITION, {"attempt": self.attempt, "step": step}, flush=True)
        self.ctx.faults.at_step(step)
        # every rank learns whether any rank got SIGTERM, so all stop at the same boundary
        if max(self.ctx.exchange(int(self.stop_requested))):
            path = self.save(step, final=True)
            self._end_attempt("preempted")
            raise Preempted(f"SIGTERM received: saved {path or 'no checkpoint (see warnings)'} before step {step}; "
                            f"rerun with --resume auto to continue")

    def after_step(self, done: int) -> None:
        if self.journal and self.journal.current["first_step_time"] is None:
            self.journal.current["first_step_time"] = time.time()
            self.journal.write()
        if self.cfg.due(done, self.steps):
            self.save(done)

    # -- saving ----------------------------------------------------------------------------------------

    def save(self, step: int, final: bool = False) -> str | None:
        """Snapshot now (every rank), write in the background unless sync or final. Returns the
        checkpoint's name when it was committed synchronously."""
        if self.dir is None:
            return None
        self.ctx.status(f"saving checkpoint step {step}", busy=True)  # long, and not a hang
        self.settle()
        start = time.perf_counter()
        self.wait()  # at most one save in flight
        background = self.cfg.async_save and not final
        job = self._snapshot(step, copy_shards=background)
        if background:
            self._thread = threading.Thread(target=self._background, args=(job,), name="distval-ckpt", daemon=True)
            self._thread.start()
            self._record(job, None, time.perf_counter() - start)
            return None
        outcome = self._write(job)
        self._record(job, outcome, time.perf_counter() - start)
        return outcome["name"] if outcome["ok"] else None

    def _snapshot(self, step: int, copy_shards: bool) -> _Job:
        """Sharded strategies: their DCP form (each rank saves its shards, nothing gathered; a
        copy of them when written in the background, as training changes the live shards);
        replicas: the portable full form (a copy, collective), which rank 0 writes."""
        sharded = self.strategy.sharded_state_dict(self.optimizer)
        if sharded is not None and copy_shards:
            sharded = {k: _copy_shard(v) for k, v in sharded.items()}
        full = self.strategy.state_dict(self.optimizer) if sharded is None else None
        rank_state = {"rng": ckpt_state.rng_state(self.ctx.device), "data": self.loader.state_dict()}
        if self.rank != 0:
            return _Job(step, None, None, rank_state, sharded)
        trainer = {"step": step,
                   "fingerprint": self.fingerprint, "fields": self.fields, "steps": list(self.history[:step])}
        return _Job(step, None if full is None else _to_host(full), trainer, rank_state, sharded)

    def _background(self, job: _Job) -> None:
        try:
            outcome = self._write(job)
            if self.journal:
                self.journal.doc["saves"][-1].update(outcome)
                self.journal.doc["saves"][-1]["write_s"] = time.perf_counter() - job.started
                self._warn_failed(outcome)
                self.journal.write()
        except BaseException as e:  # a peer died mid-save: the main thread re-raises it
            self._thread_error = e

    def _write(self, job: _Job) -> dict[str, Any]:
        """Every rank writes its files into the shared temporary directory; rank 0 commits once
        all agree they succeeded, or removes it. Returns the outcome (the same on every rank)."""
        tmp = store.tmp_path(self.dir, job.step, f"a{self.attempt}")
        files: dict[str, Any] = {}
        error = None
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            midway = _kill_self if self.ctx.faults.in_save(job.step) else None
            if job.sharded is not None:
                error = _dcp_save(job.sharded, tmp / DCP_DIR, self.group, self.rank)
            if job.state is not None:
                files[MODEL_FILE] = store.write_tensors(tmp, MODEL_FILE, store.flatten(job.state), midway=midway)
            elif midway:
                midway()
            if job.trainer is not None:
                files["trainer.json"] = store.write_file(tmp, "trainer.json", store.json_bytes(job.trainer))
            files[f"rank-{self.rank}.json"] = store.write_file(
                tmp, f"rank-{self.rank}.json", store.json_bytes(job.rank_state)
            )
        except OSError as e:
            error = f"rank {self.rank}: {e.strerror or e} ({getattr(e, 'filename', None) or tmp})"
        gathered: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(gathered, (files, error), group=self.group)
        outcome: dict[str, Any] | None = None
        if self.rank == 0:
            errors = [e for _, e in gathered if e]
            name = store.step_name(job.step)
            if not errors:
                try:
                    merged = {k: v for f, _ in gathered for k, v in f.items()}
                    if job.sharded is not None:  # every rank's DCP files are on the shared disk by now
                        merged.update(store.describe_files(tmp, DCP_DIR))
                    store.commit(tmp, self.dir, job.step, merged, {
                        "fingerprint": self.fingerprint, "fields": self.fields, "world_size": self.ctx.world_size,
                        "strategy": self.strategy.name, "layout": self.layout, "attempt": self.attempt,
                        "form": "full" if job.sharded is None else "sharded", "time": time.time()})
                    store.prune(self.dir, self.cfg.keep)
                except OSError as e:
                    errors.append(f"rank 0: commit: {e.strerror or e}")
            if errors:
                shutil.rmtree(tmp, ignore_errors=True)
            outcome = {"ok": not errors, "name": name, "error": "; ".join(errors) or None}
        box = [outcome]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _record(self, job: _Job, outcome: dict[str, Any] | None, stall_s: float) -> None:
        if not self.journal:
            return
        entry = {
            "step": job.step,
            "attempt": self.attempt,
            "async": outcome is None,
            "stall_s": stall_s,
            "write_s": None if outcome is None else stall_s,
            "ok": None,
            "name": store.step_name(job.step),
            "error": None,
        }
        if outcome is not None:
            entry.update(outcome)
        self.journal.doc["saves"].append(entry)
        if outcome is not None:
            self._warn_failed(outcome)
        self.journal.write()

    def _warn_failed(self, outcome: dict[str, Any]) -> None:
        if not outcome["ok"]:
            latest = next((s["name"] for s in reversed(self.journal.doc["saves"]) if s.get("ok")), None)
            self.journal.doc["warnings"].append(
                f"checkpoint {outcome['name']} not saved: {outcome['error']}; the latest valid checkpoint stays "
                f"{latest or 'the one resumed from (or none)'}")

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or given up."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._thread_error is not None:
            error, self._thread_error = self._thread_error, None
            raise error

    def close(self, ok: bool) -> None:
        """ok: finish the save in flight. Failing: give it a moment, then abandon it (its files
        stay in a .tmp directory that nothing loads)."""
        try:
            if ok:
                self.wait()
                self._end_attempt("finished")
            else:
                if self._thread is not None:
                    self._thread.join(timeout=10)
                self._end_attempt("running")  # failed: a restart marks it so; the step it failed in stays
        finally:
            self._remove_handler()


def check_compatible(found: store.Found, fields: dict[str, Any], layout: dict[str, Any]) -> None:
    """The fingerprint fields must match; a sharded (DCP) checkpoint also needs the layout it was
    saved with (`Strategy.layout`: the strategy, and for zero1/2 the bucket cap that cut its flat
    groups). The full form loads anywhere."""
    m = found.manifest
    diff = ckpt_state.differences(m.get("fields", {}), fields)
    if diff:
        raise ValueError(f"checkpoint {found.path} is from a different config: {'; '.join(diff)}; "
                         f"resume with the same settings or use another --ckpt-dir")
    saved = m.get("layout") or {"strategy": m.get("strategy")}
    if m.get("form") == "sharded" and saved != layout:
        flags = " ".join(f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
                         for k, v in saved.items())
        raise ValueError(
            f"checkpoint {found.path} is {saved.get('strategy')}'s sharded form (torch.distributed.checkpoint), "
            f"which loads only into the layout it was saved with: "
            f"{'; '.join(ckpt_state.differences(saved, layout))}; resume with {flags}"
        )


def _to_host(tree: Any) -> Any:
    """The full form's tensors in host memory (they are copies already; on GPU, copy to CPU)."""
    if isinstance(tree, dict):
        return {k: _to_host(v) for k, v in tree.items()}
    if isinstance(tree, torch.Tensor):
        return tree if tree.device.type == "cpu" else tree.to("cpu")
    return tree


def _copy_shard(value: Any) -> Any:
    """A copy of one entry of a sharded form: a DTensor with a cloned local shard (same mesh,
    placements and global shape; on the shard's device, which DCP stages to the host as it writes),
    or a cloned tensor."""
    if hasattr(value, "to_local"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(value.to_local().detach().clone(), value.device_mesh, value.placements,
                                  run_check=False, shape=value.shape, stride=value.stride())
    return value.detach().clone() if hasattr(value, "detach") else value


def _dcp_save(state: dict[str, Any], where: Path, group: Any, rank: int) -> str | None:
    """Every rank writes its shards (DCP coordinates over the checkpoint group, not the training
    group, and fsyncs its files). Returns this rank's error, if any."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.save(state, checkpoint_id=str(where), process_group=group)
    except Exception as e:  # DCP raises on every rank when one failed (e.g. ENOSPC)
        return (
            f"rank {rank}: torch.distributed.checkpoint: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        )
    return None


def _kill_self() -> None:
    """Drill fault: half of this rank's first file is on disk; the process dies now."""
    os.kill(os.getpid(), signal.SIGKILL)
