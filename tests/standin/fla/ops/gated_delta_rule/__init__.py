"""Stand-in kernels: importable, never meant to run."""


def chunk_gated_delta_rule(*args, **kwargs):
    raise RuntimeError("stand-in fla kernel called")


def fused_recurrent_gated_delta_rule(*args, **kwargs):
    raise RuntimeError("stand-in fla kernel called")
