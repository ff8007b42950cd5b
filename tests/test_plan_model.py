"""The planner's figures against independent computations: published parameter counts, the
all-reduce time table of a 760M-parameter model over 1/10/400 Gbit links, the ring/tree/hierarchical
formulas, the ZeRO memory and traffic formulas, Korthikanti's activation count, PaLM's FLOPs, and
the levers' own promises. Pure computation."""

import dataclasses
import math

import pytest

from distval import knobs
from distval.plan import PlanConfig, evaluate, memory_rows, presets
from distval.plan.levers import accumulation_lever, at_world, lever_rows, scaling_rows
from distval.plan.memory import activations, block_bytes_per_token, model_states
from distval.plan.network import Link, Network
from distval.plan.report import collectives_rows
from distval.plan.steps import MIB, buckets, powersgd_ratio

H100 = {"device": "H100"}  # a datasheet peak: no measurement, deterministic


@pytest.mark.parametrize("name, published", [
    ("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200),
    ("smollm2-135m", 134_515_008), ("smollm2-360m", 361_821_120), ("smollm2-1.7b", 1_711_376_384),
    ("llama-7b", 6_738_415_616), ("llama-70b", 68_976_648_192),
])
def test_preset_parameter_counts_match_the_published_totals(name, published):
    assert presets.model(name).num_params() == published


def test_distval_workload_presets_are_as_stated():
    tiny, small = presets.model("tiny"), presets.model("small")
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.num_kv_heads, tiny.seq_len, tiny.vocab_size) == (
        2,
        64,
        4,
        2,
        64,
        256,
    )
    assert (
        small.num_layers,
        small.hidden_size,
        small.num_heads,
        small.num_kv_heads,
        small.seq_len,
        small.vocab_size,
    ) == (6, 384, 6, 2, 256, 8192)
    # SwiGLU width: 8/3·h rounded up to a multiple of 64
    assert tiny.ffn_hidden_size == 192 and small.ffn_hidden_size == 1024
    # tiny by hand: q, o 64x64; k, v 64x(2 kv heads x 16); 3 MLP matrices 64x192; 2 RMSNorms; tied embedding; final norm
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192 + 2 * 64
    assert tiny.num_params() == 2 * per_layer + 256 * 64 + 64
    assert 10e6 <= small.num_params() <= 20e6


def test_preset_lookup_ignores_case_and_separators_and_lists_known_names():
    assert presets.link("400g_roce").name == "400G-RoCE" and presets.device("rtx 4070").name == "RTX-4070"
    with pytest.raises(ValueError, match=r"unknown model preset \(--model\) 'gpt5'; known: tiny, small, gpt2"):
        presets.model("gpt5")


# -- a published table: 760M params, bf16 grads, 2 ranks, ring all-reduce at 85% of the link ------

@pytest.mark.parametrize(
    "link, gbit, table_s", [("1GbE", 1, 14.0), ("10GbE", 10, 1.4), ("400G-RoCE", 400, 0.036)]
)
def test_ring_all_reduce_time_table(link, gbit, table_s):
    r = evaluate(PlanConfig(params=760e6, grad_dtype="bf16", world_size=2, link=link, **H100))
    size = 760e6 * 2
    ring = 2 * (2 - 1) / 2 * size / (gbit * 1e9 / 8 * 0.85)  # the table's formula: 2(N-1)/N S / (B * 0.85)
    assert r.comm_time_s == pytest.approx(ring, rel=0.02)  # the plan adds 2α per bucket
    assert r.comm_time_s == pytest.approx(table_s, rel=0.05)  # the table prints rounded figures
    # exactly: S/B plus 2(N-1)α for each of DDP's buckets (1 MiB first, then 25 MiB)
    spec = presets.link(link)
    num_buckets = 1 + math.ceil((size - 2**20) / (25 * 2**20))
    assert r.comm_time_s == pytest.approx(ring + num_buckets * 2 * spec.latency_us * 1e-6, rel=1e-9)
    assert sum(row["count"] for row in collectives_rows(r)) == num_buckets


# -- collective formulas (Thakur et al. 2005; docs/plan.md) ----------------------------------------

def test_ring_all_reduce_all_gather_reduce_scatter():
    link = Link("x", alpha_s=20e-6, bytes_per_s=10e9, source="given")
    net = Network(num_nodes=4, devices_per_node=1, nics_per_node=1, intra=None, inter=link)
    s, n = 64e6, 4
    t, algorithm, _ = net.time("all_reduce", s)
    assert algorithm == "ring" and t == pytest.approx(2 * (n - 1) * 20e-6 + 2 * (n - 1) / n * s / 10e9)
    for op in ("all_gather", "reduce_scatter"):
        assert net.time(op, s)[0] == pytest.approx((n - 1) * 20e-6 + (n - 1) / n * s / 10e9)


def test_tree_wins_for_small_messages_at_large_world():
    link = Link("x", alpha_s=5e-6, bytes_per_s=50e9, source="preset")
    net = Network(num_nodes=64, devices_per_node=1, nics_per_node=1, intra=None, inter=link)
    t, algorithm, _ = net.time("all_reduce", 1024)
    assert algorithm == "tree" and t == pytest.approx(2 * 6 * 5e-6 + 2 * 1024 / 50e9)
    assert net.time("all_reduce", 1e9)[1] == "ring"


def test_hierarchical_all_reduce_over_nvlink_and_ethernet():
    cfg = PlanConfig(params=1e8, num_nodes=2, devices_per_node=8, intra_link="NVLink4", inter_link="10GbE", **H100)
    net = evaluate(cfg).inputs.network
    s, d, m = 100e6, 8, 2
    bi, ai = 450e9 * 0.85, 2e-6
    be, ae = 1.25e9 * 0.85, 30e-6
    expected = ((d - 1) * ai + (d - 1) / d * s / bi) * 2 + 2 * (m - 1) * ae + 2 * (m - 1) / m * (s / d) / be
    t, algorithm, _ = net.time("all_reduce", s)
    assert algorithm == "hierarchical" and t == pytest.approx(expected)
    # fewer NICs than devices: the node's NIC is shared by its ranks
    shared = evaluate(dataclasses.replace(cfg, nics_per_node=1)).inputs.network
    assert shared.link_for("inter", "all_reduce").bytes_per_s == pytest.approx(be / 8)


# -- memory (ZeRO paper) --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, expected", [
    ("bf16", {"ddp": 16, "zero1": 4 + 12 / 8, "zero2": 2 + 14 / 8, "zero3": 16 / 8, "fsdp": 16 / 8}),
    ("fp32", {"ddp": 16, "zero1": 8 + 8 / 8, "zero2": 4 + 12 / 8, "zero3": 16 / 8, "fsdp": 16 / 8}),
])
def test_model_state_memory_mixed_precision_and_fp32(dtype, expected):
    psi = 1e9
    r = evaluate(PlanConfig(params=psi, world_size=8, param_dtype=dtype, **H100))
    rows = {row["strategy"]: row for row in memory_rows(r.inputs)}
    for strategy, factor in expected.items():
        row = rows[strategy]
        assert row["model_state_bytes"] == pytest.approx(factor * psi)
        assert row["params_bytes"] + row["grads_bytes"] + row["optimizer_bytes"] == pytest.approx(factor * psi)
        assert row["activations_bytes"] is None  # a count alone: no shape
    assert model_states("zero2", 100, 4, 2, 2, 12) == (200, 50, 300)


def test_activations_reproduce_korthikanti_for_gpt2():
    spec = presets.model("gpt2-large")
    h, a, t = spec.hidden_size, spec.num_heads, 1024
    assert block_bytes_per_token(spec, t, 2, "eager") == 34 * h + 5 * a * t  # 34sbh + 5as²b per token
    # flash attention keeps no T×T scores: 16-bit activations, the fp32 log-sum-exp, the two dropout masks
    assert block_bytes_per_token(spec, t, 2, "flash") == 2 * 16 * h + 4 * a + 2 * h
    full = activations(spec, t, 4, 2, "flash", checkpointed=False)
    ckpt = activations(spec, t, 4, 2, "flash", checkpointed=True)
    head = 2 * h + 2 * spec.vocab_size + 4 * spec.vocab_size
    assert full == 4 * t * (spec.num_layers * block_bytes_per_token(spec, t, 2, "flash") + head)
    assert ckpt == 4 * t * (spec.num_layers * 2 * h + block_bytes_per_token(spec, t, 2, "flash") + head)


# -- traffic --------------------------------------------------------------------------------------

def _sent(strategy: str, **kw) -> float:
    r = evaluate(
        PlanConfig(model="gpt2", world_size=8, param_dtype="bf16", link="10GbE", strategy=strategy, **H100, **kw)
    )
    return sum(row["sent_bytes_per_rank"] for row in collectives_rows(r))


def test_traffic_zero12_equal_ddp_zero3_is_three_psi():
    psi, n = presets.model("gpt2").num_params(), 8
    ddp = _sent("ddp")
    assert ddp == pytest.approx(2 * (n - 1) / n * psi * 2)  # 2Ψ elements of 2 bytes
    assert _sent("zero1") == pytest.approx(ddp) and _sent("zero2") == pytest.approx(ddp)
    assert _sent("zero3") == pytest.approx(1.5 * ddp)  # 3Ψ
    root = presets.model("gpt2").root_params()
    assert _sent("fsdp") == pytest.approx(1.5 * ddp - (n - 1) / n * root * 2)  # the root is not gathered again
    # with accumulation: ZeRO-2's reduce-scatter runs every micro-batch, ZeRO-3 does everything every micro-batch
    assert _sent("ddp", grad_accum=4) == pytest.approx(ddp)
    assert _sent("zero2", grad_accum=4) == pytest.approx((n - 1) / n * psi * 2 * (4 + 1))
    assert _sent("zero3", grad_accum=4) == pytest.approx(4 * 1.5 * ddp)


def test_a_total_of_whole_buckets_is_that_many_calls():
    # compare plans a per-tensor strategy as buckets of the mean tensor: n tensors must be n calls, not n + 1
    for num_params, tensors in [(115008, 20), (12_600_000, 148), (7, 3), (1_000_003, 97)]:
        total = num_params * 4
        sizes = buckets(total, total / tensors, min(MIB, total / tensors))
        assert len(sizes) == tensors and sum(sizes) == pytest.approx(total)
    assert buckets(10.0, 4.0) == [4.0, 4.0, 2.0] and buckets(10.0, 4.0, 1.0) == [1.0, 4.0, 4.0, 1.0]


def test_powersgd_ratio_by_hand():
    cfg = PlanConfig(model="tiny", world_size=2, link="10GbE", comm_hook="powersgd", powersgd_rank=4, **H100)
    inp = evaluate(cfg).inputs
    r, n = 4, inp.model.num_params
    # tiny: per layer q,o 64x64 (compressed: 4096 >= 2*4*128), k,v 64x32 (2048 >= 768), 3 MLP 64x192; embedding 256x64
    sent = 2 * 2 * r * 128 + 2 * 2 * r * 96 + 3 * 2 * r * 256 + r * (256 + 64)
    vectors = 2 * 2 * 64 + 64
    assert powersgd_ratio(inp) == pytest.approx((sent + vectors) / n)


# -- compute and the step -------------------------------------------------------------------------

def test_compute_time_is_palm_flops_over_peak_times_mfu():
    spec = presets.model("gpt2")
    r = evaluate(
        PlanConfig(model="gpt2", world_size=2, link="10GbE", micro_batch=8, grad_accum=2, peak_tflops=100, mfu=0.5)
    )
    n = spec.num_layers * spec.layer_params() + spec.norm_params() + spec.vocab_size * spec.hidden_size
    per_token = 6 * n + 12 * spec.num_layers * spec.hidden_size * spec.seq_len
    tokens_per_rank = 8 * 2 * 1024
    assert r.compute_time_s == pytest.approx(per_token * tokens_per_rank / (100e12 * 0.5))
    assert r.tokens_per_step == 8 * 2 * 2 * 1024
    ckpt = evaluate(PlanConfig(model="gpt2", world_size=2, link="10GbE", micro_batch=8, grad_accum=2, peak_tflops=100,
                               mfu=0.5, activation_checkpointing=True))
    assert ckpt.compute_time_s == pytest.approx(4 / 3 * r.compute_time_s)


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_step_time_lies_between_its_bounds(strategy):
    cfg = PlanConfig(model="gpt2", world_size=4, link="10GbE", strategy=strategy, grad_accum=2, **H100)
    r = evaluate(cfg)
    assert r.step_time_overlap_s == pytest.approx(max(r.comm_time_s, r.compute_time_s))
    assert r.step_time_no_overlap_s == pytest.approx(r.comm_time_s + r.compute_time_s)
    assert r.step_time_overlap_s - 1e-12 <= r.step_time_s <= r.step_time_no_overlap_s + 1e-12
    assert evaluate(dataclasses.replace(cfg, overlap=False)).step_time_s == pytest.approx(r.step_time_no_overlap_s)
    assert r.comm_compute_ratio == pytest.approx(r.comm_time_s / r.compute_time_s)


def test_ddp_overlap_hides_all_but_the_last_bucket_when_backward_is_long():
    # compute-bound: every bucket but the last finishes under backward
    r = evaluate(PlanConfig(model="gpt2", world_size=2, link="400G-IB", micro_batch=16, **H100))
    last = [t for t in r.phases[-1].tasks if t.stream == "comm"][-1]
    assert r.step_time_s == pytest.approx(r.compute_time_s + last.duration_s)


def test_world_of_one_has_no_communication():
    r = evaluate(PlanConfig(model="gpt2", world_size=1, **H100))
    assert r.comm_time_s == 0 and collectives_rows(r) == [] and r.step_time_s == pytest.approx(r.compute_time_s)


# -- what-ifs -------------------------------------------------------------------------------------

def test_accumulation_lever_meets_its_target_with_the_smallest_k():
    cfg = PlanConfig(model="gpt2", world_size=8, link="1GbE", overlap=False, comm_target=0.25, **H100)
    base = evaluate(cfg)
    row = accumulation_lever(cfg, base)
    k = int(row["setting"].split("=")[1])
    share = lambda kk: evaluate(dataclasses.replace(cfg, grad_accum=kk)).comm_share  # noqa: E731
    assert share(k) <= 0.25 < share(k - 1)
    assert row["speedup"] == pytest.approx(
        evaluate(dataclasses.replace(cfg, grad_accum=k)).tokens_per_s / base.tokens_per_s
    )


def test_accumulation_cannot_help_zero3_when_each_micro_batch_is_comm_bound():
    cfg = PlanConfig(model="gpt2", world_size=8, link="1GbE", strategy="zero3", **H100)
    row = accumulation_lever(cfg, evaluate(cfg))
    assert row["speedup"] is None and "cannot reach" in row["note"]


def test_levers_are_ranked_and_a_faster_link_helps_a_comm_bound_plan():
    cfg = PlanConfig(model="gpt2-large", world_size=2, link="1GbE", device="RTX-4070", micro_batch=16)
    base = evaluate(cfg)
    assert base.comm_compute_ratio > 1
    rows = lever_rows(cfg, base)
    ranked = [r["speedup"] for r in rows if r["rank"] is not None]
    assert ranked == sorted(ranked, reverse=True) and ranked[0] > 1
    links = {r["setting"]: r for r in rows if r["lever"] == "faster link"}
    assert "2.5GbE" in links  # the next step up from 1GbE, among network links only
    meets = [name for name, r in links.items() if r["comm_share"] <= 0.1]
    assert len(meets) == 1 and presets.LINKS[meets[0]].kind in ("ethernet", "roce", "infiniband")
    # the slowest preset that meets the target: the next slower network link does not
    network = sorted(
        (s for s in presets.LINKS.values() if s.kind in ("ethernet", "roce", "infiniband")), key=lambda s: s.gbps
    )
    slower = [s for s in network if s.gbps < presets.LINKS[meets[0]].gbps and s.gbps > 0.125]
    if slower:
        assert evaluate(dataclasses.replace(cfg, link=slower[-1].name)).comm_share > 0.1


def test_scaling_is_weak_scaling_with_efficiency_one_at_one_rank():
    cfg = PlanConfig(model="gpt2", world_size=8, link="10GbE", micro_batch=4, **H100)
    rows = {r["world_size"]: r for r in scaling_rows(cfg)}
    assert sorted(rows) == [2**i for i in range(11)]
    single = evaluate(at_world(cfg, 1))
    assert rows[1]["efficiency"] == pytest.approx(1.0) and rows[1]["throughput"] == pytest.approx(
        4 * 1024 / single.compute_time_s
    )
    assert rows[64]["global_batch"] == 64 * 4
    assert rows[8]["throughput"] == pytest.approx(evaluate(cfg).tokens_per_s)
    # two levels: 8 devices per node, so 16 ranks are 2 nodes
    two = PlanConfig(model="gpt2", num_nodes=2, devices_per_node=8, intra_link="NVLink4", inter_link="100G-IB", **H100)
    assert {r["world_size"]: r["num_nodes"] for r in scaling_rows(two)}[16] == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"model": "tiny", "world_size": 2, "global_batch": 5},
            "--global-batch 5 is not divisible by --micro-batch 1 × world size 2",
        ),
        ({"model": "tiny", "world_size": 2, "global_batch": 8, "micro_batch": 2, "grad_accum": 3}, "contradicts"),
        (
            {"num_layers": 2, "hidden_size": 64, "num_heads": 5, "seq_len": 64, "vocab_size": 256},
            "--heads 5 does not divide --hidden 64",
        ),
        ({"num_layers": 2, "hidden_size": 64}, "missing sizes"),
        ({"model": "gpt2", "params": 1e9}, "contradicts the architecture"),
        ({"model": "gpt2", "seq_len": 2048}, "exceeds gpt2's 1024 learned positions"),
        ({"params": 1e9, "bandwidth_gbps": 0.0}, "--bandwidth must be positive"),
        ({"params": 1e9, "world_size": 4, "num_nodes": 2, "devices_per_node": 4}, "contradicts"),
        ({"params": 1e9, "strategy": "zero3", "comm_hook": "powersgd"}, "DDP communication hook"),
        ({}, "give --model NAME"),
    ],
)
def test_config_rejects_bad_input(kwargs, message):
    """As the command line builds it from the flags: the message names them."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        knobs.build(PlanConfig, {(name,): value for name, value in kwargs.items()})


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown plan setting"):
        PlanConfig.from_dict({"model": "tiny", "gpus": 8})
