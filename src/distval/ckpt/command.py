"""The checkpoint side of `distval train`: checks before any worker starts, and what the run
journal adds to the report (table `attempts`, meta `restarts`, checks on saves and skipped
checkpoints). torch-free until a checkpoint has to be read."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from distval.ckpt.config import CheckpointConfig
from distval.results import Check, Report, Status, Table, output_dir

ATTEMPT_COLUMNS = ["attempt", "resumed_from_step", "checkpoint", "last_step", "outcome", "recovery_s"]


def prepare(cfg: Any, world_size: int) -> CheckpointConfig:
    """Validate the checkpoint flags of a TrainConfig against the disk before launching (exit 2,
    nothing written): the directory, and that the checkpoint a resume would load is from this
    config. Returns the checkpoint config resolved (absolute paths, the directory created)."""
    from distval import strategies
    from distval.ckpt import store
    from distval.ckpt.checkpointer import check_compatible
    from distval.ckpt.state import fingerprint_fields

    ckpt: CheckpointConfig = cfg.ckpt
    if ckpt.dir:
        output_dir(ckpt.dir, "--ckpt-dir")
    ckpt = ckpt.resolved()
    found = None
    if ckpt.resume == "auto":
        found = store.find_latest(Path(ckpt.dir), [])
    elif ckpt.resume:
        found = store.load_found(Path(ckpt.resume))
    if found is not None:
        layout = strategies.REGISTRY[cfg.strategy].layout(cfg.strategy_cfg)
        check_compatible(found, fingerprint_fields(cfg, world_size), layout)
    return ckpt


def job_run_id(mode: str, local_run_id: str) -> str | None:
    """The run id that names the journal: ours locally; under torchrun every worker runs the
    command, and they all see the agent's (the same on all of them)."""
    return local_run_id if mode == "local" else os.environ.get("TORCHELASTIC_RUN_ID")


def read_journal(ckpt: CheckpointConfig, run_id: str | None) -> dict[str, Any] | None:
    if not ckpt.dir or not run_id:
        return None
    try:
        return json.loads(ckpt.journal_path(run_id).read_text())
    except (OSError, ValueError):
        return None


def attempts_table(journal: dict[str, Any]) -> Table:
    table = Table("attempts", ATTEMPT_COLUMNS, title="attempts (restarts resume from the latest valid checkpoint)",
                  units={"recovery_s": "s"})
    attempts = journal["attempts"]
    for i, a in enumerate(attempts):
        outcome = a["outcome"] if a["outcome"] != "running" or i == len(attempts) - 1 else "failed"
        recovery = None
        if i > 0 and a.get("first_step_time") and attempts[i - 1].get("last_step_time"):
            recovery = a["first_step_time"] - attempts[i - 1]["last_step_time"]
        table.add(attempt=a["attempt"], resumed_from_step=a["resumed_from_step"], checkpoint=a["checkpoint"],
                  last_step=a["last_step"], outcome="failed" if outcome == "running" else outcome, recovery_s=recovery)
    return table


def annotate(report: Report | None, ckpt: CheckpointConfig, run_id: str | None) -> None:
    """Add the run journal to the train report: table `attempts`, meta `restarts` and
    `resumed_from_step`, a check on the saves, one WARN per skipped checkpoint or failed save."""
    journal = read_journal(ckpt, run_id) if report is not None else None
    if journal is None or not journal["attempts"]:
        return
    table = attempts_table(journal)
    report.tables.append(table)
    report.meta["restarts"] = len(journal["attempts"]) - 1
    report.meta["resumed_from_step"] = [a["resumed_from_step"] for a in journal["attempts"]]
    saves = journal["saves"]
    done = [s for s in saves if s.get("ok")]
    if saves:
        stall = statistics.median(s["stall_s"] for s in saves)
        writes = [s["write_s"] for s in saves if s.get("write_s") is not None]
        report.add(
            Check(
                "train checkpoints",
                Status.OK if len(done) == len(saves) else Status.WARN,
                f"{len(done)} of {len(saves)} checkpoint(s) saved "
                f"({'async' if any(s['async'] for s in saves) else 'sync'}), latest "
                f"{done[-1]['name'] if done else 'none'}; training stalled {stall * 1e3:.1f} ms per save (median)",
                details={
                    "saves": saves,
                    "stall_s_p50": stall,
                    "write_s_p50": statistics.median(writes) if writes else None,
                    "dir": ckpt.dir,
                },
                hint="" if len(done) == len(saves) else "see the warnings: free space or fix the checkpoint directory",
            )
        )
    for text in journal["warnings"]:
        report.add(Check("train checkpoint warning", Status.WARN, text, hint="the checkpoint named was not used; "
                         "delete it or investigate the storage", where={"dir": ckpt.dir}))
