"""The typer app every command registers on, the --debug switch and JSON/text output."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

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
    """A command's result as its stable ``--json`` document (docs/json.md): the record's dict, keys sorted, strict
    JSON (a number that is not finite is written as the string "Infinity", "-Infinity" or "NaN")."""
    return json.dumps(finite_json(record.to_dict()), indent=2, sort_keys=True, allow_nan=False)


def finite_json(x: Any) -> Any:
    """``x`` with every float that JSON cannot hold (inf, -inf, nan) as the string Python's ``float`` and
    JavaScript's ``Number`` both read back."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x


def emit(record: R, json_out: bool, render: Callable[[R], str]) -> None:
    """Every command's result, one path: ``record`` as stable JSON with ``--json``, else the text ``render``
    makes of it (all of it reaches stdout, or one line and exit 1)."""
    from hsstore.cli.render import write_stdout

    write_stdout(json_text(record) if json_out else render(record))
