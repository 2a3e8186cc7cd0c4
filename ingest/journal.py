"""The import journal: how far an import got, kept durably inside the store directory.

``<store>/imports/<job id>.json``, one file per import job. The job id is a hash of what
defines the job's output: the command, the input files (absolute paths), the options that
change keys or values. At each checkpoint (about every write buffer's worth of items, and at
the end) the importer calls ``store.sync()`` (the chunks written so far are in pages on disk) and
*then* rewrites the journal (write to a temporary file, fsync, rename, fsync the directory). So the journal never claims rows the store might lose; rows the store holds
beyond the journal's position (a crash between the two) are written again on resume with the
same keys and values — puts are upserts by key, so nothing is duplicated.

The journal also records each input file's identity (path, size, mtime, inode change time,
inode number): a resumed import refuses files that changed since, unless ``--restart``; so does
the rerun of a completed import.

``status`` is ``"running"`` until the job completes (``"done"``); a job that is not done is
resumed by the same command. Each run also records its process (``pid``, ``host``,
``pid_start``) and, when it stops without completing, how: ``ended`` is ``"failed"`` (with
``error``) or ``"interrupted"`` (Ctrl-C). A process killed outright (kill -9, a crash, power
loss) cannot record that: :func:`job_status` then tells from the recorded process whether the
job still runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from typing import Any, Optional

JOURNAL_DIR = "imports"
VERSION = 1


def job_id(identity: dict) -> str:
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_identity(path: str) -> dict:
    """What a later run compares to tell whether the file changed. Size and mtime alone miss a
    file rewritten to the same size with its mtime set back (``touch -d``, ``rsync -t`` of
    changed content): the inode change time, which no user call can set back, and the inode
    number (a file replaced by another) catch that."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def _host() -> str:
    try:
        return socket.gethostname()
    except OSError:  # pragma: no cover
        return ""


def _proc_stat(pid: int) -> Optional[list[bytes]]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return None


def _start_ticks(fields: Optional[list[bytes]]) -> Optional[int]:
    """The start time in a process's ``_proc_stat`` fields (clock ticks since boot, Linux), or
    None if unknown; with the pid it tells a process apart from a later one that got the same pid."""
    try:
        return int(fields[19]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def _exited(fields: Optional[list[bytes]]) -> bool:
    """Whether a process's ``_proc_stat`` fields say it has exited but not been reaped yet (a
    zombie, state Z or X): it still answers ``kill(pid, 0)`` but will never write its journal again."""
    return bool(fields) and fields[0] in (b"Z", b"X")


def process_identity() -> dict:
    """The fields a run records about its own process."""
    pid = os.getpid()
    return {"pid": pid, "host": _host(), "pid_start": _start_ticks(_proc_stat(pid))}


def _process_state(state: dict) -> str:
    """"alive", "gone" or "unknown" for the process a journal entry names."""
    pid, host = state.get("pid"), state.get("host")
    if not isinstance(pid, int) or not host or host != _host():
        return "unknown"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:  # a process of another user has that pid
        pass
    except OSError:
        return "unknown"
    fields = _proc_stat(pid)
    recorded, now = state.get("pid_start"), _start_ticks(fields)
    if recorded is not None and now is not None and recorded != now:
        return "gone"  # the pid belongs to a later process
    if _exited(fields):
        return "gone"  # killed, its parent has not reaped it yet
    return "alive"


def job_status(state: dict) -> str:
    """What a journal entry means now: ``done``; ``failed`` or ``interrupted`` (the run
    recorded how it stopped); ``running`` (its process still runs); ``killed`` (its process on
    this host is gone without recording an end: kill -9, a crash, power loss); or ``running or
    interrupted`` (recorded on another host, or by a recflash that did not record processes).
    Every status but ``done`` is resumed by running the same command again."""
    status = state.get("status")
    if status != "running":
        return str(status)
    ended = state.get("ended")
    if ended in ("failed", "interrupted"):
        return ended
    return {"alive": "running", "gone": "killed"}.get(_process_state(state), "running or interrupted")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    def __init__(self, store_path: str, job: str):
        self.dir = os.path.join(store_path, JOURNAL_DIR)
        self.path = os.path.join(self.dir, f"{job}.json")
        self.job = job

    def load(self) -> Optional[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise RuntimeError(f"the import journal {self.path} is unreadable ({e}); remove it or use --restart") from e
        if state.get("version") != VERSION:
            raise RuntimeError(f"the import journal {self.path} has version {state.get('version')}; "
                               f"this recflash writes version {VERSION} (use --restart)")
        return state

    def save(self, state: dict[str, Any]) -> None:
        state = dict(state, version=VERSION, job=self.job, updated=time.time())
        created = not os.path.isdir(self.dir)
        os.makedirs(self.dir, exist_ok=True)
        if created:
            _fsync_dir(os.path.dirname(self.dir))
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.dir)

    def remove(self) -> None:
        try:
            os.remove(self.path)
            _fsync_dir(self.dir)
        except FileNotFoundError:
            pass


def all_jobs(store_path: str) -> list[dict]:
    """Every journal in the store (running and done)."""
    d = os.path.join(store_path, JOURNAL_DIR)
    out = []
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(d, name), encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out
