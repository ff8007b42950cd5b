"""The training harness: the workload (`model.py`: the decoder built from a plan preset's
ModelSpec; `data.py`: data sources, byte tokenizer and the sharded, resumable loader). See
docs/training-workload.md."""
