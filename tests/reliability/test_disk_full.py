"""The host disk full under a daemon: its data directory lives on a small ext4 filesystem
the test makes (an image file on a loop device), and a host-side filler file takes the
rest of the space. A checkpoint, an upload and an image build must then fail with a clear
507 ``insufficient_storage``, leave the source sandbox running and usable, leave no
partial snapshot or image visible, and give the space back once the filler is gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import census, new_daemon

from _daemon import clean_up_after, leaks_of
from _smallfs import MIB, SmallFs
from _smallfs import small_fs as make_small_fs
from sandfork import Client, Sandbox, SandforkError, Snapshot

FAULT = "host disk full"
FS_MIB = 512


@pytest.fixture
def small_fs() -> Iterator[SmallFs]:
    """A fresh small filesystem at ``<root>/data`` (the daemon's data dir), gone after."""
    with make_small_fs(FS_MIB) as fs:
        yield fs


@pytest.fixture
def full_daemon(small_fs: SmallFs) -> Iterator[tuple]:
    """A daemon whose data dir is ``small_fs``; stopped and checked for leaks after."""
    # The small filesystem is all the room there is: the daemon keeps only 16 MiB free for
    # new sandboxes (default 1 GiB), so the tests can fill it while sandboxes run.
    d = new_daemon(root=small_fs.mnt.parent, config="disk_reserve_mb = 16\n")
    try:
        yield d, small_fs
    finally:
        small_fs.unfill()
        problems = clean_up_after(d) if d.process.poll() is None else leaks_of(d)
        problems += census(d)
        problems = [p for p in problems if p != str(small_fs.mnt)]
        assert not problems, f"the daemon left behind ({d.root}):\n" + "\n".join(problems)


def client_of(d) -> Client:
    return Client(url=d.url, token=d.token or "")


def expect_507(call) -> tuple:
    """Runs ``call``; returns (ok, detail): ok when it failed with 507 insufficient_storage
    and a message naming the full disk."""
    started = time.monotonic()
    try:
        call()
    except SandforkError as e:
        msg = str(e)
        ok = e.status == 507 and e.code == "insufficient_storage" and "space" in msg.lower()
        detail = f"{e.status} {e.code} after {time.monotonic() - started:.2f}s: {msg}"
        print(detail)
        return ok, detail
    return False, "it succeeded"


# A file every test's sandbox holds before the disk fills, and must still hold after.
PRECIOUS = ("/root/data", "precious\n")


def sandbox_with_precious_file(c: Client) -> Sandbox:
    sb = Sandbox.create(client=c, allow_internet_access=False)
    sb.write_file(*PRECIOUS)
    return sb


def usable(sb: Sandbox, path: str = PRECIOUS[0], content: str = PRECIOUS[1]) -> List[str]:
    problems = []
    if str(sb.status) != "running":
        problems.append(f"sandbox is {sb.status}")
    r = sb.run("cat", [path])
    if r.stdout_bytes.decode() != content:
        problems.append(f"{path} reads {r.stdout!r} {r.stderr!r}")
    return problems


def space_back(fs: SmallFs, before: int, slack: int = 16 * MIB) -> tuple:
    """Whether the filesystem's usage is back to ``before`` (± ``slack``) within a while."""
    deadline = time.monotonic() + 20
    while True:
        os.sync()
        now = fs.used()
        if abs(now - before) <= slack or time.monotonic() > deadline:
            return abs(now - before) <= slack, f"used {before // MIB} MiB before, {now // MIB} MiB after"
        time.sleep(0.5)


@pytest.mark.fault(FAULT)
def test_checkpoint_on_a_full_disk(full_daemon, faults) -> None:
    """Memory and filesystem checkpoints with the host disk full: 507, source still running, no snapshot, space released, a checkpoint succeeds after."""
    d, fs = full_daemon
    c = client_of(d)
    sb = sandbox_with_precious_file(c)
    # 24 MiB in the sandbox's memory (its /dev/shm tmpfs) for CRIU to dump.
    sb.run("dd", ["if=/dev/urandom", "of=/dev/shm/blob", "bs=1M", "count=24"])
    sb.start_process("sleep", ["3600"])
    os.sync()
    before = fs.used()
    # Full to the last block (the state database refuses first), then with a few MiB
    # left (the database works; the memory images would not fit, which is refused before
    # the sandbox is paused). A filesystem checkpoint writes next to nothing (a seal), so
    # only the full disk fails it.
    for kind, leave in (("memory", 0), ("filesystem", 0), ("memory", 4 * MIB)):
        fs.unfill()
        fs.fill(leave=leave)
        kind_left = f"{kind} checkpoint with the host disk full ({leave >> 10} KiB left)"
        ok, detail = expect_507(lambda: sb.checkpoint(checkpoint_type=kind))
        faults.injected(f"{kind_left}: 507", ok, detail)
        problems = usable(sb)
        faults.injected(f"{kind_left}: source still running and usable", not problems, "; ".join(problems))
        snaps = Snapshot.list(client=c)
        leftover = sorted(os.listdir(d.data_dir / "snapshots")) if (d.data_dir / "snapshots").exists() else []
        faults.injected(f"{kind_left}: no snapshot", not snaps and not leftover, f"listed {snaps}, files {leftover}")
    fs.unfill()
    ok, detail = space_back(fs, before)
    faults.injected("checkpoints on a full disk: space released", ok, detail)
    try:
        snap = sb.checkpoint(checkpoint_type="memory")
        restored = Sandbox.create(client=c, snapshot_id=snap.id)
        ok = restored.run("cat", [PRECIOUS[0]]).stdout_bytes.decode() == PRECIOUS[1]
        restored.terminate()
        snap.delete()
        faults.verified_snapshot()
        detail = f"snapshot {snap.id} restored"
    except SandforkError as e:
        ok, detail = False, str(e)
    faults.injected("checkpoint after the disk was freed succeeds and restores", ok, detail)
    sb.terminate()


@pytest.mark.fault(FAULT)
def test_upload_on_a_full_disk(full_daemon, faults) -> None:
    """An upload with the host disk full, and one larger than the sandbox's own disk: 507, no partial file, the sandbox usable."""
    d, fs = full_daemon
    c = client_of(d)
    sb = sandbox_with_precious_file(c)
    ok, detail = expect_507(lambda: sb.write_file("/root/too-big", os.urandom(1 << 10) * (1 << 10) * (sb.info().disk_mb + 64)))
    faults.injected("upload larger than the sandbox's own disk: 507", ok, detail)
    gone = sb.run("ls", ["/root"]).stdout.split()
    faults.injected("upload larger than the sandbox's disk: no partial file", "too-big" not in gone, f"/root holds {gone}")
    os.sync()
    before = fs.used()
    fs.fill(leave=0)
    blob = os.urandom(1 << 20) * 32
    ok, detail = expect_507(lambda: sb.write_file("/root/upload", blob))
    faults.injected("upload with the host disk full: 507", ok, detail)
    fs.unfill()
    problems = usable(sb)
    faults.injected("upload with the host disk full: sandbox still usable", not problems, "; ".join(problems))
    listing = sb.run("ls", ["/root"]).stdout.split()
    faults.injected("upload with the host disk full: no partial file", "upload" not in listing, f"/root holds {listing}")
    ok, detail = space_back(fs, before)
    faults.injected("upload on a full disk: space released", ok, detail)
    try:
        sb.run("rm", ["-f", "/root/upload"])
        sb.write_file("/root/upload", blob)
        ok = sb.run("sh", ["-c", "wc -c < /root/upload"]).stdout.strip() == str(len(blob))
        detail = ""
    except SandforkError as e:
        ok, detail = False, str(e)
    faults.injected("upload after the disk was freed succeeds", ok, detail)
    sb.terminate()


def build_image(c: Client, name: str) -> dict:
    """Builds image ``name`` (busybox); returns the last event of the progress stream."""
    _, data = c.request("POST", "/v1/images", json_body={"name": name, "builder": "busybox"}, unbounded=True)
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()][-1]


@pytest.mark.fault(FAULT)
def test_image_build_on_a_full_disk(full_daemon, faults) -> None:
    """An image build with the host disk full: a clear insufficient_storage error, no half image, space released, the build succeeds after."""
    d, fs = full_daemon
    c = client_of(d)
    c.request_json("GET", "/v1/images")
    os.sync()
    before = fs.used()
    for leave in (0, 3 * MIB, 10 * MIB):
        fs.fill(leave=leave)
        last = build_image(c, "full")
        print(f"build with {leave >> 10} KiB left: {last}")
        msg = last.get("message", "")
        ok = last.get("type", last.get("event")) != "done" and last.get("code") == "insufficient_storage" and "space" in msg.lower()
        faults.injected(f"image build with the host disk full ({leave // MIB} MiB left): clear error", ok, json.dumps(last))
        names = [i["name"] for i in c.request_json("GET", "/v1/images")["images"]]
        stray = [p.name for p in (d.data_dir / "images").iterdir() if "full" in p.name] if (d.data_dir / "images").exists() else []
        faults.injected(f"image build with the host disk full ({leave // MIB} MiB left): no half image", "full" not in names and not stray,
                        f"images {names}, files {stray}")  # fmt: skip
        fs.unfill()
    ok, detail = space_back(fs, before)
    faults.injected("image builds on a full disk: space released", ok, detail)
    last = build_image(c, "full")
    ok = "image" in last and last["image"]["name"] == "full"
    faults.injected("image build after the disk was freed succeeds", ok, json.dumps(last)[-300:])
    if ok:
        with Sandbox.create(image="full", client=c, allow_internet_access=False) as sb:
            ok = sb.run("echo", ["hi"]).stdout == "hi"
        faults.injected("a sandbox boots from the image built after", ok, "")
        c.request("DELETE", "/v1/images/full")


def sandbox_doc(c: Client, sb: Sandbox) -> dict:
    return c.request_json("GET", f"/v1/sandboxes/{sb.id}")


def wait_until(what: str, ready, timeout: float = 60) -> tuple:
    """Polls ``ready`` until it holds or ``timeout`` passes; returns (held, detail)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True, ""
        time.sleep(0.5)
    return False, f"not {what} within {timeout:.0f} s"


def event_types(sb: Sandbox) -> List[str]:
    return [e.type for e in sb.events(follow=False)]


WRITER = "dd if=/dev/urandom of=/root/g.bin bs=1M count=24 && sync && md5sum /root/g.bin > /root/g.md5 && sync && touch /root/done"


def writer_held_on_a_full_disk(c: Client, fs: SmallFs, faults, what: str) -> Sandbox:
    """A sandbox writing and syncing (``WRITER``) with the host disk full; records that it
    is reported ``disk_full``."""
    sb = sandbox_with_precious_file(c)
    os.sync()
    fs.fill(leave=0)
    sb.start_process("sh", ["-c", WRITER])
    ok, detail = wait_until("reported disk_full", lambda: sandbox_doc(c, sb).get("disk_full") is True)
    faults.injected(f"{what}: the sandbox is reported disk_full", ok, detail)
    return sb


@pytest.mark.fault(FAULT)
def test_synced_writes_survive_a_full_disk(full_daemon, faults) -> None:
    """A sandbox writes and syncs 24 MiB while the host disk is full: its writes are held, never dropped; the API and the events say so; once space is freed they go through, the data reads back after the host's caches are dropped, the root stays writable and a checkpoint succeeds."""
    d, fs = full_daemon
    c = client_of(d)
    sb = writer_held_on_a_full_disk(c, fs, faults, "synced writes on a full disk")
    faults.injected("synced writes on a full disk: a disk_full event", "disk_full" in event_types(sb), str(event_types(sb)))
    done = sb.run("test", ["-e", "/root/done"]).exit_code == 0
    faults.injected("synced writes on a full disk: the sync waits (is not acknowledged)", not done, "")
    ok, detail = expect_507(lambda: sb.checkpoint(checkpoint_type="filesystem"))
    faults.injected("checkpoint while the disk's writes wait for space: 507", ok, detail)
    fs.unfill()
    ok, detail = wait_until("done", lambda: sb.run("test", ["-e", "/root/done"]).exit_code == 0)
    faults.injected("space freed: the held writes and the sync complete", ok, detail)
    ok, detail = wait_until("recovered", lambda: "disk_recovered" in event_types(sb) and not sandbox_doc(c, sb).get("disk_full"))
    faults.injected("space freed: disk_full cleared and a disk_recovered event", ok, detail + f" {event_types(sb)}")
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    r = sb.run("md5sum", ["-c", "/root/g.md5"])
    faults.injected("the data written while the disk was full reads back after the host's caches are dropped", r.exit_code == 0, r.stdout + r.stderr)
    r = sb.run("sh", ["-c", "echo after > /root/after && sync && cat /root/after"])
    faults.injected("the sandbox's root stays writable", r.stdout.strip() == "after", r.stdout + r.stderr)
    problems = usable(sb)
    faults.injected("the sandbox still running and usable", not problems, "; ".join(problems))
    try:
        snap = sb.checkpoint(checkpoint_type="filesystem")
        snap.delete()
        ok, detail = True, ""
    except SandforkError as e:
        ok, detail = False, str(e)
    faults.injected("a checkpoint after the disk was freed succeeds", ok, detail)
    sb.terminate()


@pytest.mark.fault(FAULT)
def test_terminate_while_writes_wait_for_space(full_daemon, faults) -> None:
    """A sandbox whose disk writes wait for space is terminated: the terminate completes (the held writes are given up) and leaves nothing behind."""
    d, fs = full_daemon
    c = client_of(d)
    sb = writer_held_on_a_full_disk(c, fs, faults, "terminate on a full disk")
    try:
        sb.terminate()
        ok, detail = True, ""
    except SandforkError as e:
        ok, detail = False, str(e)
    faults.injected("terminate while writes wait for space completes", ok, detail)
    fs.unfill()
