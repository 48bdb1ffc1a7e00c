"""TensorBoard event files: what ``trainer.logger`` with ``tensorboard`` writes (verl's ``_TensorboardAdapter``:
``torch.utils.tensorboard.SummaryWriter.add_scalar(key, value, step)`` for every metric, under
``TENSORBOARD_DIR``, default ``tensorboard_log/<project>/<experiment>/``), and OpenRLHF's ``--use_tensorboard``.

A file is a TFRecord stream of ``Event`` protocol buffers (framing and fields: ``rlhfsim.report.tfevents``); a
scalar is ``Summary.Value.simple_value`` (torch, tensorboardX) or a one-element ``tensor`` (TensorFlow 2's
``tf.summary.scalar``: ``float_val``, ``double_val`` or ``tensor_content``). Every scalar of one step in one file
makes one record (a restarted run writes a new file, so a step logged again is seen as such). A directory is read
file by file in name order (the names carry their start time).

A record whose length or data checksum fails, or that the file ends inside, is skipped with its reason; after a
bad length checksum the rest of the file cannot be framed and is skipped as one bad record.
"""

from __future__ import annotations

import struct
from pathlib import Path

from rlhfsim.fromrun.logformats.base import BadLine, LogError, LogRead, StepLine, kind_of, read_bytes
from rlhfsim.report.tfevents import masked_crc32c, proto_fields

FORMAT = "TensorBoard events"
DT_FLOAT, DT_DOUBLE = 1, 2


def looks_like(data: bytes) -> bool:
    """Whether ``data`` starts with a whole TFRecord header (length and its checksum)."""
    return len(data) >= 12 and struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])


def files(path: Path) -> list[Path]:
    """The event files of ``path`` (a file, or every ``*tfevents*`` file under a directory, in name order)."""
    if not path.is_dir():
        return [path]
    found = sorted((p for p in path.rglob("*tfevents*") if p.is_file()), key=lambda p: (p.name, str(p)))
    if not found:
        raise LogError(f"{path}: expected TensorBoard event files (events.out.tfevents.*) in the directory, got none")
    return found


def _tensor_scalar(buf: bytes) -> float | None:
    dtype, content, floats, doubles = 0, b"", [], []
    for num, wire, v in proto_fields(buf):
        if num == 1 and wire == 0:
            dtype = v
        elif num == 4 and wire == 2:
            content = v
        elif num == 5:
            floats += list(struct.unpack(f"<{len(v) // 4}f", v[:len(v) // 4 * 4])) if wire == 2 else \
                [struct.unpack("<f", v)[0]]
        elif num == 6:
            doubles += list(struct.unpack(f"<{len(v) // 8}d", v[:len(v) // 8 * 8])) if wire == 2 else \
                [struct.unpack("<d", v)[0]]
    if floats or doubles:
        return float((floats or doubles)[0])
    if dtype == DT_FLOAT and len(content) == 4:
        return float(struct.unpack("<f", content)[0])
    if dtype == DT_DOUBLE and len(content) == 8:
        return float(struct.unpack("<d", content)[0])
    return None


def _event(body: bytes) -> tuple[int, dict[str, float]]:
    step, out = 0, {}
    for num, _, v in proto_fields(body):
        if num == 2:
            step = v
        elif num == 5:
            for vnum, _, value in proto_fields(v):
                if vnum != 1:
                    continue
                tag, x = None, None
                for f, wire, fv in proto_fields(value):
                    if f == 1:
                        tag = fv.decode("utf-8", errors="replace")
                    elif f == 2 and wire == 5:
                        x = float(struct.unpack("<f", fv)[0])
                    elif f == 8 and wire == 2:
                        x = _tensor_scalar(fv)
                if tag is not None and x is not None:
                    out[tag] = x
    if step >= 1 << 63:
        step -= 1 << 64
    return step, out


def read_file(path: Path, out: LogRead) -> None:
    """The records of one event file into ``out`` (module docstring); ``line`` is the event's index in its file."""
    read_data(read_bytes(path, out.notes), path.name, out)


def read_data(data: bytes, name: str, out: LogRead) -> None:
    """``read_file`` on the bytes of an event file called ``name``."""
    groups: dict[int, tuple[int, dict[str, float]]] = {}
    i = k = 0
    while i < len(data):
        k += 1
        head = data[i:i + 8]
        if len(data) - i < 12:
            out.bad.append(BadLine(k, f"truncated record (the file ends {len(data) - i} bytes into its header)",
                                   source=name))
            break
        if struct.unpack("<I", data[i + 8:i + 12])[0] != masked_crc32c(head):
            out.bad.append(BadLine(k, f"corrupt record at byte {i} (length checksum); the rest of the file "
                                      f"({len(data) - i} bytes) cannot be framed", source=name))
            break
        (n,) = struct.unpack("<Q", head)
        if len(data) - i - 12 < n + 4:
            out.bad.append(BadLine(k, f"truncated record at byte {i} (the file ends inside it)", source=name))
            break
        body = data[i + 12:i + 12 + n]
        crc_ok = struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked_crc32c(body)
        i += 16 + n
        if not crc_ok:
            out.bad.append(BadLine(k, "corrupt record (data checksum)", source=name))
            continue
        try:
            step, scalars = _event(body)
        except (IndexError, ValueError, struct.error):
            out.bad.append(BadLine(k, "malformed event (not an Event protocol buffer)", source=name))
            continue
        if scalars:
            first, metrics = groups.setdefault(step, (k, {}))
            metrics.update(scalars)
    for step, (first, metrics) in sorted(groups.items(), key=lambda kv: kv[1][0]):
        out.steps.append(StepLine(step, first, metrics, kind_of(metrics), name))


def read(path: Path) -> LogRead:
    """Every step record of an event file or a directory of them."""
    fs = files(path)
    out = LogRead(path.name, FORMAT, unit="event")
    for f in fs:
        read_file(f, out)
    if len(fs) > 1:
        out.notes.append(f"{path.name}: {len(fs)} event files read in name order ({', '.join(f.name for f in fs[:4])}"
                         + (", ..." if len(fs) > 4 else "") + ")")
    return out
