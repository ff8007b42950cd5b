"""Trace capture and analysis (docs/trace.md): a streaming Kineto reader (kineto.py), the events
the analysis keeps (events.py), interval arithmetic (intervals.py), the per-step breakdown and
collective matching (analyze.py), HTA's figures (hta.py), the report (report.py) and its terminal
views (views.py), one Perfetto trace of every rank (merge.py), two runs compared (diff.py), and
the profiler of `--trace` (capture.py, config.py)."""
