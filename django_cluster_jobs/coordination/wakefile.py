"""A wake-up between processes on one host, for a database that cannot notify (SQLite).

Every process that uses an SQLite database runs on the host that holds its file, so the file
system can carry what PostgreSQL's NOTIFY carries: a process that made a run pending appends one
byte to a small file beside the database once its transaction committed (:func:`signal`), and
each idle node looks at that file's identity and size (:func:`stamp`, one ``stat``, no SQL
statement) many times a second, and looks for pending runs when they changed.

An append only ever grows the file, and a full file is replaced by a new one (another inode:
the old one is still allocated when the new one is made), so two different states of the file
never look alike and no signal is mistaken for none, however close two signals fall.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

#: What follows the database's file name in the wake file's.
SUFFIX = "-cluster-jobs-wake"
#: The size after which the next signal starts a new file.
LIMIT = 4096

Stamp = tuple[int, int, int] | None


def path_for(name: object) -> Path | None:
    """The wake file of the SQLite database ``name`` (its ``NAME`` setting); None for a
    database in memory, which no other process can open."""
    text = str(name or "")
    if not text or text == ":memory:" or (text.startswith("file:") and "memory" in text):
        return None
    return Path(os.path.abspath(text) + SUFFIX)


def signal(path: Path) -> None:
    """Tell every watcher of ``path`` that a run became pending (raises OSError)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, b"\n")  # O_APPEND: writers of other processes never overwrite each other
        full = os.fstat(fd).st_size >= LIMIT
    finally:
        os.close(fd)
    if full:
        fresh = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
        fresh.write_bytes(b"")
        os.replace(fresh, path)


def stamp(path: Path) -> Stamp:
    """What tells two states of the wake file apart; None while it does not exist."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino, info.st_size)
