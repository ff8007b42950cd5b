"""The RCCL, HSA (ROCr) and HIP environment variables a distributed job on AMD GPUs depends on:
the names the libraries read, so a misspelt one is caught (RCCL ignores a name it does not know,
silently), and the settings AMD's documentation advises for or against. Every rule names its
source; docs/doctor.md lists them.

Names: RCCL's `RCCL_PARAM` / `NCCL_PARAM` declarations (ROCm/rccl at 0cbce2a, October 2024, and
the variables newer RCCL documentation names), ROCr's `flag.h` and libhsakmt for HSA_*. A name
not in these lists is only a WARN with the nearest known name: a newer RCCL may read it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

RCCL_NAMES = frozenset("""
RCCL_CLIQUE_ALLREDUCE_BYTE_LIMIT RCCL_CLIQUE_ALLREDUCE_NCHANNELS RCCL_CLIQUE_IGNORE_TOPO RCCL_DUMP_ROME_MODEL_FILE
RCCL_ENABLE_CLIQUE RCCL_ENABLE_INTRANET RCCL_ENABLE_SIGNALHANDLER RCCL_FORCE_ENABLE_GDRDMA RCCL_INTRANET_THRESHOLD
RCCL_KERNEL_COLL_TRACE_ENABLE RCCL_LL128_FORCE_ENABLE RCCL_MODEL_MATCHING_DISABLE RCCL_MSCCLPP_ENABLE
RCCL_MSCCLPP_THRESHOLD RCCL_MSCCL_ENABLE RCCL_MSCCL_ENABLE_SINGLE_PROCESS RCCL_MSCCL_FORCE_ENABLE
RCCL_MSCCL_FORCE_FULLOPS RCCL_MSCCL_WORK_FIFO_DEPTH RCCL_NET_CONTIGUOUS_MEM RCCL_P2P_NET_DISABLE RCCL_P2P_NET_THRESHOLD
RCCL_PIVOT_ALLTOALL_ENABLE RCCL_ROCR_PATH RCCL_STACK_SIZE_OVERRIDE RCCL_TREES RCCL_USE_ROCM_SMI_LIB
RCCL_IB_QPS_PER_P2P RCCL_IB_ABORT_ON_ERROR RCCL_USE_AMD_SMI_LIB RCCL_MODEL_REVERSAL_DISABLE
RCCL_ANVIL_TWO_SHOT_ALLREDUCE RCCL_ALL_TO_ALL_PIVOT_ENABLE RCCL_LOG_LEVEL RCCL_DIRECT_ALLGATHER_DISABLE
RCCL_IB_SPLIT_DATA_THRESHOLD RCCL_SATURATE_P2P_NCHANNELS RCCL_ENABLE_CONTEXT_TRACKING RCCL_PROXYTRACE
RCCL_IGNORE_ARCH_TABLE RCCL_DDA_THRESHOLD RCCL_DDA_LL_THRESHOLD RCCL_DDA_LL128 RCCL_DDA_LL128_THRESHOLD
RCCL_CE_ALLREDUCE RCCL_FORCE_CE_ALLREDUCE RCCL_CE_AR_MAX_MSG_BYTES RCCL_CE_AR_REG_MAX_MSG_BYTES RCCL_CE_AR_STAGING_BYTES
RCCL_KERNEL_COLL_TRACE_THREAD_ENABLE
""".split())

HSA_NAMES = frozenset("""
HSA_ALLOCATE_QUEUE_DEV_MEM HSA_ASYNCEVENTS_THREAD_PRIORITY HSA_CHECK_FLAT_SCRATCH HSA_COOP_CU_COUNT
HSA_CO_DMACOPY_SIZE HSA_CU_MASK HSA_CU_MASK_SKIP_INIT HSA_DISABLE_FRAGMENT_ALLOCATOR HSA_DISABLE_IMAGE
HSA_DISABLE_PC_SAMPLING HSA_DISCOVER_COPY_AGENTS HSA_ENABLE_DEBUG HSA_ENABLE_DTIF HSA_ENABLE_INTERRUPT
HSA_ENABLE_IPC_MODE_LEGACY HSA_ENABLE_MWAITX HSA_ENABLE_PEER_SDMA HSA_ENABLE_QUEUE_FAULT_MESSAGE HSA_ENABLE_SCRATCH_ALT
HSA_ENABLE_SCRATCH_ASYNC_RECLAIM HSA_ENABLE_SDMA HSA_ENABLE_SDMA_COPY_SIZE_OVERRIDE HSA_ENABLE_SDMA_GANG
HSA_ENABLE_SDMA_HDP_FLUSH HSA_ENABLE_SDMA_RECOMMENDED_ENG HSA_ENABLE_SRAMECC HSA_ENABLE_VM_FAULT_MESSAGE
HSA_FORCE_FINE_GRAIN_PCIE HSA_FORCE_SDMA_SIZE HSA_IGNORE_SRAMECC_MISREPORT HSA_IMAGE_ENABLE_3D_SWIZZLE_DEBUG
HSA_IMAGE_PRINT_SRD HSA_LOADER_ENABLE_MMAP_URI HSA_MAX_QUEUES HSA_NO_SCRATCH_RECLAIM HSA_NO_SCRATCH_THREAD_LIMITER
HSA_OVERRIDE_CPU_AFFINITY_DEBUG HSA_PCS_MAX_DEVICE_BUFFER_SIZE HSA_REV_COPY_DIR HSA_RUNNING_UNDER_VALGRIND
HSA_SCRATCH_MEM HSA_SCRATCH_SINGLE_LIMIT HSA_SCRATCH_SINGLE_LIMIT_ASYNC HSA_SDMA_WAIT_IDLE
HSA_SIGNAL_WAIT_ABORT_TIMEOUT HSA_SVM_PROFILE HSA_TOOLS_DISABLE_REGISTER HSA_TOOLS_LIB HSA_TOOLS_REPORT_LOAD_FAILURE
HSA_TOOLS_REPORT_REGISTER_FAILURE HSA_WAIT_ANY_DEBUG HSA_XNACK HSA_OVERRIDE_GFX_VERSION HSA_SVM_GUARD_PAGES
""".split())
_PER_NODE = re.compile(r"^HSA_OVERRIDE_GFX_VERSION_\d+$")  # libhsakmt's per-node override


@dataclass(frozen=True)
class Finding:
    """One thing to say about the environment: `level` "warn" (likely to hurt) or "advice"."""

    variable: str
    level: str
    text: str
    fix: str
    source: str


def unknown_names(env: Mapping[str, str]) -> list[Finding]:
    """RCCL_* and HSA_* names that neither library reads, with the nearest known name."""
    out = []
    for name in sorted(env):
        known = RCCL_NAMES if name.startswith("RCCL_") else HSA_NAMES if name.startswith("HSA_") else None
        if known is None or name in known or _PER_NODE.match(name):
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        out.append(Finding(name, "warn", f"{name} is not a variable {'RCCL' if name.startswith('RCCL_') else 'ROCr'} "
                           "reads: it has no effect" + (f" (did you mean {near[0]}?)" if near else ""),
                           f"rename it to {near[0]}" if near else "remove it, or check the name in the documentation "
                           "of your RCCL/ROCm release (a newer one may read it)",
                           "RCCL_PARAM names of ROCm/rccl; ROCr flag.h"))
    return out


def _on(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def advice(env: Mapping[str, str], *, products: list[str], gpus_in_job: int | None, rocm: tuple[int, ...],
           xgmi: bool | None) -> list[Finding]:
    """Settings known to hurt, and advised ones that are missing, for this host: `products` the
    GPUs' product names (MI300X, ...), `gpus_in_job` how many GPUs a process group spans here,
    `rocm` the ROCm version ((): unknown), `xgmi` whether the GPUs are linked by xGMI."""
    out: list[Finding] = []
    mi300 = any(p.startswith("MI3") for p in products)
    if _on(env.get("NCCL_P2P_DISABLE")) and xgmi:
        out.append(Finding("NCCL_P2P_DISABLE", "warn", "NCCL_P2P_DISABLE=1 on GPUs linked by xGMI: RCCL copies through "
                           "host shared memory instead of the xGMI links, several times slower",
                           "unset NCCL_P2P_DISABLE (xGMI P2P is the fast path)", "RCCL documentation: P2P transport"))
    if "HSA_OVERRIDE_GFX_VERSION" in env and products:
        value = env["HSA_OVERRIDE_GFX_VERSION"]
        out.append(Finding("HSA_OVERRIDE_GFX_VERSION", "warn", f"HSA_OVERRIDE_GFX_VERSION={value} "
                           f"on {', '.join(sorted(set(products)))}: a workaround for consumer GPUs ROCm does not "
                           "support; on an Instinct it makes kernels for another gfx target load",
                           "unset HSA_OVERRIDE_GFX_VERSION", "ROCm/ROCm#3065 (AMD: not needed on supported GPUs)"))
    if env.get("HSA_ENABLE_SDMA", "").strip() == "0":
        out.append(Finding("HSA_ENABLE_SDMA", "advice", "HSA_ENABLE_SDMA=0: copies run as blit kernels on the compute "
                           "units instead of the DMA engines (and HSA_ENABLE_PEER_SDMA is ignored): they take CUs from "
                           "the GEMMs they should overlap", "unset it unless a measurement shows it helps",
                           "ROCr env_variables.rst"))
    if mi300 and rocm and rocm < (6, 4) and not _on(env.get("HSA_NO_SCRATCH_RECLAIM")):
        out.append(Finding("HSA_NO_SCRATCH_RECLAIM", "advice", f"ROCm {'.'.join(map(str, rocm))} on MI300: AMD advises "
                           "HSA_NO_SCRATCH_RECLAIM=1 before ROCm 6.4 (collective latency; some workloads crash "
                           "without it)",
                           "export HSA_NO_SCRATCH_RECLAIM=1", "RCCL docs, how-to/perform-testing.rst"))
    if mi300 and gpus_in_job is not None and 1 < gpus_in_job < 8:
        current = env.get("NCCL_MIN_NCHANNELS", "").strip()
        if not current.isdigit() or int(current) < 32:
            out.append(Finding("NCCL_MIN_NCHANNELS", "advice", f"{gpus_in_job} of the MI300-class GPUs in one job"
                               + (f" with NCCL_MIN_NCHANNELS={current}" if current else "")
                               + ": RCCL advises NCCL_MIN_NCHANNELS=32 on fewer than 8 (fewer xGMI links per GPU to "
                               "fill)", "export NCCL_MIN_NCHANNELS=32", "RCCL README / rccl-usage-tips"))
    if _on(env.get("RCCL_MSCCL_ENABLE")) or _on(env.get("RCCL_MSCCLPP_ENABLE")):
        which = "RCCL_MSCCLPP_ENABLE" if _on(env.get("RCCL_MSCCLPP_ENABLE")) else "RCCL_MSCCL_ENABLE"
        out.append(Finding(which, "advice", f"{which}=1: AMD's Megatron container sets RCCL_MSCCL_ENABLE=0 'to avoid "
                           "data corruption/mismatch issue that existed in past releases', and newer RCCL removed "
                           "MSCCL/MSCCL++", "check `distval comm check` passes with it (exact results), or set 0",
                           "ROCm docs, prerequisite-system-validation.rst; rccl-usage-tips.rst"))
    return out
