"""The typer app every command registers on, the --debug switch and JSON/text output."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(
    help="Cached hidden states for speculative-decoding drafters, with provenance you can check.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
)
state = {"debug": False}


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    state["debug"] = debug


def emit(obj: object, json_out: bool, text: str) -> None:
    """``obj`` as stable JSON with ``--json``, else ``text`` (all of it, or one line and exit 1)."""
    from hsstore.cli.render import write_stdout

    write_stdout(json.dumps(obj, indent=2, sort_keys=True, default=str) if json_out else text)
