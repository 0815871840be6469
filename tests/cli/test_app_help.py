"""Help text is whole: every option's help and every command's summary appear in `--help` as written
(square brackets included, nothing cut with "..."), and flags show no type placeholder."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from hsstore.cli.main import app

RUNNER = CliRunner()
COMMAND = typer.main.get_command(app)


def _flat(text: str) -> str:
    """Without whitespace: the wrapping (also at hyphens) is the terminal's business, the words are ours."""
    return "".join(text.split())


def _help(*args: str) -> str:
    r = RUNNER.invoke(app, [*args, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    return _flat(r.output)


def test_the_command_list_gives_each_summary_whole():
    out = _help()
    for name, cmd in COMMAND.commands.items():
        summary = _flat((cmd.help or "").split("\n\n")[0])
        assert summary and summary in out, f"{name}: {summary!r} not whole in hsstore --help"
    assert "..." not in out.split("Commands:", 1)[1]


@pytest.mark.parametrize("name", sorted(COMMAND.commands))
def test_every_option_help_is_printed_whole(name: str):
    out = _help(name)
    cmd = COMMAND.commands[name]
    for param in cmd.params:
        text = _flat(getattr(param, "help", None) or "")
        assert text in out, f"hsstore {name} --help: {param.name}'s help {text!r} is not printed whole"
    assert "<bool>" not in out  # a flag takes no value
    silent = [p.opts[0] for p in cmd.params if p.param_type_name == "option" and not (p.help or "").strip()]
    assert not silent, f"hsstore {name}: {silent} have no help text"
    for p in cmd.params:
        if getattr(p, "is_flag", False):
            assert _flat(f"{p.opts[0]} {p.help or ''}") in out, f"{p.opts[0]} is shown with a value placeholder"


def test_square_brackets_in_help_survive():
    assert _flat("(default: as computed; overrides [store] precision)") in _help("build")
    assert _flat("Store path or URL (overrides [store] path).") in _help("build")


@pytest.mark.parametrize("name", ["build", "convert", "import"])
def test_quiet_says_that_nothing_prints_while_it_runs(name: str):
    """--quiet silences a run for minutes; its help says so (it said only "No progress bar")."""
    r = RUNNER.invoke(app, [name, "--help"], terminal_width=400)
    assert r.exit_code == 0 and "Print nothing while the" in " ".join(r.output.split()), r.output
