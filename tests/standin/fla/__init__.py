"""Stand-in for flash-linear-attention (tests only)."""

from _standin_devices import claim_cpu

claim_cpu("fla")
