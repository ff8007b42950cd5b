"""The sharding strategies on real Gloo groups: the same model as one process, the memory each
stage promises, the traffic theory says, and a checkpoint form that moves between strategies
and world sizes."""

import dataclasses
import json
import math

import pytest
import torch

from distval import strategies
from distval.launch import LaunchOptions, run
from distval.plan import presets
from distval.rank import RankContext
from distval.strategies.base import StrategyConfig
from distval.strategies.flat import FlatGroup
from distval.train.compare import parity
from distval.train.config import OptimConfig, TrainConfig
from distval.train.loop import train_rank

from conftest import reference_run, run_cli

# clip 0.5: the tiny model's gradient norm is ~1 early on, so clipping scales most steps and the
# global norm across shards must be right for parity to hold.
BASE = TrainConfig(model="tiny", steps=20, micro_batch=2, optim=OptimConfig(lr=1e-3, warmup_steps=3, clip=0.5), seed=5,
                   return_params=True, peak_flops=1e12, strategy_cfg=StrategyConfig(bucket_mb=0.05))
SHARDED = strategies.SHARDED


def _sharded(ctx: RankContext, cfg: TrainConfig) -> dict:
    """Every sharded strategy and simple_ddp_ga (the DDP traffic and memory baseline), one after
    the other in the same workers."""
    return {name: train_rank(ctx, dataclasses.replace(cfg, strategy=name)) for name in [*SHARDED, "simple_ddp_ga"]}


def _num_params() -> int:
    from distval.train.model import build_model

    return sum(p.numel() for p in build_model(presets.model("tiny"), seed=0).parameters())


# the plainest case and the hardest (an odd world: uneven splits; accumulation: the no-sync paths)
@pytest.mark.parametrize("world, grad_accum", [(2, 1), (3, 2)])
def test_sharded_strategies_match_one_process_hold_their_memory_and_move_their_bytes(world, grad_accum):
    cfg = dataclasses.replace(BASE, grad_accum=grad_accum)
    reference = reference_run(cfg, world)
    job = run(_sharded, cfg, LaunchOptions(nproc=world, timeout_s=90))
    res = job.results[0]
    assert sum(s["grad_norm"] > cfg.optim.clip for s in reference["steps"]) >= 5  # clipping was active
    psi, n = _num_params(), world
    formula = {"simple_ddp_ga": 16 * psi, "zero1": 8 * psi + 8 * psi / n, "pytorch_zero1": 8 * psi + 8 * psi / n,
               "zero2": 4 * psi + 12 * psi / n, "zero3": 16 * psi / n, "fsdp2": 16 * psi / n}
    ddp_wire = res["simple_ddp_ga"]["steps"][-1]["comm_wire_bytes"]
    for name, r in res.items():
        # parity: parameters within 1e-5 (relative) of one process, every rank the same model
        assert parity(r["params"], reference["params"]) <= 1e-5, name
        assert len({x[name]["checksum"] for x in job.results}) == 1, name
        assert [s["loss"] for s in r["steps"]] == pytest.approx([s["loss"] for s in reference["steps"]], rel=1e-4), name
        # memory: what the largest rank holds after the step is the formula (padding aside) ...
        held = r["steps"][-1]["model_state_bytes"]
        assert abs(held - formula[name]) / formula[name] <= 0.10, (name, held, formula[name])
        assert abs(held - r["expected_model_state_bytes"]) / r["expected_model_state_bytes"] <= 0.10, name
        # ... and the hand-written stages hold exactly their own account of it (no stray buffer)
        if name in ("zero1", "zero2", "zero3", "simple_ddp_ga"):
            assert held - r["expected_model_state_bytes"] < 1024, (name, held, r["expected_model_state_bytes"])
        # traffic: the layer counts exactly what the strategy claims, every step
        if r["expected_comm_bytes_per_step"] is not None:
            assert {s["comm_bytes"] for s in r["steps"]} == {r["expected_comm_bytes_per_step"]}, name
    # on the wire, ZeRO-1/2 move DDP's volume; ZeRO-3 1.5x it per micro-batch (padding and the
    # 4-byte norm aside)
    for name, factor in (("zero1", 1.0), ("zero2", 1.0), ("zero3", 1.5 * grad_accum)):
        wire = res[name]["steps"][-1]["comm_wire_bytes"]
        assert wire / ddp_wire == pytest.approx(factor, rel=2e-3), name
    # FSDP2's all-gathers and reduce-scatters go through the layer (its exact bytes: checked above):
    # per micro-batch one all-gather per unit and one more per block (resharded after forward), one
    # reduce-scatter per unit at the end; ZeroRedundancyOptimizer's broadcasts are torch's own: only DDP's
    units = presets.model("tiny").num_layers + 1
    assert res["fsdp2"]["expected_comm_bytes_per_step"] is not None
    assert {s["comm_calls"] for s in res["fsdp2"]["steps"]} == {grad_accum * (2 * units - 1) + units}
    assert res["pytorch_zero1"]["steps"][-1]["comm_bytes"] == res["simple_ddp_ga"]["steps"][-1]["comm_bytes"] == 4 * psi


@pytest.mark.parametrize("numel, world", [(10, 3), (12, 3), (1, 2), (1000003, 8)])
def test_flat_groups_split_evenly(numel, world):
    p = torch.nn.Parameter(torch.arange(numel, dtype=torch.float32))
    groups = [FlatGroup([p], ["p"], world, r) for r in range(world)]
    owned = [max(0, min(g.lo + g.shard_numel, numel) - g.lo) for g in groups]
    assert sum(owned) == numel and max(owned) - min(owned) <= world - 1  # the padding: fewer than N elements
    assert all(g.shard_numel == math.ceil(numel / world) and g.padded % world == 0 for g in groups)
    flat = groups[0].flatten([p.detach()])
    assert torch.equal(torch.cat([g.shard(flat) for g in groups])[:numel], p.detach())
    assert flat[numel:].abs().sum() == 0  # the padding is zeros


def _round_trip(ctx: RankContext, cfg: dict, keep: bool = False) -> dict:
    """Train `src` for 3 steps (or take the state given) and return its portable state; then load
    that state into each of `dst` in turn and return what each gives back."""
    from distval.train.model import build_model

    def fresh(name: str, seed: int):
        model = build_model(presets.model("tiny"), seed=seed)
        strategy = strategies.build(name, model, ctx.comm, cfg.get("strategy_cfg", StrategyConfig(bucket_mb=0.03)))
        return strategy, strategy.build_optimizer(torch.optim.AdamW, lr=1e-3, foreach=False)

    out: dict = {"state": cfg.get("state")}
    if out["state"] is None:
        strategy, optimizer = fresh(cfg["src"], BASE.seed)
        for step in range(3):
            tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(10 * step + ctx.rank))
            with strategy.micro_batch(is_last=True):
                strategy.module(tokens).float().pow(2).mean().backward()
            strategy.sync_gradients()
            strategy.clip_grad_norm(1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            strategy.after_step()
        out["state"], out["params"] = strategy.state_dict(optimizer), strategy.full_parameters()
        if keep:
            out["strategy"], out["optimizer"] = strategy, optimizer
            return out
    for name in cfg["dst"]:
        strategy, optimizer = fresh(name, seed=99)  # another init: everything must come from the state
        strategy.load_state_dict(optimizer, out["state"])
        out[name] = {"params": strategy.full_parameters(), "back": strategy.state_dict(optimizer)}
    return out if ctx.rank == 0 else {}


def _sharded_checkpoint(ctx: RankContext, cfg: dict) -> dict:
    """Save: train each strategy 3 steps, each rank writes its shards with
    torch.distributed.checkpoint, rank 0 returns the full form. Load: a fresh strategy reads the
    shards (resharded to this world size) and returns its full form."""
    import torch.distributed.checkpoint as dcp

    from distval.plan import presets
    from distval.train.model import build_model

    out = {}
    for name in cfg["names"]:
        where = f"{cfg['dir']}/{name}"
        if cfg["save"]:
            trained = _round_trip(ctx, {"src": name, "dst": [], "strategy_cfg": BASE.strategy_cfg}, keep=True)
            dcp.save(trained["strategy"].sharded_state_dict(trained["optimizer"]), checkpoint_id=where)
            out[name] = trained["state"]
        else:
            strategy = strategies.build(name, build_model(presets.model("tiny"), seed=99), ctx.comm, BASE.strategy_cfg)
            optimizer = strategy.build_optimizer(torch.optim.AdamW, lr=1e-3, foreach=False)
            state = strategy.sharded_state_dict(optimizer)
            dcp.load(state, checkpoint_id=where)
            strategy.finish_sharded_load(optimizer, state)
            out[name] = strategy.state_dict(optimizer)
    return out if ctx.rank == 0 else {}


def test_sharded_checkpoint_reshards_from_2_to_3_ranks(tmp_path):
    cfg = {"names": ["zero1", "zero3", "fsdp2"], "dir": str(tmp_path)}
    saved = run(_sharded_checkpoint, {**cfg, "save": True}, LaunchOptions(nproc=2, timeout_s=60)).results[0]
    for name in cfg["names"]:
        assert len(list((tmp_path / name).glob("*.distcp"))) == 2  # each rank wrote its own shards
    loaded = run(_sharded_checkpoint, {**cfg, "save": False}, LaunchOptions(nproc=3, timeout_s=60)).results[0]
    for name in cfg["names"]:
        _same_state(saved[name], loaded[name])
    assert saved["zero3"]["optim"]  # the state compared includes Adam's moments


def _same_state(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys() and a["optim"].keys() == b["optim"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k in a["optim"]:
        for m in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a["optim"][k][m].reshape(-1), b["optim"][k][m].reshape(-1)), (k, m)


def test_checkpoint_form_moves_between_strategies_and_world_sizes():
    # zero3 on 2 ranks -> zero2 on 2 ranks (other buckets): the state comes back bit for bit
    first = run(_round_trip, {"src": "zero3", "dst": ["zero2"]}, LaunchOptions(nproc=2, timeout_s=60)).results[0]
    assert torch.equal(first["params"], first["zero2"]["params"])
    _same_state(first["state"], first["zero2"]["back"])
    assert len(first["state"]["optim"]) == len(first["state"]["model"])  # every parameter has Adam state
    # ... and on 3 ranks into the other sharded strategies and a DDP
    dst = ["fsdp2", "pytorch_zero1", "zero1", "zero3", "pytorch_ddp"]
    again = run(_round_trip, {"state": first["state"], "dst": dst}, LaunchOptions(nproc=3, timeout_s=60)).results[0]
    for name in dst:
        assert torch.equal(again[name]["params"], first["params"]), name
        _same_state(first["state"], again[name]["back"])


def test_bad_sharding_input_is_one_line_exit_2(tmp_path, cli):
    out = tmp_path / "never.json"
    cases = [
        (["train", "--strategy", "zero9"], "unknown strategy 'zero9'"),
        (["train", "--strategy", "zero1", "--mixed-precision", "bf16"], "use --strategy fsdp2"),
        (["train", "--strategy", "fsdp2", "--mixed-precision", "fp8"], "--mixed-precision must be none, bf16 or fp16"),
        (["train", "--strategy", "zero3", "--nproc", "200000"], "more than the"),
        (["compare", "--strategies", "zero1,zero4"], "unknown strategy 'zero4'"),
    ]
    for args, message in cases:
        r = cli(*args, "--json", str(out))
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


def test_compare_reports_sharded_memory_and_planner_prediction(tmp_path):
    out = tmp_path / "c.json"
    r = run_cli(
        "compare", "--nproc", "2", "--strategies", "zero3,fsdp2", "--steps", "2", "--json", str(out), timeout=240
    )
    assert r.returncode == 0, r.stderr
    assert "state (plan)" in r.stdout
    doc = json.loads(out.read_text())
    rows = {row["strategy"]: row for row in doc["tables"]["strategies"]["rows"]}
    psi = _num_params()
    for name, row in rows.items():
        assert row["max_rel_param_diff"] <= 1e-5
        assert abs(row["model_state_bytes"] - 8 * psi) / (8 * psi) < 0.02, name  # 16Ψ/2
        assert row["predicted_model_state_bytes"] == pytest.approx(8 * psi, rel=1e-9)
        assert row["predicted_peak_mem_bytes"] > row["predicted_model_state_bytes"]
    assert rows["zero3"]["comm_wire_bytes_per_step"] == pytest.approx(1.5 * 4 * psi, rel=2e-3)  # DDP's 2(n-1)/n·4Ψ = 4Ψ
    # FSDP2's collectives, counted by the layer, block the training thread on CPU: nothing hidden, and
    # its step splits into compute and the waits like any strategy's
    fsdp2 = rows["fsdp2"]
    assert fsdp2["comm_bytes_per_step"] == fsdp2["expected_comm_bytes_per_step"] and fsdp2["comm_hidden_frac"] == 0
    assert fsdp2["measured_split"] == "harness" and 0 < fsdp2["measured_exposed_comm_s"] < fsdp2["step_time_p50_s"]
    checks = {c["name"]: c["status"] for c in doc["checks"]}
    assert checks["compare zero3 model state"] == "OK" and checks["compare fsdp2 parity"] == "OK"
