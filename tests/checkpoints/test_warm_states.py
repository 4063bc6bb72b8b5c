"""Real warm states through a memory checkpoint: a loaded PostgreSQL with open connections,
forked ×4, each fork writing rows of its own and passing PostgreSQL's own integrity checks.

The image (``python`` + Debian's postgresql and psycopg2) is built through the image route
on first use in the suite's daemon.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from sandfork import CheckpointType, Client, Sandbox

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

PG_IMAGE = "sandfork-test-postgres"
PG = "/usr/lib/postgresql/15/bin"
DATA = "/var/lib/postgresql/15/main"
CONF = "/etc/postgresql/15/main/postgresql.conf"
ROWS = 20_000

# A client holding two connections open (one with a session setting, to show it is the same
# session after the fork) and answering commands on a Unix socket: "insert <tag> <n>",
# "count <tag>", "backend".
HOLDER = r"""
import json, os, socket, psycopg2
conns = [psycopg2.connect(dbname="postgres", user="postgres", host="/var/run/postgresql") for _ in range(2)]
for c in conns:
    c.autocommit = True
conns[1].cursor().execute("SET application_name = 'warm-holder'")
path = "/tmp/holder.sock"
if os.path.exists(path):
    os.unlink(path)
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(8)
print("ready", flush=True)
while True:
    c, _ = srv.accept()
    with c:
        cmd = c.recv(4096).decode().split()
        cur = conns[1].cursor()
        if cmd[0] == "insert":
            cur.execute("INSERT INTO t (who, v) SELECT %s, g FROM generate_series(1, %s) g", (cmd[1], int(cmd[2])))
            out = "ok"
        elif cmd[0] == "count":
            cur.execute("SELECT count(*) FROM t WHERE who = %s", (cmd[1],))
            out = cur.fetchone()[0]
        else:
            cur.execute("SELECT pg_backend_pid(), current_setting('application_name')")
            out = list(cur.fetchone())
        c.sendall(json.dumps(out).encode())
"""
ASK = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/holder.sock'); "
       "s.sendall(' '.join(sys.argv[1:]).encode()); print(s.recv(65536).decode())")


def build_image(client: Client) -> None:
    images = (client.request_json("GET", "/v1/images") or {}).get("images", [])
    if any(i.get("name") == PG_IMAGE for i in images):
        return
    body = {"name": PG_IMAGE, "builder": "python", "apt": ["postgresql", "python3-psycopg2"]}
    last: dict = {}
    with client.open("POST", "/v1/images", json_body=body, unbounded=True) as stream:
        for event in stream.iter_json_lines():
            last = event
    assert last.get("type") == "done", f"the postgres image build failed: {last}"


def sh(sb: Sandbox, script: str, timeout: float = 120) -> str:
    r = sb.run("sh", ["-c", script], timeout=timeout)
    assert r.exit_code == 0, f"{sb.id}: {script!r} failed: {r.stdout[-500:]} {r.stderr[-1000:]}"
    return r.stdout.strip()


def psql(sb: Sandbox, sql: str) -> str:
    return sh(sb, f"su postgres -c \"psql -XAtq -h /var/run/postgresql -c \\\"{sql}\\\"\"")


def ask(sb: Sandbox, *words: str):
    r = sb.run("python3", ["-c", ASK, *words], timeout=60)
    assert r.exit_code == 0, f"{sb.id}: holder {words}: {r.stderr[-500:]}"
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def loaded_postgres(daemon) -> Iterator[Sandbox]:
    build_image(Client(url=daemon.url))
    with Sandbox.create(image=PG_IMAGE, memory_mb=1024, allow_internet_access=False) as sb:
        sh(sb, f"mkdir -p /var/run/postgresql && chown postgres /var/run/postgresql && "
               f"su postgres -c '{PG}/pg_ctl -D {DATA} -o \"-c config_file={CONF}\" -l /tmp/pg.log -w start'")
        psql(sb, "CREATE EXTENSION amcheck")
        psql(sb, f"CREATE TABLE t (id serial PRIMARY KEY, who text NOT NULL, v int NOT NULL); "
                 f"CREATE INDEX t_who ON t (who); INSERT INTO t (who, v) SELECT 'base', g FROM generate_series(1, {ROWS}) g")
        sb.write_file("/tmp/holder.py", HOLDER.encode())
        sb.start_process("su", ["postgres", "-c", "python3 /tmp/holder.py"])  # peer authentication
        deadline = time.monotonic() + 60
        while sb.run("test", ["-S", "/tmp/holder.sock"]).exit_code != 0:
            assert time.monotonic() < deadline, f"the holder did not connect: {sh(sb, 'tail -5 /tmp/pg.log')}"
            time.sleep(0.2)
        yield sb


def integrity(sb: Sandbox) -> str:
    """PostgreSQL's own checks: every B-tree index against its heap, and the heap itself."""
    return psql(sb, "SELECT bt_index_check('t_pkey', true), bt_index_check('t_who', true); "
                    "SELECT count(*) FROM verify_heapam('t')")


def test_postgres_with_open_connections_forks_into_independent_databases(loaded_postgres: Sandbox) -> None:
    """PostgreSQL started and loaded, two connections held open by a client: memory
    checkpoint, 4 forks. In each fork the held connection is the same session (same backend
    pid and session setting) and writes rows of its own; a new connection writes too; the
    indexes and the heap pass amcheck; no fork sees another's rows, and the source is as
    it was."""
    source = loaded_postgres
    before = ask(source, "backend")
    snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    try:
        with snap.fork(4) as forks:
            assert not forks.errors, [str(c.error) for c in forks.errors]

            def work(i_sb):
                i, sb = i_sb
                same_session = ask(sb, "backend")
                ask(sb, "insert", f"fork{i}", str(100 * (i + 1)))
                psql(sb, f"INSERT INTO t (who, v) VALUES ('fork{i}-new', {i})")
                counts = {tag: int(psql(sb, f"SELECT count(*) FROM t WHERE who LIKE '{tag}%'")) for tag in ("base", "fork")}
                return same_session, counts, ask(sb, "count", f"fork{i}"), integrity(sb)

            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(work, enumerate(forks)))
            for i, (same_session, counts, held_count, checked) in enumerate(results):
                assert same_session == before, f"fork {i}: the held connection is another session: {same_session} vs {before}"
                assert counts == {"base": ROWS, "fork": 100 * (i + 1) + 1}, f"fork {i} sees other forks' rows: {counts}"
                assert held_count == 100 * (i + 1)
                assert checked.split("\n")[-1] == "0", f"fork {i}: verify_heapam found corruption: {checked}"
    finally:
        snap.delete()
    assert int(psql(source, "SELECT count(*) FROM t")) == ROWS, "a fork's rows reached the source"
    assert ask(source, "backend") == before
    integrity(source)


# A process holding a connection to a WAL-mode SQLite database open and answering commands
# on a Unix socket: "insert <tag> <n>", "count <tag>". Automatic WAL checkpoints are off, so
# the rows written before the memory checkpoint live only in the WAL and its index (the
# `-shm` file every connection maps and holds a shared lock on).
WAL_HOLDER = r"""
import json, os, socket, sqlite3, sys
db = sqlite3.connect("/srv/wal/app.db", isolation_level=None, timeout=30)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")
db.execute("CREATE TABLE IF NOT EXISTS t (who TEXT NOT NULL, v INT NOT NULL)")
path = f"/tmp/{sys.argv[1]}.sock"
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(8)
while True:
    c, _ = srv.accept()
    with c:
        cmd = c.recv(4096).decode().split()
        if cmd[0] == "insert":
            db.executemany("INSERT INTO t VALUES (?, ?)", [(cmd[1], i) for i in range(int(cmd[2]))])
            out = "ok"
        else:
            out = db.execute("SELECT count(*) FROM t WHERE who = ?", (cmd[1],)).fetchone()[0]
        c.sendall(json.dumps(out).encode())
"""
ASK_WAL = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(f'/tmp/{sys.argv[1]}.sock'); "
           "s.sendall(' '.join(sys.argv[2:]).encode()); print(s.recv(65536).decode())")
# A new process: whether another process holds the WAL index's "dead man switch" (a shared
# POSIX lock on byte 128 of `-shm`: while it is held, a new connection must not rebuild the
# index the others are using), then rows of its own, the counts and SQLite's integrity check.
WAL_VISITOR = r"""
import fcntl, json, os, sqlite3, struct, sys
fd = os.open("/srv/wal/app.db-shm", os.O_RDWR)
probe = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 128, 1, 0))
dms_held = struct.unpack("hhqqi", probe)[0] == fcntl.F_RDLCK
os.close(fd)
db = sqlite3.connect("/srv/wal/app.db", isolation_level=None, timeout=30)
db.execute("INSERT INTO t VALUES (?, 0)", (sys.argv[1],))
counts = dict(db.execute("SELECT who, count(*) FROM t GROUP BY who").fetchall())
print(json.dumps({"dms_held": dms_held, "counts": counts, "integrity": db.execute("PRAGMA integrity_check").fetchone()[0]}))
"""


def ask_wal(sb: Sandbox, holder: str, *words: str):
    r = sb.run("python3", ["-c", ASK_WAL, holder, *words], timeout=60)
    assert r.exit_code == 0, f"{sb.id}: {holder} {words}: {r.stderr[-500:]}"
    return json.loads(r.stdout)


def visit_wal(sb: Sandbox, tag: str) -> dict:
    r = sb.run("python3", ["-c", WAL_VISITOR, tag], timeout=60)
    assert r.exit_code == 0, f"{sb.id}: {r.stderr[-1000:]}"
    return json.loads(r.stdout)


def test_sqlite_wal_held_by_two_processes_forks_into_independent_databases(daemon) -> None:
    """A WAL-mode SQLite database held open by two processes, rows only in the WAL: memory
    checkpoint, 4 forks. In each fork the index's shared lock is still held (a new
    connection does not rebuild the index under the holders), both holders and a new
    process write, every count is right and the integrity check passes; no fork sees
    another's rows, and the source is as it was."""
    with Sandbox.create(image="python", memory_mb=512, allow_internet_access=False) as source:
        sh(source, "mkdir -p /srv/wal")
        for holder in ("a", "b"):
            source.start_process("python3", ["-c", WAL_HOLDER, holder])
            deadline = time.monotonic() + 30
            while source.run("test", ["-S", f"/tmp/{holder}.sock"]).exit_code != 0:
                assert time.monotonic() < deadline, f"holder {holder} did not start"
                time.sleep(0.1)
            ask_wal(source, holder, "insert", f"base-{holder}", "1000")
        assert visit_wal(source, "probe")["dms_held"], "the holders hold no lock on the WAL index"
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            with snap.fork(4) as forks:
                assert not forks.errors, [str(c.error) for c in forks.errors]

                def work(i_sb):
                    i, sb = i_sb
                    held = visit_wal(sb, f"fork{i}-visitor")["dms_held"]
                    for holder in ("a", "b"):
                        ask_wal(sb, holder, "insert", f"fork{i}-{holder}", str(100 * (i + 1)))
                    return held, visit_wal(sb, "check"), [ask_wal(sb, h, "count", f"fork{i}-{h}") for h in ("a", "b")]

                with ThreadPoolExecutor(4) as pool:
                    results = list(pool.map(work, enumerate(forks)))
                for i, (held, seen, held_counts) in enumerate(results):
                    assert held, f"fork {i}: the WAL index's lock was dropped by the restore"
                    want = {"base-a": 1000, "base-b": 1000, "probe": 1, f"fork{i}-visitor": 1,
                            f"fork{i}-a": 100 * (i + 1), f"fork{i}-b": 100 * (i + 1), "check": 1}
                    assert seen["counts"] == want, f"fork {i}: {seen['counts']}"
                    assert seen["integrity"] == "ok", f"fork {i}: {seen['integrity']}"
                    assert held_counts == [100 * (i + 1)] * 2
        finally:
            snap.delete()
        seen = visit_wal(source, "source")
        assert seen["counts"] == {"base-a": 1000, "base-b": 1000, "probe": 1, "source": 1}, seen
        assert seen["integrity"] == "ok" and seen["dms_held"]
