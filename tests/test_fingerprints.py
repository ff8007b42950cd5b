"""health/fingerprints.py: windows of K collectives cut from Flight Recorder entries, and the
cross-rank comparison that names the rank(s) outside the majority with both sides."""

from distval.health.fingerprints import compare, digest, fingerprint, windows


def entry(seq: int, op: str = "all_reduce", sizes=((4,),), dtype: str = "Float", pg: str = "0", **extra) -> dict:
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "process_group": [pg, "default_pg"],
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype], "output_sizes": [[4]],
            "output_dtypes": [dtype], "is_p2p": False, "time_created_ns": seq * 10**9, **extra}


def published(prints: dict) -> dict:
    """What each rank publishes (the channel adds the time)."""
    return {r: {"windows": doc, "time": 1.0} for r, doc in prints.items()}


def test_a_fingerprint_keeps_what_every_rank_of_a_correct_job_shares():
    assert fingerprint(entry(1)) == "all_reduce [[4]] Float"
    # a scatter's input lives on its root only: its output is what the ranks share
    assert fingerprint(entry(2, "scatter", sizes=(), input_dtypes=[])) == "scatter [[4]] Float"
    assert fingerprint(entry(3, "all_to_all", sizes=((7,),))) == "all_to_all ['Float']"  # splits may differ


def test_windows_are_cut_at_multiples_of_k_and_only_whole_ones_are_taken():
    entries = [entry(s) for s in range(3, 11)] + [entry(1, pg="1"), entry(2, pg="1"), entry(5, is_p2p=True)]
    got = windows(entries, {"0": 10, "1": 2}, every=2, done={"0": 2})
    assert sorted(got["0"]) == [3, 4, 5]  # window 2 (seqs 3-4) already taken; 6 (11-12) not complete
    assert got["0"][3] == {"prints": ["all_reduce [[4]] Float"] * 2, "times": [5.0, 6.0]} and list(got["1"]) == [1]
    assert windows(entries[1:], {"0": 4}, every=2, done={}) == {}  # seq 3 fell out of the buffer


def test_a_differing_window_names_the_minority_and_the_first_collective_that_differs():
    good = ["all_reduce [[4]] Float"] * 4
    bad = good[:2] + ["all_reduce [[1, 4]] Float"] + good[3:]
    times = [100.0, 101.0, 102.0, 103.0]
    prints = {r: {"0": {"7": {"prints": p, "times": times}}} for r, p in enumerate([good, bad, good])}
    digests = {r: {"0": {"6": "same", "7": digest(p["0"]["7"]["prints"])}} for r, p in prints.items()}
    culprits, verdict, issued_at = compare(digests, 4, lambda: published(prints))
    assert culprits == [1] and issued_at == 102.0
    assert verdict == ("collective #27 of group 0 differs: rank 1 issued all_reduce [[1, 4]] Float, while ranks 0, 2 "
                       "issued all_reduce [[4]] Float")
    assert compare({0: digests[0], 2: digests[2]}, 4, lambda: prints) is None


def test_without_a_majority_the_collective_no_rank_issued_elsewhere_is_the_odd_one():
    step = ["all_reduce [[4]] Float", "broadcast [[2]] Float"]
    odd = ["all_reduce [[1, 4]] Float", step[1]]
    prints = {r: {"0": {"2": {"prints": step, "times": [1, 2]}, "3": {"prints": last, "times": [3, 4]}}}
              for r, last in enumerate([step, odd])}
    digests = {r: {"0": {w: digest(f["prints"]) for w, f in doc["0"].items()}} for r, doc in prints.items()}
    culprits, verdict, _ = compare(digests, 2, lambda: published(prints))
    assert culprits == [1] and verdict == (
        "collective #5 of group 0 differs: rank 1 issued all_reduce [[1, 4]] Float, while rank 0 issued all_reduce "
        "[[4]] Float (no majority: rank 1's is the one no rank issued anywhere else)")


def test_two_ranks_that_differ_and_nothing_decides_are_both_named():
    a, b = ["broadcast [[4]] Float"], ["all_reduce [[4]] Float"]
    prints = {0: {"1": {"3": {"prints": a, "times": [9]}}}, 1: {"1": {"3": {"prints": b, "times": [9]}}}}
    digests = {0: {"1": {"3": digest(a)}}, 1: {"1": {"3": digest(b)}}}
    culprits, verdict, _ = compare(digests, 1, lambda: published(prints))
    assert culprits == [0, 1] and verdict.endswith("(no majority decides)")
    assert "rank 0 issued broadcast [[4]] Float; rank 1 issued all_reduce [[4]] Float" in verdict
    # fingerprints already replaced by newer windows: the digests still name the ranks
    culprits, verdict, issued_at = compare({0: {"1": {"3": "x"}}, 1: {"1": {"3": "y"}}}, 1, lambda: {0: {}, 1: None})
    assert culprits == [0, 1] and issued_at is None
    assert "collectives #3-#3 of group 1 differ between rank 0 and rank 1" in verdict


def test_a_window_that_is_a_prefix_of_the_others_is_a_rank_that_ended_early_not_a_mismatch():
    full, part = ["all_reduce [[4]] Float"] * 3, ["all_reduce [[4]] Float"] * 2  # the job's last part-window
    prints = {0: {"0": {"9": {"prints": full, "times": [1, 2, 3]}}}, 1: {"0": {"9": {"prints": part, "times": [1, 2]}}}}
    assert compare({0: {"0": {"9": digest(full)}}, 1: {"0": {"9": digest(part)}}}, 3, lambda: published(prints)) is None
