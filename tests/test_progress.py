"""Live training progress: rank 0's steps, published on the rank channel, reach the console
while training runs."""

import json
import time

from distval.launch import channel as channels
from distval.train.progress import ProgressView

from conftest import run_cli


def test_progress_view_shows_each_new_step_once(capsys):
    store, _ = channels.serve()
    rank0, reader = channels.RankChannel(0, store), channels.ChannelReader(store)
    view = ProgressView(total=3, label="train x", every_s=0)
    view.tick(reader)  # nothing published yet: nothing shown
    for step in range(3):
        rank0.publish("step", {"step": step, "loss": 5.0 - step, "step_time_s": 0.25}, flush=True)
        view.tick(reader)
        view.tick(reader)  # the same step again: no second line
    view.close()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" · ")[0] for line in lines] == ["train x: step 1/3", "train x: step 2/3", "train x: step 3/3"]
    assert lines[-1].startswith("train x: step 3/3 · loss 3.0000 · 0.250 s/step")


def test_train_shows_progress_on_stderr_while_running():
    res = run_cli("train", "--nproc", "2", "--steps", "5", "--strategy", "simple_ddp", timeout=120,
                  env={"DISTVAL_PROGRESS_EVERY": "0"})
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("train simple_ddp: step ")]
    assert lines and lines[-1].startswith("train simple_ddp: step 5/5 · loss ")
    assert "step 5/5" not in res.stdout  # the report on stdout stays clean


class CountingStore:
    """A real TCPStore behind a proxy that counts the requests a reader makes."""

    def __init__(self, store):
        self.store, self.requests = store, []

    def __getattr__(self, name):
        def call(*args):
            self.requests.append(name)
            return getattr(self.store, name)(*args)
        return call


def test_a_reader_gets_every_rank_in_two_requests_once_all_have_published():
    store, _ = channels.serve()
    ranks = [channels.RankChannel(r, store) for r in range(8)]
    counting = CountingStore(store)
    reader = channels.ChannelReader(counting)
    for r in ranks[:5]:
        r.publish("heartbeat", {"step": r.rank}, flush=True)
    beats = reader.all(8, "heartbeat")  # three ranks not yet published: one read per rank
    assert [b and b["step"] for b in beats.values()] == [0, 1, 2, 3, 4, None, None, None]
    for r in ranks[5:]:
        r.publish("heartbeat", {"step": r.rank}, flush=True)
    counting.requests.clear()
    assert [b["step"] for b in reader.all(8, "heartbeat").values()] == list(range(8))
    assert counting.requests == ["check", "multi_get"]  # 2 requests, not 16
    store.set("distval/heartbeat/3", b"not json")  # a bad payload: the per-rank reads say None for that rank
    assert [b and b["step"] for b in reader.all(8, "heartbeat").values()] == [0, 1, 2, None, 4, 5, 6, 7]
    for r in ranks:
        r.publish("state", {"error": f"rank {r.rank}"}, flush=True)
    counting.requests.clear()
    assert reader.all(8, "state")[7] == {"error": "rank 7", "time": reader.all(8, "state")[7]["time"]}
    assert "multi_get" not in counting.requests  # a kind whose keys are deleted is read key by key



class SlowStore:
    """A store whose writes take 0.2 s (a loaded host's), counting those in flight."""

    def __init__(self):
        self.values, self.in_flight = {}, 0

    def set(self, key, value):
        self.in_flight += 1
        time.sleep(0.2)
        self.values[key] = value
        self.in_flight -= 1


def test_closing_a_rank_channel_waits_for_the_write_in_flight():
    """A writer thread left inside TCPStore.set (the GIL released) while the interpreter finalizes
    aborts the process ("terminate called without an active exception"): a job that finished,
    reported as killed by SIGABRT. close() returns only once nothing is being written."""
    store = SlowStore()
    channel = channels.RankChannel(0, store)
    channel.publish("step", {"step": 1})
    time.sleep(0.05)  # the writer thread has taken it: nothing is left for a flush to write
    channel.close()
    assert store.in_flight == 0 and json.loads(store.values["distval/step/0"])["step"] == 1
