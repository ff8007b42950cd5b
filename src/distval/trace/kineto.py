"""A streaming reader of Kineto trace files (torch.profiler's `export_chrome_trace` JSON, plain
or gzip), in bounded memory: the top-level object is read key by key, and `traceEvents` one
event at a time (the C scanner of `json` decodes each event; the file is never held whole).

    header, events = open_trace(path)   # events: an iterator of dicts; header fills as it reads
    for event in events: ...
    header["distributedInfo"]            # complete once the iterator is exhausted

Every way a file can be unreadable (not gzip though named so, cut short, not JSON, JSON but not
a Kineto trace, no events) is a TraceError naming the file: one line for the user.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20
_SCAN = json.JSONDecoder().scan_once  # the C scanner: (value, end) for the JSON value at an index
_SPACE = re.compile(r"[ \t\n\r]*")
_NEXT = re.compile(r"[ \t\n\r]*(,)?[ \t\n\r]*")  # the gap before the next event, and its comma


class TraceError(ValueError):
    """A trace file we cannot read; the message names the file and says why."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason

    def __reduce__(self):  # it crosses process boundaries (files read in parallel)
        return TraceError, (self.path, self.reason)


def _open(path: Path) -> IO[str]:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")


class _Stream:
    """A growing text buffer over the file: values are decoded at `pos`, more is read when a
    value runs past the end of what has been read."""

    def __init__(self, path: Path, f: IO[str]):
        self.path, self.f, self.buf, self.pos, self.eof, self.read_chars = path, f, "", 0, False, 0

    def more(self) -> bool:
        if self.eof:
            return False
        try:
            text = self.f.read(max(CHUNK, len(self.buf) - self.pos))  # doubles for a value larger than a chunk
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise TraceError(self.path, f"the gzip stream is cut short or corrupt ({e})") from None
        except UnicodeDecodeError:
            raise TraceError(self.path, "not a text (JSON) file") from None
        self.read_chars += len(text)
        self.buf, self.pos = self.buf[self.pos:] + text, 0
        self.eof = not text
        return bool(text)

    def peek(self) -> str:
        """The next non-space character ('' at the end of the file)."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def expect(self, char: str, what: str) -> None:
        if self.peek() != char:
            raise TraceError(self.path, self._bad(what))
        self.pos += 1

    def value(self, what: str) -> Any:
        """Decode the JSON value at the cursor. A value cut by the end of the buffer fails at a
        place that moves once more is read; an error that stays put is bad JSON."""
        self.peek()
        last = None
        while True:
            try:
                value, self.pos = _SCAN(self.buf, self.pos)
                return value
            except (json.JSONDecodeError, StopIteration) as e:
                at, msg = (e.pos, e.msg) if isinstance(e, json.JSONDecodeError) else (e.value, "Expecting value")
                where = (self.read_chars - len(self.buf) + at, msg)
                if where == last:
                    raise TraceError(self.path, f"not valid JSON in {what} near character {where[0]}: "
                                                f"{msg}") from None
                last = where
                if not self.more():
                    raise TraceError(self.path, f"cut short or not valid JSON in {what} near character "
                                                f"{where[0]} (truncated file?)") from None

    def _bad(self, what: str) -> str:
        if self.eof and self.pos >= len(self.buf):
            return f"cut short: ends before {what} (truncated file?)"
        return f"not a Kineto trace: expected {what} near character {self.read_chars - len(self.buf) + self.pos}"


def open_trace(path: str | Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """The header (every top-level key but traceEvents, filled as the file is read) and an
    iterator over the events. Raises TraceError for a file that is missing, empty or not a trace."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(path, "no such file")
    if path.stat().st_size == 0:
        raise TraceError(path, "empty file")
    header: dict[str, Any] = {}
    return header, _events(path, header)


def _list(s: _Stream) -> Iterator[dict[str, Any]]:
    """The events of the traceEvents list, the cursor just past its '['. The hot loop of the
    reader: within the buffer it calls only the regex and the C scanner; the buffer's end and
    every error go through the careful path (`more`, `value`)."""
    buf, pos, need_comma = s.buf, s.pos, False
    while True:
        m = _NEXT.match(buf, pos)
        if m.group(1) is not None:
            if not need_comma:
                s.pos = m.start(1)
                raise TraceError(s.path, s._bad("an event"))
            need_comma = False
        pos = m.end()
        if pos >= len(buf):
            s.pos = pos
            if not s.more():
                raise TraceError(s.path, "cut short inside the traceEvents list (truncated file?)")
            buf, pos = s.buf, s.pos
            continue
        if buf[pos] == "]":
            s.pos = pos + 1
            return
        if need_comma:
            s.pos = pos
            raise TraceError(s.path, s._bad("',' between events"))
        try:
            event, pos = _SCAN(buf, pos)
        except (json.JSONDecodeError, StopIteration):  # cut by the buffer's end, or bad: the careful path
            s.pos = pos
            event = s.value("an event")
            buf, pos = s.buf, s.pos
        need_comma = True
        if isinstance(event, dict):
            yield event


def _events(path: Path, header: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with _open(path) as f:
        s = _Stream(path, f)
        if s.peek() != "{":
            raise TraceError(path, "not a Kineto trace: the file is not a JSON object" if s.peek() else "empty file")
        s.pos += 1
        seen_events, first_key = False, True
        while s.peek() != "}":
            if not first_key:
                s.expect(",", "',' between keys")
            first_key = False
            if s.peek() != '"':
                raise TraceError(path, s._bad("a key"))
            key = s.value("a key")
            s.expect(":", f"':' after {key!r}")
            if key != "traceEvents":
                header[key] = s.value(repr(key))
                continue
            seen_events = True
            s.expect("[", "the traceEvents list")
            yield from _list(s)
        if not seen_events:
            raise TraceError(path, "not a Kineto trace: no traceEvents (was it written by torch.profiler?)")
