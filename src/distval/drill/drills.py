"""`distval drill`: inject the faults a long training job meets and assert it survives each one.

One uninterrupted baseline run, then one drill per fault, each a real `distval train` job (its
own process group, real workers, real files) with checkpoints every E steps:

  kill9_rank        SIGKILL of rank 1 at step k; --max-restarts restarts every worker
  exception_rank    rank 1 raises at step k; restarted likewise
  sigterm_job       SIGTERM to the whole job (launcher and workers) at step k: a final checkpoint
                    at the step boundary, exit 130; a second run with --resume auto continues
  kill_during_save  rank 0 SIGKILLed halfway through writing the first checkpoint at or after step k;
                    the restart must resume from the previous checkpoint, never the partial one
  corrupt_file      a run stopped at step k, one byte of its newest checkpoint's model.safetensors flipped;
                    --resume auto must warn naming the file and use the one before
  disk_full         checkpoints on a small tmpfs (root only, else SKIP) that holds one checkpoint:
                    the next saves fail with ENOSPC and are reported, training goes on; a kill at
                    step k then resumes from the one checkpoint that fits
  hang_rank         rank 1 stops (SIGSTOP) at step k: the hang watchdog (--hang-after 3s) must name
                    rank 1 "stopped" and end the job; a rerun with --resume auto continues
  skip_collective   rank 1 skips the first collective of step k: rank 1 must be named, by the
                    watchdog (it went on without it) or, when Gloo aborts on the mismatched sizes
                    that follow, by the failure diagnosis; the rerun continues likewise
  dead_rank_in_collective   rank 1 SIGKILLed inside the first collective of step k: rank 1 must
                    be named dead (by the watchdog, or by the launcher that saw it die); the
                    rerun continues likewise
  slow_rank         rank 1's compute takes twice as long from step 20 of a 140-step run: the health
                    monitor must name rank 1 a straggler, since step 20 (within 5 steps)
  desync            rank 1's first parameter drifts by 1e-3 after step k's update, on 3 ranks
                    (two replicas cannot say which one is wrong): the replica check (every 4
                    steps) must name rank 1 at its first check after step k (a FAIL)
  nan_rank          rank 1's loss is NaN at step k: the monitor must name rank 1 and step k (a FAIL)
  mismatch_shape    rank 1 issues the first all_reduce of step k in another shape, same bytes (a
                    mismatch Gloo lets through, silently): the fingerprint check must name rank 1
                    (a FAIL, exit 1). Detection only: checkpoints written between the mismatch
                    and its verdict hold what it corrupted, so there is no bitwise resume to check

Each drill asserts detection, the step resumed from (the newest checkpoint committed before the
fault, read from the run journal), and that the per-step losses of the whole run are bitwise equal
to the baseline's. Row: drill, status (PASS/FAIL/SKIP), detected, recovery_s (from the failed
attempt's last step start to the end of the first resumed step, restart or rerun included),
steps_lost (steps done after the checkpoint resumed from, so done twice), resumed_from_step,
loss_identical.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from distval import envvars
from distval.drill.config import DrillConfig
from distval.results import Check, Report, Status, Table

DRILL_COLUMNS = ["drill", "status", "detected", "diagnosis_s", "recovery_s", "steps_lost", "resumed_from_step",
                 "loss_identical"]
HANG_AFTER = "3s"  # the hang drills' --hang-after: a sub-second-step job, diagnosed in seconds


@dataclass
class Run:
    code: int
    report: dict[str, Any] | None
    stderr: str
    journal: dict[str, Any] | None
    ended: float = field(default_factory=time.time)  # wall clock, as the journal's times

    def table(self, name: str) -> list[dict[str, Any]]:
        return ((self.report or {}).get("tables", {}).get(name) or {}).get("rows", [])

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.table("steps")]


@dataclass
class Outcome:
    detected: bool = False
    resumed_from_step: int | None = None
    expected_resume: int | None = None
    steps_lost: int | None = None
    recovery_s: float | None = None
    diagnosis_s: float | None = None  # from the last progress to the verdict (a crash: to the job's end)
    how: str = ""  # how it was detected, when that can differ (a hang, or a crash)
    losses: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skip: str | None = None
    detect_only: bool = False  # no resume to check (mismatch_shape)


class Driller:
    def __init__(self, cfg: DrillConfig, work: Path):
        self.cfg, self.work = cfg, work
        self.baseline: list[float] = []

    def train(self, name: str, ckpt_dir: Path, *extra: str, fault: str | None = None,
              new_session: bool = True, nproc: int | None = None, steps: int | None = None) -> Run:
        out = self.work / f"{name}.json"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "distval", "train", "--nproc", str(nproc or self.cfg.nproc), "--model",
               self.cfg.model, "--strategy", self.cfg.strategy, "--steps", str(steps or self.cfg.steps),
               "--ckpt-dir", str(ckpt_dir),
               "--ckpt-every", str(self.cfg.ckpt_every), "--timeout", "30s", "--json", str(out), *extra]
        env = {k: v for k, v in os.environ.items() if not k.startswith((envvars.FAULT.name, "TORCHELASTIC"))}
        if fault:
            env[envvars.FAULT.name] = fault
        before = set((ckpt_dir / "runs").glob("*.json")) if (ckpt_dir / "runs").exists() else set()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=new_session)
        try:
            _, stderr = proc.communicate(timeout=self.cfg.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            stderr += f"\n(drill: killed after {self.cfg.timeout_s:g}s)"
        report = json.loads(out.read_text()) if out.exists() else None
        new = sorted(set((ckpt_dir / "runs").glob("*.json")) - before) if (ckpt_dir / "runs").exists() else []
        journal = json.loads(new[-1].read_text()) if new else None
        return Run(proc.returncode, report, stderr.strip(), journal)

    def fresh_dir(self, name: str) -> Path:
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    # -- the drills ------------------------------------------------------------------------------

    def run_baseline(self) -> Run:
        run = self.train("baseline", self.fresh_dir("baseline"))
        if run.code != 0 or len(run.losses) != self.cfg.steps:
            raise RuntimeError(f"the uninterrupted baseline run failed (exit {run.code}): {run.stderr[-500:]}")
        self.baseline = run.losses
        return run

    def restarted(self, name: str, fault: str) -> Outcome:
        """One job with --max-restarts: the fault fires in attempt 0, attempt 1 must resume."""
        ckpt = self.fresh_dir(name)
        run = self.train(name, ckpt, "--max-restarts", "2", "--resume", "auto", fault=fault)
        out = Outcome(losses=run.losses)
        attempts = run.table("attempts")
        if run.code != 0 or len(attempts) < 2:
            out.notes.append(f"exit {run.code}, {len(attempts)} attempt(s): {run.stderr[-300:]}")
            return out
        first, second = attempts[0], attempts[1]
        out.detected = first["outcome"] == "failed"
        out.resumed_from_step = second["resumed_from_step"] or 0
        out.expected_resume = committed_before(run.journal, ckpt, attempt=0)
        out.steps_lost = (first["last_step"] or 0) - out.resumed_from_step
        out.recovery_s = second["recovery_s"]
        return out

    def kill9_rank(self) -> Outcome:
        return self.restarted("kill9_rank", f"step={self.cfg.fault_step},rank=1,action=kill")

    def exception_rank(self) -> Outcome:
        return self.restarted("exception_rank", f"step={self.cfg.fault_step},rank=1,action=raise")

    def kill_during_save(self) -> Outcome:
        out = self.restarted("kill_during_save", f"step={self.cfg.fault_step},rank=0,action=kill_in_save")
        if out.detected:  # the killed save must be the one after the fault step, and never loaded
            killed = next(
                s for s in out_journal(self.work / "kill_during_save")["saves"] if s["step"] >= self.cfg.fault_step
            )
            out.detected = killed["attempt"] == 0 and not killed["ok"]
            if (out.resumed_from_step or 0) >= killed["step"]:
                out.notes.append(
                    f"resumed from step {out.resumed_from_step}: the partial checkpoint {killed['name']} was used"
                )
                out.detected = False
        return out

    def sigterm_job(self) -> Outcome:
        ckpt = self.fresh_dir("sigterm_job")
        first = self.train(
            "sigterm_job_1", ckpt, "--resume", "auto", fault=f"step={self.cfg.fault_step},rank=0,action=sigterm_job"
        )
        attempt = (first.journal or {}).get("attempts", [{}])[-1]
        saved = [s for s in (first.journal or {}).get("saves", []) if s.get("ok")]
        out = Outcome()
        out.detected = first.code == 130 and attempt.get("outcome") == "preempted" and bool(saved) \
            and saved[-1]["step"] == attempt.get("last_step")
        if not out.detected:
            out.notes.append(
                f"first run: exit {first.code}, outcome {attempt.get('outcome')}, saves {[s['step'] for s in saved]}: "
                f"{first.stderr[-300:]}"
            )
        out.expected_resume = saved[-1]["step"] if saved else 0
        second = self.train("sigterm_job_2", ckpt, "--resume", "auto")
        return self.rerun_outcome(out, first, second)

    def rerun_outcome(self, out: Outcome, first: Run, second: Run) -> Outcome:
        out.losses = second.losses
        rows = second.table("attempts")
        if second.code != 0 or not rows:
            out.notes.append(f"the resumed run failed (exit {second.code}): {second.stderr[-300:]}")
            out.detected = False
            return out
        out.resumed_from_step = rows[0]["resumed_from_step"] or 0
        last = (first.journal or {}).get("attempts", [{}])[-1]
        out.steps_lost = (last.get("last_step") or 0) - out.resumed_from_step
        resumed = (second.journal or {}).get("attempts", [{}])[0]
        if resumed.get("first_step_time") and last.get("last_step_time"):
            out.recovery_s = resumed["first_step_time"] - last["last_step_time"]
        return out

    def dead_rank_in_collective(self) -> Outcome:
        return self.hung("dead_rank_in_collective", f"step={self.cfg.fault_step},rank=1,action=kill_in_op", "dead",
                         or_crash=True)

    def health(self, name: str, fault: str, kind: str, step: int, code: int, *extra: str, slack: int = 0,
               **train: Any) -> Outcome:
        """A job whose health monitor must name rank 1 with this kind of finding at `step` (up to
        `slack` steps earlier or later) and end with `code`. Detection only: nothing to resume."""
        run = self.train(name, self.fresh_dir(name), *extra, fault=fault, **train)
        rows = [r for r in ((run.report or {}).get("tables", {}).get("health") or {}).get("rows", [])
                if r["kind"] == kind]
        out = Outcome(detect_only=True)
        out.detected = run.code == code and bool(rows) and rows[0]["ranks"] == [1] \
            and abs(rows[0]["step"] - step) <= slack
        if out.detected:
            out.how = f"rank 1 named ({kind}) at step {rows[0]['step']}: {rows[0]['summary']}"
        else:
            out.notes.append(f"expected rank 1 named ({kind}) at step {step}, exit {code}: exit {run.code}, "
                             f"{rows[0] if rows else run.stderr[-300:]}")
        return out

    def slow_rank(self) -> Outcome:
        return self.health("slow_rank", "step=20,rank=1,action=slow,percent=100", "straggler", 20, 0, slack=5,
                           steps=140)

    def desync(self) -> Outcome:
        every = 4
        first_check = (self.cfg.fault_step // every + 1) * every - 1
        return self.health("desync", f"step={self.cfg.fault_step},rank=1,action=perturb", "replicas", first_check,
                           1, "--check-replicas-every", str(every), nproc=max(3, self.cfg.nproc))

    def nan_rank(self) -> Outcome:
        return self.health("nan_rank", f"step={self.cfg.fault_step},rank=1,action=nan", "nonfinite",
                           self.cfg.fault_step, 1)

    def mismatch_shape(self) -> Outcome:
        run = self.train("mismatch_shape", self.fresh_dir("mismatch_shape"), "--hang-after", HANG_AFTER,
                         fault=f"step={self.cfg.fault_step},rank=1,action=reshape")
        fails = [c for c in (run.report or {}).get("checks", []) if c["status"] == "FAIL"
                 and c["details"].get("hang") == "mismatch"]
        out = Outcome(detect_only=True)
        out.detected = run.code == 1 and bool(fails) and fails[0]["where"].get("rank") == 1
        if out.detected:
            out.diagnosis_s = fails[0]["details"]["diagnosed_s"]
            out.how = f"rank 1 named by the fingerprint check {out.diagnosis_s} s after its collective"
        else:
            out.notes.append(f"expected rank 1 named by the fingerprint check, exit 1: exit {run.code}, "
                             f"{fails[0]['summary'] if fails else run.stderr[-300:]}")
        return out

    def hung(self, name: str, fault: str, kind: str, or_crash: bool = False) -> Outcome:
        """A job that hangs at the fault: the watchdog must name rank 1 with this kind of hang and
        end the job (exit 3); a rerun with --resume auto continues from the newest checkpoint.
        Recovery: from the stall to the first resumed step (diagnosis, then the rerun at once).
        `or_crash`: the fault may also crash the backend on rank 1 (Gloo aborts when the
        collectives after a skipped one pair tensors of different sizes): then rank 1 must be
        named by the failure diagnosis."""
        ckpt = self.fresh_dir(name)
        first = self.train(f"{name}_1", ckpt, "--resume", "auto", "--hang-after", HANG_AFTER, fault=fault)
        errors = [c for c in (first.report or {}).get("checks", []) if c["status"] == "ERROR"]
        details = errors[0]["details"] if errors else {}
        hang = details if "hang" in details else {}
        out = Outcome(diagnosis_s=hang.get("diagnosed_s"))
        last = ((first.journal or {}).get("attempts") or [{}])[-1]
        if not hang and last.get("last_step_time"):  # named by the launcher: at most from the fault's step to the end
            out.diagnosis_s = round(first.ended - last["last_step_time"], 2)
        named = first.code == 3 and bool(errors) and errors[0]["where"].get("rank") == 1
        out.detected = named and (hang.get("hang") == kind or (or_crash and not hang))
        out.how = (f"rank 1 named by the watchdog in {out.diagnosis_s} s ({kind})" if hang
                   else f"rank 1 named by the failure diagnosis ({errors[0]['summary'][:80]}...)" if errors else "")
        if not out.detected:
            out.notes.append(f"expected rank 1 named ({kind}), exit 3: exit {first.code}, "
                             f"{errors[0]['summary'] if errors else first.stderr[-300:]}")
        out.expected_resume = committed_before(first.journal, ckpt, attempt=0)
        second = self.train(f"{name}_2", ckpt, "--resume", "auto")
        out = self.rerun_outcome(out, first, second)
        at = max((row["step"] for row in hang.get("ranks", []) if row.get("step") is not None), default=None)
        resumed = ((second.journal or {}).get("attempts") or [{}])[0]
        if at is not None and out.resumed_from_step is not None:
            out.steps_lost = at - out.resumed_from_step
        if resumed.get("first_step_time"):  # from the stall (or the crash) to the first resumed step
            out.recovery_s = (out.diagnosis_s or 0.0) + resumed["first_step_time"] - first.ended
        return out

    def hang_rank(self) -> Outcome:
        return self.hung("hang_rank", f"step={self.cfg.fault_step},rank=1,action=stop", "stopped")

    def skip_collective(self) -> Outcome:
        return self.hung("skip_collective", f"step={self.cfg.fault_step},rank=1,action=skip", "outside",
                         or_crash=True)

    def corrupt_file(self) -> Outcome:
        ckpt = self.fresh_dir("corrupt_file")
        first = self.train(
            "corrupt_file_1", ckpt, "--resume", "auto", fault=f"step={self.cfg.fault_step},rank=1,action=kill"
        )
        from distval.ckpt import store

        committed = [p for p in store.candidates(ckpt) if (p / store.MANIFEST).exists()]
        out = Outcome()
        if first.code == 0 or not committed:
            out.notes.append(
                f"the first run should fail with a checkpoint on disk: exit {first.code}, "
                f"{len(committed)} checkpoint(s)"
            )
            return out
        target = committed[0] / "model.safetensors"
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        out.expected_resume = int(committed[1].name.split("-")[1]) if len(committed) > 1 else 0
        second = self.train("corrupt_file_2", ckpt, "--resume", "auto")
        warns = [c["summary"] for c in (second.report or {}).get("checks", []) if c["status"] == "WARN"]
        out.detected = any(str(target) in w and "SHA-256" in w for w in warns)
        if not out.detected:
            out.notes.append(f"no WARN naming {target}: {warns}")
        return self.rerun_outcome(out, first, second)

    def disk_full(self) -> Outcome:
        if os.geteuid() != 0:
            return Outcome(skip="needs root to mount a small tmpfs for the checkpoint directory")
        mount = self.fresh_dir("disk_full")
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "distval-drill", str(mount)], capture_output=True, text=True
        )
        if res.returncode != 0:
            return Outcome(skip=f"cannot mount a tmpfs ({res.stderr.strip() or res.returncode})")
        try:
            # leave room for one checkpoint and a half: the first save fits, the second cannot
            one = checkpoint_bytes(self.work / "baseline")
            free = shutil.disk_usage(mount).free
            (mount / "ballast").write_bytes(b"\0" * max(free - int(1.5 * one), 0))
            run = self.train("disk_full", mount, "--max-restarts", "1", "--resume", "auto", "--ckpt-keep", "1",
                             fault=f"step={self.cfg.fault_step},rank=1,action=kill")
            out = Outcome(losses=run.losses)
            attempts = run.table("attempts")
            warns = [c["summary"] for c in (run.report or {}).get("checks", []) if c["status"] == "WARN"]
            out.detected = any("No space left on device" in w for w in warns)
            if not out.detected:
                out.notes.append(f"no WARN about the full disk (exit {run.code}): {warns} {run.stderr[-300:]}")
            if len(attempts) >= 2:
                out.resumed_from_step = attempts[1]["resumed_from_step"] or 0
                out.steps_lost = (attempts[0]["last_step"] or 0) - out.resumed_from_step
                out.recovery_s = attempts[1]["recovery_s"]
            else:
                out.notes.append(f"expected a restart after the kill: exit {run.code}")
            out.expected_resume = committed_before(run.journal, mount, attempt=0)
            return out
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)

    def row(self, name: str, fn: Callable[[], Outcome]) -> tuple[dict[str, Any], Check]:
        start = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # a drill that could not even run is a FAIL with the reason, not a crash
            out = Outcome(notes=[f"{type(e).__name__}: {e}"])
        if out.skip:
            return (
                {"drill": name, "status": "SKIP"},
                Check(f"drill {name}", Status.SKIP, out.skip, where={"drill": name}),
            )
        identical = None if out.detect_only else bool(out.losses) and out.losses == self.baseline
        resumed_ok = out.resumed_from_step is not None and out.resumed_from_step == out.expected_resume
        if out.resumed_from_step is not None and not resumed_ok:
            out.notes.append(f"resumed from step {out.resumed_from_step}, expected {out.expected_resume} (the newest "
                             f"checkpoint committed before the fault)")
        if not identical and out.losses:
            first = next(
                (i for i, (a, b) in enumerate(zip(out.losses, self.baseline)) if a != b),
                min(len(out.losses), len(self.baseline)),
            )
            out.notes.append(f"losses differ from the baseline from step {first}")
        ok = out.detected and (out.detect_only or (resumed_ok and identical))
        row = {
            "drill": name,
            "status": "PASS" if ok else "FAIL",
            "detected": out.detected,
            "diagnosis_s": out.diagnosis_s,
            "recovery_s": out.recovery_s,
            "steps_lost": out.steps_lost,
            "resumed_from_step": out.resumed_from_step,
            "loss_identical": identical,
        }
        summary = (
            f"{name}: detected, {out.how}" if ok and out.detect_only
            else f"{name}: detected{', ' + out.how if out.how else ''}, resumed from step {out.resumed_from_step} "
            f"({out.steps_lost} step(s) redone), losses bitwise equal to the uninterrupted run"
            if ok
            else f"{name}: " + "; ".join(out.notes or ["not detected"])
        )
        return row, Check(
            f"drill {name}",
            Status.OK if ok else Status.FAIL,
            summary,
            details={**row, "notes": out.notes, "drill_s": time.perf_counter() - start},
            hint="" if ok else "see details.notes; rerun `distval train` with the same DISTVAL_FAULT to look closer",
            where={"drill": name},
        )


def committed_before(journal: dict[str, Any] | None, ckpt: Path, attempt: int) -> int:
    """The newest checkpoint attempt `attempt` committed: where a restart must resume. The journal
    says so, and so does the disk: a kill can land between a background save's commit and its line
    in the journal (the checkpoint is in place and intact; the journal never heard of it)."""
    from distval.ckpt import store

    saves = [s["step"] for s in (journal or {}).get("saves", []) if s.get("attempt") == attempt and s.get("ok")]
    for path in store.candidates(ckpt):
        try:
            manifest = store.verify(path)
        except store.CorruptCheckpoint:
            continue
        if manifest.get("attempt") == attempt:
            saves.append(manifest["step"])
    return max(saves, default=0)


def out_journal(ckpt: Path) -> dict[str, Any]:
    return json.loads(sorted((ckpt / "runs").glob("*.json"))[-1].read_text())


def checkpoint_bytes(ckpt: Path) -> int:
    from distval.ckpt import store

    newest = store.candidates(ckpt)[0]
    return sum(p.stat().st_size for p in newest.iterdir())


def run_drills(cfg: DrillConfig, work: Path | None = None) -> Report:
    from distval import device, meta

    own = work is None
    work = Path(tempfile.mkdtemp(prefix="distval-drill-")) if own else work
    report = Report("drill", meta=meta.collect(None, cfg, world_size=cfg.nproc, backend=device.default_backend()))
    table = Table("drills", DRILL_COLUMNS, title=f"fault drills on {cfg.nproc} ranks ({cfg.model}, {cfg.strategy}, "
                  f"{cfg.steps} steps, checkpoint every {cfg.ckpt_every}, fault at step {cfg.fault_step})",
                  units={"recovery_s": "s"})
    report.tables.append(table)
    driller = Driller(cfg, work)
    try:
        base = driller.run_baseline()
        report.meta["baseline_final_loss"] = base.losses[-1]
        for name in cfg.drills:
            row, check = driller.row(name, getattr(driller, name))
            table.add(**row)
            report.add(check)
    except RuntimeError as e:
        report.add(
            Check("drill baseline", Status.ERROR, str(e), hint="`distval train` itself fails here; run it alone")
        )
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return report
