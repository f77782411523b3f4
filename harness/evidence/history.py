"""Run history in SQLite: every run appended in one transaction, never rewritten.

SQLite gives the guarantees the history needs: a run killed midway leaves the file as it
was before that run (the transaction never committed), earlier runs are never touched
(rows are only inserted), and concurrent readers see a consistent file. A history carries a
marker in its SQLite header (``application_id`` and the schema's ``user_version``), so a
database of something else is refused, never extended. Reading opens the file read-only
and writes nothing, not even a journal: a history in a read-only folder can be read. Every
problem raises ``HistoryError``: one line naming the file and what is wrong with it.
"""

import functools
import json
import os
import secrets
import sqlite3
import stat
import time
import urllib.parse
from contextlib import closing

from harness.evidence.records import columns as record_columns

APPLICATION_ID = 0x53445648  # "SDVH" in the header's application_id: a specdec-verify history
SCHEMA_VERSION = 2  # the header's user_version; a reader refuses a higher one, an append upgrades a lower one

# The records table holds every field of ``CheckRecord``, as ``records.columns`` declares it:
# a field added to the record is a column of the history, with no second declaration here.
RECORD_COLUMNS = record_columns()
_JSON_COLUMNS = {name for name, kind, _ in RECORD_COLUMNS if kind == "JSON"}
_RECORDS_TABLE = f"""CREATE TABLE records (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    {", ".join(f'"{name}" {"TEXT" if kind == "JSON" else kind}{" NOT NULL" * required}' for name, kind, required in RECORD_COLUMNS)}
)"""
_RECORDS_INDEX = 'CREATE INDEX records_key ON records(backend, scenario, template, "check")'
SCHEMA = f"""
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    label TEXT,
    profile TEXT NOT NULL,
    seed INTEGER NOT NULL,
    vllm_version TEXT,
    vllm_commit TEXT,
    environment TEXT NOT NULL,
    command TEXT
);
{_RECORDS_TABLE};
{_RECORDS_INDEX};
"""
# Version 1 (and the unmarked histories before it) stored these record columns; an append
# upgrades such a file to the current schema in the append's own transaction.
_V1_RECORD_COLUMNS = [
    "run_id", "backend", "scenario", "template", "check_name", "verdict", "kind", "p_value", "alpha", "trials",
    "detectable_tv", "tv_estimate", "tv_lo", "tv_hi", "message", "reproducer",
]  # fmt: skip
_V1_UPGRADE = f"""
ALTER TABLE records RENAME TO records_v1;
{_RECORDS_TABLE};
INSERT INTO records (run_id, backend, scenario, template, "check", verdict, kind, message, reproducer, p_value, alpha,
    trials, detectable_tv, tv_estimate, tv_ci)
    SELECT run_id, backend, scenario, template, check_name, verdict, kind, coalesce(message, ''), coalesce(reproducer, ''),
        p_value, alpha, trials, detectable_tv, tv_estimate,
        CASE WHEN tv_lo IS NULL OR tv_hi IS NULL THEN NULL ELSE json_array(tv_lo, tv_hi) END
    FROM records_v1 ORDER BY rowid;
DROP TABLE records_v1;
{_RECORDS_INDEX}
"""

_MAGIC = b"SQLite format 3\x00"


class HistoryError(Exception):
    pass


def check_history(path: str) -> None:
    """Raise ``HistoryError`` unless a run can be appended to ``path``: an existing history
    (or an empty file), or a new file in an existing folder that can be written. Creates and
    changes nothing (but rolls back an append killed midway, as the append would), so it can
    run before the sampling that would produce the run."""
    _appendable(path)


def append_run(path: str, doc: dict, label: str | None = None) -> int:
    """Append one run (a ``results.json`` document) atomically; return its run id."""
    run, records = _rows(doc, label)  # a malformed document fails before the file is touched
    if not _appendable(path):
        try:
            return _create(path, run, records)
        except FileExistsError:  # another process created it meanwhile: append to that one
            _appendable(path)
    return _insert(path, path, "rw", run, records)


def load(path: str) -> tuple[list[dict], list[dict]]:
    """All runs (oldest first) and all records of a history. Writes nothing, except to roll
    back an append that was killed midway (which any read-write open would)."""
    for _ in range(3):
        header = _header(path)
        if not header:
            raise HistoryError(f"history {path}: an empty file, no run has been appended to it")
        immutable, before = _immutable(path, header), _stamp(path)
        try:
            with closing(_open_read(path, immutable)) as conn:
                conn.row_factory = sqlite3.Row
                conn.execute("BEGIN")  # runs and records of one moment
                if _kind(conn, path) == "new":
                    raise HistoryError(f"history {path}: an empty database, no run has been appended to it")
                _quick_check(conn, path)
                runs = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]
                records = [dict(r) for r in conn.execute("SELECT * FROM records ORDER BY run_id")]
        except sqlite3.Error as e:
            if not _interrupted(e):
                raise HistoryError(f"history {path}: {_sqlite_problem(e)}") from None
            _roll_back(path)
            continue
        if not immutable or _stamp(path) == before:  # an immutable open takes no lock: retry if it changed meanwhile
            break
    else:
        raise HistoryError(f"history {path}: changed while being read, three times over; try again")
    for run in runs:
        try:
            run["environment"] = json.loads(run["environment"])
        except (TypeError, json.JSONDecodeError):
            raise HistoryError(f"history {path}: run {run['id']} has a corrupt environment field") from None
    return runs, [_record_fields(r, path) for r in records]


def _record_fields(row: dict, path: str) -> dict:
    """A stored record as ``CheckRecord``'s fields (a version-1 file's columns renamed, its
    fields added since absent)."""
    if "check_name" in row:  # version 1, read without upgrading: the file is not written
        lo, hi = row.pop("tv_lo"), row.pop("tv_hi")
        row["check"] = row.pop("check_name")
        row["tv_ci"] = None if lo is None or hi is None else [lo, hi]
        return {"run_id": row["run_id"], **{name: row.get(name) for name, _, _ in RECORD_COLUMNS}}
    for name in _JSON_COLUMNS:
        if row[name] is not None:
            try:
                row[name] = json.loads(row[name])
            except json.JSONDecodeError:
                raise HistoryError(f"history {path}: run {row['run_id']} has a corrupt {name!r} field") from None
    return row


def read_run_document(path: str) -> dict:
    """The run document (``results.json`` written by ``run``) at ``path``, or in the run's
    output folder ``path``; ``HistoryError`` saying why when it is not one."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise HistoryError(f"{path}: no such file") from None
    except OSError as e:
        raise HistoryError(f"{path}: cannot read it ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HistoryError(f"{path}: not JSON ({e})") from None
    problem = _document_problem(doc)
    if problem:
        raise HistoryError(f"{path}: not a run document written by 'python -m harness run' ({problem})")
    return doc


def _document_problem(doc) -> str | None:
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    if "records" not in doc:
        return "no 'records'"
    if not isinstance(doc["records"], list):
        return "'records' is not a list"
    if not isinstance(doc.get("profile"), dict) or not isinstance(doc["profile"].get("name"), str):
        return "no profile name"
    if not _is(doc.get("seed"), int):
        return "no integer 'seed'"
    if not isinstance(doc.get("environment", {}), dict):
        return "'environment' is not an object"
    for key in ("created", "command"):
        if not _is(doc.get(key), str, None):
            return f"'{key}' is not a string"
    for i, r in enumerate(doc["records"]):
        if not isinstance(r, dict):
            return f"record {i} is not an object"
        for key, types in _RECORD_FIELDS.items():
            if key not in r and None not in types:
                return f"record {i} has no '{key}'"
            if not _is(r.get(key), *types):
                return f"record {i}: '{key}' is not {' or '.join(t.__name__ if t else 'null' for t in types)}"
        ci = r.get("tv_ci")
        if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(_is(x, float, None) for x in ci)):
            return f"record {i}: 'tv_ci' is not a pair of numbers"
    return None


_RECORD_FIELDS = {
    **dict.fromkeys(("backend", "scenario", "check", "verdict", "kind"), (str,)),
    "template": (int,),
    **dict.fromkeys(("message", "reproducer"), (str, None)),
    "trials": (int, None),
    **dict.fromkeys(("p_value", "alpha", "detectable_tv", "tv_estimate"), (float, None)),
}


def _is(value, *types) -> bool:
    if value is None:
        return None in types
    if isinstance(value, bool):  # JSON true is no count and no number
        return False
    return any(t is not None and (isinstance(value, t) or (t is float and isinstance(value, int))) for t in types)


def _rows(doc: dict, label: str | None) -> tuple[tuple, list[tuple]]:
    env = doc.get("environment", {})
    run = (
        doc.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        label,
        doc["profile"]["name"],
        doc["seed"],
        env.get("vllm"),
        env.get("vllm_commit"),
        json.dumps(env, sort_keys=True),
        doc.get("command"),
    )
    rows = [tuple(_cell(r.get(name), kind) for name, kind, _ in RECORD_COLUMNS) for r in doc["records"]]
    return run, rows


def _cell(value, kind: str):
    """A record field as the history stores it (``kind``: its column's declared type)."""
    if kind == "JSON":
        return None if value is None else json.dumps(value, sort_keys=True)
    if kind == "REAL":
        return _num(value)
    return value


def _num(x):
    if isinstance(x, str) and x in ("inf", "-inf"):  # the run document writes infinities as text
        return float(x)
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _appendable(path: str) -> bool:
    """Whether ``path`` exists; raises unless a run can be appended to it."""
    try:
        os.stat(path)
    except PermissionError:
        raise HistoryError(f"history {path}: permission denied (cannot reach it)") from None
    except (FileNotFoundError, NotADirectoryError):
        why = _why_missing(path)
        if why:
            raise HistoryError(f"history {path}: {why}") from None
        _writable_folder(path)
        return False
    header = _header(path)
    if not os.access(path, os.W_OK):
        raise HistoryError(f"history {path}: permission denied (cannot write it)")
    _writable_folder(path)  # the journal of the append is written next to the file
    for _ in range(2 if header else 0):
        try:
            with closing(_open_read(path, _immutable(path, header))) as conn:
                _kind(conn, path)
                _quick_check(conn, path)
            break
        except sqlite3.Error as e:
            if not _interrupted(e):
                raise HistoryError(f"history {path}: {_sqlite_problem(e)}") from None
            _roll_back(path)
    return True


def _interrupted(e: sqlite3.Error) -> bool:
    """A read-only open met the journal of an append that was killed midway."""
    return getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_READONLY_ROLLBACK


def _roll_back(path: str) -> None:
    """Restore the file to its last committed state, as any read-write open of it would: a
    read-only reader cannot use it until the interrupted append is undone."""
    if not (os.access(path, os.W_OK) and os.access(os.path.dirname(path) or ".", os.W_OK | os.X_OK)):
        raise HistoryError(
            f"history {path}: an append to it was interrupted and {path}-journal must be rolled back first, "
            "which needs write access to the file and its folder"
        )
    try:
        with closing(sqlite3.connect(_uri(path, "mode=rw"), uri=True, timeout=30)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise HistoryError(f"history {path}: an append to it was interrupted and could not be rolled back ({e})") from None


def _writable_folder(path: str) -> None:
    folder = os.path.dirname(path) or "."
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HistoryError(f"history {path}: permission denied (cannot create files in {folder})")


def _why_missing(path: str) -> str | None:
    """What is missing on the way to ``path`` (None: only the file itself)."""
    folder, missing = os.path.dirname(path), None
    while folder and not os.path.exists(folder):
        folder, missing = os.path.dirname(folder), folder
    if folder and not os.path.isdir(folder):
        return f"{folder} is not a directory"
    return f"directory {missing} does not exist" if missing else None


def _header(path: str) -> bytes:
    """The SQLite header (b"" for an empty file); raises for a file that cannot be read or
    is no SQLite file."""
    try:
        mode = os.stat(path).st_mode
    except PermissionError:
        raise HistoryError(f"history {path}: permission denied (cannot reach it)") from None
    except (FileNotFoundError, NotADirectoryError):
        raise HistoryError(f"history {path}: {_why_missing(path) or 'no such file'}") from None
    if stat.S_ISDIR(mode):
        raise HistoryError(f"history {path}: a directory, not a history file")
    if not stat.S_ISREG(mode):
        raise HistoryError(f"history {path}: not a regular file")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except PermissionError:
        raise HistoryError(f"history {path}: permission denied (cannot read it)") from None
    except OSError as e:
        raise HistoryError(f"history {path}: cannot read it ({e.strerror})") from None
    if header and not header.startswith(_MAGIC):
        raise HistoryError(f"history {path}: not an SQLite file")
    return header


def _stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _uri(path: str, query: str) -> str:
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?{query}"


def _immutable(path: str, header: bytes) -> bool:
    """Whether to open the file as immutable. Even read-only, a WAL file gets -wal and -shm
    files next to it; with nothing pending in a WAL the file alone is the whole database."""
    if not (len(header) > 18 and header[18] == 2):
        return False  # a rollback journal: read-only reads take a lock and create nothing
    try:
        return os.path.getsize(path + "-wal") == 0
    except OSError:
        return True


def _open_read(path: str, immutable: bool) -> sqlite3.Connection:
    query = "mode=ro&immutable=1" if immutable else "mode=ro"
    return sqlite3.connect(_uri(path, query), uri=True, timeout=30, isolation_level=None)


def _kind(conn: sqlite3.Connection, path: str) -> str:
    """The history's kind: current, v1 (an older schema an append upgrades), legacy (version
    1's tables, written before the marker) or new (no tables yet);
    raises for a database that is no history this code can read."""
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    columns = _columns(conn)
    if app == APPLICATION_ID:
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"history {path}: a history of a newer schema (version {version}; this harness reads version {SCHEMA_VERSION}): "
                "update specdec-verify to use it"
            )
        if version == 1 and columns == _v1_columns():
            return "v1"
        if version != SCHEMA_VERSION or columns != _expected_columns():
            raise HistoryError(f"history {path}: a corrupt history (schema version {version}, tables {_names(columns)})")
        return "current"
    if app == 0 and not columns:
        return "new"
    if app == 0 and columns == _v1_columns():
        return "legacy"  # written before the marker, with version 1's tables
    what = f"application_id {app:#x}, " if app else ""
    raise HistoryError(
        f"history {path}: an SQLite database, but not a run history of specdec-verify ({what}it has tables {_names(columns)})"
    )


def _names(columns: dict) -> str:
    return ", ".join(sorted(columns)) or "none"


def _columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    return {t: [c[1] for c in conn.execute("SELECT * FROM pragma_table_info(?)", (t,))] for t in tables}


@functools.cache
def _expected_columns() -> dict[str, list[str]]:
    with closing(sqlite3.connect(":memory:")) as mem:
        mem.executescript(SCHEMA)
        return _columns(mem)


@functools.cache
def _v1_columns() -> dict[str, list[str]]:
    return {"runs": _expected_columns()["runs"], "records": _V1_RECORD_COLUMNS}


def _quick_check(conn: sqlite3.Connection, path: str) -> None:
    result = conn.execute("PRAGMA quick_check").fetchone()[0]
    if result != "ok":
        raise HistoryError(f"history {path}: corrupt SQLite file ({result})")


def _sqlite_problem(e: sqlite3.Error) -> str:
    text = str(e)
    if "not a database" in text or "malformed" in text:
        return f"corrupt SQLite file ({text})"
    return f"cannot read it as SQLite ({text})"


def _create(path: str, run: tuple, records: list[tuple]) -> int:
    """A new history, made whole under a temporary name and then linked into place: no
    reader ever sees it half made, a failure leaves nothing, and a history that another
    process created meanwhile is never overwritten (``FileExistsError``)."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.new")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        raise HistoryError(f"history {path}: cannot create it ({e.strerror})") from None
    try:
        run_id = _insert(tmp, path, "rw", run, records)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # no hard links on this file system: build it in place instead
            return _insert(path, path, "rwc", run, records)
        return run_id
    finally:
        os.unlink(tmp)


def _execute_script(conn: sqlite3.Connection, script: str) -> None:
    """``script``'s statements inside the caller's transaction (``executescript`` commits)."""
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _insert(target: str, path: str, mode: str, run: tuple, records: list[tuple]) -> int:
    """One transaction on ``target``: the schema and marker if it has none yet, then the run."""
    try:
        conn = sqlite3.connect(_uri(target, f"mode={mode}"), uri=True, timeout=30, isolation_level=None)
    except sqlite3.Error as e:
        raise HistoryError(f"history {path}: could not open it ({e})") from None
    with closing(conn):
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                kind = _kind(conn, path)  # again, under the write lock
                if kind == "new":
                    _execute_script(conn, SCHEMA)
                else:
                    _quick_check(conn, path)
                if kind in ("v1", "legacy"):
                    _execute_script(conn, _V1_UPGRADE)
                if kind != "current":
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                run_id = conn.execute(
                    "INSERT INTO runs(created, label, profile, seed, vllm_version, vllm_commit, environment, command) VALUES (?,?,?,?,?,?,?,?)",
                    run,
                ).lastrowid
                names = ", ".join(f'"{name}"' for name, _, _ in RECORD_COLUMNS)
                marks = ",".join("?" * (len(RECORD_COLUMNS) + 1))
                conn.executemany(f"INSERT INTO records (run_id, {names}) VALUES ({marks})", [(run_id, *r) for r in records])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise HistoryError(f"history {path}: could not append ({e})") from None
        try:
            # Histories written before the marker are WAL files; a rollback journal lets
            # readers open the file read-only without creating anything next to it.
            if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                conn.execute("PRAGMA journal_mode=DELETE")
        except sqlite3.Error:
            pass  # another connection has it open: it stays WAL, which reads fine too
    return run_id
