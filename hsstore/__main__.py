"""``python -m hsstore`` is the same CLI (so ``torchrun -m hsstore build ...`` works)."""

from hsstore.cli.main import run

run()
