"""Stand-in for flash-linear-attention (tests only)."""
