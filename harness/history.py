"""Run history in SQLite: every run appended in one transaction, never rewritten.

SQLite gives the guarantees the history needs: a run killed midway leaves the file as it
was before that run (the transaction never committed), earlier runs are never touched
(rows are only inserted), and concurrent readers see a consistent file. A file that is not
a history (or is corrupt) raises ``HistoryError`` naming it, never a bare traceback.
"""

import json
import os
import sqlite3
import time
from contextlib import closing

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
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
CREATE TABLE IF NOT EXISTS records (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    backend TEXT NOT NULL,
    scenario TEXT NOT NULL,
    template INTEGER NOT NULL,
    check_name TEXT NOT NULL,
    verdict TEXT NOT NULL,
    kind TEXT NOT NULL,
    p_value REAL,
    alpha REAL,
    trials INTEGER,
    detectable_tv REAL,
    tv_estimate REAL,
    tv_lo REAL,
    tv_hi REAL,
    message TEXT,
    reproducer TEXT
);
CREATE INDEX IF NOT EXISTS records_key ON records(backend, scenario, template, check_name);
"""


class HistoryError(Exception):
    pass


def _connect(path: str, create: bool) -> sqlite3.Connection:
    if not create and not os.path.exists(path):
        raise HistoryError(f"history {path}: no such file")
    try:
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        if create:
            conn.executescript(SCHEMA)
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"runs", "records"} <= tables:
            raise HistoryError(f"history {path}: not a run history (tables runs and records missing)")
        conn.execute("PRAGMA quick_check").fetchone()
        return conn
    except sqlite3.DatabaseError as e:
        raise HistoryError(f"history {path}: unreadable or corrupt SQLite file ({e})") from None


def append_run(path: str, doc: dict, label: str | None = None) -> int:
    """Append one run (a ``results.json`` document) atomically; return its run id."""
    env = doc.get("environment", {})
    with closing(_connect(path, create=True)) as conn:
        try:
            with conn:  # one transaction: all of the run or none of it
                cur = conn.execute(
                    "INSERT INTO runs(created, label, profile, seed, vllm_version, vllm_commit, environment, command) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        doc.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        label,
                        doc["profile"]["name"],
                        doc["seed"],
                        env.get("vllm"),
                        env.get("vllm_commit"),
                        json.dumps(env, sort_keys=True),
                        doc.get("command"),
                    ),
                )
                run_id = cur.lastrowid
                conn.executemany(
                    "INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [
                        (
                            run_id,
                            r["backend"],
                            r["scenario"],
                            r["template"],
                            r["check"],
                            r["verdict"],
                            r["kind"],
                            _num(r.get("p_value")),
                            _num(r.get("alpha")),
                            r.get("trials"),
                            _num(r.get("detectable_tv")),
                            _num(r.get("tv_estimate")),
                            *(_num(x) for x in (r.get("tv_ci") or (None, None))),
                            r.get("message"),
                            r.get("reproducer"),
                        )  # fmt: skip
                        for r in doc["records"]
                    ],
                )
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"history {path}: could not append ({e})") from None
    return run_id


def _num(x):
    return float(x) if isinstance(x, (int, float)) else None


def load(path: str) -> tuple[list[dict], list[dict]]:
    """All runs (oldest first) and all records of a history."""
    with closing(_connect(path, create=False)) as conn:
        conn.row_factory = sqlite3.Row
        try:
            runs = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]
            records = [dict(r) for r in conn.execute("SELECT * FROM records ORDER BY run_id")]
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"history {path}: unreadable or corrupt SQLite file ({e})") from None
    for run in runs:
        try:
            run["environment"] = json.loads(run["environment"])
        except (TypeError, json.JSONDecodeError):
            raise HistoryError(f"history {path}: run {run['id']} has a corrupt environment field") from None
    return runs, records
