"""The one atomic-write helper: a reader (or a crash) never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling and a rename; the file gets the usual
    permissions (mkstemp's 0600 widened by the umask). ``fsync``: flush to disk before the rename (for
    files a crash must not lose, like a calibration profile)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, text)


def write_json_atomic(path: str | Path, doc, *, fsync: bool = True) -> Path:
    """JSON (indent 1, a final newline), fsynced by default."""
    return write_atomic(path, json.dumps(doc, indent=1) + "\n", fsync=fsync)


def out_path(out: str | Path | None, default_name: str, also: tuple[str, ...] = ()) -> Path | None:
    """Where a command's ``-o/--out`` writes its main file: ``-o`` names a directory of results (the
    same meaning for every command) and the file is ``default_name`` inside it. A path ending in the
    file's own suffix (``x.json``, ``x.html``; or one of ``also``, e.g. ``.yml``) is the older usage, a
    file path, and still works."""
    if out is None:
        return None
    out = Path(out)
    suffixes = {Path(default_name).suffix.lower(), *(x.lower() for x in also)}
    if out.suffix.lower() in suffixes and not out.is_dir():
        return out
    return out / default_name
