"""Parameters in PostgreSQL's formats, and statement texts with psycopg's
placeholders converted to ``$n`` once per text."""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import Any, Final

#: Type oids sent with parameters (0: let PostgreSQL infer it from the statement).
_UNKNOWN: Final = 0
_BOOL: Final = 16
_BYTEA: Final = 17
_INT8: Final = 20
_TEXT: Final = 25
_NUMERIC: Final = 1700
_BOOL_ARRAY: Final = 1000
TEXT_ARRAY_OID: Final = 1009
_INT8_MIN: Final = -(2**63)
_INT8_MAX: Final = 2**63 - 1

_ARRAY_HEAD: Final = struct.Struct("!iiIii").pack  # ndim, has nulls, item oid, size, lbound
_ITEM_LEN: Final = struct.Struct("!i").pack
_NULL_ITEM: Final = _ITEM_LEN(-1)
_TRUE_ITEM: Final = _ITEM_LEN(1) + b"\x01"
_FALSE_ITEM: Final = _ITEM_LEN(1) + b"\x00"
_EMPTY_TEXT_ARRAY: Final = struct.pack("!iiI", 0, 0, _TEXT)  # ndim 0, no nulls, item oid

_PLACEHOLDER: Final = re.compile(r"%(?:\((\w+)\))?([bst%])")


class Unencodable(TypeError):
    """A parameter this module does not send (the caller uses psycopg for it)."""


def text_array(items: Sequence[Any]) -> bytes:
    """``text[]`` in PostgreSQL's binary format: items ``str``, ``int`` (as decimal
    text, for statements that cast the array to NUMERIC) or None."""
    if not items:
        return _EMPTY_TEXT_ARRAY
    parts: list[bytes] = [b""]
    nulls = 0
    for item in items:
        if item is None:
            parts.append(_NULL_ITEM)
            nulls = 1
            continue
        if item.__class__ is str:
            data = item.encode()
        elif item.__class__ is int:
            data = str(item).encode()
        else:  # a bool is an int: it must not pass as 0 or 1, nor as "True"
            raise Unencodable(f"a text[] item must be str, int or None, not {item!r}")
        parts += (_ITEM_LEN(len(data)), data)
    parts[0] = _ARRAY_HEAD(1, nulls, _TEXT, len(items), 1)
    return b"".join(parts)


def _bool_array(items: Sequence[Any]) -> bytes:
    parts = [_ARRAY_HEAD(1, int(None in items), _BOOL, len(items), 1)]
    for item in items:
        if item is None:
            parts.append(_NULL_ITEM)
        elif item is True or item is False:
            parts.append(_TRUE_ITEM if item else _FALSE_ITEM)
        else:
            raise Unencodable(f"a bool[] item must be bool or None, not {item!r}")
    return b"".join(parts)


def encode(value: Any, kind: str) -> tuple[bytes | None, int, int]:
    """One parameter as (data, type oid, format: 0 text, 1 binary); ``kind`` is its
    placeholder's letter (``b`` asks for a typed ``text``, as psycopg's binary str)."""
    if value is None:
        return None, _UNKNOWN, 0
    cls = value.__class__
    if cls is str:
        return value.encode(), _TEXT if kind == "b" else _UNKNOWN, 0
    if cls is bool:
        return (b"t" if value else b"f"), _BOOL, 0
    if cls is int:
        oid = _INT8 if _INT8_MIN <= value <= _INT8_MAX else _NUMERIC
        return str(value).encode(), oid, 0
    if cls is bytes:
        return value, _BYTEA, 1
    if isinstance(value, list):
        if (
            cls is list  # a TextArray (a list subclass) is text[] whatever it holds
            and all(v is None or v.__class__ is bool for v in value)
            and any(v is not None for v in value)
        ):
            return _bool_array(value), _BOOL_ARRAY, 1
        return text_array(value), TEXT_ARRAY_OID, 1
    raise Unencodable(f"no wire encoding for {cls.__name__}")


class Parsed:
    """A statement text with psycopg's placeholders, converted once."""

    __slots__ = ("kinds", "names", "query")

    def __init__(self, sql: str) -> None:
        names: list[int | str] = []
        kinds: list[str] = []
        index: dict[str, int] = {}
        position = 0

        def swap(m: re.Match[str]) -> str:
            nonlocal position
            name, kind = m.group(1), m.group(2)
            if kind == "%":
                return "%"
            if name is None:
                names.append(position)
                kinds.append(kind)
                position += 1
                return f"${len(names)}"
            if name not in index:
                names.append(name)
                kinds.append(kind)
                index[name] = len(names)
            return f"${index[name]}"

        self.query = _PLACEHOLDER.sub(swap, sql).encode()
        if position and index:
            raise ValueError("a statement mixes positional and named placeholders")
        self.names: tuple[int | str, ...] = tuple(names)
        self.kinds: tuple[str, ...] = tuple(kinds)
