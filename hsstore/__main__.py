"""``python -m hsstore`` is the same CLI (so ``torchrun -m hsstore build ...`` works)."""

from .cli import main

main()
