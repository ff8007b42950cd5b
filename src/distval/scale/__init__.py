"""Is this cluster as fast as it should be, and where is it not (docs/scaling.md).

config.py (the knobs of `comm pairs` and `scale`, torch-free), pairs.py (pair bandwidth by
round-robin rounds, node all_reduce, compute probe, outlier rules, bisection), run.py (`scale`:
training throughput at a ladder of world sizes next to the planner's prediction).
"""
