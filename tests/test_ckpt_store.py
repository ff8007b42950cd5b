"""The checkpoint store without processes: atomic layout, verification, skipping what is corrupt
or partial, keep-K, RNG states and the config fingerprint."""

import json
import random

import numpy as np
import pytest
import torch

from distval.ckpt import state, store
from distval.train.config import OptimConfig, TrainConfig


def _save(ckpt_dir, step, keep=10, fields=None):
    """What the checkpointer does for one save, on one rank."""
    tmp = store.tmp_path(ckpt_dir, step, "a0")
    tmp.mkdir()
    files = {"model.safetensors": store.write_tensors(tmp, "model.safetensors",
                                                      store.flatten({"model": {"w": torch.full((64,), float(step))}})),
             "rank-0.json": store.write_file(tmp, "rank-0.json", store.json_bytes({"step": step}))}
    path = store.commit(tmp, ckpt_dir, step, files, {"fields": fields or {}})
    store.prune(ckpt_dir, keep)
    return path


def test_commit_layout_latest_pointer_and_load(tmp_path):
    for step in (3, 6):
        _save(tmp_path, step)
    assert (tmp_path / "latest").read_text().strip() == "step-00000006"
    assert not list(tmp_path.glob(".tmp-*"))
    manifest = json.loads((tmp_path / "step-00000006" / "manifest.json").read_text())
    assert manifest["format"] == store.FORMAT and set(manifest["files"]) == {"model.safetensors", "rank-0.json"}
    warnings = []
    found = store.find_latest(tmp_path, warnings)
    assert found.step == 6 and warnings == []
    assert torch.equal(store.load_tensors(found.path, "model.safetensors")["model"]["w"], torch.full((64,), 6.0))


def test_corrupt_file_is_skipped_with_a_warning_naming_it(tmp_path):
    for step in (3, 6, 9):
        _save(tmp_path, step)
    bad = tmp_path / "step-00000009" / "model.safetensors"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    bad.write_bytes(bytes(data))
    (tmp_path / "step-00000006" / "rank-0.json").write_text('{"step": 6')  # truncated
    warnings = []
    found = store.find_latest(tmp_path, warnings)
    assert found.step == 3
    assert len(warnings) == 2
    assert str(bad) in warnings[0] and "SHA-256" in warnings[0] and "step-00000003" in warnings[0]
    assert "rank-0.json" in warnings[1] and "truncated" in warnings[1]
    with pytest.raises(ValueError, match="does not match its SHA-256"):
        store.load_found(tmp_path / "step-00000009")


def test_a_partial_save_is_never_picked(tmp_path):
    _save(tmp_path, 3)
    # killed before the rename: a temporary directory with complete-looking files
    tmp = store.tmp_path(tmp_path, 6, "a0")
    tmp.mkdir()
    store.write_file(tmp, "model.safetensors", b"complete-looking")
    # a step directory without its manifest (e.g. copied by hand, or a foreign tool)
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000009" / "model.safetensors").write_bytes(b"junk")
    warnings = []
    assert store.find_latest(tmp_path, warnings).step == 3
    assert "manifest.json is missing" in warnings[0] and "step-00000009" in warnings[0]
    assert store.clean_temporary(tmp_path) == [tmp.name] and not tmp.exists()


def test_keep_k_deletes_the_oldest(tmp_path):
    for step in range(1, 7):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in store.candidates(tmp_path)] == ["step-00000006", "step-00000005"]


def test_nothing_valid_means_step_0(tmp_path):
    _save(tmp_path, 4)
    (tmp_path / "step-00000004" / "manifest.json").write_text("{")
    warnings = []
    assert store.find_latest(tmp_path, warnings) is None
    assert "unreadable" in warnings[0] and "starting at step 0" in warnings[0]


def test_tensor_file_round_trips_every_dtype_without_pickle(tmp_path):
    state = {"model": {"w": torch.randn(3, 5), "h": torch.randn(4).to(torch.bfloat16), "ids": torch.arange(7),
                       "mask": torch.tensor([True, False]), "empty": torch.zeros(0, 3)},
             "optim": {"w": {"step": torch.tensor(12.0), "exp_avg": torch.randn(3, 5).double()}}}
    meta = store.write_tensors(tmp_path, "m.safetensors", store.flatten(state))
    raw = (tmp_path / "m.safetensors").read_bytes()
    assert meta["bytes"] == len(raw)
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert header["optim/w/exp_avg"]["dtype"] == "F64" and header["model/h"]["dtype"] == "BF16"
    back = store.load_tensors(tmp_path, "m.safetensors")
    for key, t in store.flatten(state).items():
        got = store.flatten(back)[key]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), key
    try:  # the layout is safetensors': its reader agrees when it is installed
        from safetensors.torch import load_file
    except ImportError:
        return
    assert torch.equal(load_file(str(tmp_path / "m.safetensors"))["model/w"], state["model"]["w"])


def test_rng_states_round_trip_as_json():
    saved = json.loads(json.dumps(state.rng_state(torch.device("cpu"))))
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    random.random(), np.random.rand(5), torch.rand(7)  # move every generator on
    state.set_rng_state(saved, torch.device("cpu"))
    got = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_fingerprint_names_what_differs_and_ignores_the_split():
    a = state.fingerprint_fields(TrainConfig(micro_batch=2, optim=OptimConfig(lr=3e-3)), world_size=2)
    b = state.fingerprint_fields(
        TrainConfig(micro_batch=4, optim=OptimConfig(lr=3e-3), strategy="pytorch_ddp"), world_size=1
    )
    assert state.fingerprint(a) == state.fingerprint(b)  # same global batch of 4, strategy free
    c = state.fingerprint_fields(TrainConfig(micro_batch=2, optim=OptimConfig(lr=1e-3), model="small"), world_size=2)
    assert state.differences(a, c) == [
        "lr 0.003 (checkpoint) vs 0.001 (this run)",
        "model 'tiny' (checkpoint) vs 'small' (this run)",
    ]


def test_a_sharded_checkpoint_needs_its_own_strategy(tmp_path):
    from distval.ckpt.checkpointer import check_compatible
    from distval.strategies import REGISTRY, StrategyConfig

    fields = state.fingerprint_fields(TrainConfig(strategy="pytorch_ddp"), 2)

    def found(strategy: str, bucket_mb: float, form: str = "sharded") -> store.Found:
        layout = REGISTRY[strategy].layout(StrategyConfig(bucket_mb=bucket_mb))
        return store.Found(tmp_path, 3, {"fields": fields, "form": form, "strategy": strategy, "layout": layout})

    def layout(strategy: str, bucket_mb: float = 25.0) -> dict:
        return REGISTRY[strategy].layout(StrategyConfig(bucket_mb=bucket_mb))

    with pytest.raises(
        ValueError,
        match="zero3's sharded form .* loads only into the layout it was saved with: "
        "strategy 'zero3' \\(checkpoint\\) vs 'pytorch_ddp' \\(this run\\); resume with --strategy zero3",
    ):
        check_compatible(found("zero3", 25.0), fields, layout("pytorch_ddp"))
    check_compatible(found("zero3", 25.0, form="full"), fields, layout("pytorch_ddp"))  # the full form loads anywhere
    # zero1/2's flat groups are the buckets: another cap is another layout; zero3's units do not use it
    with pytest.raises(
        ValueError,
        match="bucket_mb 25.0 \\(checkpoint\\) vs 10.0 \\(this run\\); resume with --strategy zero1 --bucket-mb 25",
    ):
        check_compatible(found("zero1", 25.0), fields, layout("zero1", 10.0))
    check_compatible(found("zero3", 25.0), fields, layout("zero3", 10.0))
