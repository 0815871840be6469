from __future__ import annotations

import importlib
import pkgutil

import pytest

import hsstore
from hsstore.core.schema.record import UNSET, Record, present


def _records() -> list[type[Record]]:
    for m in pkgutil.walk_packages(hsstore.__path__, "hsstore."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    found, todo = [], list(Record.__subclasses__())
    while todo:
        c = todo.pop()
        found.append(c)
        todo += c.__subclasses__()
    return found


def test_every_record_is_built_by_keyword_only():
    """msgspec makes only the class that says ``kw_only=True`` keyword-only, not its subclasses: records were
    positional at run time although the type checker took them as keyword-only, so ``DiffRequest("b", "a")``
    would have diffed the targets swapped. Every record of the package now refuses positional fields."""
    records = [c for c in _records() if c.__struct_fields__]
    assert len(records) > 50
    positional = []
    for c in records:
        with pytest.raises(TypeError) as e:
            c(*range(len(c.__struct_fields__)))
        if "positional" not in str(e.value):
            positional.append(f"{c.__module__}.{c.__qualname__}: {e.value}")
    assert not positional, positional


def test_present_gives_a_set_field_and_names_an_unset_one():
    assert present(0, "recipe.model.hidden_size") == 0  # a falsy value is still set
    with pytest.raises(TypeError, match="recipe.model.num_layers is not set"):
        present(UNSET, "recipe.model.num_layers")


def test_a_variant_result_holds_every_field_of_the_capture_result_with_its_type() -> None:
    """A worker spreads its capture loop's result into the variant's (``hsstore.capture.run.worker.run_variant``:
    ``VariantResult(..., **out.to_dict())``), which no type checker follows: a field the loop reports that the
    variant's result lacks or types otherwise would fail only at run time, in a worker, after the capture."""
    import typing

    from hsstore.core.schema.build import CaptureResult, VariantResult

    loop, variant = typing.get_type_hints(CaptureResult), typing.get_type_hints(VariantResult)
    assert {name: variant.get(name) for name in loop} == loop
