"""The task set's SQLite schema (``index.sqlite``): numbered, append-only migrations.

:class:`cadenza.tasks.records.store.TaskStore` applies the ones a set has not seen and records the version in
``schema_version``, so later features add tables without touching existing ones.
"""

# Append-only: migration N brings the schema from version N-1 to N.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        source TEXT NOT NULL,
        level INTEGER NOT NULL,
        qualname TEXT NOT NULL,
        kind TEXT NOT NULL,
        path TEXT NOT NULL,
        f2p INTEGER NOT NULL,
        p2p INTEGER NOT NULL,
        state TEXT NOT NULL DEFAULT 'ready',
        created TEXT NOT NULL,
        UNIQUE (source, qualname, level)
    );
    CREATE TABLE builds (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started TEXT NOT NULL,
        finished TEXT,
        params TEXT NOT NULL
    );
    CREATE TABLE build_sources (
        build_id INTEGER NOT NULL REFERENCES builds(id),
        source TEXT NOT NULL,
        params_key TEXT NOT NULL,
        status TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        candidates INTEGER NOT NULL DEFAULT 0,
        validated INTEGER NOT NULL DEFAULT 0,
        emitted INTEGER NOT NULL DEFAULT 0,
        rejected INTEGER NOT NULL DEFAULT 0,
        suite_runs REAL NOT NULL DEFAULT 0,
        seconds REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (build_id, source)
    );
    CREATE TABLE rejections (
        build_id INTEGER NOT NULL REFERENCES builds(id),
        source TEXT NOT NULL,
        task_id TEXT NOT NULL,
        reason TEXT NOT NULL
    );
    """,
    # 2: candidates skipped because the set already held their task (resumed builds).
    "ALTER TABLE build_sources ADD COLUMN skipped INTEGER NOT NULL DEFAULT 0",
    # 3: seconds of a source's own work (fetch, base env, baseline + coverage), the capacity model's input.
    "ALTER TABLE build_sources ADD COLUMN prepare_seconds REAL NOT NULL DEFAULT 0",
]
