"""TensorBoard event files without TensorBoard: a TFRecord file of ``Event`` protocol buffers, each holding
one scalar (``Summary.Value.simple_value``), written by hand so the simulator needs no tensorboard,
tensorflow or protobuf package.

Record framing (TFRecord): ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little endian; ``masked(c) = ((c >> 15 | c << 17) + 0xa282ead8) mod 2**32``.

Event fields used (tensorflow/core/util/event.proto, summary.proto): Event.wall_time (1, double),
Event.step (2, int64), Event.file_version (3, string), Event.summary (5, Summary); Summary.value (1,
repeated Value); Value.tag (1, string), Value.simple_value (2, float). ``read_scalars`` reads them back
(for tests, and to check a file without TensorBoard)."""

from __future__ import annotations

import struct
from pathlib import Path


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # CRC-32C (Castagnoli), reflected
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, wire: int) -> bytes:
    return _varint(num << 3 | wire)


def _bytes_field(num: int, data: bytes) -> bytes:
    return _field(num, 2) + _varint(len(data)) + data


def _event(wall_time: float, step: int, *, file_version: str | None = None,
           scalars: dict[str, float] | None = None) -> bytes:
    msg = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        msg += _bytes_field(3, file_version.encode())
    if scalars:
        values = b"".join(_bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", v))
                          for tag, v in scalars.items())
        msg += _bytes_field(5, values)
    return msg


def _record(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data))


def event_file_bytes(rows: list[tuple[int, float, dict[str, float]]]) -> bytes:
    """One event file: the version record, then one event per (step, wall_time, {tag: value})."""
    t0 = rows[0][1] if rows else 0.0
    out = [_record(_event(t0, 0, file_version="brain.Event:2"))]
    out += [_record(_event(wall, step, scalars=scalars)) for step, wall, scalars in rows]
    return b"".join(out)


def event_file_name(wall_time: float, host: str = "rlhfsim") -> str:
    """TensorBoard finds files by this pattern: ``events.out.tfevents.<time>.<host>``."""
    return f"events.out.tfevents.{int(wall_time)}.{host}"


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(buf: bytes):
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = _read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield num, wire, v


# Public names for the readers of event files written by others (rlhfsim.fromrun.logformats.tensorboard).
masked_crc32c = _masked
proto_fields = _fields


def read_scalars(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from an event file, checking both CRCs of every record."""
    data = Path(path).read_bytes()
    out: dict[str, list[tuple[int, float]]] = {}
    i = 0
    while i < len(data):
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        if struct.unpack("<I", data[i + 8:i + 12])[0] != _masked(head):
            raise ValueError(f"{path}: bad length CRC at byte {i}")
        body = data[i + 12:i + 12 + n]
        if struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] != _masked(body):
            raise ValueError(f"{path}: bad data CRC at byte {i}")
        i += 16 + n
        step = 0
        for num, _, v in _fields(body):
            if num == 2:
                step = v
            elif num == 5:
                for vnum, _, value in _fields(v):
                    if vnum != 1:
                        continue
                    tag, x = None, None
                    for f, _, fv in _fields(value):
                        if f == 1:
                            tag = fv.decode()
                        elif f == 2:
                            (x,) = struct.unpack("<f", fv)
                    if tag is not None and x is not None:
                        out.setdefault(tag, []).append((step, x))
    return out
