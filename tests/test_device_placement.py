"""Device placement without a GPU: the model on `meta` stands for the rank's GPU, and
`DevicePlacement` (tests/placement.py) raises on every op that mixes devices, as CUDA does.

On main before this test, zero1/2/3 failed at their first step on a GPU (the norm's sum of squares
lived on the host) and every resume failed (the optimizer state loaded from a checkpoint stayed on
the host): both raise here, on 2 CPU-only Gloo ranks. torch's own wrappers (DDP, ZeroRedundancy-
Optimizer, FSDP2) cannot be built on `meta` (DDP reads parameter shapes back with .item(); FSDP2
needs a device module); `benchmarks/gpu_check.sh` covers them on a GPU."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from distval.ckpt import store
from distval.launch import LaunchOptions, run
from distval.plan import presets
from distval.rank import RankContext
from distval.strategies import build
from distval.strategies.base import StrategyConfig, initial_adam_state, optimizer_state_like
from distval.train.loop import loss_of
from distval.train.model import build_model

from placement import DevicePlacement, DevicePlacementError

HAND_WRITTEN = ["simple_ddp", "simple_ddp_ga", "simple_ddp_hook", "simple_ddp_async", "bucket_ddp_async",
                "zero1", "zero2", "zero3"]
CFG = StrategyConfig(bucket_mb=0.05)  # several buckets on `tiny`


def _step(strategy, optimizer, device: str) -> torch.Tensor:
    tokens = torch.arange(32, dtype=torch.int64).reshape(2, 16).to(device)
    with strategy.micro_batch(is_last=True):
        loss_of(strategy.module(tokens), {"tokens": tokens}).backward()
    strategy.sync_gradients()
    norm = strategy.clip_grad_norm(1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    strategy.after_step()
    return norm


def _built(name: str, ctx: RankContext, device: str):
    model = build_model(presets.model("tiny"), device=device)
    strategy = build(name, model, ctx.comm, CFG)
    return strategy, strategy.build_optimizer(torch.optim.AdamW, lr=1e-3, foreach=False)


def _placement(strategy, optimizer) -> dict[str, list[str]]:
    """Where every tensor of the model state lives, by role."""
    out: dict[str, set[str]] = {"params": set(), "moments": set(), "step": set()}
    out["params"].update(str(p.device) for p in strategy.model.parameters())
    for st in optimizer.state.values():
        for key, value in st.items():
            out["step" if key == "step" else "moments"].add(str(value.device))
    return {k: sorted(v) for k, v in out.items()}


def _rank(ctx: RankContext, cfg: dict) -> dict:
    results = {}
    for name in cfg["strategies"]:
        # a checkpoint saved on the host: one CPU step, the full form written as the checkpointer writes it
        cpu_strategy, cpu_opt = _built(name, ctx, "cpu")
        _step(cpu_strategy, cpu_opt, "cpu")
        state = cpu_strategy.state_dict(cpu_opt)
        cpu_strategy.close()
        where = Path(cfg["dir"]) / name
        if ctx.rank == 0:
            where.mkdir()
            store.write_tensors(where, "model.safetensors", store.flatten(state))
        ctx.control_comm.barrier()
        try:
            with DevicePlacement() as mode:
                strategy, optimizer = _built(name, ctx, "meta")
                norm = _step(strategy, optimizer, "meta")
                # as the checkpointer loads: the file read into host memory, each tensor placed by the strategy
                strategy.load_state_dict(optimizer, store.load_tensors(where, "model.safetensors"))
                placed = _placement(strategy, optimizer)
                _step(strategy, optimizer, "meta")  # the first step of a resumed run
                strategy.close()
            results[name] = {"ops": mode.ops, "norm_device": str(norm.device), **placed}
        except DevicePlacementError as e:
            results[name] = {"error": str(e)}
    return results


def test_hand_written_strategies_step_and_resume_on_the_model_device():
    with tempfile.TemporaryDirectory() as d:
        job = run(_rank, {"strategies": HAND_WRITTEN, "dir": d}, LaunchOptions(nproc=2, timeout_s=60))
    for rank_result in job.results:
        for name in HAND_WRITTEN:
            row = rank_result[name]
            assert "error" not in row, (name, row)
            assert row["ops"] > 500  # forward, backward, optimizer: the mode saw the work
            assert row["norm_device"] == "meta"
            # parameters and Adam's moments on the model's device; AdamW (not fused) keeps 'step' on the host
            assert (row["params"], row["moments"], row["step"]) == (["meta"], ["meta"], ["cpu"]), (name, row)


def test_the_placement_rule_catches_a_host_tensor_in_a_device_op():
    grad = torch.empty(4, device="meta")
    with DevicePlacement():
        torch.zeros(1, device="meta").add_(grad.sum())  # same device
        grad.mul_(torch.tensor(0.5))  # a 0-dim host scalar joins a device op, as CUDA allows
        with pytest.raises(DevicePlacementError, match="cpu, meta"):
            torch.zeros(1).add_(grad.pow(2).sum())  # zero1/2/3's norm on main: "cuda:0 and cpu"
        with pytest.raises(DevicePlacementError, match="cpu, meta"):
            torch.zeros(4).lerp_(grad, 0.1)  # Adam's moment on the host, the gradient on the device


@pytest.mark.parametrize("flags, step_device", [({}, "cpu"), ({"capturable": True}, "meta"), ({"fused": True}, "meta")])
def test_optimizer_state_is_placed_as_the_optimizer_keeps_it(flags, step_device):
    p = torch.nn.Parameter(torch.empty(3, device="meta", dtype=torch.bfloat16))
    optimizer = torch.optim.AdamW([p], **flags)
    loaded = {"step": torch.tensor(7.0, dtype=torch.float64), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
    placed = optimizer_state_like(optimizer, p, loaded)
    assert placed["step"].device.type == step_device and placed["step"].dtype == torch.float32
    assert all(placed[k].device.type == "meta" and placed[k].dtype == torch.bfloat16 for k in ("exp_avg", "exp_avg_sq"))
    fresh = initial_adam_state(optimizer, p)
    assert fresh["step"].device.type == step_device and fresh["exp_avg"].device.type == "meta"



def test_adamw_is_fused_on_cuda_and_mfu_is_against_the_gpus_datasheet_peak(monkeypatch):
    """On CUDA the harness steps with the fused AdamW (a bare loop's choice; foreach for FSDP2's
    DTensor shards) and quotes MFU against the detected GPU's dense bf16 datasheet peak; on CPU
    the single-tensor AdamW and a measured fp32 matmul rate, as before."""
    from distval import strategies
    from distval.train.loop import device_peak_flops, optimizer_impl

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert optimizer_impl(cpu, strategies.REGISTRY["pytorch_ddp"]) == {"foreach": False}
    assert optimizer_impl(cuda, strategies.REGISTRY["pytorch_ddp"]) == {"fused": True}
    assert optimizer_impl(cuda, strategies.REGISTRY["zero2"]) == {"fused": True}
    assert optimizer_impl(cuda, strategies.REGISTRY["fsdp2"]) == {"foreach": True}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert device_peak_flops(cuda) == presets.device("H100").peak_tflops * 1e12
    assert 1e8 < device_peak_flops(cpu) < 1e14


def test_dataparallel_is_one_process_and_a_skip_without_two_gpus(cli):
    """dp (nn.DataParallel) is compared as one process with the whole batch; on this host
    (no GPU) `compare` says why it cannot run it, and `train` refuses more than one rank."""
    from distval.strategies.dataparallel import unavailable
    from distval.train.compare import gpu_memory_check

    assert unavailable() == "nn.DataParallel splits each batch over 2 or more local GPUs; this host has 0"
    res = cli("train", "--strategy", "dp", "--nproc", "2")
    assert res.returncode == 2 and "dp is one process driving every local GPU: run it with --nproc 1" in res.stderr
    check = gpu_memory_check("dp", [3 * 2**30, 2**30, 2**30 + 2**20])
    assert check.summary == "GPU 0 peaks at 3,072 MiB, the other 2 at up to 1,025 MiB, 3.00x the others"


def test_compile_is_refused_where_the_strategy_cannot_be_compiled(cli):
    res = cli("train", "--compile", "--strategy", "zero3")
    assert res.returncode == 2 and "--compile: zero3 gathers each layer's parameters in forward hooks" in res.stderr
    assert "compile one of simple_ddp, " in res.stderr and "zero3," not in res.stderr
