"""The libpq functions the wire calls holding the GIL, found in the libpq psycopg
loaded (or none, and then psycopg's own calls are made)."""

from __future__ import annotations

import ctypes
from array import array
from functools import cache
from typing import Final


class LibPq:
    """The libpq calls the wire makes that psycopg's binary wrapper makes with the
    GIL released (``send_*``, ``is_busy``), made with it held: they never block (the
    connection is non-blocking) and take microseconds, while taking the GIL back
    after each waits behind the event loop's thread for up to the switch interval
    (``server/run.py``) — measured, dozens of such waits per batch."""

    def __init__(self, path: str) -> None:
        lib = ctypes.PyDLL(path)  # PyDLL: calls keep the GIL
        # Parameter arrays go as addresses of ``array`` buffers, and each value as the
        # address of its bytes object's data: building ctypes arrays of ``c_char_p``
        # cost ~11 µs per statement of 14 parameters (measured), this ~5.
        p, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        self.send_params = lib.PQsendQueryParams
        self.send_params.argtypes = [p, c, i, p, p, p, p, i]
        self.send_prepare = lib.PQsendPrepare
        self.send_prepare.argtypes = [p, c, c, i, p]
        self.send_prepared = lib.PQsendQueryPrepared
        self.send_prepared.argtypes = [p, c, i, p, p, p, i]
        self.is_busy = lib.PQisBusy
        self.is_busy.argtypes = [p]
        for f in (self.send_params, self.send_prepare, self.send_prepared, self.is_busy):
            f.restype = i


#: Where a ``bytes`` object's data starts, from its address (CPython's layout; checked
#: by :func:`loaded_libpq` before the wire relies on it).
BYTES_DATA: Final = bytes.__basicsize__ - 1


def layout_holds() -> bool:
    probe = b"troth wire probe"
    return (
        array("Q").itemsize == ctypes.sizeof(ctypes.c_void_p)
        and array("i").itemsize == ctypes.sizeof(ctypes.c_int)
        and array("I").itemsize == ctypes.sizeof(ctypes.c_uint)
        and ctypes.string_at(id(probe) + BYTES_DATA, len(probe)) == probe
    )


@cache
def loaded_libpq() -> LibPq | None:
    """The libpq psycopg loaded (its connections' pointers are that library's), or
    None when it cannot be told for sure — not exactly one libpq in this process's
    maps (calling one build's functions on another's connection would corrupt
    memory) — and then psycopg's own calls are made."""
    if not layout_holds():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {
                path
                for line in maps
                if (path := line.rsplit(None, 1)[-1]).rsplit("/", 1)[-1].startswith("libpq")
            }
        return LibPq(paths.pop()) if len(paths) == 1 else None
    except (OSError, AttributeError):
        return None
