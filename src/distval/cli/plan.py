"""`distval plan`: the cost model of a training step, from flags (no ranks are started, torch is
not imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from distval.cli.app import app, check_outputs, finish, make_console
from distval.cli.app import option as O  # noqa: N812 (short: the signature below is long)


@app.command("plan")
def plan(
    model: Annotated[
        Optional[str],
        O(
            "--model",
            help="Model preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, smollm2-135m, smollm2-360m, smollm2-1.7b, "
            "llama-7b, llama-70b, tiny, small.",
        ),
    ] = None,
    params: Annotated[
        Optional[str],
        O("--params", help="Parameter count, e.g. 760e6, 760M, 1.5B (alone, or correcting a preset by up to 10%)."),
    ] = None,
    layers: Annotated[Optional[int], O("--layers", help="Transformer blocks.")] = None,
    hidden: Annotated[Optional[int], O("--hidden", help="Hidden size.")] = None,
    heads: Annotated[Optional[int], O("--heads", help="Attention heads.")] = None,
    kv_heads: Annotated[
        Optional[int], O("--kv-heads", help="Key/value heads (grouped-query attention; default --heads).")
    ] = None,
    seq: Annotated[Optional[int], O("--seq", help="Sequence length in tokens.")] = None,
    vocab: Annotated[Optional[int], O("--vocab", help="Vocabulary size.")] = None,
    micro_batch: Annotated[
        Optional[int], O("--micro-batch", help="Sequences per rank per micro-batch (default 1).")
    ] = None,
    global_batch: Annotated[
        Optional[int], O("--global-batch", help="Sequences per optimizer step over all ranks.")
    ] = None,
    grad_accum: Annotated[Optional[int], O("--grad-accum", help="Micro-batches per rank per optimizer step.")] = None,
    param_dtype: Annotated[
        str, O("--param-dtype", help="fp32, bf16 or fp16 (16-bit: mixed precision with an fp32 master copy).")
    ] = "fp32",
    grad_dtype: Annotated[Optional[str], O("--grad-dtype", help="Gradient dtype (default: as the params).")] = None,
    optim_dtype: Annotated[str, O("--optim-dtype", help="Dtype of Adam's moments.")] = "fp32",
    world: Annotated[Optional[int], O("--world", help="Ranks on one flat network.")] = None,
    nodes: Annotated[Optional[int], O("--nodes", help="Nodes (two-level: with --devices-per-node).")] = None,
    devices_per_node: Annotated[Optional[int], O("--devices-per-node", help="Ranks per node.")] = None,
    nics_per_node: Annotated[
        Optional[int], O("--nics-per-node", help="NICs per node (default one per device).")
    ] = None,
    link: Annotated[
        Optional[str],
        O(
            "--link",
            help="Link preset between ranks: 1GbE, 2.5GbE, 10GbE, 25GbE, 100G/200G/400G-IB or -RoCE, "
            "PCIe4, PCIe5, NVLink3, NVLink4, xGMI.",
        ),
    ] = None,
    intra_link: Annotated[Optional[str], O("--intra-link", help="Link preset inside a node.")] = None,
    inter_link: Annotated[Optional[str], O("--inter-link", help="Link preset between nodes (per rank's NIC).")] = None,
    bandwidth: Annotated[
        Optional[float], O("--bandwidth", help="Link rate per rank and direction, GB/s (1e9 B/s), instead of --link.")
    ] = None,
    latency: Annotated[
        Optional[float], O("--latency", help="Per-message latency of --bandwidth's link, µs (default 0).")
    ] = None,
    efficiency: Annotated[float, O("--efficiency", help="Share of the link rate collectives reach.")] = 0.85,
    device: Annotated[
        str, O("--device", help="Device preset: RTX-4070, L4, A100, H100, H200, MI300X, cpu (measured).")
    ] = "cpu",
    peak_tflops: Annotated[
        Optional[float], O("--peak-tflops", help="Peak TFLOP/s per device instead of the preset's.")
    ] = None,
    device_memory: Annotated[
        Optional[float], O("--device-memory", help="Memory per device, GiB, instead of the preset's.")
    ] = None,
    mfu: Annotated[float, O("--mfu", help="Achieved fraction of peak on the executed FLOPs.")] = 0.4,
    strategy: Annotated[str, O("--strategy", help="ddp, zero1, zero2, zero3 or fsdp.")] = "ddp",
    bucket_mb: Annotated[float, O("--bucket-mb", help="DDP bucket (and ZeRO bucket) size, MiB.")] = 25.0,
    overlap: Annotated[
        bool, O("--overlap/--no-overlap", help="Overlap communication with backward (and prefetch for ZeRO-3).")
    ] = True,
    activation_checkpointing: Annotated[
        bool, O("--activation-checkpointing", help="Recompute each block's activations in backward.")
    ] = False,
    attention: Annotated[str, O("--attention", help="flash (no T×T scores kept) or eager.")] = "flash",
    comm_hook: Annotated[
        str, O("--comm-hook", help="Gradient compression: none, bf16, fp16, powersgd (ddp).")
    ] = "none",
    powersgd_rank: Annotated[int, O("--powersgd-rank", help="PowerSGD matrix approximation rank.")] = 4,
    comm_target: Annotated[float, O("--comm-target", help="Comm share of the step the levers aim under.")] = 0.1,
    calibration: Annotated[
        Optional[Path],
        O("--calibration", help="A `distval comm bench --json` file: use its measured α and β per collective."),
    ] = None,
    sweep: Annotated[
        Optional[str],
        O("--sweep", help="NAME=v1,v2,...: one row per value of one input, e.g. link=1GbE,10GbE or world=2,8,64."),
    ] = None,
    json: Annotated[Optional[Path], O("--json", help="Write the report as JSON (schema distval.report/1).")] = None,
) -> int:
    """Cost model of a training step: comm/compute time, memory per rank per strategy, scaling, levers."""
    from distval.plan import report as plan_report
    from distval.plan.config import PlanConfig, parse_count
    from distval.results import write_json

    cfg = PlanConfig(
        model=model,
        params=parse_count(params) if params is not None else None,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        seq_len=seq,
        vocab_size=vocab,
        micro_batch=micro_batch,
        global_batch=global_batch,
        grad_accum=grad_accum,
        param_dtype=param_dtype,
        grad_dtype=grad_dtype,
        optim_dtype=optim_dtype,
        world_size=world,
        num_nodes=nodes,
        devices_per_node=devices_per_node,
        nics_per_node=nics_per_node,
        link=link,
        intra_link=intra_link,
        inter_link=inter_link,
        bandwidth_gbps=bandwidth,
        latency_us=latency,
        efficiency=efficiency,
        device=device,
        peak_tflops=peak_tflops,
        device_memory_gb=device_memory,
        mfu=mfu,
        strategy=strategy,
        bucket_mb=bucket_mb,
        overlap=overlap,
        activation_checkpointing=activation_checkpointing,
        attention=attention,
        comm_hook=comm_hook,
        powersgd_rank=powersgd_rank,
        comm_target=comm_target,
        calibration=str(calibration) if calibration is not None else None,
    )
    check_outputs({"--json": json})
    report = plan_report.sweep_report(cfg, sweep) if sweep else plan_report.build_report(cfg)
    console = make_console()
    code = finish(plan_report.readable(report), None, console)  # the terminal copy shows GB
    if json:
        write_json(report, json)
        console.print(f"wrote {json}")
    return code
