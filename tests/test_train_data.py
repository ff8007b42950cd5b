"""The training workload's data: the byte tokenizer, the synthetic corpus, real files of every
format written here and read back, HF names from an offline cache (when `datasets` is installed),
bad inputs, and the loader contract the strategies' parity tests rely on: the ranks' micro-batches
of a step, concatenated rank by rank, are the single-process global batch in the same order, and a
resumed loader continues exactly like an uninterrupted one. CPU, no process groups."""

import csv
import importlib.util
import json
import math
import sys

import pytest
import torch
from torch.utils.data import DistributedSampler

from distval.train.data import (
    EOS_ID,
    PAD_ID,
    TEXT_VOCAB_SIZE,
    DataConfig,
    ShardedLoader,
    TokenDataset,
    accumulation_steps,
    decode,
    encode,
    load_data,
    synthetic_corpus,
    validate_data_source,
)

HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None
HAS_DATASETS = importlib.util.find_spec("datasets") is not None
REVIEWS = [(4, "Great tacos, friendly staff."), (0, "Cold food. Never again."), (2, "Fine, nothing special"),
           (3, "Good coffee ☕ and quick"), (1, "Slow service, okay pastries")]


def numbered(n, seq=4):
    """A dataset whose sample i is [i, i, ..., i]: batches show their indices."""
    return TokenDataset("numbered", torch.arange(n).repeat_interleave(seq).view(n, seq), vocab_size=n)


def indices(batch):
    return batch["tokens"][:, 0].tolist()


# ---------------------------------------------------------------------------------------- tokenizer

def test_byte_tokenizer_round_trips_utf8():
    text = "héllo, wörld ☕"
    ids = encode(text)
    assert ids.tolist() == list(text.encode("utf-8")) and ids.max() < 256
    assert decode(list(ids) + [EOS_ID, PAD_ID]) == text + "\n"
    assert (EOS_ID, PAD_ID, TEXT_VOCAB_SIZE) == (256, 257, 258)


# ---------------------------------------------------------------------------------------- synthetic

def test_synthetic_corpus_is_deterministic_and_learnable():
    a = synthetic_corpus(256, 32, 256, seed=1)
    b = synthetic_corpus(256, 32, 256, seed=1)
    c = synthetic_corpus(256, 32, 256, seed=2)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert a.tokens.shape == (256, 32) and 0 <= a.tokens.min() and a.tokens.max() < 256
    assert a.loss_floor < 0.3 * math.log(256)
    # the structure is real: each token is followed by at most `branching` distinct tokens
    pairs = torch.stack([a.tokens[:, :-1].flatten(), a.tokens[:, 1:].flatten()], 1).long()
    successors = {}
    for prev, nxt in pairs.tolist():
        successors.setdefault(prev, set()).add(nxt)
    assert max(len(s) for s in successors.values()) <= 4


def test_synthetic_corpus_with_a_large_vocab_uses_int32():
    data = synthetic_corpus(8, 16, 50257, seed=0)
    assert data.tokens.dtype == torch.int32 and data.tokens.max() < 50257
    assert data.batch(torch.tensor([0, 1]))["tokens"].dtype == torch.int64


# ---------------------------------------------------------------------------------------- files

def write_reviews(tmp_path, fmt, rows=REVIEWS, columns=("label", "text")):
    path = tmp_path / f"reviews.{fmt}"
    records = [dict(zip(columns, row)) for row in rows]
    if fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(records)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(records), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    return path


FORMATS = [
    "csv",
    "jsonl",
    "json",
    pytest.param("parquet", marks=pytest.mark.skipif(not HAS_PYARROW, reason="pyarrow not installed")),
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_classification_file_is_read_back(tmp_path, fmt):
    path = write_reviews(tmp_path, fmt)
    cfg = DataConfig(source=str(path), task="classify")
    assert validate_data_source(cfg, TEXT_VOCAB_SIZE) == "file"
    data = load_data(cfg, seq_len=16, vocab_size=TEXT_VOCAB_SIZE)
    assert data.labels.tolist() == [label for label, _ in REVIEWS] and data.num_classes == 5
    assert data.tokens.shape == (5, 16)
    for row, (_, text) in zip(data.tokens.tolist(), REVIEWS):
        body = list(text.encode("utf-8"))[:15]
        assert row[-1] == EOS_ID and row[-1 - len(body):-1] == body  # first 15 bytes, then EOS
        assert row[:16 - 1 - len(body)] == [PAD_ID] * (15 - len(body))  # left padding
    batch = data.batch(torch.tensor([1, 0]))
    assert batch["labels"].tolist() == [0, 4] and batch["tokens"].dtype == torch.int64


@pytest.mark.parametrize("fmt", FORMATS)
def test_language_model_file_is_packed_into_windows(tmp_path, fmt):
    path = write_reviews(tmp_path, fmt)
    data = load_data(DataConfig(source=str(path)), seq_len=8, vocab_size=TEXT_VOCAB_SIZE)
    stream = "".join(text + "\n" for _, text in REVIEWS).encode("utf-8")  # EOS decodes as newline
    assert data.labels is None and data.vocab_size == TEXT_VOCAB_SIZE
    assert len(data) == (len(stream)) // 8
    assert decode(data.tokens.flatten()).encode("utf-8") == stream[: len(data) * 8]


def test_text_file_and_sample_cap(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("abcdefgh" * 10, encoding="utf-8")
    data = load_data(DataConfig(source=str(path)), seq_len=16, vocab_size=300)
    assert len(data) == 81 // 16 and decode(data.tokens[0]) == "abcdefghabcdefgh"
    capped = load_data(DataConfig(source=str(path), num_samples=2), seq_len=16, vocab_size=300)
    assert torch.equal(capped.tokens, data.tokens[:2])


# ---------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize(
    "make, cfg_kwargs, vocab, message",
    [
        (None, {"source": "missing/data.csv"}, 258, "does not exist"),
        ("dir", {}, 258, "is a directory"),
        ("reviews.xlsx", {}, 258, "unknown format"),
        (
            "csv-cols",
            {"task": "classify"},
            258,
            r"no column 'label', 'text' \(columns found: stars, review\).*--label-column and --text-column",
        ),
        ("csv-cols", {}, 258, r"columns found: stars, review"),
        ("txt", {"task": "classify"}, 258, "classification needs"),
        ("csv", {}, 256, "larger vocabulary"),
        ("empty.csv", {}, 258, "empty"),
        ("bad.jsonl", {}, 258, "line 1 is not JSON"),
    ],
)
def test_bad_sources_are_rejected_before_loading(tmp_path, make, cfg_kwargs, vocab, message):
    source = cfg_kwargs.pop("source", None)
    if make == "dir":
        source = tmp_path
    elif make == "csv-cols":
        source = write_reviews(tmp_path, "csv", columns=("stars", "review"))
    elif make == "csv":
        source = write_reviews(tmp_path, "csv")
    elif make == "txt":
        source = tmp_path / "a.txt"
        source.write_text("hello")
    elif make == "bad.jsonl":
        source = tmp_path / make
        source.write_text("{not json\n")
    elif make is not None:
        source = tmp_path / make
        source.write_text("")
    cfg = DataConfig(source=str(source), **cfg_kwargs)
    with pytest.raises(ValueError, match=message) as err:
        validate_data_source(cfg, vocab)
    assert "\n" not in str(err.value)


def test_bad_labels_and_tiny_files(tmp_path):
    path = write_reviews(tmp_path, "jsonl", rows=[(1, "a"), ("good", "b")])
    with pytest.raises(ValueError, match="row 1: label 'good' is not an integer"):
        load_data(DataConfig(source=str(path), task="classify"), 8, TEXT_VOCAB_SIZE)
    path = write_reviews(tmp_path, "csv", rows=[(1, "a"), (5, "b")])
    with pytest.raises(ValueError, match=r"labels span 1\.\.5 but classes are 0\.\.4"):
        load_data(DataConfig(source=str(path), task="classify", num_classes=5), 8, TEXT_VOCAB_SIZE)
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"label,text\n1,caf\xe9\n")
    with pytest.raises(ValueError, match="latin1.csv: not UTF-8 text"):
        load_data(DataConfig(source=str(latin1), task="classify"), 8, TEXT_VOCAB_SIZE)
    short = tmp_path / "short.txt"
    short.write_text("hi")
    with pytest.raises(ValueError, match="not one window"):
        load_data(DataConfig(source=str(short)), 64, TEXT_VOCAB_SIZE)


def test_config_validates_itself():
    with pytest.raises(ValueError, match="unknown data task"):
        DataConfig(task="regress")
    with pytest.raises(ValueError, match="synthetic corpus is for task 'lm'"):
        DataConfig(task="classify")
    with pytest.raises(ValueError, match="unknown data option.*colums"):
        DataConfig.from_dict({"source": "synthetic", "colums": "x"})
    assert DataConfig.from_dict({"source": "a.csv"}).kind == "file"
    assert DataConfig(source="./corpus").kind == "file"
    assert DataConfig(source="Yelp/yelp_review_full").kind == "hf"
    assert DataConfig(source="hf:data.csv").kind == "hf" and DataConfig(source="hf:data.csv").hf_name == "data.csv"


def test_parquet_without_pyarrow_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    path = tmp_path / "reviews.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="pip install pyarrow"):
        validate_data_source(DataConfig(source=str(path)))


# ---------------------------------------------------------------------------------------- HF datasets

def test_hf_name_without_datasets_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ValueError, match="pip install datasets"):
        validate_data_source(DataConfig(source="yelp_review_full", task="classify"))


def offline(monkeypatch):
    # hf_dataset switches downloads off in os.environ; let monkeypatch restore it afterwards
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.skipif(not HAS_DATASETS, reason="datasets not installed")
def test_hf_name_absent_from_the_offline_cache(tmp_path, monkeypatch):
    offline(monkeypatch)
    with pytest.raises(ValueError, match="not in the offline Hugging Face cache"):
        validate_data_source(DataConfig(source="hf:distval-test/never-downloaded", cache_dir=str(tmp_path)))


@pytest.mark.skipif(not HAS_DATASETS, reason="datasets not installed")
def test_hf_name_resolved_from_the_offline_cache(tmp_path, monkeypatch):
    """Lay out a cache entry as a past download would (name/config/version/hash) and load it by name."""
    offline(monkeypatch)
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.json.json import Json

    source = write_reviews(tmp_path, "jsonl")
    cache = tmp_path / "cache"
    builder = Json(cache_dir=str(cache), dataset_name="yelp_review_full", hash="0123abcd",
                   data_files=DataFilesDict.from_patterns({"train": [str(source)]}))
    builder.download_and_prepare()
    (config_dir,) = (cache / "yelp_review_full").iterdir()
    config_dir.rename(config_dir.with_name("default"))
    cfg = DataConfig(source="yelp_review_full", task="classify", cache_dir=str(cache))
    assert validate_data_source(cfg, TEXT_VOCAB_SIZE) == "hf"
    data = load_data(cfg, 16, TEXT_VOCAB_SIZE)
    assert data.labels.tolist() == [label for label, _ in REVIEWS] and data.num_classes == 5
    with pytest.raises(ValueError, match=r"columns found: label, text"):
        validate_data_source(DataConfig(source="yelp_review_full", text_column="body", cache_dir=str(cache)))


# ---------------------------------------------------------------------------------------- loader

def test_batch_split_must_divide():
    assert accumulation_steps(24, 2, 3) == 4
    with pytest.raises(
        ValueError, match="global batch 10 is not divisible by world size 3 × micro-batch 2; use a multiple of 6"
    ):
        accumulation_steps(10, 2, 3)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        ShardedLoader(numbered(5), global_batch=8, micro_batch=8)
    with pytest.raises(ValueError, match="rank 2 is outside world size 2"):
        ShardedLoader(numbered(16), global_batch=8, micro_batch=2, rank=2, world_size=2)


def test_epoch_order_is_distributed_samplers_and_drops_the_partial_batch():
    data = numbered(50)
    loader = ShardedLoader(data, global_batch=8, micro_batch=8, seed=3)
    assert loader.steps_per_epoch == 6
    seen = {0: [], 1: []}
    for _ in range(12):
        epoch = loader.epoch if loader.offset + 8 <= 50 else loader.epoch + 1
        seen[epoch] += indices(next(loader))
    for epoch, got in seen.items():
        sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
        sampler.set_epoch(epoch)
        assert got == list(sampler)[:48]  # the last 2 samples do not fill a global batch
    assert seen[0] != seen[1]  # set_epoch reshuffles
    unshuffled = ShardedLoader(data, global_batch=8, micro_batch=4, shuffle=False)
    assert [indices(b) for b in unshuffled.next_step()] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("accum", [1, 4])
def test_ranks_micro_batches_concatenate_to_the_single_process_batch(world_size, accum):
    micro = 2
    global_batch = world_size * micro * accum
    data = numbered(61)
    single = ShardedLoader(data, global_batch, micro_batch=global_batch, seed=7)
    ranks = [ShardedLoader(data, global_batch, micro, rank=r, world_size=world_size, seed=7) for r in range(world_size)]
    steps = 2 * single.steps_per_epoch + 1  # crosses two epoch boundaries
    for _ in range(steps):
        (reference,) = single.next_step()
        parts = []
        for loader in ranks:
            micro_batches = loader.next_step()
            assert len(micro_batches) == accum == loader.accum_steps
            assert all(b["tokens"].shape == (micro, 4) for b in micro_batches)
            parts += [b["tokens"] for b in micro_batches]
        assert torch.equal(torch.cat(parts), reference["tokens"])
    assert single.epoch == 2
    assert all(
        (ld.epoch, ld.offset, ld.step_offset) == (2, single.offset, 0) for ld in ranks
    )  # position is world-size free


def test_classification_batches_carry_labels():
    data = TokenDataset("cls", torch.zeros(12, 4, dtype=torch.int16), TEXT_VOCAB_SIZE, torch.arange(12) % 3, 3)
    batch = next(ShardedLoader(data, 4, 4, shuffle=False))
    assert batch["labels"].tolist() == [0, 1, 2, 0] and batch["labels"].dtype == torch.int64


def run(loader, steps):
    return [[indices(b) for b in loader.next_step()] for _ in range(steps)]


def test_resumed_loader_yields_what_an_uninterrupted_one_would():
    data = numbered(45)
    uninterrupted = run(ShardedLoader(data, 12, 2, rank=1, world_size=2, seed=4), 10)
    first = ShardedLoader(data, 12, 2, rank=1, world_size=2, seed=4)
    head = run(first, 4)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    assert state["epoch"] == 1 and state["offset"] == 12
    resumed = ShardedLoader(data, 12, 2, rank=1, world_size=2, seed=4)
    resumed.load_state_dict(state)
    assert head + run(resumed, 6) == uninterrupted


def test_resume_on_another_world_size_continues_the_same_global_batches():
    data = numbered(40)
    single = ShardedLoader(data, 12, 12, seed=5)
    run(single, 5)
    expected = [indices(next(single)) for _ in range(3)]
    two = ShardedLoader(data, 12, 2, rank=0, world_size=2, seed=5)
    run(two, 5)
    state = two.state_dict()
    three = [ShardedLoader(data, 12, 2, rank=r, world_size=3, seed=5) for r in range(3)]
    for loader in three:
        loader.load_state_dict(state)
    for want in expected:
        assert sum((sum(run(loader, 1)[0], []) for loader in three), []) == want


def test_loader_state_from_other_data_is_refused():
    loader = ShardedLoader(numbered(40), 8, 4, seed=1)
    with pytest.raises(ValueError, match="seed=2 but this loader has seed=1"):
        loader.load_state_dict({"epoch": 0, "offset": 8, "num_samples": 40, "seed": 2, "shuffle": True})
    with pytest.raises(ValueError, match="num_samples=41"):
        loader.load_state_dict({"epoch": 0, "offset": 8, "num_samples": 41, "seed": 1, "shuffle": True})


def test_resume_inside_a_step_needs_the_same_split():
    data = numbered(40)
    uninterrupted = ShardedLoader(data, 12, 2, rank=2, world_size=3, seed=6)
    want = [indices(next(uninterrupted)) for _ in range(5)]
    first = ShardedLoader(data, 12, 2, rank=2, world_size=3, seed=6)
    head = [indices(next(first)) for _ in range(3)]  # a step and a half
    state = first.state_dict()
    assert state["step_offset"] == 6
    with pytest.raises(ValueError, match="in the middle of a step"):
        first.next_step()
    resumed = ShardedLoader(data, 12, 2, rank=2, world_size=3, seed=6)
    resumed.load_state_dict(state)
    assert head + [indices(next(resumed)) for _ in range(2)] == want
    with pytest.raises(ValueError, match="world_size=3 but this loader has world_size=2"):
        ShardedLoader(data, 12, 2, rank=0, world_size=2, seed=6).load_state_dict(state)


def test_build_loader_for_the_training_loop():
    from distval.plan import presets
    from distval.train.data import build_loader, validate_source

    tiny = presets.model("tiny")
    assert validate_source("synthetic") == "synthetic"
    ranks = [
        build_loader("synthetic", tiny, micro_batch=2, grad_accum=3, rank=r, world_size=2, seed=1) for r in range(2)
    ]
    single = build_loader(DataConfig(), tiny, micro_batch=12, grad_accum=1, seed=1)
    for _ in range(2):
        step = [b["tokens"] for loader in ranks for b in loader.next_step()]
        assert all(t.shape == (2, tiny.seq_len) and t.dtype == torch.int64 for t in step)
        assert torch.equal(torch.cat(step), next(single)["tokens"])
