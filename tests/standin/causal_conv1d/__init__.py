"""Stand-in for causal-conv1d (tests only): importable, never meant to run."""

from _standin_devices import claim_cpu

claim_cpu("causal_conv1d")


def causal_conv1d_fn(*args, **kwargs):
    raise RuntimeError("stand-in causal_conv1d kernel called")


def causal_conv1d_update(*args, **kwargs):
    raise RuntimeError("stand-in causal_conv1d kernel called")
