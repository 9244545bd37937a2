"""SQLite files of the local Fleet: seeds, per-instance copies, and the manager's queries.

Each ``(app, data_key, data_version)`` seed is built once per server with the app's
``build_database`` and then copied per instance, which costs a file copy instead of a
schema build. The seed file doubles as every instance's read-only ``seed`` resource: it
is only ever opened with ``mode=ro``, so sharing it is safe.

Everything here blocks; the async routes call it through ``anyio.to_thread``.
"""

from __future__ import annotations

import base64
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

SQLITE_TIMEOUT_SECONDS = 10.0


class SeedCache:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._built: dict[tuple[str, str, str], Path] = {}

    def seed_path(
        self,
        app_key: str,
        data_key: str,
        data_version: str,
        build: Callable[[sqlite3.Connection, str, str], None],
    ) -> Path:
        key = (app_key, data_key, data_version)
        with self._lock:
            path = self._built.get(key)
            if path is not None:
                return path
            path = self._dir / f"{_safe(app_key)}--{_safe(data_key)}--{_safe(data_version)}.sqlite"
            partial = path.with_suffix(".building")
            partial.unlink(missing_ok=True)
            with closing(sqlite3.connect(partial)) as conn:
                build(conn, data_key, data_version)
                conn.commit()
            partial.replace(path)
            self._built[key] = path
            return path


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def copy_database(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".copying")
    shutil.copyfile(source, tmp)
    tmp.replace(target)


def connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        return sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=SQLITE_TIMEOUT_SECONDS,
            check_same_thread=False,
        )
    return sqlite3.connect(path, timeout=SQLITE_TIMEOUT_SECONDS, check_same_thread=False)


class ReadOnlyGuard:
    """Make a connection truly read-only, in SQLite itself rather than by reading the SQL.

    ``mode=ro`` only protects the file it opened: ``VACUUM INTO 'x.db'`` and
    ``ATTACH 'file:y.db?mode=rwc'`` still create (and fill) other files. So a read-only
    connection also gets ``PRAGMA query_only = ON`` and an authorizer that allows only
    reading actions (SELECT, reading columns, functions other than ``load_extension``,
    transactions and savepoints, recursive CTEs, and pragmas that only report) and
    denies everything else, ATTACH, DETACH and VACUUM (which attaches its target)
    included. ``denied`` names the first refused action, for the error message.
    """

    _ALLOWED = frozenset({
        sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
        sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT,
        getattr(sqlite3, "SQLITE_RECURSIVE", 33),
    })
    # Pragmas that only report, even when given an argument (a table or index name).
    _REPORTING_PRAGMAS = frozenset({
        "table_info", "table_xinfo", "table_list", "index_list", "index_info",
        "index_xinfo", "foreign_key_list", "foreign_key_check", "integrity_check",
        "quick_check", "collation_list", "function_list", "module_list", "pragma_list",
        "compile_options", "database_list",
    })
    _ACTIONS = (
        "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE",
        "CREATE_TEMP_TRIGGER", "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE",
        "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER",
        "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "PRAGMA", "UPDATE",
        "ATTACH", "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE",
        "DROP_VTABLE",
    )
    _NAMES = {getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
              for name in _ACTIONS if hasattr(sqlite3, f"SQLITE_{name}")}

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.denied: str | None = None
        conn.execute("PRAGMA query_only = ON")  # before the authorizer, which refuses it
        conn.set_authorizer(self._authorize)

    def _authorize(self, action: int, arg1: str | None, arg2: str | None,
                   _db: str | None, _trigger: str | None) -> int:
        if action in self._ALLOWED:
            if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() == "load_extension":
                return self._deny("load_extension()")
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (
            arg2 is None or (arg1 or "").lower() in self._REPORTING_PRAGMAS
        ):
            return sqlite3.SQLITE_OK
        what = self._NAMES.get(action, f"action {action}")
        if action == sqlite3.SQLITE_PRAGMA:
            what = f"PRAGMA {arg1} = {arg2}"
        elif action == sqlite3.SQLITE_ATTACH:
            what = f"ATTACH {arg1!r} (VACUUM attaches its target too)"
        elif arg1:
            what = f"{what} {arg1}"
        return self._deny(what)

    def _deny(self, what: str) -> int:
        if self.denied is None:
            self.denied = what
        return sqlite3.SQLITE_DENY


class InstanceStopped(RuntimeError):
    pass


class InstanceDatabase:
    """The ``current`` database of one instance, serialised by one lock.

    Tools, manager queries, reset and diff all take the same lock, so an agent's tool call
    never interleaves with a reset, and a verifier's diff sees whole tool calls only.
    """

    def __init__(self, current: Path, seed: Path) -> None:
        self.current = current
        self.seed = seed
        self.lock = threading.RLock()
        self.closed = False

    @contextmanager
    def session(self) -> Iterator[sqlite3.Connection]:
        """The ``DbFactory`` apps receive: commit on success, roll back on error."""
        with self.lock:
            self._check_open()
            conn = connect(self.current, read_only=False)
            try:
                yield conn
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                conn.close()

    def reset(self) -> None:
        with self.lock:
            self._check_open()
            copy_database(self.seed, self.current)

    def locked(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` under the instance lock, refusing once the instance is stopped."""
        with self.lock:
            self._check_open()
            return work()

    def _check_open(self) -> None:
        if self.closed:
            raise InstanceStopped("this instance is stopped; its database is gone")

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.current.unlink(missing_ok=True)

    def path_for(self, resource: str) -> Path | None:
        return {"current": self.current, "seed": self.seed}.get(resource)


def describe(path: Path, resource: str) -> dict[str, Any]:
    with closing(connect(path, read_only=True)) as conn:
        tables = []
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='table' "
            "AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ):
            columns = [
                {
                    "name": col_name,
                    "type": col_type,
                    "notnull": bool(notnull),
                    "default_value": default,
                    "primary_key": bool(pk),
                    "pk": int(pk),
                }
                for _cid, col_name, col_type, notnull, default, pk in conn.execute(
                    f'PRAGMA table_info("{name}")'
                )
            ]
            tables.append({"name": name, "sql": sql or "", "columns": columns})
    return {"success": True, "resource_name": resource, "tables": tables, "error": None,
            "message": f"described {len(tables)} tables"}


def run_query(path: Path, query: str, args: list[Any] | None, *, read_only: bool) -> dict[str, Any]:
    """Run one statement the way the Fleet manager does; failures go in the body."""
    guard: ReadOnlyGuard | None = None
    try:
        with closing(connect(path, read_only=read_only)) as conn:
            if read_only:
                guard = ReadOnlyGuard(conn)
            cursor = conn.execute(query, list(args or []))
            if cursor.description is not None:
                columns = [d[0] for d in cursor.description]
                rows = [[_jsonable(v) for v in row] for row in cursor.fetchall()]
                if not read_only:
                    conn.commit()  # e.g. INSERT ... RETURNING
                return {"success": True, "columns": columns, "rows": rows, "rows_affected": None,
                        "last_insert_id": None, "error": None, "message": "ok"}
            conn.commit()
            return {"success": True, "columns": None, "rows": None,
                    "rows_affected": cursor.rowcount, "last_insert_id": cursor.lastrowid,
                    "error": None, "message": "ok"}
    except sqlite3.Error as exc:
        error = f"{type(exc).__name__}: {exc}"
        message = "query failed"
        if read_only and (
            (guard is not None and guard.denied is not None) or _is_readonly_error(exc)
        ):
            what = guard.denied if guard is not None and guard.denied else "a write"
            error = (f"read-only query refused: {what} is not allowed on a read-only query "
                     f"(a readonly connection; SQLite said: {exc}); writes need read_only=False "
                     "on the 'current' resource (the 'seed' resource is never writable)")
            message = "query failed: read-only"
        return {"success": False, "columns": None, "rows": None, "rows_affected": None,
                "last_insert_id": None, "error": error, "message": message}


def _is_readonly_error(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == sqlite3.SQLITE_READONLY:
        return True
    return "readonly" in str(exc) or "read-only" in str(exc)


def _jsonable(value: Any) -> Any:
    # BLOBs travel as base64 text: the SDK does nothing special with them.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def structured_diff(seed: Path, current: Path, ignore: dict[str, Any] | None) -> dict[str, Any]:
    """``POST /diff/structured``: fleet-python's own ``diff_dbs`` with ``ignore_config``."""
    from fleet.verifiers.local_executor import diff_dbs

    ignore = ignore or {}
    tables = set(ignore.get("tables") or [])
    fields = set(ignore.get("fields") or [])
    table_fields = {t: set(f) for t, f in (ignore.get("table_fields") or {}).items()}
    if fields:
        with closing(connect(seed, read_only=True)) as conn:
            names = [row[0] for row in
                     conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for name in names:
            table_fields[name] = table_fields.get(name, set()) | fields
    # fleet-python ships no type information; diff_dbs is documented to return this dict.
    diff: dict[str, Any] = diff_dbs(
        str(seed), str(current), ignore_tables=tables, ignore_table_fields=table_fields
    )
    return diff
