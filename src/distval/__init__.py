"""distval: validate, benchmark, profile and harden distributed PyTorch training."""

__version__ = "0.1.0"
