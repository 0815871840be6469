"""``run_diff`` takes one DiffRequest (issue 42): every ``hsstore diff`` flag reaches its field of the request, the
CLI's defaults are the record's, and the record refuses a field it does not have."""

from __future__ import annotations

import inspect

import msgspec
import pytest
from helpers import run_cli

from hsstore.compare import align, diff
from hsstore.compare.diff import DiffRequest, run_diff
from hsstore.core.errors import BadInput

A, B, C = "a.zarr#dtype=bf16", "b.zarr#dtype=bf16", "c.zarr#dtype=fp32"
# every field of the request, each at a value other than its default, and the flag that sets it
FLAGS = {
    "floor": (["--floor", C], C),
    "layers": (["--layers", "3", "--layers", "1"], [3, 1]),
    "loss_only": (["--loss-only"], True),
    "noise_factor": (["--noise", "3.5"], 3.5),
    "device": (["--device", "cuda:1"], "cuda:1"),
    "threads": (["--threads", "3"], 3),
    "samples": (["--samples", "7"], 7),
    "fraction": (["--fraction", "0.25"], 0.25),
    "seed": (["--seed", "11"], 11),
    "confidence": (["--confidence", "0.9"], 0.9),
    "allow_different_models": (["--allow-different-models"], True),
}


class Stop(BadInput):
    """Raised by the stand-in run_diff once it has the request (exit 2, nothing read)."""


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[DiffRequest, object]]:
    """What ``hsstore diff`` passed to run_diff (the request, A's opened reader); no store is opened."""
    calls: list[tuple[DiffRequest, object]] = []
    opened = object()

    def fake_run_diff(request: DiffRequest, a_reader: object = None) -> None:
        calls.append((request, a_reader))
        raise Stop("stand-in run_diff: request recorded")

    monkeypatch.setattr(diff, "open_target", lambda target: opened)
    monkeypatch.setattr(align, "should_align", lambda reader: False)
    monkeypatch.setattr(diff, "run_diff", fake_run_diff)
    return calls


def _cli_request(calls: list[tuple[DiffRequest, object]], *args: str) -> DiffRequest:
    r = run_cli("diff", A, B, *args)
    assert r.returncode == 2 and "request recorded" in r.stderr, (r.returncode, r.stderr)
    assert len(calls) == 1
    request, a_reader = calls.pop()
    assert a_reader is not None  # A opened once by the CLI and handed over, not opened again
    return request


def test_every_flag_reaches_its_field_of_the_request(asked: list[tuple[DiffRequest, object]]):
    fields = {f.name for f in msgspec.structs.fields(DiffRequest)}
    assert fields == {"a_target", "b_target", *FLAGS}, "a field of DiffRequest has no flag here (or a flag no field)"
    request = _cli_request(asked, *(arg for args, _ in FLAGS.values() for arg in args))
    want = DiffRequest(a_target=A, b_target=B, **{name: value for name, (_, value) in FLAGS.items()})
    default = DiffRequest(a_target=A, b_target=B)
    for name in FLAGS:  # each set to a value not its default: a flag dropped on the way shows as the default
        assert getattr(want, name) != getattr(default, name), name
    assert {n: getattr(request, n) for n in fields} == {n: getattr(want, n) for n in fields}


def test_the_clis_defaults_are_the_requests(asked: list[tuple[DiffRequest, object]]):
    assert _cli_request(asked) == DiffRequest(a_target=A, b_target=B)


def test_run_diff_takes_the_request_and_an_opened_reader():
    assert list(inspect.signature(run_diff).parameters) == ["request", "a_reader"]
    assert DiffRequest(a_target=A, b_target=B).noise_factor == diff.NOISE_FACTOR


def test_the_request_refuses_unknown_fields():
    with pytest.raises(TypeError):
        DiffRequest(a_target=A, b_target=B, noise=3.0)  # type: ignore[call-arg]  # (the flag's name, not the field's)
    with pytest.raises(BadInput, match="noise"):
        DiffRequest.from_dict({"a_target": A, "b_target": B, "noise": 3.0}, "diff request", BadInput)
    with pytest.raises(BadInput, match="seed"):
        DiffRequest.from_dict({"a_target": A, "b_target": B, "seed": "1"}, "diff request", BadInput)
