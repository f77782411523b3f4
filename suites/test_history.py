"""The run history: it refuses files that are not histories (and leaves them untouched),
reading never writes, every problem is named in one line, a run can be appended later
from its results.json, and a failed append leaves the history as it was."""

import dataclasses
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing, contextmanager

import pytest

from harness.cli import main
from harness.evidence import history
from harness.evidence.history import HistoryError, append_run, load
from harness.evidence.records import CheckRecord
from harness.report.outputs import write_outputs
from harness.run.runner import run
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile

# The schema the history had before it carried a marker: files written then must keep working.
LEGACY_SCHEMA = """
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT NOT NULL, label TEXT, profile TEXT NOT NULL,
    seed INTEGER NOT NULL, vllm_version TEXT, vllm_commit TEXT, environment TEXT NOT NULL, command TEXT);
CREATE TABLE records (run_id INTEGER NOT NULL REFERENCES runs(id), backend TEXT NOT NULL, scenario TEXT NOT NULL,
    template INTEGER NOT NULL, check_name TEXT NOT NULL, verdict TEXT NOT NULL, kind TEXT NOT NULL, p_value REAL,
    alpha REAL, trials INTEGER, detectable_tv REAL, tv_estimate REAL, tv_lo REAL, tv_hi REAL, message TEXT, reproducer TEXT);
CREATE INDEX records_key ON records(backend, scenario, template, check_name);
INSERT INTO runs VALUES (1, '2025-01-01T00:00:00', 'old', 'smoke', 0, NULL, NULL, '{}', NULL);
INSERT INTO records VALUES (1, 'reference', 's', 0, 'structure', 'pass', 'exact', 1.0, 0.0, 10, 0.1, 0.0, NULL, NULL, '', '');
"""


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    profile = get_profile("smoke")
    result = run(["reference"], [s for s in catalog(profile) if s.name == "greedy-ties"], profile)
    return write_outputs(result, str(tmp_path_factory.mktemp("run")), argv=["python", "-m", "harness", "run"])["document"]


def legacy_history(path, journal="wal"):
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.executescript(LEGACY_SCHEMA)
    conn.close()
    return path


def pragma(path, name):
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


def snapshot(directory):
    """Names, bytes and modification times of everything in a folder."""
    out = {}
    for name in sorted(os.listdir(directory)):
        p = os.path.join(directory, name)
        st = os.stat(p)
        out[name] = (st.st_mtime_ns, open(p, "rb").read() if os.path.isfile(p) else None)
    return out


@contextmanager
def read_only(path):
    """Make a file or folder really unwritable. Root ignores permission bits, so as root the
    immutable attribute (``chattr +i``) is set too; skip where neither can be had."""
    mode = os.stat(path).st_mode & 0o7777
    os.chmod(path, 0o555 if os.path.isdir(path) else 0o444)
    attr = False
    try:
        if os.geteuid() == 0:
            attr = shutil.which("chattr") is not None and subprocess.run(["chattr", "+i", path], capture_output=True).returncode == 0
        probe = os.path.join(path, ".probe") if os.path.isdir(path) else path
        try:
            with open(probe, "a"):
                pass
        except OSError:
            pass
        else:
            pytest.skip("cannot make a path read-only here (root without chattr +i)")
        yield
    finally:
        if attr:
            subprocess.run(["chattr", "-i", path], check=True)
        os.chmod(path, mode)


# 1. A database that is not a history is refused and left as it was.


def test_a_foreign_database_is_refused_and_left_untouched(doc, tmp_path):
    path = tmp_path / "app.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE a (x); CREATE TABLE b (y); INSERT INTO a VALUES (1);")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match=rf"{path}.* an SQLite database, but not a run history .*\(it has tables a, b\)"):
        append_run(str(path), doc)
    with pytest.raises(HistoryError, match=r"it has tables a, b"):
        load(str(path))
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["app.sqlite"]


def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(doc, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    with pytest.raises(HistoryError, match=rf"{path}: not an SQLite file"):
        append_run(str(path), doc)
    assert path.read_text() == "my notes\n" and sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_new_histories_carry_the_marker_and_an_empty_file_is_new(doc, tmp_path):
    path = tmp_path / "h.sqlite"
    assert append_run(str(path), doc) == 1
    assert pragma(path, "application_id") == history.APPLICATION_ID
    assert pragma(path, "user_version") == history.SCHEMA_VERSION
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    assert append_run(str(empty), doc) == 1 and pragma(empty, "application_id") == history.APPLICATION_ID


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_history_written_before_the_marker_keeps_working(doc, tmp_path, journal):
    path = legacy_history(str(tmp_path / "old.sqlite"), journal)
    runs, records = load(path)
    assert [r["label"] for r in runs] == ["old"] and len(records) == 1
    assert pragma(path, "application_id") == 0  # reading did not migrate it
    assert append_run(path, doc, "new") == 2
    assert pragma(path, "application_id") == history.APPLICATION_ID
    assert pragma(path, "user_version") == history.SCHEMA_VERSION
    runs, records = load(path)
    assert [r["label"] for r in runs] == ["old", "new"] and len(records) == 1 + len(doc["records"])


def test_a_version_1_history_is_read_as_records_and_upgraded_by_an_append(doc, tmp_path):
    """A file of the previous schema (marked, version 1): read without a write, with the
    record's field names; the next append upgrades it in its own transaction, rows kept."""
    path = legacy_history(str(tmp_path / "v1.sqlite"), "delete")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA application_id = {history.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 1")
        conn.execute("UPDATE records SET tv_lo = 0.01, tv_hi = 0.02")
        conn.commit()
    before = snapshot(tmp_path)
    _, (old,) = load(path)
    assert snapshot(tmp_path) == before
    assert old["check"] == "structure" and old["tv_ci"] == [0.01, 0.02] and "check_name" not in old
    assert append_run(path, doc, "new") == 2 and pragma(path, "user_version") == history.SCHEMA_VERSION
    _, records = load(path)
    assert records[0] == dict(old, message=old["message"] or "", reproducer=old["reproducer"] or "")
    assert len(records) == 1 + len(doc["records"]) and records[1]["check"] == doc["records"][0]["check"]


def test_the_records_table_holds_every_field_of_the_record(doc, tmp_path):
    """The schema is derived from ``CheckRecord``: every field is stored and read back."""
    path = str(tmp_path / "h.sqlite")
    append_run(path, doc)
    fields = [f.name for f in dataclasses.fields(CheckRecord)]
    with closing(sqlite3.connect(path)) as conn:
        assert [c[1] for c in conn.execute("PRAGMA table_info(records)")] == ["run_id", *fields]
    _, records = load(path)
    for stored, written in zip(records, json.loads(json.dumps(doc["records"]))):
        assert {k: stored[k] for k in fields} == {k: written.get(k) for k in fields}


def test_a_history_of_a_newer_schema_is_refused(doc, tmp_path):
    path = tmp_path / "h.sqlite"
    append_run(str(path), doc)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 1000")
    before = path.read_bytes()
    for call in (lambda: load(str(path)), lambda: append_run(str(path), doc), lambda: history.check_history(str(path))):
        with pytest.raises(HistoryError, match=r"newer schema \(version 1000;"):
            call()
    assert path.read_bytes() == before


# 2. Reading never writes: not in a read-only folder, not a marker, not a journal mode.


@pytest.mark.parametrize("kind", ["current", "legacy-wal"])
def test_report_reads_a_history_in_a_read_only_directory(doc, tmp_path, kind, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = str(folder / "h.sqlite")
    if kind == "current":
        append_run(path, doc, "a")
        append_run(path, doc, "b")
    else:
        legacy_history(path)
    before = snapshot(folder)
    out = tmp_path / "drift.html"
    with read_only(str(folder)):
        assert main(["report", "--history", path, "--out", str(out)]) == 0, capsys.readouterr().err
        runs, _ = load(path)
    assert snapshot(folder) == before and out.exists()
    assert len(runs) == (2 if kind == "current" else 1)


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_reading_changes_nothing(doc, tmp_path, journal):
    path = legacy_history(str(tmp_path / "h.sqlite"), journal)
    before = snapshot(tmp_path)
    load(path)
    assert main(["report", "--history", path, "--out", str(tmp_path / "out" / "drift.html")]) == 0
    shutil.rmtree(tmp_path / "out")
    assert snapshot(tmp_path) == before


# 3. Each problem named for what it is.


def _all_calls(path, doc):
    return {
        "load": lambda: load(path),
        "append": lambda: append_run(path, doc),
        "check": lambda: history.check_history(path),
    }


def test_a_missing_directory_is_named_not_called_corrupt(doc, tmp_path, capsys):
    path = str(tmp_path / "no" / "such" / "dir" / "h.sqlite")
    for name, call in _all_calls(path, doc).items():
        with pytest.raises(HistoryError) as e:
            call()
        assert f"directory {tmp_path / 'no'} does not exist" in str(e.value), name
        assert "corrupt" not in str(e.value)
    assert os.listdir(tmp_path) == []
    assert main(["report", "--history", path, "--out", str(tmp_path / "d.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_a_directory_is_named(doc, tmp_path):
    for call in _all_calls(str(tmp_path), doc).values():
        with pytest.raises(HistoryError, match=rf"{tmp_path}: a directory, not a history file"):
            call()


def test_a_file_that_cannot_be_written_is_named(doc, tmp_path):
    path = tmp_path / "h.sqlite"
    append_run(str(path), doc)
    before = path.read_bytes()
    with read_only(str(path)):
        for call in (lambda: append_run(str(path), doc), lambda: history.check_history(str(path))):
            with pytest.raises(HistoryError, match=rf"{path}: permission denied \(cannot write it\)"):
                call()
        assert len(load(str(path))[0]) == 1  # still readable
    assert path.read_bytes() == before


def test_a_folder_that_cannot_be_written_is_named(doc, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(str(folder)):
        for call in (lambda: append_run(str(folder / "h.sqlite"), doc), lambda: history.check_history(str(folder / "h.sqlite"))):
            with pytest.raises(HistoryError, match=rf"permission denied \(cannot create files in {folder}\)"):
                call()
    assert os.listdir(folder) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permission bits")
def test_a_file_that_cannot_be_read_is_named(doc, tmp_path):
    path = tmp_path / "h.sqlite"
    append_run(str(path), doc)
    path.chmod(0)
    try:
        with pytest.raises(HistoryError, match=rf"{path}: permission denied \(cannot read it\)"):
            load(str(path))
    finally:
        path.chmod(0o644)


def test_a_corrupt_sqlite_file_is_called_corrupt(doc, tmp_path):
    path = tmp_path / "h.sqlite"
    append_run(str(path), doc)
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # the page contents, past the header
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match=rf"{path}: corrupt SQLite file"):
        load(str(path))


def interrupted_history(folder, doc):
    """A history whose last append was killed after it had written pages (a hot journal)."""
    path = str(folder / "h.sqlite")
    for _ in range(20):
        append_run(path, doc)
    kill = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('PRAGMA cache_size=1');"
        " c.execute('BEGIN IMMEDIATE'); c.execute(\"UPDATE records SET message = message || printf('%.500c', 'x')\"); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", kill, path], check=True)
    try:
        sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("SELECT count(*) FROM runs").fetchone()
        pytest.skip("the killed append left no hot journal")
    except sqlite3.Error as e:
        assert e.sqlite_errorcode == sqlite3.SQLITE_READONLY_ROLLBACK
    return path


def test_an_append_killed_midway_is_rolled_back_before_reading(doc, tmp_path):
    path = interrupted_history(tmp_path, doc)
    runs, records = load(path)
    assert len(runs) == 20 and sorted(r["message"] for r in records) == sorted(r["message"] for r in doc["records"] * 20)
    assert not os.path.exists(path + "-journal") and append_run(path, doc) == 21


def test_an_append_killed_midway_in_a_read_only_folder_is_named(doc, tmp_path):
    path = interrupted_history(tmp_path, doc)
    with read_only(str(tmp_path)):
        with pytest.raises(HistoryError, match=r"an append to it was interrupted and .*-journal must be rolled back first"):
            load(path)


# 4. Checked before sampling, creating nothing.


def test_check_history_accepts_what_append_accepts_and_creates_nothing(doc, tmp_path):
    history.check_history(str(tmp_path / "new.sqlite"))
    (tmp_path / "empty.sqlite").touch()
    history.check_history(str(tmp_path / "empty.sqlite"))
    append_run(str(tmp_path / "h.sqlite"), doc)
    history.check_history(str(tmp_path / "h.sqlite"))
    history.check_history(legacy_history(str(tmp_path / "old.sqlite")))
    before = snapshot(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(HistoryError, match="not an SQLite file"):
        history.check_history(str(tmp_path / "notes.txt"))
    os.unlink(tmp_path / "notes.txt")
    assert snapshot(tmp_path) == before and pragma(tmp_path / "old.sqlite", "application_id") == 0


# Appending is one transaction.


def test_a_failed_append_leaves_no_new_history(doc, tmp_path):
    broken = dict(doc, records=doc["records"] + [dict(doc["records"][0], message={"not": "storable"})])
    path = tmp_path / "h.sqlite"
    with pytest.raises(HistoryError, match=rf"{path}: could not append"):
        append_run(str(path), broken)
    assert os.listdir(tmp_path) == []
    append_run(str(path), doc, "kept")
    before = path.read_bytes()
    with pytest.raises(HistoryError, match="could not append"):
        append_run(str(path), broken)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["h.sqlite"]


def test_concurrent_first_appends_all_land(doc, tmp_path):
    path = str(tmp_path / "h.sqlite")
    ids, errors = [], []

    def one(i):
        try:
            ids.append(append_run(path, doc, str(i)))
        except Exception as e:  # collected, asserted below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(ids) == [1, 2, 3, 4, 5, 6]
    assert len(load(path)[0]) == 6 and os.listdir(tmp_path) == ["h.sqlite"]


# 5. `history append`: a run's results.json added later.


def test_history_append_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    hist = str(tmp_path / "h.sqlite")
    assert main(["run", "--profile", "smoke", "--scenario", "greedy-ties", "--out", str(out), "--no-progress", "--in-process"]) == 0
    capsys.readouterr()
    assert main(["history", "append", str(out / "results.json"), "--history", hist, "--label", "later"]) == 0
    assert capsys.readouterr().out.strip() == f"history: {hist} (run 1)"
    assert main(["history", "append", "--history", hist, str(out)]) == 0  # the run's folder will do
    assert capsys.readouterr().out.strip() == f"history: {hist} (run 2)"
    runs, records = load(hist)
    doc = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in runs] == ["later", None] and len(records) == 2 * len(doc["records"])
    assert runs[0]["created"] == doc["created"] and runs[0]["profile"] == "smoke"
    page = tmp_path / "drift.html"
    assert main(["report", "--history", hist, "--out", str(page)]) == 0
    assert page.exists() and "(2 runs," in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, why",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a run document"),
        ('{"rows": []}', r"not a run document written by 'python -m harness run' \(no 'records'\)"),
        ('{"profile": {"name": "smoke"}, "seed": 0, "records": [{"backend": "b"}]}', r"record 0 has no 'scenario'"),
    ],
)
def test_history_append_refuses_what_is_not_a_run_document(tmp_path, capsys, content, why):
    src = tmp_path / "results.json"
    if content is not None:
        src.write_text(content)
    hist = tmp_path / "h.sqlite"
    assert main(["history", "append", str(src), "--history", str(hist)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(src) in err
    assert re.search(why, err), err
    assert not hist.exists()
