"""Buffer files: a buffer's state in one safetensors file, written and read a chunk at a time.

A buffer of 2^25 transitions holds about 14 GB of rows. ``torch.save`` of its state would copy
each tensor to the host whole, so a save would need 14 GB of host memory at once. Here every
tensor goes to the file in chunks of :data:`CHUNK_BYTES` (device to host, host to disk), so a save
holds one chunk at a time whatever the buffer's size, and a load reads the rows back the same way.

The file is a plain `safetensors <https://github.com/huggingface/safetensors>`_ file: an 8-byte
little-endian header length, a JSON header (each tensor's dtype, shape and byte range, and
gper's settings, seed and host counts under ``__metadata__``), then the raw bytes of every
tensor. Reading it never unpickles anything; any safetensors reader can open it. gper writes it
itself (the safetensors library writes only tensors it holds in memory whole) and reads it with
the safetensors library.

Writes are atomic: the file is written under a temporary name in the same folder, flushed to
disk, then renamed over ``path``; a crash at any moment leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from gper._files import atomic_file

#: bytes moved per device-to-host copy and per write: the save's host memory, whatever the buffer's size
CHUNK_BYTES = 64 * 2**20

#: the largest header read (the safetensors library's own limit is 100 MB)
_MAX_HEADER = 100_000_000

#: the value of ``__metadata__["format"]`` in a gper buffer file
FORMAT = "gper.replay/1"

_DTYPES = {
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.bool: "BOOL",
}


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's bytes."""
    t = t.detach().contiguous()
    return t.view(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def write_tensors(
    path: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, Any],
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write ``tensors`` and JSON-able ``metadata`` to a safetensors file at ``path``, atomically,
    a chunk of :data:`CHUNK_BYTES` at a time; ``progress(done, total)`` after each chunk.

    Returns:
        bytes written.
    """
    header: dict[str, Any] = {"__metadata__": {"format": FORMAT, "gper": json.dumps(metadata)}}
    end = 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} has no safetensors name")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [end, end + n]}
        end += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    done = 0
    with atomic_file(path) as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in tensors.values():
            flat = _as_bytes(t)
            for lo in range(0, flat.numel(), CHUNK_BYTES):
                chunk = flat[lo : lo + CHUNK_BYTES].cpu()
                f.write(memoryview(chunk.numpy()))
                done += chunk.numel()
                if progress is not None:
                    progress(done, end)
    return 8 + len(blob) + end


class TensorFile:
    """A safetensors file opened for reading, held open until :meth:`close` (or the ``with`` block ends).

    The file is opened once and everything is read from that open file: a save that replaces
    ``path`` meanwhile (an atomic rename: a new file) does not mix into the load. The safetensors
    library checks the format (its header against the file's size) on the same file; tensors are
    read with plain reads a chunk at a time into one reused host buffer, so a load's host memory
    is one chunk (a memory map would count the whole file as resident as it is read).

    Raises:
        ValueError: the file is missing, truncated, changed while being opened, or not a gper
            buffer file (the message names it).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        try:
            from safetensors import SafetensorError, safe_open
        except ImportError as err:  # a core dependency: only a broken install lacks it
            msg = "gper: reading buffer files needs the safetensors package: pip install safetensors"
            raise ImportError(msg) from err
        self.path = Path(path)
        try:
            self._f = open(self.path, "rb")  # noqa: SIM115 - held until close()
        except OSError as err:
            raise ValueError(f"{self.path}: not a readable buffer file ({err})") from err
        try:
            st = os.fstat(self._f.fileno())
            n = int.from_bytes(self._f.read(8), "little")
            if not 0 < n <= min(st.st_size - 8, _MAX_HEADER):
                raise ValueError(f"a header of {n} bytes in a file of {st.st_size}")
            self._header = json.loads(self._f.read(n))
            self._data_start = 8 + n
            # the format checked by the safetensors library, on this same file (same inode, size)
            meta = safe_open(str(self.path), framework="pt", device="cpu").metadata() or {}
            now = os.stat(self.path)
            if (now.st_ino, now.st_dev, now.st_size) != (st.st_ino, st.st_dev, st.st_size):
                raise ValueError("the file was replaced while it was being opened")
            ends = [v["data_offsets"][1] for k, v in self._header.items() if k != "__metadata__"]
            if self._data_start + max(ends, default=0) != st.st_size:
                raise ValueError("its size differs from its header's")
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as err:
            self._f.close()
            raise ValueError(f"{self.path}: not a readable buffer file ({err})") from err
        if meta.get("format") != FORMAT:
            self._f.close()
            got = meta.get("format")
            raise ValueError(f"{self.path}: not a gper buffer file (format {got!r}, expected {FORMAT!r})")
        try:
            self.metadata: dict[str, Any] = json.loads(meta["gper"])
        except (KeyError, json.JSONDecodeError) as err:
            self._f.close()
            raise ValueError(f"{self.path}: the buffer file's settings are unreadable ({err})") from err

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()

    def keys(self) -> list[str]:
        return [k for k in self._header if k != "__metadata__"]

    def meta(self, name: str) -> tuple[torch.Size, torch.dtype | None]:
        """(shape, dtype) of tensor ``name`` without reading it."""
        entry = self._header[name]
        return torch.Size(entry["shape"]), {v: k for k, v in _DTYPES.items()}.get(entry["dtype"])

    def copy_into(self, name: str, dst: torch.Tensor) -> None:
        """Copy tensor ``name`` into contiguous ``dst`` (same shape and dtype) a chunk at a time."""
        begin, end = self._header[name]["data_offsets"]
        flat = _as_bytes(dst) if dst.is_contiguous() else None
        if flat is None or flat.data_ptr() != dst.data_ptr() or flat.numel() != end - begin:
            raise ValueError(f"copy_into({name!r}): needs a contiguous tensor of {end - begin} bytes")
        buf = torch.empty(min(CHUNK_BYTES, end - begin), dtype=torch.uint8)
        view = memoryview(buf.numpy())
        self._f.seek(self._data_start + begin)
        for lo in range(0, end - begin, CHUNK_BYTES):
            n = min(CHUNK_BYTES, end - begin - lo)
            if self._f.readinto(view[:n]) != n:
                raise OSError(f"{self.path}: ends inside tensor {name!r} (cut short while being read)")
            flat[lo : lo + n].copy_(buf[:n])
