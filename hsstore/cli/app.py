"""The typer app every command registers on, the --debug switch and JSON/text output."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

if TYPE_CHECKING:
    from hsstore.core.schema.record import Record

R = TypeVar("R", bound="Record")

# an option two commands share word for word (build, import); convert's names its --store
AnotherModel = Annotated[
    bool, typer.Option("--another-model", help="Let this model into a store that holds another model's states.")
]

app = typer.Typer(
    help="Cached hidden states for speculative-decoding drafters, with provenance you can check.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
state = {"debug": False}


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    state["debug"] = debug


def json_text(record: Record) -> str:
    """A command's result as its stable ``--json`` document (docs/json.md): the record's dict, keys sorted."""
    return json.dumps(record.to_dict(), indent=2, sort_keys=True)


def emit(record: R, json_out: bool, render: Callable[[R], str]) -> None:
    """Every command's result, one path: ``record`` as stable JSON with ``--json``, else the text ``render``
    makes of it (all of it reaches stdout, or one line and exit 1)."""
    from hsstore.cli.render import write_stdout

    write_stdout(json_text(record) if json_out else render(record))
