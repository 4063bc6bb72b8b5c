"""The SQLite workload of the benchmarks: 100k inserts in batches, an index, 2k queries.
Prints the seconds it took. Usage: python3 bench/sqlite_workload.py DIR"""
import os, sqlite3, sys, time
path = os.path.join(sys.argv[1], "bench.db")
for suffix in ("", "-wal", "-journal"):
    if os.path.exists(path + suffix):
        os.remove(path + suffix)
t = time.perf_counter()
db = sqlite3.connect(path)
db.execute("create table t (id integer primary key, k integer, v text)")
for b in range(100):
    with db:
        db.executemany("insert into t (k, v) values (?, ?)",
                       ((i * 7919 % 100003, "x" * 64) for i in range(b * 1000, (b + 1) * 1000)))
db.execute("create index tk on t (k)")
for q in range(2000):
    db.execute("select count(*), max(v) from t where k between ? and ?", (q * 50, q * 50 + 500)).fetchone()
db.close()
print(time.perf_counter() - t)
