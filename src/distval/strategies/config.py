"""The options of the data-parallel strategies (`StrategyConfig`): torch-free, so the command line
reads its flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from distval.knobs import FieldError, knob

MIB = 2**20  # --bucket-mb is MiB, as torch's bucket_cap_mb


BUCKET_HELP = ("Bucket cap in MiB (as torch's bucket_cap_mb) of bucket_ddp_async, pytorch_ddp, zero1 and zero2; "
               "compare: a comma list sweeps the sizes (e.g. 1,5,25,100) and names the best.")


def bucket_sizes(text: str, flag: str = "--bucket-mb") -> list[float]:
    """`--bucket-mb 25` or a comma list `1,5,25,100` (MiB, each > 0, no repeats)."""
    sizes: list[float] = []
    for item in (s.strip() for s in str(text).split(",")):
        if not item:
            continue
        try:
            size = float(item)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: give MiB as a number or a comma list (1,5,25,100)") from None
        if not size > 0 or size in sizes:
            raise ValueError(f"{flag} {text!r}: sizes must be positive and different")
        sizes.append(size)
    if not sizes:
        raise ValueError(f"{flag}: give a size in MiB")
    return sizes


def _one_size(text: str, flag: str) -> float:
    sizes = bucket_sizes(text, flag)
    if len(sizes) > 1:
        raise ValueError(f"{flag} {','.join(f'{x:g}' for x in sizes)}: one size here (compare sweeps a list)")
    return sizes[0]


@dataclass(frozen=True)
class StrategyConfig:
    bucket_mb: float = knob(25.0, parse=_one_size, text="25",
                            help=BUCKET_HELP)
    comm_hook: str = knob("none", help="pytorch_ddp: none, fp16, bf16 or powersgd.")
    powersgd_rank: int = knob(1, help="Rank of PowerSGD's approximation.")
    mixed_precision: str = knob("none", help="fsdp2: none or bf16 (bf16 parameters for "
                                "compute, fp32 gradient reduction).")

    def __post_init__(self) -> None:
        if self.bucket_mb <= 0:
            raise FieldError("bucket_mb", f"must be positive (got {self.bucket_mb:g})")
        if self.comm_hook not in ("none", "fp16", "bf16", "powersgd"):
            raise FieldError("comm_hook", f"must be none, fp16, bf16 or powersgd (got {self.comm_hook!r})")
        if self.powersgd_rank < 1:
            raise FieldError("powersgd_rank", f"must be at least 1 (got {self.powersgd_rank})")
        if self.mixed_precision not in ("none", "bf16", "fp16"):
            raise FieldError("mixed_precision", f"must be none, bf16 or fp16 (got {self.mixed_precision!r})")

    @property
    def bucket_bytes(self) -> int:
        """The bucket cap in bytes, as torch's DDP computes it from bucket_cap_mb."""
        return int(self.bucket_mb * MIB)
