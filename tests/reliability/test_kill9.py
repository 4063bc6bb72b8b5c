"""The daemon killed with SIGKILL at random points of its operations, restarted on the same
data directory, and checked: snapshots, sandboxes, and what is left on the host.

Each round picks an operation (a seeded shuffle of all of them, so every one comes up),
starts it in a thread, kills the daemon after a random delay within the operation's
measured duration, restarts it on the same data dir and checks that:
- every snapshot reported complete is listed, and every listed snapshot restores with the
  file written before its checkpoint (and, for memory snapshots, the value a running
  process held only in memory); none appears that no checkpoint could have made;
- no snapshot directory exists that no listed snapshot (or suspended sandbox) owns;
- every sandbox is running and answers exec, is suspended, or failed cleanly;
- nothing of the sandboxes that are not live is left on the host;
- an export cut short leaves nothing in the daemon's scratch space, and a file it reported
  written imports and restores; an import cut short is either listed whole or not at all.

In a quarter of the rounds the restarted daemon is killed once more during its recovery.
``SANDFORK_FAULT_SEED`` picks operations and delays (default 7); ``SANDFORK_FAULT_ROUNDS``
is the number of kills (default 40: spread over the twelve operations).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pytest
from _daemon import Daemon, daemon_binary, start_daemon
from conftest import Faults, finish, leaks_except, new_daemon
from sandfork import Client, Sandbox, SandforkError, Snapshot

SEED = int(os.environ.get("SANDFORK_FAULT_SEED", "7"))
ROUNDS = int(os.environ.get("SANDFORK_FAULT_ROUNDS", "40"))
OPS = ["create", "exec", "checkpoint filesystem", "checkpoint memory", "fork", "suspend", "resume", "snapshot delete",
       "snapshot export", "snapshot import", "image build", "terminate"]  # fmt: skip
MEMORY_MB = 128
SETTLE_SECS = 30.0
# The share of rounds in which the restarted daemon is killed again while it recovers.
RECOVERY_KILLS = 0.25

# A process holding a value only in memory: /tmp/set replaces the value, /tmp/ask makes it
# write the value to /tmp/answer.
HOLDER = (
    "v=; while :; do"
    " if [ -e /tmp/set ]; then v=$(cat /tmp/set); rm -f /tmp/set; fi;"
    ' if [ -e /tmp/ask ]; then echo "$v" > /tmp/answer.tmp; mv /tmp/answer.tmp /tmp/answer; rm -f /tmp/ask; fi;'
    " sleep 0.05; done"
)
ASK = "cat /root/mark; rm -f /tmp/answer; touch /tmp/ask; i=0; while [ ! -e /tmp/answer ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; cat /tmp/answer"


@dataclass
class Expect:
    """What a sandbox restored from a snapshot must show."""

    kind: str
    mark: str
    value: Optional[str]
    source: str


@dataclass
class Pending:
    """An operation in flight when the daemon was killed."""

    op: str
    action: Callable[[], Any]
    context: Dict[str, Any]
    result: Any = None
    error: Optional[BaseException] = None
    done: bool = False


def status(info: Any) -> str:
    return str(getattr(info.status, "value", info.status))


class KillLoop:
    """One daemon, killed and restarted round after round, and what the client knows."""

    def __init__(self, faults: Faults, d: Daemon):
        self.faults = faults
        self.rng = random.Random(SEED)
        self.d = d
        self.c = Client(url=self.d.url)
        self.expect: Dict[str, Expect] = {}
        self.complete: Set[str] = set()
        self.verified: Set[str] = set()
        self.durations: Dict[str, float] = {}
        self.holders: Dict[str, Tuple[str, str]] = {}
        self.round = 0
        self.restarts: List[float] = []
        self.src = self.holder("k9-src")
        self.sus = self.holder("k9-sus")
        self.files = Path(tempfile.mkdtemp(prefix="sfk9-files-"))

    # --- sandboxes holding a file and an in-memory value ---------------------------

    def holder(self, name: str) -> Sandbox:
        sb = Sandbox.create(client=self.c, name=name, memory_mb=MEMORY_MB, allow_internet_access=False)
        sb.start_process("sh", ["-c", HOLDER])
        self.mark(sb)
        return sb

    def mark(self, sb: Sandbox) -> Tuple[str, str]:
        """Writes a new /root/mark and a new in-memory value; returns both."""
        mark, value = f"mark-{secrets.token_hex(6)}", f"value-{secrets.token_hex(6)}"
        script = f"echo {mark} > /root/mark && echo {value} > /tmp/set.tmp && mv /tmp/set.tmp /tmp/set; while [ -e /tmp/set ]; do sleep 0.05; done"
        r = sb.run("sh", ["-c", script], timeout=30)
        assert r.exit_code == 0, r.stderr
        self.holders[sb.id] = (mark, value)
        return mark, value

    def shows(self, sb: Sandbox, mark: str, value: Optional[str]) -> Optional[str]:
        """None when ``sb`` has ``mark`` in /root/mark (and ``value`` in its holder's memory)."""
        r = sb.run("sh", ["-c", ASK if value is not None else "cat /root/mark"], timeout=30)
        got = r.stdout.split()
        want = [mark] + ([value] if value is not None else [])
        return None if got == want else f"{sb.id} shows {got}, expected {want} ({r.stderr.strip()})"

    # --- operations ----------------------------------------------------------------

    def prepare(self, op: str) -> Pending:
        """Readies ``op`` (un-killed set-up steps) and returns it, not yet started."""
        tag = f"r{self.round}"
        if op == "create":  # half of them with a network of their own (veth, rules, address lease)
            net = self.rng.random() < 0.5
            return Pending(op, lambda: Sandbox.create(client=self.c, memory_mb=MEMORY_MB, labels={"k9": tag}, allow_internet_access=net).id, {})
        if op == "exec":
            token = secrets.token_hex(8)
            return Pending(op, lambda: self.src.run("sh", ["-c", f"sleep 0.3; echo {token}"]).stdout.strip(), {"token": token})
        if op.startswith("checkpoint"):
            kind = op.split()[1]
            mark, value = self.mark(self.src)
            exp = Expect(kind, mark, value if kind == "memory" else None, self.src.id)
            return Pending(op, lambda: self.src.checkpoint(checkpoint_type=kind).id, {"expect": exp})
        if op == "fork" and self.rng.random() < 0.5:
            sid = self.memory_snapshot()
            return Pending(op, lambda: self.forked(Snapshot.fork(sid, 2, labels={"k9": tag}, client=self.c), sid), {})
        if op == "fork":  # of the running source: a memory checkpoint in place, then children
            mark, value = self.mark(self.src)
            exp = Expect("memory", mark, value, self.src.id)
            return Pending(op, lambda: self.forked(self.src.fork(2, labels={"k9": tag})), {"expect": exp})
        if op == "terminate":
            sb = Sandbox.create(client=self.c, memory_mb=MEMORY_MB, labels={"k9": tag}, allow_internet_access=False)
            return Pending(op, sb.terminate, {"sandbox": sb.id})
        if op == "suspend":
            self.ensure_sus("running")
            return Pending(op, lambda: self.sus.suspend(), {})
        if op == "resume":
            self.ensure_sus("suspended")
            return Pending(op, lambda: self.sus.resume(), {})
        if op == "snapshot delete":
            sid = self.take("filesystem")
            return Pending(op, lambda: Snapshot.delete_by_id(sid, client=self.c), {"snapshot": sid})
        if op == "snapshot export":
            sid = self.memory_snapshot()
            path = self.files / f"export-{self.round}.sfs"
            return Pending(op, lambda: Snapshot.get(sid, client=self.c).export(path), {"file": path, "of": self.expect[sid]})
        if op == "snapshot import":
            sid = self.memory_snapshot()
            path = self.files / f"import-{self.round}.sfs"
            Snapshot.get(sid, client=self.c).export(path)
            return Pending(op, lambda: Snapshot.import_(path, client=self.c).id, {"expect": self.expect[sid]})
        if op == "image build":
            name = f"k9img{self.round}"
            return Pending(op, lambda: self.build_image(name), {"image": name})
        raise ValueError(op)

    @staticmethod
    def forked(result: Any, sid: Optional[str] = None) -> Tuple[str, List[str], List[str]]:
        return sid or result.snapshot_id, [s.id for s in result], [str(e.error) for e in result.errors]

    def take(self, kind: str) -> str:
        """An un-killed checkpoint of the source; recorded as complete."""
        mark, value = self.mark(self.src)
        sid = self.src.checkpoint(checkpoint_type=kind).id
        self.expect[sid] = Expect(kind, mark, value if kind == "memory" else None, self.src.id)
        self.complete.add(sid)
        return sid

    def memory_snapshot(self) -> str:
        known = sorted(s for s in self.complete if self.expect[s].kind == "memory")
        return self.rng.choice(known) if known else self.take("memory")

    def ensure_sus(self, state: str) -> None:
        now = status(self.sus.info())
        if now == state:
            return
        if state == "running":
            self.sus.resume()
            self.check_sus_running()
        else:
            self.sus.suspend()

    def check_sus_running(self) -> None:
        problem = self.shows(self.sus, *self.holders[self.sus.id])
        assert problem is None, problem

    def build_image(self, name: str) -> Dict[str, Any]:
        with self.c.open("POST", "/v1/images", json_body={"name": name, "builder": "busybox"}, unbounded=True) as r:
            for ev in r.iter_json_lines():
                if ev.get("type") == "done":
                    return ev["image"]
                if ev.get("type") == "error":
                    raise RuntimeError(f"image build failed: {ev}")
        raise RuntimeError("image build stream ended without a result")

    def run(self, p: Pending) -> None:
        try:
            p.result = p.action()
        except BaseException as e:  # noqa: BLE001 - recorded, judged after the restart
            p.error = e
        p.done = True

    # --- one round -----------------------------------------------------------------

    def measure(self, op: str) -> None:
        """Runs ``op`` once without a fault, for its duration, and applies its effects."""
        p = self.prepare(op)
        started = time.monotonic()
        self.run(p)
        self.durations[op] = time.monotonic() - started
        assert p.error is None, f"{op} failed without a fault: {p.error!r}"
        problems: List[str] = []
        self.after(p, problems)
        assert not problems, problems

    def kill_during(self, op: str) -> None:
        self.round += 1
        p = self.prepare(op)
        delay = self.rng.uniform(0.0, 1.1) * self.durations[op]
        t = threading.Thread(target=self.run, args=(p,), daemon=True)
        t.start()
        time.sleep(delay)
        was_done = p.done
        self.d.process.kill()
        self.d.process.wait()
        t.join(60)
        problems: List[str] = [] if not t.is_alive() else [f"the {op} call did not return after the kill"]
        log_from = self.d.log.stat().st_size
        again = self.kill_while_recovering() if self.rng.random() < RECOVERY_KILLS else ""
        restarted = time.monotonic()
        self.d = new_daemon(root=self.d.root)
        self.restarts.append(time.monotonic() - restarted)
        try:
            self.after(p, problems)
            self.check_all(problems, p)
        except (SandforkError, AssertionError, OSError) as e:
            problems.append(f"check failed: {e!r}")
        problems += self.recovery_errors(log_from)
        when = "after it completed" if was_done else f"{delay * 1000:.0f} ms in"
        outcome = "completed" if p.error is None else f"interrupted ({type(p.error).__name__})"
        detail = f"round {self.round}, seed {SEED}: killed {when}{again}; the call {outcome}; " + "; ".join(problems)
        self.faults.injected(f"kill -9 during {op}", not problems, detail)

    def kill_while_recovering(self) -> str:
        """Starts the daemon and kills it again after a random part of its recovery."""
        binary = daemon_binary()
        assert binary is not None
        d = start_daemon(binary, ["--pool-size", "0"], root=self.d.root)
        delay = self.rng.uniform(0.0, 0.4)
        time.sleep(delay)
        d.process.kill()
        d.process.wait()
        return f", and again {delay * 1000:.0f} ms into the restart"

    def recovery_errors(self, offset: int) -> List[str]:
        """Errors the restarted daemon logged while recovering (before it served)."""
        with open(self.d.log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        recovery = text.split(" serving ", 1)[0]
        return [f"recovery logged: {line.strip()[-300:]}" for line in recovery.splitlines() if "ERROR" in line]

    def after(self, p: Pending, problems: List[str]) -> None:
        """Checks and records what the client saw of ``p``."""
        ok = p.done and p.error is None
        if p.op == "exec" and ok and p.result != p.context["token"]:
            problems.append(f"exec answered {p.result!r}")
        if (p.op.startswith("checkpoint") or p.op == "snapshot import") and ok:
            self.expect[p.result] = p.context["expect"]
            self.complete.add(p.result)
        if p.op == "snapshot export":
            self.check_export(p, ok, problems)
        if p.op == "fork" and ok and "expect" in p.context:
            self.expect[p.result[0]] = p.context["expect"]
            self.complete.add(p.result[0])
        if p.op == "snapshot delete" and ok:
            self.complete.discard(p.context["snapshot"])
        if p.op == "fork" and ok:
            self.check_children(p, problems)
        if p.op == "image build":
            self.check_image(p, ok, problems)
        if p.op == "terminate":
            # Cut short, the terminate is finished by the restart (or had not begun).
            state = status(Sandbox.connect(p.context["sandbox"], client=self.c).info())
            allowed = ("terminated",) if ok else ("terminated", "running")
            problems += [] if state in allowed else [f"a sandbox being terminated is {state}"]
        if p.op == "resume" and ok:
            problem = self.shows(self.sus, *self.holders[self.sus.id])
            problems += [problem] if problem else []

    def check_export(self, p: Pending, ok: bool, problems: List[str]) -> None:
        """A reported export imports (and is then a snapshot like any other); a cut-short
        one left no file, not even a partial one."""
        path: Path = p.context["file"]
        problems += [f"a partial export was left: {x.name}" for x in self.files.glob(f".{path.name}.*")]
        if not ok:
            problems += [f"a cut-short export left {path}"] if path.exists() else []
            return
        sid = Snapshot.import_(path, client=self.c).id
        self.expect[sid] = p.context["of"]
        self.complete.add(sid)
        path.unlink()

    def check_children(self, p: Pending, problems: List[str]) -> None:
        sid, children, errors = p.result
        problems += [f"fork child failed: {e}" for e in errors]
        exp = self.expect[sid]
        for cid in children:
            problem = self.shows(Sandbox.connect(cid, client=self.c), exp.mark, exp.value)
            problems += [f"fork child: {problem}"] if problem else []
            Sandbox.connect(cid, client=self.c).terminate()
        self.faults.verified_snapshot()

    def check_image(self, p: Pending, ok: bool, problems: List[str]) -> None:
        name = p.context["image"]
        images = {i["name"] for i in self.c.request_json("GET", "/v1/images").get("images", [])}
        if ok and name not in images:
            problems.append(f"image {name} was reported built but is not listed")
        if name in images:
            with Sandbox.create(client=self.c, image=name, memory_mb=MEMORY_MB, allow_internet_access=False) as sb:
                r = sb.run("sh", ["-c", "echo built"])
                if r.stdout.strip() != "built":
                    problems.append(f"a sandbox of image {name} answered {r.stdout!r}")
            self.c.request("DELETE", f"/v1/images/{name}")
        builds = [str(x) for x in (self.d.data_dir / "images").glob(".build-*")]
        problems += [f"build directory left behind: {b}" for b in builds]
        listed = {i["name"] for i in self.c.request_json("GET", "/v1/images").get("images", [])}
        held = {x.stem for x in (self.d.data_dir / "images").glob("*.json")}
        problems += [f"image {x} is held on disk but not listed" for x in sorted(held - listed)]

    # --- the state after a restart -------------------------------------------------

    def check_all(self, problems: List[str], p: Pending) -> None:
        scratch = self.d.data_dir / "tmp" / "snapshot-transfer"
        problems += [f"transfer scratch left after a restart: {x.name}" for x in (scratch.iterdir() if scratch.is_dir() else [])]
        self.check_snapshots(problems, p)
        live = self.check_sandboxes(problems)
        problems += [f"leaked: {x}" for x in leaks_except(self.d, live)]
        # Only the two holders go on to the next round.
        for sid in set(live) - {self.src.id, self.sus.id}:
            Sandbox(sid, client=self.c).terminate()
        problems += [f"leaked after terminate: {x}" for x in leaks_except(self.d, [self.src.id, self.sus.id])]

    def check_snapshots(self, problems: List[str], p: Pending) -> None:
        listed = {s.id: s for s in Snapshot.list(client=self.c)}
        missing = sorted(self.complete - set(listed))
        if p.op == "snapshot delete" and p.context["snapshot"] in missing:
            self.complete.discard(p.context["snapshot"])  # deleted: the request was in flight
            missing.remove(p.context["snapshot"])
        problems += [f"snapshot {s} was reported complete but is not listed" for s in missing]
        for sid, snap in listed.items():
            if sid not in self.expect and "expect" in p.context:
                exp = p.context["expect"]
                if snap.source_sandbox_id == exp.source and str(getattr(snap.type, "value", snap.type)) == exp.kind:
                    self.expect[sid] = exp  # completed as the daemon died; must be whole
            if sid not in self.expect:
                problems.append(f"snapshot {sid} appeared that no checkpoint made")
        todo = [s for s in sorted(listed) if s in self.expect and s not in self.verified]
        old = sorted(set(listed) & self.verified)
        todo += [self.rng.choice(old)] if old else []
        for sid in todo:
            problem = self.verify(sid)
            problems += [problem] if problem else []
        self.check_snapshot_dirs(set(listed), problems)

    def verify(self, sid: str) -> Optional[str]:
        """Restores ``sid`` and checks what it must show."""
        exp = self.expect[sid]
        try:
            with Sandbox.create(client=self.c, snapshot_id=sid) as sb:
                problem = self.shows(sb, exp.mark, exp.value)
        except SandforkError as e:
            problem = f"restore failed: {e}"
        if problem:
            return f"snapshot {sid} ({exp.kind}): {problem}"
        self.verified.add(sid)
        self.faults.verified_snapshot()
        return None

    def check_snapshot_dirs(self, listed: Set[str], problems: List[str]) -> None:
        suspended = {s.id for s in Sandbox.list(client=self.c, state="suspended")}
        owned = listed | {"snap-suspend-" + s.removeprefix("sb-") for s in suspended}
        on_disk = {p.name for p in (self.d.data_dir / "snapshots").iterdir()} if (self.d.data_dir / "snapshots").is_dir() else set()
        # A deleted snapshot's memory images stay while a later one reads pages from them.
        read = set()
        for sid in owned:
            link = self.d.data_dir / "snapshots" / sid / "memory" / "parent"
            while link.is_symlink():
                parent = link.resolve().parent.name
                if parent in read:
                    break
                read.add(parent)
                link = self.d.data_dir / "snapshots" / parent / "memory" / "parent"
        problems += [f"snapshot directory {x} has no snapshot" for x in sorted(on_disk - owned - read)]

    def settled(self) -> List[Any]:
        deadline = time.monotonic() + SETTLE_SECS
        while True:
            infos = Sandbox.list(client=self.c)
            moving = [i for i in infos if status(i) not in ("running", "suspended", "failed")]
            if not moving or time.monotonic() > deadline:
                return infos
            time.sleep(0.2)

    def check_sandboxes(self, problems: List[str]) -> List[str]:
        """Every sandbox usable, suspended or cleanly failed (then terminated); returns the live ids."""
        live = []
        for info in self.settled():
            state = status(info)
            sb = Sandbox(info.id, client=self.c)
            if state == "running":
                problem = self.check_running(sb)
                problems += [problem] if problem else []
                live.append(info.id)
            elif state == "suspended":
                live.append(info.id)
            elif state == "failed":
                pass  # its resources must be gone already (checked by the caller)
            else:
                problems.append(f"sandbox {info.id} still {state} {SETTLE_SECS:g} s after the restart")
                live.append(info.id)
            if info.id in (self.src.id, self.sus.id) and state not in ("running", "suspended"):
                problems.append(f"{info.name} is {state}: {info.error}")
                self.replace(info.id)
        for sid in (self.src.id, self.sus.id):
            if sid not in {i.id for i in self.settled()}:
                problems.append(f"sandbox {sid} vanished")
                self.replace(sid)
        return live + [self.src.id, self.sus.id]

    def check_running(self, sb: Sandbox) -> Optional[str]:
        if sb.id in self.holders:
            return self.shows(sb, *self.holders[sb.id])
        try:
            r = sb.run("echo", ["alive"], timeout=30)
        except SandforkError as e:
            return f"running sandbox {sb.id} does not answer exec: {e}"
        return None if r.stdout.strip() == "alive" else f"{sb.id} answered {r.stdout!r}"

    def replace(self, sid: str) -> None:
        """A lost holder sandbox is replaced so that later rounds have one."""
        try:
            Sandbox(sid, client=self.c).terminate()
        except SandforkError:
            pass
        if sid == self.src.id:
            self.src = self.holder("k9-src")
        else:
            self.sus = self.holder("k9-sus")

    # --- the end -------------------------------------------------------------------

    def final(self) -> None:
        """Every listed snapshot restores once more; then everything is terminated and counted."""
        problems: List[str] = []
        for s in Snapshot.list(client=self.c):
            problem = self.verify(s.id) if s.id in self.expect else f"snapshot {s.id} appeared that no checkpoint made"
            problems += [problem] if problem else []
        assert not problems, problems
        for info in Sandbox.list(client=self.c):
            Sandbox(info.id, client=self.c).terminate()
        shutil.rmtree(self.files, ignore_errors=True)
        self.faults.leaks(leaks_except(self.d, []))  # the census, and address leases


@pytest.mark.fault("daemon killed")
def test_daemon_killed_during_every_operation(faults: Faults) -> None:
    """The daemon killed with SIGKILL during create, exec, checkpoints, fork, suspend, resume, snapshot delete, export and import, image build and terminate (seeded)."""
    d = new_daemon()
    loop: Optional[KillLoop] = None
    try:
        loop = KillLoop(faults, d)
        for op in OPS:
            loop.measure(op)
        order = [op for _ in range(ROUNDS // len(OPS) + 1) for op in loop.rng.sample(OPS, len(OPS))][:ROUNDS]
        for op in order:
            loop.kill_during(op)
        loop.final()
        restarts = sorted(loop.restarts)
        print(f"\nkill -9: seed {SEED}, {len(order)} kills, {faults.snapshots_verified} snapshots verified;"
              f" restart to healthy p50 {restarts[len(restarts) // 2] * 1000:.0f} ms, max {restarts[-1] * 1000:.0f} ms; durations "
              + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in loop.durations.items()))  # fmt: skip
    finally:
        finish(loop.d if loop else d)


BURSTS = int(os.environ.get("SANDFORK_FAULT_BURSTS", "3"))
BURST_THREADS = 16


class Burst:
    """Client threads taking sandboxes through create, exec, checkpoint and terminate until
    the daemon is killed under them; what they saw complete is checked after the restart."""

    def __init__(self, c: Client, seed: int):
        self.c, self.seed = c, seed
        self.lock = threading.Lock()
        self.marks: Dict[str, str] = {}  # sandbox -> the mark it was last seen to hold
        self.pending: Dict[str, str] = {}  # sandbox -> mark, while a checkpoint is in flight
        self.expect: Dict[str, str] = {}  # snapshot -> mark
        self.errors: List[Tuple[float, str]] = []

    def worker(self, n: int) -> None:
        rng = random.Random(self.seed * 100 + n)
        while True:
            try:
                self.one_sandbox(rng)
            except (SandforkError, OSError) as e:
                with self.lock:
                    self.errors.append((time.monotonic(), f"{type(e).__name__}: {e}"))
                return  # the daemon is gone (or failed: judged by the time of the error)

    def one_sandbox(self, rng: random.Random) -> None:
        net = rng.random() < 0.25
        sb = Sandbox.create(client=self.c, memory_mb=MEMORY_MB, labels={"burst": "1"}, allow_internet_access=net)
        mark = f"mark-{secrets.token_hex(6)}"
        r = sb.run("sh", ["-c", f"echo {mark} > /root/mark && cat /root/mark"])
        if r.stdout.strip() != mark:
            raise AssertionError(f"{sb.id} answered {r.stdout!r}")
        with self.lock:
            self.marks[sb.id] = mark
        if rng.random() < 0.5:
            with self.lock:
                self.pending[sb.id] = mark
            snap = sb.checkpoint(checkpoint_type=rng.choice(["filesystem", "memory"]))
            with self.lock:
                self.expect[snap.id] = mark
        sb.terminate()
        with self.lock:
            self.marks.pop(sb.id, None)


def verify_burst(c: Client, burst: Burst, faults: Faults, problems: List[str]) -> None:
    listed = {s.id: s for s in Snapshot.list(client=c)}
    problems += [f"snapshot {s} was reported complete but is not listed" for s in sorted(set(burst.expect) - set(listed))]
    for sid, snap in sorted(listed.items()):
        mark = burst.expect.get(sid) or burst.pending.get(snap.source_sandbox_id or "")
        if mark is None:
            problems.append(f"snapshot {sid} appeared that no checkpoint made")
            continue
        try:
            with Sandbox.create(client=c, snapshot_id=sid) as sb:
                got = sb.run("cat", ["/root/mark"]).stdout.strip()
            if got != mark:
                problems.append(f"snapshot {sid} restores with {got!r}, expected {mark!r}")
            else:
                faults.verified_snapshot()
        except SandforkError as e:
            problems.append(f"snapshot {sid} does not restore: {e}")
        Snapshot.delete_by_id(sid, client=c)
    for info in Sandbox.list(client=c):
        state, mark = status(info), burst.marks.get(info.id)
        if state == "running":
            got = Sandbox(info.id, client=c).run("cat", ["/root/mark"]).stdout.strip()
            if mark is not None and got != mark:
                problems.append(f"{info.id} holds {got!r}, expected {mark!r}")
        elif state != "failed" or mark is not None:
            problems.append(f"{info.id} is {state} after the restart: {info.error}")


@pytest.mark.fault("daemon killed")
def test_daemon_killed_under_load(faults: Faults) -> None:
    """The daemon killed with SIGKILL while 16 client threads create, exec, checkpoint and terminate sandboxes."""
    rng = random.Random(SEED)
    d = new_daemon()
    try:
        for n in range(BURSTS):
            c = Client(url=d.url)
            burst = Burst(c, SEED + n)
            threads = [threading.Thread(target=burst.worker, args=(i,), daemon=True) for i in range(BURST_THREADS)]
            for t in threads:
                t.start()
            delay = rng.uniform(2.0, 6.0)
            time.sleep(delay)
            killed_at = time.monotonic()
            d.process.kill()
            d.process.wait()
            for t in threads:
                t.join(60)
            problems = [f"before the kill: {e}" for t, e in burst.errors if t < killed_at]
            d = new_daemon(root=d.root)
            try:
                verify_burst(c, burst, faults, problems)
            except (SandforkError, OSError) as e:
                problems.append(f"check failed: {e!r}")
            live = [s.id for s in Sandbox.list(client=c) if status(s) == "running"]
            problems += [f"leaked: {x}" for x in leaks_except(d, live)]
            for sid in live:
                Sandbox(sid, client=c).terminate()
            problems += [f"leaked after terminate: {x}" for x in leaks_except(d, [])]
            detail = (f"burst {n}, seed {SEED}: killed {delay:.1f} s in with {len(burst.marks)} sandboxes mid-life,"
                      f" {len(burst.pending)} checkpoints started, {len(burst.expect)} complete; " + "; ".join(problems))  # fmt: skip
            print(f"\n{detail}")
            faults.injected(f"kill -9 under load ({BURST_THREADS} threads)", not problems, detail)
        faults.leaks(leaks_except(d, []))  # the census, and address leases
    finally:
        finish(d)


@pytest.mark.fault("daemon killed")
def test_daemon_killed_while_the_pool_fills(faults: Faults) -> None:
    """The daemon killed while it restores forks into its pool of ready forks (restored and
    frozen, never recorded): the next daemon removes every one of them."""
    rng = random.Random(SEED)
    d = new_daemon(pool=True)
    try:
        for n in range(3):
            c = Client(url=d.url)
            src = Sandbox.create(client=c, image="busybox", memory_mb=MEMORY_MB, allow_internet_access=False)
            src.start_process("sh", ["-c", "while :; do sleep 1; done"])
            snap = src.checkpoint(checkpoint_type="memory")
            # The first restore makes the snapshot hot: the pool starts filling behind it.
            Sandbox.create(client=c, snapshot_id=snap.id).terminate()
            delay = rng.uniform(0.0, 1.0)
            time.sleep(delay)
            d.process.kill()
            d.process.wait()
            d = new_daemon(root=d.root, pool=True)
            c = Client(url=d.url)
            Snapshot.delete_by_id(snap.id, client=c)
            Sandbox(src.id, client=c).terminate()
            problems = [f"leaked: {x}" for x in leaks_except(d, [])]
            detail = f"round {n}, seed {SEED}: killed {delay * 1000:.0f} ms after the pool began to fill; " + "; ".join(problems)
            faults.injected("kill -9 while the pool fills", not problems, detail)
    finally:
        finish(d)


def children_of_fork(c: Client, tag: str) -> List[Any]:
    return [s for s in Sandbox.list(client=c) if s.labels.get("cut") == tag]


@pytest.mark.fault("daemon killed")
def test_a_fork_cut_short_leaves_no_children_running(faults: Faults) -> None:
    """The daemon killed (SIGKILL) while a fork of 8 is under way, once some children run: after the restart none of that call's children runs (its caller never heard of them), they hold no admission, and nothing is left on the host."""
    d = new_daemon()
    try:
        c = Client(url=d.url)
        src = Sandbox.create(client=c, image="busybox", memory_mb=MEMORY_MB, allow_internet_access=False)
        snap = src.checkpoint(checkpoint_type="memory")
        tag = secrets.token_hex(4)
        call = threading.Thread(target=lambda: _ignore(lambda: snap.fork(8, labels={"cut": tag})), daemon=True)
        call.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(status(s) == "running" for s in children_of_fork(c, tag)):
            time.sleep(0.05)
        seen = len(children_of_fork(c, tag))
        d.process.kill()
        d.process.wait()
        call.join(60)
        d = new_daemon(root=d.root)
        c = Client(url=d.url)
        left = {s.id: status(s) for s in children_of_fork(c, tag)}
        running = [sid for sid, st in left.items() if st == "running"]
        detail = f"{seen} children listed before the kill; after the restart: {left}"
        faults.injected("fork cut short by kill -9: no child of it left running", seen > 0 and not running, detail)
        ids = [x for x in (s.get("id") for s in c.request_json("GET", "/v1/sandboxes").get("sandboxes", [])) if x]
        leaks = leaks_except(d, [src.id]) if src.id in ids else leaks_except(d, [])
        faults.injected("fork cut short by kill -9: nothing of its children on the host", not leaks, "; ".join(leaks))
        Sandbox(src.id, client=c).terminate()
        Snapshot.delete_by_id(snap.id, client=c)
    finally:
        finish(d)


def _ignore(call: Callable[[], Any]) -> None:
    try:
        call()
    except (SandforkError, OSError):
        pass


def parked_forks(d: Daemon, keep: List[str]) -> List[str]:
    """Containers of the daemon's data dir other than ``keep``'s (parked forks are never listed)."""
    from _daemon import leftover_containers

    return [x for x in leftover_containers(d.data_dir) if not any(k in x for k in keep)]


@pytest.mark.fault("daemon stopped")
def test_a_stopped_daemon_leaves_no_ready_forks(faults: Faults) -> None:
    """SIGTERM with the pool of ready forks full (and filling): the daemon empties the pool
    before it exits, so no frozen fork outlives it, even with its data directory gone after."""
    d = new_daemon(pool=True)
    try:
        c = Client(url=d.url)
        src = Sandbox.create(client=c, image="busybox", memory_mb=MEMORY_MB, allow_internet_access=False)
        snap = src.checkpoint(checkpoint_type="memory")
        Sandbox.create(client=c, snapshot_id=snap.id).terminate()  # the snapshot is hot: the pool fills
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not parked_forks(d, [src.id]):
            time.sleep(0.1)
        parked = parked_forks(d, [src.id])
        d.process.terminate()
        d.process.wait(120)
        left = parked_forks(d, [src.id])
        faults.injected("SIGTERM with a full pool: no ready fork left", bool(parked) and not left, f"parked before {parked}; after the stop {left}")
        d = new_daemon(root=d.root, pool=True)
        c = Client(url=d.url)
        Snapshot.delete_by_id(snap.id, client=c)
        Sandbox(src.id, client=c).terminate()
    finally:
        finish(d)
