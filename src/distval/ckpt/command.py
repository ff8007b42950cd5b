"""The checkpoint side of `distval train`: checks before any worker starts, and what the run
journal adds to the report (table `attempts`, meta `restarts`, checks on saves and skipped
checkpoints). torch-free until a checkpoint has to be read."""

from __future__ import annotations

import json
import os
import statistics
import uuid
from pathlib import Path
from typing import Any

from distval.results import Check, Report, Status, Table, output_dir

ATTEMPT_COLUMNS = ["attempt", "resumed_from_step", "checkpoint", "last_step", "outcome", "recovery_s"]


def prepare(cfg: Any, world_size: int, mode: str) -> None:
    """Validate the checkpoint flags against the disk before launching (exit 2, nothing
    written): the directory, and that the checkpoint a resume would load is from this config."""
    from distval import strategies
    from distval.ckpt import store
    from distval.ckpt.checkpointer import check_compatible
    from distval.ckpt.state import fingerprint_fields

    if cfg.ckpt_dir:
        cfg.ckpt_dir = str(output_dir(cfg.ckpt_dir, "--ckpt-dir").resolve())  # workers may start elsewhere
    found = None
    if cfg.resume == "auto":
        found = store.find_latest(Path(cfg.ckpt_dir), [])
    elif cfg.resume:
        found = store.load_found(Path(cfg.resume))
        cfg.resume = str(Path(cfg.resume).resolve())
    if found is not None:
        layout = strategies.REGISTRY[cfg.strategy].layout(cfg.strategy_cfg)
        check_compatible(found, fingerprint_fields(cfg, world_size), layout)
    # the journal's name: one per invocation locally; under torchrun every worker runs this
    # command, so they use the agent's run id (the same on all of them)
    cfg.run_id = f"distval-{uuid.uuid4().hex[:12]}" if mode == "local" else os.environ.get("TORCHELASTIC_RUN_ID")


def read_journal(cfg: Any) -> dict[str, Any] | None:
    if not cfg.ckpt_dir or not cfg.run_id:
        return None
    try:
        return json.loads((Path(cfg.ckpt_dir) / "runs" / f"{cfg.run_id}.json").read_text())
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


def annotate(report: Report | None, cfg: Any) -> None:
    """Add the run journal to the train report: table `attempts`, meta `restarts` and
    `resumed_from_step`, a check on the saves, one WARN per skipped checkpoint or failed save."""
    journal = read_journal(cfg) if report is not None else None
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
        report.add(Check("train checkpoints", Status.OK if len(done) == len(saves) else Status.WARN,
                         f"{len(done)} of {len(saves)} checkpoint(s) saved ({'async' if any(s['async'] for s in saves) else 'sync'}), latest "
                         f"{done[-1]['name'] if done else 'none'}; training stalled {stall * 1e3:.1f} ms per save (median)",
                         details={"saves": saves, "stall_s_p50": stall,
                                  "write_s_p50": statistics.median(writes) if writes else None, "dir": cfg.ckpt_dir},
                         hint="" if len(done) == len(saves) else "see the warnings: free space or fix the checkpoint directory"))
    for text in journal["warnings"]:
        report.add(Check("train checkpoint warning", Status.WARN, text, hint="the checkpoint named was not used; "
                         "delete it or investigate the storage", where={"dir": cfg.ckpt_dir}))
