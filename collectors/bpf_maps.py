"""Read-and-clear of a BPF hash map by its file descriptor, once per interval.

The agent never imports BCC (its LLVM costs ~100 MB of RSS, see collectors/ebpf_loader.py):
it holds the maps' file descriptors and talks to them with the bpf(2) syscall directly.

Reading every key and then deleting it would drop the events counted between the two steps;
BPF_MAP_LOOKUP_AND_DELETE_BATCH (kernel >= 5.6) copies and removes each bucket under its lock.
Kernels without it get the per-key walk (GET_NEXT_KEY, LOOKUP, DELETE), which can lose the
increments that land between a key's lookup and its delete. Keys and values come back as raw
bytes and are decoded with `struct`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_CHUNK = 256  # entries per syscall (more calls when a map holds more); a bucket holds far fewer
_BPF_NR = {"x86_64": 321, "aarch64": 280}
BPF_MAP_LOOKUP_ELEM, BPF_MAP_DELETE_ELEM, BPF_MAP_GET_NEXT_KEY = 1, 3, 4
BPF_MAP_LOOKUP_AND_DELETE_BATCH = 25
# union bpf_attr, the `batch` member (linux/bpf.h): in_batch, out_batch, keys, values,
# count (u32, written back by the kernel), map_fd (u32), elem_flags, flags.
_BATCH_ATTR = struct.Struct("=QQQQIIQQ")
_BATCH_COUNT_OFFSET = 32
# union bpf_attr, the element member: map_fd, key, value (or next_key), flags.
_ELEM_ATTR = struct.Struct("=I4xQQQ")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def bpf(cmd: int, attr: ctypes.Array) -> int:
    """The bpf(2) syscall; raises OSError with the kernel's errno."""
    nr = _BPF_NR.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2): unknown syscall number on {platform.machine()}")
    res = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr,
                        ctypes.c_uint(ctypes.sizeof(attr)))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return res


def _addr(buf: ctypes.Array) -> int:
    return ctypes.addressof(buf)


class MapDrainer:
    """Drains one BPF hash map of fixed-size keys and values into (key tuple, value tuple)."""

    def __init__(self, map_fd: int, key_format: str, value_format: str = "=Q",
                 chunk: int = _CHUNK) -> None:
        self.fd = map_fd
        self._key = struct.Struct(key_format)
        self._value = struct.Struct(value_format)
        self._chunk = chunk
        self._keys = ctypes.create_string_buffer(self._key.size * chunk)
        self._values = ctypes.create_string_buffer(self._value.size * chunk)
        self._tokens = ctypes.create_string_buffer(16)  # in_batch, out_batch
        self._attr = ctypes.create_string_buffer(_BATCH_ATTR.size)
        self.batch = True  # falls back to per-key reads on kernels without batch operations

    def drain(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Every entry of the map, removed from it."""
        if self.batch:
            try:
                return self._drain_batch()
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                self.batch = False
        return self._drain_each()

    def _drain_batch(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        key_size, value_size = self._key.size, self._value.size
        tokens = _addr(self._tokens)
        first = True
        while True:
            _BATCH_ATTR.pack_into(
                self._attr, 0, 0 if first else tokens, tokens + 8, _addr(self._keys),
                _addr(self._values), self._chunk, self.fd, 0, 0)
            try:
                bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH, self._attr)
                done = False
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: the whole map has been walked
                    raise
                done = True
            (n,) = struct.unpack_from("=I", self._attr, _BATCH_COUNT_OFFSET)
            if n:
                keys = self._key.iter_unpack(self._keys.raw[:n * key_size])
                values = self._value.iter_unpack(self._values.raw[:n * value_size])
                out.extend(zip(keys, values, strict=True))
            if done:
                return out
            ctypes.memmove(tokens, tokens + 8, 8)  # continue where the kernel stopped
            first = False

    def _drain_each(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        key_size = self._key.size
        keys: list[bytes] = []
        current = None
        next_key = ctypes.create_string_buffer(key_size)
        attr = ctypes.create_string_buffer(_ELEM_ATTR.size)
        while True:
            _ELEM_ATTR.pack_into(attr, 0, self.fd, _addr(current) if current else 0,
                                 _addr(next_key), 0)
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    break
                raise
            keys.append(next_key.raw)
            current = ctypes.create_string_buffer(next_key.raw, key_size)
        out = []
        value = ctypes.create_string_buffer(self._value.size)
        for raw in keys:
            key = ctypes.create_string_buffer(raw, key_size)
            _ELEM_ATTR.pack_into(attr, 0, self.fd, _addr(key), _addr(value), 0)
            try:
                bpf(BPF_MAP_LOOKUP_ELEM, attr)
                _ELEM_ATTR.pack_into(attr, 0, self.fd, _addr(key), 0, 0)  # no value: EINVAL
                bpf(BPF_MAP_DELETE_ELEM, attr)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                raise
            out.append((self._key.unpack(raw), self._value.unpack(value.raw)))
        return out
