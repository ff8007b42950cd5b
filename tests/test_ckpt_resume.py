"""Exact resume on real Gloo ranks: a run resumed from a checkpoint continues bitwise identically
(every later loss, the final parameters) for the DDP family (full form, sync and async saves) and
the sharded strategies (their torch.distributed.checkpoint form); a checkpoint loads on another
world size with the same global batch."""

import dataclasses
import json
from pathlib import Path

import torch

from distval.ckpt.config import CheckpointConfig
from distval.launch import LaunchOptions, run
from distval.rank import RankContext
from distval.train.config import OptimConfig, TrainConfig
from distval.train.loop import train_rank

from conftest import reference_run

BASE = TrainConfig(model="tiny", steps=8, micro_batch=2, optim=OptimConfig(lr=3e-3, warmup_steps=2), seed=5,
                   return_params=True, peak_flops=1e12, ckpt=CheckpointConfig(every=3, keep=5))


def with_ckpt(cfg: TrainConfig, **changes) -> CheckpointConfig:
    return dataclasses.replace(cfg.ckpt, **changes)


DDP = ["simple_ddp", "simple_ddp_ga", "simple_ddp_hook", "simple_ddp_async", "bucket_ddp_async", "pytorch_ddp"]
SHARDED = ["fsdp2", "zero1", "zero3"]  # async, sync, async saves (i % 2 below)


def _interrupted_and_resumed(ctx: RankContext, arg: tuple) -> dict:
    """Per strategy, in the same workers: an uninterrupted run that saves at steps 3 and 6, then
    a fresh model/optimizer/loader resumed from step 3 (so steps 3..7 are recomputed)."""
    cfg, names = arg
    out = {}
    for i, name in enumerate(names):
        ckpt = Path(cfg.ckpt.dir) / name
        one = dataclasses.replace(cfg, strategy=name, ckpt=with_ckpt(cfg, dir=str(ckpt), async_save=i % 2 == 0))
        full = train_rank(ctx, one)
        resumed = train_rank(
            ctx, dataclasses.replace(one, ckpt=with_ckpt(one, dir=None, resume=str(ckpt / "step-00000003")))
        )
        out[name] = (full, resumed)
    return out


def _check(results: dict, names: list[str]) -> None:
    for name in names:
        full, resumed = results[name]
        assert [s["loss"] for s in resumed["steps"]] == [s["loss"] for s in full["steps"]], name
        assert [s["grad_norm"] for s in resumed["steps"][3:]] == [s["grad_norm"] for s in full["steps"][3:]], name
        assert torch.equal(resumed["params"], full["params"]), name
        assert resumed["checksum"] == full["checksum"]


def test_ddp_family_resumes_bitwise(tmp_path):
    for name in DDP:
        (tmp_path / name).mkdir()
    cfg = dataclasses.replace(BASE, ckpt=with_ckpt(BASE, dir=str(tmp_path)))
    job = run(_interrupted_and_resumed, (cfg, DDP), LaunchOptions(nproc=2, timeout_s=60, run_id="first"))
    _check(job.results[0], DDP)
    # the async and sync saves both left verified checkpoints at 3, 6 and the end
    for name in DDP:
        assert sorted(p.name for p in (tmp_path / name).glob("step-*")) == [
            "step-00000003",
            "step-00000006",
            "step-00000008",
        ]
        journal = json.loads((tmp_path / name / "runs" / "first.json").read_text())  # the job's run id
        assert [s["ok"] for s in journal["saves"]] == [True, True, True]


def test_sharded_strategy_resumes_bitwise(tmp_path):
    for name in SHARDED:
        (tmp_path / name).mkdir()
    cfg = dataclasses.replace(BASE, ckpt=with_ckpt(BASE, dir=str(tmp_path)), steps=6)
    job = run(_interrupted_and_resumed, (cfg, SHARDED), LaunchOptions(nproc=2, timeout_s=60))
    _check(job.results[0], SHARDED)
    for name in SHARDED:  # saved in the sharded form: each rank wrote its shards through DCP
        step = tmp_path / name / "step-00000003"
        assert (step / "dcp" / ".metadata").exists() and len(list((step / "dcp").glob("*.distcp"))) == 2
        assert not (step / "model.safetensors").exists()
        manifest = json.loads((step / "manifest.json").read_text())
        assert manifest["form"] == "sharded" and "dcp/.metadata" in manifest["files"]


def test_checkpoint_loads_on_another_world_size(tmp_path):
    """Saved by 2 ranks x micro-batch 2, resumed by 1 rank x micro-batch 4: same global batch,
    same samples per step, so the losses agree closely (not bitwise: another summation order)."""
    cfg = dataclasses.replace(BASE, strategy="simple_ddp", ckpt=with_ckpt(BASE, dir=str(tmp_path)), steps=6)
    two = run(train_rank, cfg, LaunchOptions(nproc=2, timeout_s=60)).results[0]
    one = reference_run(cfg, 2, strategy=cfg.strategy,
                        ckpt=with_ckpt(cfg, dir=None, resume=str(tmp_path / "step-00000003")))
    assert [s["loss"] for s in one["steps"][:3]] == [s["loss"] for s in two["steps"][:3]]  # carried over
    for a, b in zip(one["steps"][3:], two["steps"][3:]):
        assert abs(a["loss"] - b["loss"]) < 1e-4


def test_sharded_checkpoint_resumes_on_three_ranks(tmp_path):
    """zero1's DCP checkpoint from 2 ranks x micro-batch 3 resumed on 3 ranks x micro-batch 2: DCP
    reshards the flat shards; same global batch, so the losses agree closely."""
    cfg = dataclasses.replace(BASE, strategy="zero1", micro_batch=3, ckpt=with_ckpt(BASE, dir=str(tmp_path)), steps=6)
    two = run(train_rank, cfg, LaunchOptions(nproc=2, timeout_s=60)).results[0]
    assert (tmp_path / "step-00000003" / "dcp" / ".metadata").exists()
    three_cfg = dataclasses.replace(
        cfg, micro_batch=2, ckpt=with_ckpt(cfg, dir=None, resume=str(tmp_path / "step-00000003"))
    )
    three = run(train_rank, three_cfg, LaunchOptions(nproc=3, timeout_s=60)).results[0]
    for a, b in zip(three["steps"][3:], two["steps"][3:]):
        assert abs(a["loss"] - b["loss"]) < 1e-4
    assert three["steps"][3]["loss"] != 0 and len(three["steps"]) == 6


def _now_late_and_resumed(ctx: RankContext, cfg: TrainConfig) -> tuple[dict, dict, dict]:
    now = train_rank(ctx, dataclasses.replace(cfg, ckpt=with_ckpt(cfg, dir=str(Path(cfg.ckpt.dir) / "now"))))
    late_cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics, readback="late"),
                                   ckpt=with_ckpt(cfg, dir=str(Path(cfg.ckpt.dir) / "late")))
    late = train_rank(ctx, late_cfg)
    resumed = train_rank(ctx, dataclasses.replace(late_cfg, ckpt=with_ckpt(
        late_cfg, dir=None, resume=str(Path(late_cfg.ckpt.dir) / "step-00000003"))))
    return now, late, resumed


def test_figures_read_one_step_late_are_the_same_and_every_checkpoint_holds_them(tmp_path):
    """The GPU's readback (a step's figures read while the next runs), here on Gloo: the same
    records as read at once, and a checkpoint taken while a step's figures were still on their way
    holds that step's record (the resumed run carries all of them)."""
    (tmp_path / "now").mkdir()
    (tmp_path / "late").mkdir()
    cfg = dataclasses.replace(BASE, strategy="simple_ddp", grad_accum=2, ckpt=with_ckpt(BASE, dir=str(tmp_path)))
    now, late, resumed = run(_now_late_and_resumed, cfg, LaunchOptions(nproc=2, timeout_s=60)).results[0]
    keys = ("step", "loss", "grad_norm", "lr", "comm_calls", "comm_bytes", "model_state_bytes")
    assert [[s[k] for k in keys] for s in late["steps"]] == [[s[k] for k in keys] for s in now["steps"]]
    assert [s["step"] for s in resumed["steps"]] == list(range(8))
    assert [s["loss"] for s in resumed["steps"]] == [s["loss"] for s in late["steps"]]
    assert all(s["step_time_s"] > 0 and s["tokens_per_s"] > 0 for s in late["steps"])
