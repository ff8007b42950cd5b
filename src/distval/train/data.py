"""What distval trains on, and how the samples of one optimizer step are split over ranks.

Sources (`DataConfig.source`):
  "synthetic"        a deterministic corpus with learnable structure: every sample is a walk of a
                     fixed random sparse Markov chain (each token has `branching` possible
                     successors with Dirichlet-drawn probabilities), all drawn from `seed`. The
                     best possible next-token loss is the chain's conditional entropy
                     (`TokenDataset.loss_floor`, ~1 nat), far below the uniform ln(vocab).
  a file path        .txt (one document per file), .jsonl/.json, .csv, .parquet (needs pyarrow)
  "hf:NAME" or NAME  a Hugging Face `datasets` name, loaded OFFLINE from the local cache only
                     (`datasets` is optional; nothing is ever downloaded)

Tokenizer: byte level and deterministic. A text's UTF-8 bytes are its ids 0-255; EOS_ID = 256 ends
a document, PAD_ID = 257 pads a classification sample; so text needs a model vocab of at least
TEXT_VOCAB_SIZE = 258. Language-model text is packed: documents + EOS concatenated into one stream
cut into `seq_len` windows (the tail that does not fill a window is dropped). Classification
samples (task "classify", the (label, text) layout of Yelp Review Full) are one text each: its first
seq_len-1 bytes, then EOS, left-padded with PAD to seq_len, so the last position is always EOS.

The loader (`ShardedLoader`): one epoch is a permutation of the samples drawn exactly as
`torch.utils.data.DistributedSampler` draws it (`torch.randperm` seeded with seed + epoch; the
order a single replica sees), cut into consecutive global batches; a partial last global batch is
dropped (drop_last). Within a global batch, rank r takes the r-th contiguous slice and cuts it into
`accum_steps` micro-batches. So the ranks' micro-batches, concatenated rank by rank, are exactly
the global batch a single process would use, in the same order (unlike DistributedSampler's
strided r, r+W, ... split, which holds the same set in another order). `next(loader)` is this
rank's next micro-batch ({"tokens": int64 [micro_batch, seq_len]}, plus "labels" int64
[micro_batch] for classification); `next_step()` is the list of one step's micro-batches. The
position is (epoch, offset in samples of that epoch, counted over all ranks), so a state saved
between steps resumes under another world size or micro-batch with the same global batch.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from distval.envvars import scoped
from distval.plan.presets import ModelSpec

EOS_ID = 256
PAD_ID = 257
TEXT_VOCAB_SIZE = 258
TASKS = ("lm", "classify")
FILE_SUFFIXES = (".txt", ".jsonl", ".json", ".csv", ".parquet")
DEFAULT_SYNTHETIC_SAMPLES = 4096
HF_PREFIX = "hf:"


# ---------------------------------------------------------------------------------------- tokenizer

def encode(text: str) -> np.ndarray:
    """UTF-8 bytes of `text` as token ids (int16, values 0-255)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int16)


def decode(ids: Any) -> str:
    """Text of token ids; EOS becomes a newline, PAD is dropped, invalid UTF-8 is replaced."""
    out = bytearray()
    for i in (int(x) for x in ids):
        if i < 256:
            out.append(i)
        elif i == EOS_ID:
            out.extend(b"\n")
    return out.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class DataConfig:
    """Where the samples come from. `num_samples`: synthetic windows to generate (default 4096),
    or at most this many samples from real data (None: all). `cache_dir` overrides the HF
    datasets cache (HF_DATASETS_CACHE)."""

    source: str = "synthetic"
    task: str = "lm"
    text_column: str = "text"
    label_column: str = "label"
    split: str = "train"
    hf_config: str | None = None
    num_classes: int | None = None
    num_samples: int | None = None
    cache_dir: str | None = None
    branching: int = 4

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown data task {self.task!r}; choose {' or '.join(TASKS)}")
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1 (got {self.num_samples})")
        if self.num_classes is not None and self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2 (got {self.num_classes})")
        if self.branching < 1:
            raise ValueError(f"branching must be at least 1 (got {self.branching})")
        if self.task == "classify" and self.source == "synthetic":
            raise ValueError(
                "the synthetic corpus is for task 'lm'; classification needs a (label, text) file or data set"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DataConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown data option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    @property
    def kind(self) -> str:
        """"synthetic", "file" or "hf"."""
        if self.source == "synthetic":
            return "synthetic"
        if self.source.startswith(HF_PREFIX):
            return "hf"
        # A path-looking source is a file (and a missing one is reported as such, not looked up
        # on the Hub); any other name ("yelp_review_full", "Yelp/yelp_review_full") is a data set.
        path = Path(self.source).expanduser()
        looks_like_path = self.source.startswith((".", "/", "~")) or path.suffix.lower() in FILE_SUFFIXES
        return "file" if looks_like_path or path.exists() else "hf"

    @property
    def hf_name(self) -> str:
        return self.source[len(HF_PREFIX):] if self.source.startswith(HF_PREFIX) else self.source


@dataclass
class TokenDataset:
    """Fixed-length samples: tokens [N, seq_len] (int16/int32 to save memory), labels [N] for
    classification. `loss_floor` is the best achievable mean loss when known (synthetic)."""

    name: str
    tokens: torch.Tensor
    vocab_size: int
    labels: torch.Tensor | None = None
    num_classes: int | None = None
    loss_floor: float | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The samples at `indices` as int64 tensors: "tokens" [B, T] (and "labels" [B])."""
        out = {"tokens": self.tokens[indices].long()}
        if self.labels is not None:
            out["labels"] = self.labels[indices].long()
        return out


# ---------------------------------------------------------------------------------------- synthetic

def synthetic_corpus(
    num_samples: int, seq_len: int, vocab_size: int, seed: int = 0, branching: int = 4
) -> TokenDataset:
    """`num_samples` independent walks of length seq_len on a random sparse Markov chain over
    `vocab_size` tokens; the first token of each walk is uniform. All from `seed`."""
    rng = np.random.default_rng([seed, vocab_size, branching])
    successors = rng.integers(0, vocab_size, size=(vocab_size, branching))
    probs = rng.dirichlet(np.ones(branching), size=vocab_size)
    cum = np.cumsum(probs, axis=1)
    row_entropy = -(probs * np.log(probs, where=probs > 0, out=np.zeros_like(probs))).sum(1)
    dtype = np.int16 if vocab_size <= np.iinfo(np.int16).max else np.int32
    tokens = np.empty((num_samples, seq_len), dtype=dtype)
    tokens[:, 0] = rng.integers(0, vocab_size, size=num_samples)
    entropy_sum = 0.0
    for t in range(1, seq_len):  # vectorized over samples, sequential over positions
        cur = tokens[:, t - 1].astype(np.int64)
        entropy_sum += row_entropy[cur].sum()
        choice = (rng.random(num_samples)[:, None] > cum[cur]).sum(1).clip(max=branching - 1)
        tokens[:, t] = successors[cur, choice]
    floor = entropy_sum / (num_samples * (seq_len - 1)) if seq_len > 1 else None
    return TokenDataset(f"synthetic(seed={seed})", torch.from_numpy(tokens), vocab_size, loss_floor=floor)


# ---------------------------------------------------------------------------------------- files

def _need(package: str, what: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"{what} needs the optional package {package!r}: pip install {package}")


def _first_json_record(path: Path) -> dict:
    with path.open(encoding="utf-8") as f:
        head = f.read(1 << 16).lstrip()
    if not head:
        raise ValueError(f"{path}: file is empty")
    if head.startswith("["):
        records = _json_records(path)
        return records[0] if records else {}
    line = head.splitlines()[0]
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line 1 is not JSON ({e.msg}); expected one JSON object per line") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: line 1 is not a JSON object; expected one object per line")
    return record


def _json_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        records = json.loads(text)
    else:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {number} is not JSON ({e.msg})") from None
    if not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path}: every record must be a JSON object")
    return records


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn decoding errors of a local file into one-line errors naming it."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); re-save it as UTF-8") from None
    except csv.Error as e:
        raise ValueError(f"{path}: malformed CSV ({e})") from None


def file_columns(path: Path) -> list[str]:
    """Column names of a CSV/JSONL/Parquet file, read from its header/first record/schema only."""
    with _reading(path):
        return _file_columns(path)


def read_columns(path: Path, columns: list[str]) -> dict[str, list]:
    """The values of `columns` in a CSV/JSONL/Parquet file."""
    with _reading(path):
        return _read_columns(path, columns)


def _file_columns(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
        if not header:
            raise ValueError(f"{path}: file is empty; a CSV needs a header row naming its columns")
        return header
    if suffix in (".jsonl", ".json"):
        return list(_first_json_record(path))
    if suffix == ".parquet":
        _need("pyarrow", f"reading Parquet ({path})")
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    raise ValueError(f"{path}: a .txt file has no columns; classification needs a CSV, JSONL or Parquet file")


def _read_columns(path: Path, columns: list[str]) -> dict[str, list]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        return {c: [row[c] for row in rows] for c in columns}
    if suffix in (".jsonl", ".json"):
        records = _json_records(path)
        try:
            return {c: [r[c] for r in records] for c in columns}
        except KeyError as e:
            raise ValueError(f"{path}: a record has no {e.args[0]!r} field") from None
    _need("pyarrow", f"reading Parquet ({path})")
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=columns)
    return {c: table.column(c).to_pylist() for c in columns}


# ---------------------------------------------------------------------------------------- HF datasets

def hf_dataset(cfg: DataConfig) -> Any:
    """The split of a Hugging Face data set from the local cache, with downloads switched off while
    it loads (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1, restored after). ValueError if `datasets` is missing or
    the set/split is not cached."""
    name = cfg.hf_name
    _need("datasets", f"data set {name!r} (a Hugging Face name)")
    with scoped({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}):  # read when `datasets` is first imported
        import datasets

        # the variables are read when `datasets` is first imported; set the flags too in case it was
        datasets.config.HF_DATASETS_OFFLINE = True
        if hasattr(datasets.config, "HF_HUB_OFFLINE"):
            datasets.config.HF_HUB_OFFLINE = True
        cache = cfg.cache_dir or datasets.config.HF_DATASETS_CACHE
        try:
            return datasets.load_dataset(name, cfg.hf_config, split=cfg.split, cache_dir=cfg.cache_dir)
        except Exception as e:  # datasets raises many types here (FileNotFoundError, ConnectionError, ...)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"data set {name!r} (split {cfg.split!r}) is not in the offline Hugging Face cache "
                             f"{cache}: {reason}; download it once where there is network, or pass a local "
                             f"file") from None


# ---------------------------------------------------------------------------------------- tokenizing

def _text(value: Any) -> str:
    return "" if value is None else str(value)  # a missing cell is an empty text, not "None"


def pack_lm(texts: Any, seq_len: int, max_samples: int | None = None) -> torch.Tensor:
    """Documents + EOS concatenated and cut into [N, seq_len] windows (stops reading once
    `max_samples` windows are filled)."""
    parts, total = [], 0
    eos = np.array([EOS_ID], dtype=np.int16)
    limit = None if max_samples is None else max_samples * seq_len
    for text in texts:
        ids = encode(_text(text))
        parts += [ids, eos]
        total += len(ids) + 1
        if limit is not None and total >= limit:
            break
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
    num = len(stream) // seq_len if limit is None else min(len(stream) // seq_len, max_samples)
    return torch.from_numpy(stream[: num * seq_len].reshape(num, seq_len).copy())


def encode_classification(texts: list, seq_len: int) -> torch.Tensor:
    """Each text as its first seq_len-1 bytes + EOS, left-padded with PAD: [N, seq_len]."""
    out = np.full((len(texts), seq_len), PAD_ID, dtype=np.int16)
    for i, text in enumerate(texts):
        ids = encode(_text(text))[: seq_len - 1]
        out[i, seq_len - 1 - len(ids): seq_len - 1] = ids
        out[i, seq_len - 1] = EOS_ID
    return torch.from_numpy(out)


def parse_labels(values: list, where: str, num_classes: int | None) -> tuple[torch.Tensor, int]:
    """Integer class ids 0..num_classes-1 (num_classes inferred as max + 1 when not given)."""
    labels = []
    for row, value in enumerate(values):
        try:
            label = int(value)
            if label != float(value):
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"{where}: row {row}: label {value!r} is not an integer class id") from None
        labels.append(label)
    if not labels:
        raise ValueError(f"{where}: no samples")
    low, high = min(labels), max(labels)
    classes = num_classes or max(high + 1, 2)
    if low < 0 or high >= classes:
        raise ValueError(f"{where}: labels span {low}..{high} but classes are 0..{classes - 1}; "
                         f"relabel to start at 0 or set num_classes")
    return torch.tensor(labels, dtype=torch.int64), classes


# ---------------------------------------------------------------------------------------- sources

def _source_file(cfg: DataConfig) -> Path:
    path = Path(cfg.source).expanduser()
    if not path.exists():
        raise ValueError(
            f"data file {path} does not exist; pass an existing .txt/.jsonl/.csv/.parquet file or 'synthetic'"
        )
    if path.is_dir():
        raise ValueError(f"data path {path} is a directory; pass one .txt/.jsonl/.csv/.parquet file")
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise ValueError(
            f"data file {path}: unknown format {path.suffix or '(no suffix)'!r}; use {', '.join(FILE_SUFFIXES)}"
        )
    return path


def _needed_columns(cfg: DataConfig) -> list[str]:
    return [cfg.label_column, cfg.text_column] if cfg.task == "classify" else [cfg.text_column]


def _check_columns(found: list[str], cfg: DataConfig, where: str) -> None:
    missing = [c for c in _needed_columns(cfg) if c not in found]
    if missing:
        flags = " and ".join(f"--{c.replace('_', '-')}" for c in ("label_column", "text_column")
                             if getattr(cfg, c) in missing)
        raise ValueError(
            f"{where}: no column {', '.join(map(repr, missing))} (columns found: {', '.join(found) or 'none'}); "
            f"name the right one with {flags}"
        )


def validate_data_source(cfg: DataConfig | str, vocab_size: int | None = None) -> str:
    """Check, cheaply and before any worker starts, that `cfg` can be loaded: the file exists and
    has the needed columns (header/first record/schema only), optional packages are installed, the
    HF set is in the offline cache, and the model vocab holds the byte tokenizer. Returns the
    source kind ("synthetic", "file", "hf"); raises a one-line ValueError naming the fix."""
    cfg = cfg if isinstance(cfg, DataConfig) else DataConfig(source=cfg)
    kind = cfg.kind
    if kind == "file":
        path = _source_file(cfg)
        if path.suffix.lower() == ".txt":
            if cfg.task == "classify":
                raise ValueError(
                    f"{path}: classification needs (label, text) columns: use a CSV, JSONL or Parquet file"
                )
        else:
            _check_columns(file_columns(path), cfg, str(path))
    elif kind == "hf":
        _check_columns(list(hf_dataset(cfg).column_names), cfg, f"data set {cfg.hf_name!r}")
    # after the source itself: a missing file is the first thing to fix
    if kind != "synthetic" and vocab_size is not None and vocab_size < TEXT_VOCAB_SIZE:
        raise ValueError(
            f"text data uses the byte tokenizer ({TEXT_VOCAB_SIZE} ids) but the model vocab is {vocab_size}; "
            f"use a model preset with a larger vocabulary (e.g. --model small)"
        )
    return kind


def load_data(cfg: DataConfig, seq_len: int, vocab_size: int, seed: int = 0) -> TokenDataset:
    """The samples of `cfg` as seq_len windows for a model with `vocab_size` ids; `seed` only
    affects the synthetic corpus (shuffling belongs to the loader)."""
    kind = validate_data_source(cfg, vocab_size)
    if kind == "synthetic":
        return synthetic_corpus(cfg.num_samples or DEFAULT_SYNTHETIC_SAMPLES, seq_len, vocab_size, seed, cfg.branching)
    if kind == "file":
        path = _source_file(cfg)
        where = str(path)
        if path.suffix.lower() == ".txt":
            columns = {cfg.text_column: [path.read_text(encoding="utf-8", errors="replace")]}
        else:
            columns = read_columns(path, _needed_columns(cfg))
    else:
        where = f"data set {cfg.hf_name!r}"
        ds = hf_dataset(cfg)
        if cfg.num_samples is not None and cfg.task == "classify":
            ds = ds.select(range(min(cfg.num_samples, len(ds))))
        columns = {c: ds[c] for c in _needed_columns(cfg)}
    texts = columns[cfg.text_column]
    if cfg.task == "lm":
        tokens = pack_lm(texts, seq_len, cfg.num_samples)
        if len(tokens) == 0:
            raise ValueError(f"{where}: fewer than {seq_len} tokens of text, not one window of --seq {seq_len}")
        return TokenDataset(where, tokens, TEXT_VOCAB_SIZE)
    labels_raw, texts = list(columns[cfg.label_column]), list(texts)
    if cfg.num_samples is not None:
        labels_raw, texts = labels_raw[: cfg.num_samples], texts[: cfg.num_samples]
    labels, num_classes = parse_labels(labels_raw, where, cfg.num_classes)
    return TokenDataset(where, encode_classification(texts, seq_len), TEXT_VOCAB_SIZE, labels, num_classes)


validate_source = validate_data_source  # the name distval.cli imports


# ---------------------------------------------------------------------------------------- loader

def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step: global_batch / (world_size × micro_batch)."""
    if global_batch < 1 or micro_batch < 1 or world_size < 1:
        raise ValueError(
            f"global batch {global_batch}, micro-batch {micro_batch} and world size {world_size} must be positive"
        )
    per_step = world_size * micro_batch
    if global_batch % per_step:
        raise ValueError(
            f"global batch {global_batch} is not divisible by world size {world_size} × micro-batch {micro_batch}; "
            f"use a multiple of {per_step}"
        )
    return global_batch // per_step


class ShardedLoader:
    """This rank's micro-batches: `next(loader)` is the next micro-batch dict, `next_step()` the
    `accum_steps` micro-batches of the next optimizer step (the split is in the module docstring).
    Epochs roll over by themselves (set_epoch(epoch + 1)); state_dict() and load_state_dict() on a
    fresh loader continue exactly where an uninterrupted loader would."""

    def __init__(self, dataset: TokenDataset, global_batch: int, micro_batch: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, shuffle: bool = True) -> None:
        self.accum_steps = accumulation_steps(global_batch, micro_batch, world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if len(dataset) < global_batch:
            raise ValueError(
                f"{dataset.name} has {len(dataset)} samples, fewer than one global batch of {global_batch}; "
                f"lower the global batch or add data"
            )
        self.dataset, self.global_batch, self.micro_batch = dataset, global_batch, micro_batch
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.epoch = 0
        self.offset = 0  # samples of this epoch consumed by all ranks together
        self.step_offset = 0  # of which in the current, unfinished step (0 between steps)
        self._order: torch.Tensor | None = None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.global_batch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning (its own shuffle)."""
        self.epoch, self.offset, self.step_offset, self._order = epoch, 0, 0, None

    def epoch_order(self) -> torch.Tensor:
        """All sample indices of this epoch, in the order a single DistributedSampler replica
        (num_replicas=1) with this seed and epoch yields them."""
        if self._order is None:
            sampler = DistributedSampler(self.dataset, num_replicas=1, rank=0, shuffle=self.shuffle, seed=self.seed)
            sampler.set_epoch(self.epoch)
            self._order = torch.tensor(list(sampler), dtype=torch.int64)
        return self._order

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.step_offset == 0 and self.offset + self.global_batch > len(self.dataset):
            self.set_epoch(self.epoch + 1)  # drop_last: the rest does not fill a global batch
        step_start = self.offset - self.step_offset
        micro_index = self.step_offset // (self.micro_batch * self.world_size)
        begin = step_start + self.rank * (self.global_batch // self.world_size) + micro_index * self.micro_batch
        indices = self.epoch_order()[begin: begin + self.micro_batch]
        # every rank takes one micro-batch in lockstep, so together they consumed micro_batch × world
        self.offset += self.micro_batch * self.world_size
        self.step_offset = (self.step_offset + self.micro_batch * self.world_size) % self.global_batch
        return self.dataset.batch(indices)

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """The `accum_steps` micro-batches of the next optimizer step."""
        if self.step_offset:
            raise ValueError("next_step() called in the middle of a step; finish it with next(loader)")
        return [next(self) for _ in range(self.accum_steps)]

    def state_dict(self) -> dict[str, int | bool]:
        """Position (epoch, offset in samples, and the part of it inside an unfinished step) plus
        what must match on resume. Offsets count all ranks' samples, so a state saved between
        steps resumes under any world size and micro-batch with the same global batch."""
        return {"epoch": self.epoch, "offset": self.offset, "step_offset": self.step_offset,
                "num_samples": len(self.dataset), "seed": self.seed, "shuffle": self.shuffle,
                "global_batch": self.global_batch, "micro_batch": self.micro_batch, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int | bool]) -> None:
        keys = ["num_samples", "seed", "shuffle"]
        if state.get("step_offset"):  # resuming inside a step needs the same split of that step
            keys += ["global_batch", "micro_batch", "world_size"]
        mine = self.state_dict()
        for key in keys:
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"data loader state was saved with {key}={state[key]} but this loader has {key}={mine[key]}; "
                    f"resume with the same data, seed and batch split"
                )
        self.set_epoch(int(state["epoch"]))
        self.offset, self.step_offset = int(state["offset"]), int(state.get("step_offset", 0))


def build_loader(data: str | DataConfig, spec: ModelSpec, micro_batch: int, grad_accum: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0) -> ShardedLoader:
    """The loader the training loop uses: `data` (a source string or DataConfig) loaded for the
    spec's seq_len and vocab, global batch = micro_batch × world_size × grad_accum."""
    cfg = data if isinstance(data, DataConfig) else DataConfig(source=data)
    dataset = load_data(cfg, spec.seq_len, spec.vocab_size, seed)
    return ShardedLoader(dataset, micro_batch * world_size * grad_accum, micro_batch, rank, world_size, seed)
