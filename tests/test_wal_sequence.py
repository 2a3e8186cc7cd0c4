"""The store's WAL files from the metadata's first one on stay consecutive, and only the last
one may be empty: a session that writes nothing logs to the empty last file instead of
unlinking it and making the next number, and a flush takes an empty current file as its new
first one. Commits of this version say so in the state record, and the open then refuses a
missing file between two others or an empty file before the last (synced writes went with
it), unless StoreOptions(wal_recovery="point_in_time"). A read-only open racing a writer that
retires files calls what it sees stale while the writer holds the LOCK."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from recflash.reader import CorruptionError, StaleSnapshotError, Store, StoreOptions, testing
from storeutil import open_held_at

U64 = np.uint64

# One session in a child process that ends without close() (a crash as far as the store can
# tell): "create" makes feature x with 100 zeros and flushes; "putB" writes keys 10B..10B+9 = B+1
# and syncs (one WAL record); "nothing" writes nothing; "feature" creates feature y (a commit
# before any flush); "bulk" puts keys 200..209 = 9 in bulk-load mode and syncs (a flush).
# Prints the session's stats as JSON.
SESSION_CHILD = r'''
import json, os, sys
import numpy as np
from recflash.reader import Store, StoreOptions
path, action, recovery = sys.argv[1], sys.argv[2], sys.argv[3]
s = Store.open(path, StoreOptions(page_size=4096, write_buffer_bytes=1 << 20, wal_recovery=recovery,
                                  bulk_load=action == "bulk"))
if action == "create":
    s.create_feature("x", "int64")
    s.put("x", np.arange(100, dtype=np.uint64), np.zeros(100, np.int64))
    s.flush()
elif action.startswith("put"):
    b = int(action[3:])
    s.put("x", np.arange(10 * b, 10 * b + 10, dtype=np.uint64), np.full(10, b + 1, np.int64))
    s.sync()
elif action == "feature":
    s.create_feature("y", "int64")
elif action == "bulk":
    s.put("x", np.arange(200, 210, dtype=np.uint64), np.full(10, 9, np.int64))
    s.sync()
else:
    assert action == "nothing", action
st = s.stats()
print(json.dumps({k: st[k] for k in ("recovered_wal_records", "wal_bytes_dropped")}))
sys.stdout.flush()
os._exit(0)
'''


def _session(path, action, recovery="tolerate_torn_tail"):
    out = subprocess.run([sys.executable, "-P", "-c", SESSION_CHILD, path, action, recovery], check=True,
                         timeout=120, capture_output=True, text=True)
    return json.loads(out.stdout)


def _wal(path, n):
    return os.path.join(path, "wal", f"{n:06d}.log")


def _wal_files(path):
    """{number: size} of the store's WAL files."""
    d = os.path.join(path, "wal")
    return {int(f[:-4]): os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log")}


def _opts(**kw):
    return StoreOptions(page_size=4096, write_buffer_bytes=1 << 20, **kw)


def _x(s, n=30):
    return s.get("x", np.arange(n, dtype=U64)).to_pylist()


def _three_wal_files(path):
    """A store whose WAL holds three files, 2..4, each with one synced record (keys 0..29)."""
    _session(path, "create")  # file 1 flushed away; 2 is the (empty) first one
    for b in range(3):
        _session(path, f"put{b}")  # 2 takes put0 (reused), then 3 and 4 follow
    files = _wal_files(path)
    assert sorted(files) == [2, 3, 4] and all(files.values()), files
    return files


def _state_record(path):
    return testing._t.meta_get(os.path.join(path, "meta"), 2, 0)


def test_sessions_that_write_nothing_reuse_the_empty_last_file(store_path):
    """Before, a session that wrote nothing left an empty file that the next open unlinked
    before making the next number, so the numbers had holes; now the next session logs to it."""
    _three_wal_files(store_path)
    _session(store_path, "nothing")  # a fresh file after the last one with records
    files = _wal_files(store_path)
    assert sorted(files) == [2, 3, 4, 5] and files[5] == 0, files
    for _ in range(3):
        assert _session(store_path, "nothing")["recovered_wal_records"] == 3
        assert sorted(_wal_files(store_path)) == [2, 3, 4, 5]  # 5 reused, not replaced by 6
    _session(store_path, "put3")  # into 5
    assert sorted(_wal_files(store_path)) == [2, 3, 4, 5] and _wal_files(store_path)[5] > 0
    # A clean close: its flush finds the current file (6, made after 5) empty and makes it the
    # first one, holding what stays pinned (nothing: close pins nothing).
    with Store.open(store_path, _opts()) as s:
        assert sorted(_wal_files(store_path)) == [2, 3, 4, 5, 6]
        assert _x(s, 40) == [1] * 10 + [2] * 10 + [3] * 10 + [4] * 10
    assert _wal_files(store_path) == {6: 0}
    for _ in range(2):
        Store.open(store_path, _opts()).close()
        assert _wal_files(store_path) == {6: 0}
    state = _state_record(store_path)
    # wal_start_kept, wal_files_consecutive, then wal_last: file 6, the newest a session logged to
    assert len(state) == 46 and state[36:38] == b"\x01\x01", state
    assert int.from_bytes(state[38:], "little") == 6, state


def test_bulk_load_sessions_keep_the_files_consecutive(store_path):
    """Bulk-load mode logs nothing: its flushes take the empty current file as the first one."""
    _three_wal_files(store_path)
    _session(store_path, "bulk")  # replays 2..4, logs to a fresh 5, whose flush retires 2..4
    assert _wal_files(store_path) == {5: 0}
    _session(store_path, "nothing")
    assert _wal_files(store_path) == {5: 0}
    with Store.open(store_path, _opts()) as s:
        assert _x(s) == [1] * 10 + [2] * 10 + [3] * 10
        assert s.get("x", np.arange(200, 210, dtype=U64)).to_pylist() == [9] * 10


def _refused(path, **kw):
    """The CorruptionError of a writable and of a read-only open (no writer), which change nothing."""
    files, pages = _wal_files(path), os.path.getsize(os.path.join(path, "pages.dat"))
    errs = []
    for ro in (False, True):
        with pytest.raises(CorruptionError) as e:
            Store.open(path, _opts(read_only=ro, **kw))
        assert not isinstance(e.value, StaleSnapshotError)
        errs.append(str(e.value))
    assert _wal_files(path) == files and os.path.getsize(os.path.join(path, "pages.dat")) == pages
    return errs


def test_missing_wal_file_between_two_others_fails_the_open(store_path):
    _three_wal_files(store_path)
    os.unlink(_wal(store_path, 3))  # put1's record, synced, goes with it
    for msg in _refused(store_path):
        assert f"WAL file '{_wal(store_path, 3)}' is missing between '{_wal(store_path, 2)}' and " \
               f"'{_wal(store_path, 4)}'" in msg, msg
        assert "synced writes" in msg and "point_in_time" in msg, msg


def test_several_missing_wal_files_are_named_as_a_range(store_path):
    _three_wal_files(store_path)
    _session(store_path, "put3")  # a fresh 5
    _session(store_path, "put4")  # 6
    for n in (3, 4, 5):
        os.unlink(_wal(store_path, n))
    for msg in _refused(store_path):
        assert f"WAL files '{_wal(store_path, 3)}' to '{_wal(store_path, 5)}' are missing between " \
               f"'{_wal(store_path, 2)}' and '{_wal(store_path, 6)}'" in msg, msg


@pytest.mark.parametrize("n", [2, 3], ids=["first", "middle"])
def test_wal_file_cut_to_nothing_before_the_last_fails_the_open(store_path, n):
    _three_wal_files(store_path)
    os.truncate(_wal(store_path, n), 0)
    for msg in _refused(store_path):
        assert f"WAL file '{_wal(store_path, n)}' is empty although a later one, '{_wal(store_path, n + 1)}', " \
               "exists" in msg, msg
        assert "synced writes" in msg, msg


def test_last_wal_file_cut_to_nothing_opens(store_path):
    """The last file empty is what a session that wrote nothing leaves: its records are lost
    without an error (documented), and the next session logs to it."""
    _three_wal_files(store_path)
    os.truncate(_wal(store_path, 4), 0)
    assert _session(store_path, "nothing")["recovered_wal_records"] == 2
    assert _wal_files(store_path)[4] == 0 and sorted(_wal_files(store_path)) == [2, 3, 4]
    with Store.open(store_path, _opts(read_only=True)) as s:
        assert _x(s) == [1] * 10 + [2] * 10 + [0] * 10


def test_point_in_time_opens_as_of_the_files_before_a_gap(store_path):
    """point_in_time replays up to the break and counts the later files' bytes as dropped. A
    read-only open changes nothing; a writable one deletes the later files before it logs
    anything, so its own synced writes survive a crash and the next default open succeeds."""
    files = _three_wal_files(store_path)
    os.unlink(_wal(store_path, 3))
    with Store.open(store_path, _opts(read_only=True, wal_recovery="point_in_time")) as s:
        assert _x(s) == [1] * 10 + [0] * 20
        assert s.stats()["wal_bytes_dropped"] == files[4]
    assert sorted(_wal_files(store_path)) == [2, 4]
    st = _session(store_path, "put5", recovery="point_in_time")  # crashes after its synced put
    assert st == {"recovered_wal_records": 1, "wal_bytes_dropped": files[4]}, st
    assert sorted(_wal_files(store_path)) == [2, 3]  # 4 deleted, the session's file right after 2
    with Store.open(store_path, _opts()) as s:  # the point in time is the store's state now
        assert s.stats()["wal_bytes_dropped"] == 0
        assert _x(s) == [1] * 10 + [0] * 20
        assert s.get("x", np.arange(50, 60, dtype=U64)).to_pylist() == [6] * 10


def test_point_in_time_after_an_empty_file_reuses_it(store_path):
    files = _three_wal_files(store_path)
    os.truncate(_wal(store_path, 3), 0)
    st = _session(store_path, "put5", recovery="point_in_time")
    assert st == {"recovered_wal_records": 1, "wal_bytes_dropped": files[4]}, st
    assert sorted(_wal_files(store_path)) == [2, 3] and _wal_files(store_path)[3] > 0
    with Store.open(store_path, _opts()) as s:
        assert _x(s) == [1] * 10 + [0] * 20
        assert s.get("x", np.arange(50, 60, dtype=U64)).to_pylist() == [6] * 10


def test_point_in_time_after_a_damaged_record_makes_the_point_durable(store_path):
    """A damaged record with later files: before, a writable point_in_time open logged to the
    file after the damaged one, which existed (appending behind its old records), so the next
    open replayed the records point_in_time had dropped. Now the open cuts the damaged file at
    the record (here to nothing: the session then logs to it) and deletes the later files."""
    files = _three_wal_files(store_path)
    data = bytearray(open(_wal(store_path, 3), "rb").read())
    data[20] ^= 0xFF  # inside put1's record, the only one of the file
    data = bytes(data) * 2  # a second copy after it: later records, so damage rather than a torn tail
    open(_wal(store_path, 3), "wb").write(bytes(data))
    _refused(store_path)
    st = _session(store_path, "put5", recovery="point_in_time")
    assert st == {"recovered_wal_records": 1, "wal_bytes_dropped": len(data) + files[4]}, st
    assert sorted(_wal_files(store_path)) == [2, 3] and _wal_files(store_path)[3] > 0  # cut, then reused
    with Store.open(store_path, _opts()) as s:
        assert _x(s) == [1] * 10 + [0] * 20
        assert s.get("x", np.arange(50, 60, dtype=U64)).to_pylist() == [6] * 10


def test_state_record_of_an_older_version_opens_a_store_with_a_gap_as_before(store_path):
    """A state record without the trailing byte was committed by a version whose writers
    unlinked empty files (gaps were normal): the open replays what is there. This version's
    commits claim the files consecutive only once they are: a commit before the session's first
    flush keeps saying they may not be, so a crash then does not turn the old gap into an
    error; the first flush starts a fresh run of files and says so."""
    _three_wal_files(store_path)
    os.unlink(_wal(store_path, 3))
    state = _state_record(store_path)
    assert len(state) == 46 and state[37:38] == b"\x01", state
    testing._t.meta_put(os.path.join(store_path, "meta"), 2, 0, state[:37])  # without the later fields
    with Store.open(store_path, _opts(read_only=True)) as s:
        assert _x(s) == [1] * 10 + [0] * 10 + [3] * 10  # as before: put1 silently gone
    _session(store_path, "feature")  # commits (create_feature), then crashes
    state = _state_record(store_path)
    assert len(state) == 46 and state[37:38] == b"\x00", state
    assert sorted(_wal_files(store_path)) == [2, 4, 5]
    with Store.open(store_path, _opts()) as s:
        assert _x(s) == [1] * 10 + [0] * 10 + [3] * 10
    assert _wal_files(store_path) == {5: 0}  # close's flush: 5 is the first file now
    assert _state_record(store_path)[37:38] == b"\x01"


# -- the newest files --------------------------------------------------------------------------
def _wal_last(path):
    return int.from_bytes(_state_record(path)[38:46], "little")


def test_each_session_records_its_file_before_it_logs_there(store_path):
    """put0 logs to 2 (the first file, reused), put1 and put2 to the files their opens made: each
    committed its file as the newest before its record went in. A session that writes nothing
    records nothing (its open commits nothing, so it opens on a full disk too)."""
    _three_wal_files(store_path)
    assert _wal_last(store_path) == 4
    _session(store_path, "nothing")  # makes 5, logs nothing there
    assert sorted(_wal_files(store_path)) == [2, 3, 4, 5] and _wal_last(store_path) == 4


@pytest.mark.parametrize("gone", [[4], [3, 4]], ids=["newest", "two-newest"])
def test_newest_wal_files_deleted_fail_the_open(store_path, gone):
    """Before, nothing after the newest files said they existed: deleting them (put2's synced
    record, or put1's and put2's) opened the store without a word and without those writes."""
    _three_wal_files(store_path)
    for n in gone:
        os.unlink(_wal(store_path, n))
    what = (f"WAL file '{_wal(store_path, 4)}' is missing" if gone == [4] else
            f"WAL files '{_wal(store_path, 3)}' to '{_wal(store_path, 4)}' are missing")
    for msg in _refused(store_path):
        assert what in msg, msg
        assert f"records '{_wal(store_path, 4)}' as the newest file a session logged to" in msg, msg
        assert f"the last one there is '{_wal(store_path, min(gone) - 1)}'" in msg, msg
        assert "synced writes" in msg and "point_in_time" in msg, msg


@pytest.mark.parametrize("gone", [[4], [3, 4]], ids=["newest", "two-newest"])
def test_point_in_time_opens_as_of_the_files_left_and_records_them(store_path, gone):
    """point_in_time opens as of the files that are there. A writable open records its own file
    as the newest before it logs anything (at the open when that file is older than the one on
    record), so neither a crash before its first write nor one after it leaves a store that the
    next default open refuses."""
    _three_wal_files(store_path)
    for n in gone:
        os.unlink(_wal(store_path, n))
    kept = [1] * 10 + ([2] * 10 if gone == [4] else [0] * 10) + [0] * 10
    with Store.open(store_path, _opts(read_only=True, wal_recovery="point_in_time")) as s:
        assert _x(s) == kept
    assert _wal_last(store_path) == 4  # a read-only open changes nothing
    _session(store_path, "nothing", recovery="point_in_time")  # crashes before any write
    first_free = min(gone)
    assert sorted(_wal_files(store_path)) == list(range(2, first_free + 1))
    assert _wal_last(store_path) == first_free
    with Store.open(store_path, _opts(read_only=True)) as s:  # the default recovery accepts it now
        assert _x(s) == kept
    st = _session(store_path, "put5", recovery="point_in_time")  # logs to first_free, crashes
    assert st["wal_bytes_dropped"] == 0, st
    with Store.open(store_path, _opts()) as s:
        assert _x(s) == kept
        assert s.get("x", np.arange(50, 60, dtype=U64)).to_pylist() == [6] * 10


def test_recording_the_newest_file_keeps_the_checkpoint(store_path):
    """The commit that records a session's file leaves pages and sequence as they are, so the
    checkpoint of the last clean close stays valid: a session that writes and crashes before
    its first flush does not cost the next open a rebuild from the pages."""
    _session(store_path, "create")
    Store.open(store_path, _opts()).close()  # a clean close writes the checkpoint
    assert os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    _session(store_path, "put0")  # records its file, logs, crashes
    assert _wal_last(store_path) > 0
    with Store.open(store_path, _opts()) as s:
        assert s.stats()["opened_from_checkpoint"] == 1
        assert _x(s, 10) == [1] * 10


def test_newest_file_missing_while_a_writer_holds_the_lock_is_stale_for_a_read_only_open(store_path):
    _three_wal_files(store_path)
    w = Store.open(store_path, _opts())  # replayed 2..4, logs to 5
    try:
        w.put("x", np.arange(5, dtype=U64), np.full(5, 8, np.int64))
        w.sync()  # 5 recorded as the newest, then the record
        os.unlink(_wal(store_path, 5))
        with pytest.raises(StaleSnapshotError) as e:
            Store.open(store_path, _opts(read_only=True))
        assert _wal(store_path, 5) in str(e.value) and "LOCK" in str(e.value), str(e.value)
    finally:
        w.close()


# -- read-only opens and a writer ----------------------------------------------------------------
def _ro_open_held(path, point, change):
    """A read-only Store.open(path) held at pause point `point` while change() runs (see
    storeutil.open_held_at)."""
    return open_held_at(path, _opts(read_only=True), point, change)


def test_read_only_open_sees_a_writers_fresh_empty_last_file(store_path):
    """A writer opening while a read-only open has read the metadata but not listed wal/ adds
    its fresh, empty file after the last one: the read-only open takes it as it is, no reopen."""
    _three_wal_files(store_path)
    holder = {}

    def writer_opens():
        holder["w"] = Store.open(store_path, _opts())  # replays 2..4 (three files opened), makes 5

    r, opened = _ro_open_held(store_path, "wal.replay.before_list", writer_opens)
    w = holder["w"]
    try:
        assert isinstance(r, Store), repr(r)
        assert _wal_files(store_path)[5] == 0
        assert opened == 3 + 4  # the writer's 2..4, then the read-only open's 2..5 once: no reopen
        assert _x(r) == [1] * 10 + [2] * 10 + [3] * 10
        r.close()
    finally:
        w.close()


def test_read_only_open_racing_a_writers_flush(store_path):
    """The writer flushes (a fresh file, the commit, the older files deleted) after a read-only
    open read the metadata and before it listed wal/: its first file is gone while a writer
    holds the LOCK, so the snapshot is stale and the open takes a newer one."""
    _three_wal_files(store_path)
    w = Store.open(store_path, _opts(pinner_enabled=False))  # its flush writes everything
    try:
        def writer_flushes():
            w.put("x", np.arange(30, dtype=U64), np.full(30, 7, np.int64))
            w.flush()
            assert sorted(_wal_files(store_path)) == [6]

        r, _ = _ro_open_held(store_path, "wal.replay.before_list", writer_flushes)
        assert isinstance(r, Store), repr(r)
        assert _x(r) == [7] * 30
        r.close()
    finally:
        w.close()


def test_read_only_open_racing_a_writers_flush_and_close(store_path):
    """As above, but the writer also closes (releasing the LOCK) before the read-only open lists
    wal/: no writer holds the LOCK then, yet the committed state is not the one the open read,
    so the missing first file is a stale snapshot (reopen), not damage."""
    _three_wal_files(store_path)

    def writer_flushes_and_closes():
        w = Store.open(store_path, _opts(pinner_enabled=False))
        w.put("x", np.arange(30, dtype=U64), np.full(30, 7, np.int64))
        w.close()  # the flush commits a new first WAL file and deletes the older ones
        assert 2 not in _wal_files(store_path)

    r, _ = _ro_open_held(store_path, "wal.replay.before_list", writer_flushes_and_closes)
    assert isinstance(r, Store), repr(r)
    assert _x(r) == [7] * 30
    r.close()


def test_gap_while_a_writer_holds_the_lock_is_stale_for_a_read_only_open(store_path):
    """A file missing between two others while a writer holds the LOCK may be the writer
    retiring files (a commit deletes the files below its new first one, in any order): a
    read-only open calls it stale, naming the file. With no writer it is damage."""
    _three_wal_files(store_path)
    w = Store.open(store_path, _opts())  # replayed 2..4 into its buffer, logs to 5
    try:
        os.unlink(_wal(store_path, 3))
        with pytest.raises(StaleSnapshotError) as e:
            Store.open(store_path, _opts(read_only=True))
        assert _wal(store_path, 3) in str(e.value) and "LOCK" in str(e.value), str(e.value)
    finally:
        w.close()  # its flush commits what it replayed and retires 2..4
    assert _wal_files(store_path) == {5: 0}
    with Store.open(store_path, _opts(read_only=True)) as r:
        assert _x(r) == [1] * 10 + [2] * 10 + [3] * 10


def test_no_metadata_commit_after_a_failed_flush_commit(store_path):
    """A flush whose metadata commit failed has moved the store's first WAL file on in DRAM.
    Before, create_feature then committed that state: the next open deleted the WAL file
    holding the flushed items (below the committed first one) and lost them. Now the store
    refuses it with the flush's error, as it does writes."""
    child = r'''
import os, sys
import numpy as np
from recflash.reader import Store, StoreOptions, testing
from recflash.reader.errors import IOError_
s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=1 << 20, pinner_enabled=False))
s.create_feature("x", "int64")
s.put("x", np.arange(1000, dtype=np.uint64), np.full(1000, 5, np.int64))
s.sync()
testing.arm("meta_commit", nth=1)
try:
    s.flush()
    raise SystemExit("the flush's commit did not fail")
except IOError_:
    pass
testing.disarm()
try:
    s.create_feature("y", "int64")
    raise SystemExit("create_feature committed after the failed flush")
except IOError_ as e:
    assert "metadata commit" in str(e), str(e)
os._exit(0)
'''
    subprocess.run([sys.executable, "-P", "-c", child, store_path], check=True, timeout=120)
    with Store.open(store_path, _opts()) as s:
        assert s.get("x", np.arange(1000, dtype=U64)).to_pylist() == [5] * 1000
        assert list(s.features()) == ["x"]
