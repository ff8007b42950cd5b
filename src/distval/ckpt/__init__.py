"""Checkpoints that never corrupt, and exact resume (the fault drills that prove both: distval/drill/).

  store.py         the on-disk format and the atomic commit protocol (temp dir, fsync, manifest
                   with SHA-256 per file written last, rename, `latest` pointer, keep-K), and
                   verified loading that skips a corrupt or partial checkpoint
  state.py         per-rank RNG states as JSON, the config fingerprint a resume must match
  checkpointer.py  the component the training loop calls: resume, save (sync or async), the
                   final save on SIGTERM, the run journal (attempts, crash-loop detection)
See docs/checkpointing.md.
"""
