"""The IDX file format of MNIST (and Fashion-MNIST, KMNIST, EMNIST): read and write.

Layout (all big-endian)::

    0x00 0x00 <dtype code> <ndim>   magic
    ndim * uint32                   dimension sizes
    prod(dims) * item               the data, row-major

Files may be gzip-compressed; the reader tells by the gzip magic, not by the
name, because an IDX file always starts with two zero bytes.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from svc_trainer.plan import TrialError

BAD_DATASET = "bad_dataset"

#: IDX dtype code → big-endian numpy dtype.
DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dtype.newbyteorder("="): code for code, dtype in DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_DIM = 2**32 - 1


def read_idx(path: str | Path) -> NDArray[Any]:
    """The array stored in an IDX file (plain or gzip), in native byte order.

    The array is a writable copy with exactly the file's shape and dtype.
    Raises TrialError(reason="bad_dataset") naming the file when it cannot be
    read, is not gzip it claims to be, has a bad magic or dtype code, or holds
    fewer or more bytes than its dimensions say.
    """
    raw = _read_bytes(Path(path))
    return _parse(raw, str(path))


def write_idx(path: str | Path, array: NDArray[Any]) -> None:
    """Write ``array`` as IDX; gzip-compressed when ``path`` ends in ``.gz``.

    ``read_idx(path)`` gives back an equal array of the same dtype and shape.
    Raises ValueError for a dtype IDX has no code for (only uint8, int8,
    int16, int32, float32 and float64 exist) or a shape it cannot hold.
    """
    data = np.asarray(array)
    code = _CODES.get(data.dtype.newbyteorder("="))
    if code is None:
        names = ", ".join(str(d.newbyteorder("=")) for d in DTYPES.values())
        raise ValueError(f"IDX cannot hold dtype {data.dtype}; it holds {names}")
    if data.ndim > 255 or any(size > _MAX_DIM for size in data.shape):
        raise ValueError(f"IDX cannot hold shape {data.shape}")
    header = bytes([0, 0, code, data.ndim]) + struct.pack(f">{data.ndim}I", *data.shape)
    payload = header + data.astype(DTYPES[code], copy=False).tobytes(order="C")
    target = Path(path)
    if target.name.endswith(".gz"):
        # mtime=0: the same array always gives the same bytes.
        payload = gzip.compress(payload, mtime=0)
    target.write_bytes(payload)


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc.strerror or exc})") from exc
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise _bad(path, f"is a damaged or truncated gzip file ({exc})") from exc


def _parse(raw: bytes, name: str) -> NDArray[Any]:
    if len(raw) < 4:
        raise _bad(name, f"is truncated: {len(raw)} bytes, shorter than the 4-byte magic")
    zero, code, ndim = raw[:2], raw[2], raw[3]
    if zero != b"\x00\x00":
        raise _bad(name, f"has a bad magic {raw[:4].hex()}: an IDX file starts with 0000")
    dtype = DTYPES.get(code)
    if dtype is None:
        known = ", ".join(f"0x{c:02X}" for c in DTYPES)
        raise _bad(name, f"has an unknown dtype code 0x{code:02X}; known: {known}")
    data_start = 4 + 4 * ndim
    if len(raw) < data_start:
        raise _bad(name, f"is truncated inside its header ({ndim} dimensions, {len(raw)} bytes)")
    shape = struct.unpack(f">{ndim}I", raw[4:data_start])
    expected = math.prod(shape) * dtype.itemsize
    actual = len(raw) - data_start
    if actual != expected:
        problem = "is truncated" if actual < expected else "has trailing bytes"
        raise _bad(
            name,
            f"{problem}: shape {tuple(shape)} of {dtype.newbyteorder('=')} needs "
            f"{expected} data bytes, found {actual}",
        )
    flat = np.frombuffer(raw, dtype=dtype, count=math.prod(shape), offset=data_start)
    return flat.reshape(shape).astype(dtype.newbyteorder("="))


def _bad(name: str | Path, problem: str) -> TrialError:
    return TrialError(f"IDX file {name} {problem}", reason=BAD_DATASET)
