"""health/diagnose.py: which rank caused a failure, from what the ranks published."""

from distval.health.diagnose import diagnose, secondary


def _state(t: float, error: str | None = None, issued: int = 10, status: str = "train step 4") -> dict:
    return {"time": t, "error": error, "issued": issued, "status": status, "pending": []}


def test_an_error_of_its_own_beats_the_peers_timeouts():
    states = {
        0: _state(1.0, "RuntimeError: Timed out waiting 60000ms for recv"),
        1: _state(2.0, "ValueError: bad shard"),
    }
    failure = diagnose(states, {})
    assert failure.rank == 1 and failure.message == "ValueError: bad shard"
    assert failure.details["ranks"][0]["error"].startswith("RuntimeError: Timed out")
    assert secondary("PeerFailed: rank 2 failed") and not secondary("ValueError: bad shard")


def test_a_rank_that_left_no_state_was_killed():
    states = {0: _state(1.0, "RuntimeError: Connection closed by peer"), 1: None, 2: _state(1.1, "Connection reset")}
    assert "died without a word" in diagnose(states, {1: {"status": "train step 7"}}).message
    failure = diagnose(states, {}, exitcodes={1: -9})
    assert failure.rank == 1 and failure.message == "killed by SIGKILL"
    # a script's ranks leave no state: the one the agent's teardown SIGTERMed is not the culprit
    failure = diagnose({0: None, 1: None}, {}, exitcodes={0: -15, 1: -9})
    assert failure.rank == 1 and failure.message == "killed by SIGKILL"


def test_the_rank_behind_in_collectives_is_the_one_the_others_wait_for():
    states = {0: _state(1.0, issued=41), 1: _state(1.0, issued=40), 2: _state(1.0, issued=41)}
    failure = diagnose(states, {1: {"status": "train step 9"}}, deadline_s=8)
    assert failure.rank == 1 and failure.last_status == "train step 9"
    assert failure.message == "stopped after 40 collective(s) while ranks [0, 2] waited in the next one " \
                              "(job stopped at its deadline of 8s)"


def test_at_a_deadline_with_no_culprit_every_rank_is_named():
    states = {0: _state(1.0, status="bench"), 1: _state(1.0, status="bench")}
    failure = diagnose(states, {0: {"status": "comm bench all_reduce 1M"}}, deadline_s=5)
    assert failure.rank is None and "deadline of 5s" in failure.message
    assert failure.last_status == "rank 0: comm bench all_reduce 1M; rank 1: bench"
