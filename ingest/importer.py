"""The import driver: source chunks -> store puts, durable progress, resume.

Pipeline (two threads, bounded): a reader thread pulls chunks from the source — reading,
parsing (pyarrow, multi-threaded) and converting to numpy/Arrow values — and hands them over
through a queue of ``QUEUE_CHUNKS``; the calling thread writes each chunk (one ``put`` per
feature; the engine releases the GIL, so parsing the next chunk overlaps it). The store is
opened in bulk-load mode (no WAL): a checkpoint — ``store.sync()``, which writes the buffered
items into pages and commits the metadata, then the journal entry
(:mod:`recflash.ingest.journal`) naming the last chunk written — follows every
write buffer's worth of items (synced just before the buffer would fill: then the buffer goes
to pages only at checkpoints; each checkpoint costs a few fsyncs) and the last chunk. At most ``QUEUE_CHUNKS + 2`` chunks exist at once and the
store's buffer is bounded, so memory does not grow with the input.

Keys: a ``--key`` column, or row numbers: the n-th written row of the job gets key
``key_start + n`` (bad lines that are skipped get no key). ``key_start`` is ``--key-offset``,
or with ``--append`` the end of the keys earlier imports wrote into this store, else 0.

Rules for existing data: a new import job refuses to write into features that already hold
items — unless ``--upsert`` (update values of keys: how feature updates arrive),
``--append`` or an explicit ``--key-offset``. Resuming the same job (same command line) is
always allowed and continues after the last durable chunk.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from recflash.reader.errors import DiskFullError, IOError_, ValueTooLargeError
from recflash.ingest.convert import compatible
from recflash.ingest.errors import BadInputError, BadLine
from recflash.ingest.journal import Journal, all_jobs, job_id, process_identity
from recflash.ingest.sources import Chunk, Source

QUEUE_CHUNKS = 2
SAMPLE_BAD_LINES = 10
# The engine's PageBuilder::MaxValueBytes (reader/csrc/format.cc): one variable-length value
# must fit in a page beside the page header (40 bytes), a segment descriptor (32), the segment
# body header (8) and two offsets (8). Values above it are bad rows of the input, found while
# converting (with their file and line); the engine's own check stays the authority.
PAGE_VALUE_OVERHEAD = 40 + 32 + 8 + 8


def max_value_bytes(page_size: int) -> int:
    return int(page_size) - PAGE_VALUE_OVERHEAD


@dataclasses.dataclass
class ImportOptions:
    upsert: bool = False
    append: bool = False
    key_offset: Optional[int] = None
    write_buffer_mb: float = 64
    page_size: int = 16384
    restart: bool = False


@dataclasses.dataclass
class ImportResult:
    store: str
    job: str
    status: str  # "done", "already-done", "interrupted"
    resumed: bool
    features: dict[str, str]
    rows: int = 0  # rows written by this run
    rows_total: int = 0  # rows written by the job, all runs
    items: int = 0  # (feature, key) items written by this run
    input_rows: int = 0  # input lines / rows consumed by this run, bad ones included
    input_bytes: int = 0  # uncompressed text bytes consumed by this run (text formats)
    disk_bytes: int = 0  # on-disk input bytes consumed by this run
    bad_lines_skipped: int = 0  # by this run
    bad_line_sample: list[dict] = dataclasses.field(default_factory=list)
    key_start: int = 0
    key_end: int = 0  # one past the last row-number key of the job
    seconds: float = 0.0  # wall time of this run, closing the store included
    write_seconds: float = 0.0  # time in put/sync (the store), for the profile
    close_seconds: float = 0.0
    warnings: list[str] = dataclasses.field(default_factory=list)
    rerun_options: str = ""  # options that import the same input again over the job's keys

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rows_per_s"] = self.rows_per_s
        d["mb_per_s"] = self.mb_per_s
        return d


class Interrupted(Exception):
    def __init__(self, result: ImportResult):
        super().__init__("interrupted")
        self.result = result


# progress callback: (rows written so far, input bytes, disk bytes done, skipped) -> None
ProgressFn = Callable[[dict[str, Any]], None]


def _open_store(path: str, opts: ImportOptions):
    from recflash.reader import Store, StoreOptions

    wb = int(opts.write_buffer_mb * (1 << 20))
    # Bulk-load mode: no WAL; each chunk's sync() writes it into pages and commits the
    # metadata, which is what makes the chunk durable before the journal records it.
    # Imported tables are mostly ids and counts: compact pages store int64 values packed.
    return Store.open(path, StoreOptions(page_size=opts.page_size, write_buffer_bytes=wb, bulk_load=True,
                                         compact_pages=True))


class _Reader(threading.Thread):
    """Pulls chunks from the source into a bounded queue."""

    def __init__(self, source: Source, position: Optional[dict], next_key: int):
        super().__init__(name="recflash-import-reader", daemon=True)
        self.source = source
        self.position = position
        self.next_key = next_key
        self.q: queue.Queue = queue.Queue(maxsize=QUEUE_CHUNKS)
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            for chunk in self.source.chunks(self.position):
                # Each column's keys are selected here, off the writer thread (which the
                # store's flushes keep busy): the writer only puts.
                puts = _chunk_puts(chunk, self.next_key)
                if chunk.keys is None:
                    self.next_key += chunk.n_rows
                if not self._put(("chunk", (chunk, puts))):
                    return
            self._put(("end", None))
        except BaseException as e:  # handed to the writer thread
            self._put(("error", e))

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self):
        return self.q.get()


def run_import(source: Source, store_path: str, opts: ImportOptions,
               progress: Optional[ProgressFn] = None) -> ImportResult:
    """Imports ``source`` into the store at ``store_path``. Raises BadInputError for wrong
    input, :class:`Interrupted` on KeyboardInterrupt (after closing the store cleanly)."""
    t_start = time.perf_counter()
    schema = source.prepare()  # before the store is touched
    if not schema:
        raise BadInputError("nothing to import: no columns selected")
    identity = source.identity()
    if opts.key_offset is not None:
        identity["key_offset"] = int(opts.key_offset)
    identity["append"] = bool(opts.append)
    identity["upsert"] = bool(opts.upsert)
    job = job_id(identity)
    if opts.append and source.key is not None:
        raise BadInputError("--append numbers rows after the existing keys; it cannot be used with --key")
    if opts.key_offset is not None and source.key is not None:
        raise BadInputError("--key-offset applies to row-number keys; it cannot be used with --key")
    if opts.key_offset is not None and opts.key_offset < 0:
        raise BadInputError("--key-offset must be >= 0")

    try:
        store = _open_store(store_path, opts)
    except IOError_ as e:  # e.g. the directory cannot be created (a path under a regular file)
        if isinstance(e, DiskFullError):
            raise
        raise BadInputError(f"store {store_path}: {e}") from None
    closed = False
    journal = None
    last_state: Optional[dict] = None  # this run's last journal entry while the job is its own
    result = ImportResult(store=store_path, job=job, status="done", resumed=False, features=dict(schema),
                          warnings=list(getattr(source, "warnings", [])))
    try:
        journal = Journal(store_path, job)
        state = journal.load()
        if state is not None and opts.restart:
            # Forgotten; the journal file stays until this run saves its own state (same job
            # id, same file), so a restart refused below leaves the earlier record as it was.
            state = None
        # The input files as this run reads them, recorded with every checkpoint: a file
        # changed during the run (after its rows were read) must not enter the journal as the
        # identity those rows came from, or a rerun would call it unchanged.
        files = source.files()
        if state is not None and state.get("status") == "done":
            changed = _changed_files(state, files, upto=None, what="the completed import")
            if changed:
                raise BadInputError(
                    f"{changed}; nothing was imported. To import it "
                    f"again over the same keys (replacing their values), run the same command with "
                    f"{rerun_options(opts, source, int(state.get('key_start', 0)))}")
            store.close()
            closed = True
            result.status = "already-done"
            result.rows_total = int(state.get("rows", 0))
            result.key_start = int(state.get("key_start", 0))
            result.key_end = int(state.get("next_key", 0))
            result.rerun_options = rerun_options(opts, source, result.key_start)
            result.seconds = time.perf_counter() - t_start
            return result
        existing = store.features()
        mismatched = {n: (existing[n], t) for n, t in schema.items() if n in existing and not compatible(existing[n], t)}
        if mismatched:
            raise BadInputError("the store already has feature(s) of other types: " + ", ".join(
                f"{n} is {a}, the input gives {b}" for n, (a, b) in mismatched.items()) + ". Nothing was imported.")
        if state is not None:
            changed = _changed_files(state, files, upto=(state.get("position") or {}).get("file", 0),
                                     what="the interrupted import")
            if changed:
                raise BadInputError(f"{changed}; run the same command "
                                    f"with {rerun_options(opts, source, int(state['key_start']))} to import "
                                    "it from the beginning")
            result.resumed = True
            state = dict(state, ended=None, error=None, **process_identity())  # this run's now
            journal.save(state)
            key_start = int(state["key_start"])
            next_key = int(state["next_key"])
            rows_total = int(state.get("rows", 0))
            skipped_total = int(state.get("bad_lines_skipped", 0))
            sample = list(state.get("bad_line_sample", []))
            position = state.get("position")
        else:
            key_start = _key_start(store, store_path, schema, opts, source, job)
            next_key = key_start
            rows_total = 0
            skipped_total = 0
            sample = []
            position = None
            for name, t in schema.items():
                store.create_feature(name, t)
            state = _state(identity, files, "running", None, key_start, next_key, 0, 0, [])
            journal.save(state)
        # From here on the job is this run's: a run that stops without completing records how.
        last_state = state
        result.key_start = key_start
        result.rerun_options = rerun_options(opts, source, key_start)
        source.max_value_bytes = max_value_bytes(store.page_size)
        for name, t in schema.items():  # no-op when they exist with the same type
            store.create_feature(name, t)

        reader = _Reader(source, position, next_key)
        reader.start()
        write_s = 0.0
        checkpoint_bytes = max(1, int(opts.write_buffer_mb * (1 << 20)))
        pending: Optional[dict] = None  # journal state of the last chunk written, not yet durable
        pending_bytes = 0

        def checkpoint() -> float:
            """Makes every chunk written so far durable, then records it; returns the seconds."""
            nonlocal pending, pending_bytes, last_state
            if pending is None:
                return 0.0
            t = time.perf_counter()
            store.sync()
            journal.save(pending)
            last_state = pending
            pending, pending_bytes = None, 0
            return time.perf_counter() - t

        try:
            while True:
                kind, item = reader.get()
                if kind == "error":
                    checkpoint()  # keep the chunks before the bad input
                    raise item
                if kind == "end":
                    break
                chunk, puts = item
                t0 = time.perf_counter()
                try:
                    written, chunk_bytes = _write_chunk(store, puts)
                except ValueTooLargeError as e:  # values the conversion's check let through
                    checkpoint()
                    raise BadInputError(f"{chunk.where or 'the input'}: {e} (--on-bad-lines does not apply to "
                                        "this check; a new store with a larger --page-size holds larger "
                                        "values)") from None
                write_s += time.perf_counter() - t0
                if chunk.keys is None:
                    next_key += chunk.n_rows
                rows_total += chunk.n_rows
                skipped_total += len(chunk.skipped)
                for b in chunk.skipped:
                    if len(sample) < SAMPLE_BAD_LINES:
                        sample.append(b.as_dict())
                # Fully written: this is where a resume may continue once it is durable.
                pending = _state(identity, files, "running", chunk.position, key_start, next_key, rows_total,
                                 skipped_total, sample)
                pending_bytes += chunk_bytes
                # Sync before the store's buffer would fill during the next chunk (chunks are of
                # similar size): the buffer then goes to pages only at checkpoints, so what is
                # durable is what the journal says (plus at most the group a crash cut short
                # between sync and journal), and a resume rewrites little.
                if pending_bytes + chunk_bytes >= checkpoint_bytes:
                    write_s += checkpoint()
                result.rows += chunk.n_rows
                result.items += written
                result.input_rows += chunk.rows_read
                result.input_bytes += chunk.input_bytes
                result.disk_bytes = chunk.disk_done
                result.bad_lines_skipped += len(chunk.skipped)
                if progress is not None:
                    progress({"rows": result.rows, "rows_total": rows_total, "input_bytes": result.input_bytes,
                              "disk_done": chunk.disk_done, "skipped": result.bad_lines_skipped,
                              "items": result.items})
            write_s += checkpoint()
        except KeyboardInterrupt:
            reader.stop.set()
            result.status = "interrupted"
            checkpoint()  # the chunks written completely are kept (a partial one is redone on resume)
            _record_end(journal, last_state, "interrupted")
            last_state = None
        finally:
            reader.stop.set()
            # Joined before returning (it stops within one chunk): a daemon thread still inside
            # the native parser when the interpreter exits would be torn down there, and the
            # forced unwind through the binding aborts the process (an interrupted import
            # then ended in SIGABRT instead of exit code 130).
            reader.join()
        result.rows_total = rows_total
        result.key_end = next_key
        result.bad_line_sample = sample
        result.write_seconds = write_s
        if result.status == "done":
            journal.save(_state(identity, files, "done", None, key_start, next_key, rows_total, skipped_total,
                                sample))
            last_state = None
        t0 = time.perf_counter()
        store.close()  # writes the buffer into pages; every chunk was durable already
        closed = True
        result.close_seconds = time.perf_counter() - t0
        result.seconds = time.perf_counter() - t_start
        if result.status == "interrupted":
            raise Interrupted(result)
        return result
    except Interrupted:
        raise
    except KeyboardInterrupt:
        _record_end(journal, last_state, "interrupted")
        raise
    except BaseException as e:
        _record_end(journal, last_state, "failed", e)
        raise
    finally:
        if not closed:
            try:
                store.close()
            except Exception:
                pass


def _chunk_puts(chunk: Chunk, next_key: int) -> list[tuple[str, np.ndarray, Any]]:
    """A chunk's puts: (feature, keys, values) per column with values; row-number keys start
    at next_key."""
    if chunk.n_rows == 0:
        return []
    keys = chunk.keys if chunk.keys is not None else np.arange(next_key, next_key + chunk.n_rows, dtype=np.uint64)
    puts = []
    for name, col in chunk.columns.items():
        k = keys if col.valid is None else keys[col.valid]
        if len(k):
            puts.append((name, k, col.values))
    return puts


def _write_chunk(store, puts: list[tuple[str, np.ndarray, Any]]) -> tuple[int, int]:
    """Puts a chunk; returns (items, their approximate buffered bytes: 8 per key + values)."""
    written = nbytes = 0
    for name, k, values in puts:
        store.put(name, k, values)
        written += len(k)
        nbytes += 8 * len(k) + int(getattr(values, "nbytes", 0))
    return written, nbytes


def _state(identity: dict, files: list[dict], status: str, position: Optional[dict], key_start: int, next_key: int,
           rows: int, skipped: int, sample: list[dict]) -> dict:
    return {"status": status, "identity": identity, "files": files, "position": position,
            "key_start": key_start, "next_key": next_key, "rows": rows, "bad_lines_skipped": skipped,
            "bad_line_sample": sample, "ended": None, "error": None, **process_identity()}


def _record_end(journal: Optional[Journal], state: Optional[dict], how: str,
                error: Optional[BaseException] = None) -> None:
    """Records in the journal that this run stopped without completing the job (``how``:
    ``failed`` or ``interrupted``). The durable position is the one already recorded."""
    if journal is None or state is None:
        return
    text = None
    if error is not None:
        text = str(error) if isinstance(error, BadInputError) else f"{type(error).__name__.rstrip('_')}: {error}"
        text = " ".join(text.split())
        if len(text) > 500:
            text = text[:497] + "..."
    try:
        journal.save(dict(state, ended=how, error=text, **process_identity()))
    except Exception:  # pragma: no cover - the error being reported matters more
        pass


def _changed_files(state: dict, files: list[dict], upto: Optional[int], what: str) -> str:
    """"<file> changed since <what> read it (...)" for the first input file (up to index
    ``upto``; all when None) whose size, mtime, inode change time or inode number differs from
    the journal's record, or "". (Journals of earlier versions have no inode fields: size and
    mtime decide for them.)"""
    recorded = state.get("files") or []
    for i, (old, new) in enumerate(zip(recorded, files)):
        if upto is not None and i > upto:
            break
        how = []
        if old["size"] != new["size"]:
            how.append(f"size {old['size']:,} -> {new['size']:,} bytes")
        if old["mtime_ns"] != new["mtime_ns"]:
            how.append("modified since")
        elif old.get("ino", new["ino"]) != new["ino"]:
            how.append("same size and modification time, but another file (inode) by that name")
        elif old.get("ctime_ns", new["ctime_ns"]) != new["ctime_ns"]:
            how.append("same size and modification time, but its inode changed since: rewritten with the "
                       "modification time set back, or its permissions, owner or links changed")
        if how:
            return f"{new['path']} changed since {what} read it ({', '.join(how)})"
    return ""


def rerun_options(opts: ImportOptions, source: Source, key_start: int) -> str:
    """The options that, added to a job's command, import its input again over the keys the
    job wrote. ``--restart`` alone forgets the job's progress, but a new run refuses features
    that already hold items unless ``--upsert``; ``--upsert`` is part of the job's identity, so
    ``--restart`` only matters when that upsert job ran before. An ``--append`` job's rerun
    appends after every import (its own rows included): its keys are given by ``--key-offset``."""
    if source.key is not None:
        return "--restart" if opts.upsert else "--upsert --restart"
    same_offset = (opts.key_offset if opts.key_offset is not None else 0) == key_start
    if opts.upsert and not opts.append and same_offset:
        return "--restart"
    out = "--upsert --restart"
    if opts.append or not same_offset:
        out += f" --key-offset {key_start}"
    if opts.append:
        out += " instead of --append"
    return out


def _key_start(store, store_path: str, schema: dict[str, str], opts: ImportOptions, source: Source,
               job: str = "") -> int:
    if source.key is not None:
        has = _features_with_items(store, schema)
        if has and not opts.upsert:
            raise BadInputError(f"feature(s) {', '.join(has)} already hold items; pass --upsert to update them "
                                "by key. Nothing was imported.")
        return 0
    if opts.key_offset is not None:
        return int(opts.key_offset)
    # a restarted job's own earlier record does not count (its file stays until this run saves)
    jobs_end = max([int(j.get("next_key", 0)) for j in all_jobs(store_path) if j.get("job") != job] or [0])
    if opts.append:
        has = _features_with_items(store, schema)
        if has and jobs_end == 0:
            raise BadInputError(f"--append: feature(s) {', '.join(has)} hold items that no recflash import "
                                "wrote, so where to append is unknown; pass --key-offset N")
        return jobs_end
    has = _features_with_items(store, schema)
    if has and not opts.upsert:
        hint = f" (earlier imports end at key {jobs_end}: --append continues there)" if jobs_end else ""
        raise BadInputError(f"feature(s) {', '.join(has[:8])}{'…' if len(has) > 8 else ''} already hold items; "
                            f"pass --upsert to update existing keys, --append to add rows after the existing "
                            f"ones{hint}, or --key-offset N. Nothing was imported.")
    return 0


def _features_with_items(store, schema: dict[str, str]) -> list[str]:
    existing = store.features()
    names = [n for n in schema if n in existing]
    if not names:
        return []
    stats = store.stats()
    per = stats.get("features") or {}
    out = []
    for n in names:
        items = int((per.get(n) or {}).get("items", 0))
        if items == 0:
            # items still in the write buffer (or pinned) are not in the per-feature page counts
            try:
                t = store.scan(n, key_range=(0, 1 << 63))
                items = t.num_rows
            except Exception:
                items = 0
        if items:
            out.append(n)
    return out


def describe_bad_lines(sample: list[dict], total: int) -> list[str]:
    lines = [str(BadLine(**b)) for b in sample]
    if total > len(sample):
        lines.append(f"… and {total - len(sample)} more")
    return lines


__all__ = ["ImportOptions", "ImportResult", "Interrupted", "run_import", "describe_bad_lines"]
