"""Read-and-clear of a BPF hash map, once per interval, without losing what arrives meanwhile.

Reading every key and then deleting it would drop the events counted between the two steps;
BPF_MAP_LOOKUP_AND_DELETE_BATCH (kernel >= 5.6) copies and removes each bucket under its lock.
BCC 0.26's own wrapper (Table.items_lookup_and_delete_batch) passes one variable as both the
input and output batch token, and allocates arrays of the map's maximum size on every call, so
this module drives the syscall itself with fixed buffers. Keys and values come back as raw
bytes and are decoded with `struct`, which is several times faster than ctypes structures.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

_CHUNK = 4096  # entries per syscall; a hash bucket never holds more than this many


class MapDrainer:
    """Drains one BCC table of fixed-size keys into (key tuple, u64 value) pairs."""

    def __init__(self, table: Any, key_format: str, chunk: int = _CHUNK) -> None:
        from bcc.libbcc import lib  # imported here: only machines with BCC get this far

        self._lib = lib
        self._table = table
        self._fd = table.map_fd
        self._key = struct.Struct(key_format)
        key_size = ctypes.sizeof(table.Key)
        if key_size != self._key.size:
            raise ValueError(f"key layout {key_format!r} is {self._key.size} bytes, "
                             f"the map's key is {key_size}")
        if ctypes.sizeof(table.Leaf) != 8:
            raise ValueError("histogram values must be u64")
        self._chunk = chunk
        self._keys = ctypes.create_string_buffer(self._key.size * chunk)
        self._values = ctypes.create_string_buffer(8 * chunk)
        self.batch = True  # falls back to per-key reads on kernels without batch operations

    def drain(self) -> list[tuple[tuple[int, ...], int]]:
        """Every entry of the map, removed from it."""
        if self.batch:
            try:
                return self._drain_batch()
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                self.batch = False
        return self._drain_each()

    def _drain_batch(self) -> list[tuple[tuple[int, ...], int]]:
        out: list[tuple[tuple[int, ...], int]] = []
        token_in, token_out = ctypes.c_uint32(0), ctypes.c_uint32(0)
        first = True
        unpack_keys = self._key.iter_unpack
        key_size = self._key.size
        while True:
            count = ctypes.c_uint32(self._chunk)
            ctypes.set_errno(0)
            res = self._lib.bpf_lookup_and_delete_batch(
                self._fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
                self._keys, self._values, ctypes.byref(count))
            err = ctypes.get_errno() or (-res if res < 0 else 0)
            n = count.value
            if n:
                keys = unpack_keys(self._keys.raw[:n * key_size])
                values = struct.unpack(f"={n}Q", self._values.raw[:n * 8])
                out.extend(zip(keys, values, strict=True))
            if res != 0:
                if err == errno.ENOENT:  # the whole map has been walked
                    return out
                raise OSError(err, f"BPF_MAP_LOOKUP_AND_DELETE_BATCH: {os.strerror(err)}")
            token_in.value = token_out.value
            first = False

    def _drain_each(self) -> list[tuple[tuple[int, ...], int]]:
        out = []
        table = self._table
        for key in list(table.keys()):
            try:
                value = table[key].value
                del table[key]
            except KeyError:
                continue
            out.append((self._key.unpack(bytes(key)), value))
        return out
