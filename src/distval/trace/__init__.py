"""Trace capture and analysis (docs/trace.md): a streaming Kineto reader (kineto.py), the events
the analysis keeps (events.py), interval arithmetic (intervals.py), the per-step breakdown and
collective matching (analyze.py), HTA's figures (hta.py) and the report (report.py)."""
