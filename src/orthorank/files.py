"""Files written whole or not at all: a reader (or a run killed mid-write) never sees half a plan or result."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from orthorank.errors import UserError


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write a whole text file or nothing (see atomic_write_bytes)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save_figure(fig, path: str | Path, **savefig_kwargs) -> Path:
    """A matplotlib figure as a PNG, written whole or not at all."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig_kwargs)
    return atomic_write_bytes(path, buf.getvalue())


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write a whole file or nothing: a temporary file beside it, fsync, rename (a reader never sees half a file).
    An unwritable folder or a full disk is a one-line error naming the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # an ordinary file's mode, not mkstemp's private 0600
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
