"""JSON and TOML from users, checked before code that trusts it: a value nested deeper than any real row,
manifest or config is refused before Python's recursive parsers (or templates and ``json.dumps`` walking it
later) end in a RecursionError traceback (the depth is measured without recursion); a string holding a lone
UTF-16 surrogate (JSON's ``"\\ud800"``) is found before a tokenizer fails to encode it."""

from __future__ import annotations

import json
import sys
from typing import Any

MAX_INPUT_DEPTH = 64  # chat rows with tool schemas nest ~15 levels; a manifest 3


class TooDeep(ValueError):
    """A parsed value (or the text being parsed) nests deeper than the limit."""


def nesting_depth(value: Any, stop: int | None = None) -> int:
    """Levels of dicts and lists in ``value`` (a scalar is 0, ``[]`` is 1); counting stops past ``stop``."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if stop is not None and deepest > stop:
            break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def check_depth(value: Any, limit: int = MAX_INPUT_DEPTH) -> Any:
    """``value`` if it nests at most ``limit`` levels; TooDeep otherwise."""
    if nesting_depth(value, stop=limit) > limit:
        raise TooDeep(f"nested deeper than {limit} levels")
    return value


def loads_bounded(text: str | bytes, limit: int | None = MAX_INPUT_DEPTH) -> Any:
    """``json.loads(text)``, nested at most ``limit`` levels (None: as deep as the parser gets): TooDeep (a
    ValueError) instead of a RecursionError; json.JSONDecodeError for text that is not JSON (or holds a
    number too long for Python to read, a ValueError of its own otherwise)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested too deeply to parse (more than {limit or MAX_INPUT_DEPTH} levels)") from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise json.JSONDecodeError(
            f"a number longer than {sys.get_int_max_str_digits()} digits", text if isinstance(text, str) else "", 0
        ) from None
    return value if limit is None else check_depth(value, limit)


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate (as ``\\udXXX``) in the strings (keys included) of ``value``, if any."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"\\u{ord(node[e.start]):04x}"
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None
