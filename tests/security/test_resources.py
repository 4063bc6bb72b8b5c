"""Resource exhaustion: fork bomb, memory hog, disk and inode fill, tmpfs fill, output flood, exec storm."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import out_of, sh


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", "--apparent-size", str(path)], capture_output=True, text=True).stdout
    real = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True).stdout
    return int(real.split()[0]) if real else int(out.split()[0])


@pytest.mark.promise("resources")
def test_fork_bomb(attempts, daemon) -> None:
    """A fork bomb hits the pids limit; the sandbox, the neighbour and the daemon keep working."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=128, allow_internet_access=False) as sb:
        from test_processes_kernel import _host_limits

        r = sh(sb, "f() { f | f & }; f; sleep 8; echo bombed", timeout=20)
        limits = _host_limits(sb.id)
        pids_max = [int(v) for k, v in limits.items() if k.endswith("pids.max") and v.strip() != "max"]
        procs = max((v for k, v in limits.items() if k.endswith("cgroup.procs")), default=0)
        attempts.refused("fork bomb past pids.max", bool(pids_max) and 0 < procs <= pids_max[0] and "can't fork" in r.stderr, f"pids.max={pids_max} procs={procs} {out_of(r)}")
        # While the bomb holds every pid, even the shell that kills it may fail to start
        # ("try again"): a slot frees whenever one of its forks fails and exits.
        deadline = time.monotonic() + 60
        while True:
            try:
                sh(sb, "kill -9 -1; true", timeout=30)
                break
            except Exception:  # noqa: BLE001 - the spawn refused at the pids limit
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        ok = sh(sb, "echo alive", timeout=60)
        attempts.refused("the sandbox answers exec after its fork bomb", ok.stdout.strip() == "alive", out_of(ok))


@pytest.mark.promise("resources")
def test_memory_hog(attempts, daemon) -> None:
    """Allocating past memory_mb is killed inside the sandbox; the agent, daemon and host live."""
    from sandfork import Sandbox

    rss_before = _rss_kib(daemon.process.pid)
    with Sandbox.create(memory_mb=64, allow_internet_access=False) as sb:
        r = sh(sb, "dd if=/dev/zero of=/dev/null bs=256M count=1; echo rc=$?", timeout=60)
        attempts.refused("allocate 256 MiB in a 64 MiB sandbox", "rc=0" not in r.stdout, out_of(r))
        r = sh(sb, "cat /dev/zero | head -c 300000000 | tail -c 1 > /dev/null; x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}", timeout=60)
        attempts.refused("fill a shell variable past the limit", r.stdout.strip() != "200000000", out_of(r))
        ok = sh(sb, "echo alive")
        attempts.refused("the agent survives the OOM", ok.stdout.strip() == "alive", out_of(ok))
    grew = _rss_kib(daemon.process.pid) - rss_before
    attempts.refused("grow the daemon's RSS by > 64 MiB through an OOM", grew < 64 * 1024, f"{grew} KiB")


@pytest.mark.promise("resources")
def test_disk_fill(attempts, daemon) -> None:
    """dd until ENOSPC stops at the sandbox's disk size; host space barely moves; neighbour fine."""
    from sandfork import Sandbox

    disk_mb = 128
    with Sandbox.create(memory_mb=64, disk_mb=disk_mb, allow_internet_access=False) as sb:
        free_before = shutil.disk_usage(daemon.data_dir).free
        used_before = _du_bytes(daemon.data_dir)
        r = sh(sb, "dd if=/dev/zero of=/fill bs=1M; echo rc=$?; sync; ls -l /fill; df -m /", timeout=120)
        size = int([ln.split()[4] for ln in r.stdout.splitlines() if ln.endswith("/fill")][0])
        attempts.refused(f"write past disk_mb={disk_mb}", "rc=0" not in r.stdout and size <= disk_mb << 20, out_of(r))
        grew = _du_bytes(daemon.data_dir) - used_before
        attempts.refused("grow the data dir by more than the disk size", grew <= (disk_mb + 32) << 20, f"{grew >> 20} MiB")
        dropped = free_before - shutil.disk_usage(daemon.data_dir).free
        attempts.refused("use more host disk than the disk size (+256 MiB for other activity)", dropped <= (disk_mb + 256) << 20, f"{dropped >> 20} MiB")
        ok = sh(sb, "rm /fill && echo alive")
        attempts.refused("the sandbox recovers after deleting the fill", ok.stdout.strip() == "alive", out_of(ok))


@pytest.mark.promise("resources")
@pytest.mark.parametrize("fs,cap", [("/run/sandfork", 4), ("/dev/shm", 8), ("/dev", 8)])
def test_tmpfs_fill(attempts, daemon, fs, cap) -> None:
    """Filling a tmpfs (/run/sandfork, /dev/shm, /dev) stops at its size and leaves the agent of a 64 MiB sandbox alive."""
    from sandfork import Sandbox, SandforkError

    with Sandbox.create(memory_mb=64, allow_internet_access=False) as sb:
        try:
            r = sh(sb, f"dd if=/dev/zero of={fs}/fill bs=1M count=1000; echo rc=$?; du -m {fs}/fill", timeout=60)
            used = [int(ln.split()[0]) for ln in r.stdout.splitlines() if ln.endswith("/fill")]
            attempts.refused(f"fill {fs} past {cap} MiB", "rc=0" not in r.stdout and bool(used) and used[0] <= cap, out_of(r))
        except SandforkError as e:
            attempts.refused(f"fill {fs}: the exec itself survives", False, repr(e))
        try:
            ok = sh(sb, f"rm -f {fs}/fill; echo alive", timeout=30)
            attempts.refused(f"the agent survives a full {fs}", ok.stdout.strip() == "alive", out_of(ok))
        except SandforkError as e:
            attempts.refused(f"the agent survives a full {fs}", False, f"{e!r}; state={sb.info().status}")


@pytest.mark.promise("resources")
def test_inode_exhaustion(attempts, daemon) -> None:
    """Creating files until the inodes run out fails inside the sandbox only."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=64, disk_mb=32, allow_internet_access=False) as sb:
        before = sh(sb, "df -i / | tail -1").stdout.split()
        r = sh(sb, "mkdir /f && cd /f && seq 1 400000 | xargs touch 2>&1 | tail -2; df -i / | tail -1", timeout=150)
        after = r.stdout.strip().splitlines()[-1].split()
        attempts.refused("create files past the inode count", "No space left" in r.stdout and int(after[3]) == 0, out_of(r) + f" before={before}")
        ok = sh(sb, "rm -rf /f; touch /after && echo alive", timeout=120)
        attempts.refused("the sandbox recovers", ok.stdout.strip() == "alive", out_of(ok))
    df = os.statvfs(daemon.data_dir)
    attempts.refused("exhaust the host's inodes", df.f_ffree > 10000, str(df.f_ffree))


@pytest.mark.promise("resources")
def test_output_flood(attempts, sandbox, daemon) -> None:
    """A command printing GiBs: streamed or collected, the daemon's RSS stays bounded."""
    pid = daemon.process.pid
    rss_before = _rss_kib(pid)
    peak = [rss_before]
    done = threading.Event()
    phases: dict = {}

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_kib(pid))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        total = 0
        started = time.monotonic()
        stream = sandbox.stream(["sh", "-c", "head -c 536870912 /dev/zero"], timeout=240)
        for event in stream:
            total += len(event.data)
        streamed = time.monotonic() - started
        attempts.refused("stream 512 MiB and get all of it", total == 1 << 29, f"{total} bytes in {streamed:.1f}s")
        phases["stream"] = peak[0]
        r = sandbox.run(["sh", "-c", "head -c 536870912 /dev/zero; head -c 536870912 /dev/zero >&2"], timeout=240)
        attempts.refused("collect 2 x 512 MiB non-streamed (must be capped)", r.stdout_truncated and len(r.stdout_bytes) <= 64 << 20, f"out={len(r.stdout_bytes)} trunc={r.stdout_truncated}")
        phases["collect"] = peak[0]
        p = sandbox.start_process(["sh", "-c", "head -c 268435456 /dev/zero"])
        p.wait(timeout=240)
        phases["background"] = peak[0]
    finally:
        done.set()
        watcher.join()
    grew = peak[0] - rss_before
    attempts.refused("grow the daemon's peak RSS by > 256 MiB with output", grew < 256 * 1024, f"before={rss_before} KiB peak={peak[0]} KiB; peak after each phase: {phases}")


@pytest.mark.promise("resources")
def test_exec_storm(attempts, sandbox, daemon) -> None:
    """200 simultaneous execs: each answered correctly or refused with a clean 4xx/503; the daemon lives."""
    from sandfork import Client, SandforkError, Sandbox, ServerError

    handle = Sandbox(sandbox.id, client=Client(url=daemon.url, timeout=120))

    def one(i: int) -> str:
        try:
            r = handle.run(["echo", str(i)], timeout=100)
            return "ok" if r.stdout.strip() == str(i) else f"wrong: {r.stdout!r}"
        except ServerError as e:
            return f"500: {e}"
        except SandforkError as e:
            return f"refused {e.status}" if e.status and e.status < 600 else f"broken: {e!r}"

    with ThreadPoolExecutor(max_workers=200) as pool:
        results = list(pool.map(one, range(200)))
    bad = [r for r in results if not (r == "ok" or r.startswith("refused 4") or r == "refused 503")]
    attempts.refused("200 simultaneous execs", not bad, f"{len(bad)} bad: {bad[:5]}; ok={results.count('ok')}")
    ok = sh(sandbox, "echo alive")
    attempts.refused("the sandbox answers afterwards", ok.stdout.strip() == "alive", out_of(ok))


SHM_FILL_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/shm.h>
/* Creates a System V segment of argv[1] MiB, touches every page, detaches and exits
   without removing it. */
int main(int argc, char **argv) {
    size_t size = (size_t)atoi(argv[1]) << 20;
    int id = shmget(IPC_PRIVATE, size, IPC_CREAT | 0600);
    if (id < 0) { perror("shmget"); return 2; }
    char *p = shmat(id, NULL, 0);
    if (p == (void *)-1) { perror("shmat"); return 3; }
    memset(p, 1, size);
    shmdt(p);
    printf("left segment %d\n", id);
    return 0;
}
"""


@pytest.mark.promise("resources")
def test_sysv_shm_cannot_outlive_its_processes(attempts, daemon, tmp_path) -> None:
    """System V segments left behind by exited processes are removed; their memory cannot crowd out the agent."""
    from sandfork import Sandbox, SandforkError

    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the static test program")
    src, exe = tmp_path / "shmfill.c", tmp_path / "shmfill"
    src.write_text(SHM_FILL_C)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(exe), str(src)], check=True)
    with Sandbox.create(memory_mb=64, allow_internet_access=False) as sb:
        sb.write_file("/root/shmfill", exe.read_bytes())
        sh(sb, "chmod +x /root/shmfill")
        # Four segments of 40 MiB would need 160 MiB if they outlived their creators.
        for i in range(4):
            try:
                r = out_of(sh(sb, "/root/shmfill 40; echo rc=$?", timeout=60))
                alive = sh(sb, "echo alive", timeout=60).stdout.strip() == "alive"
            except SandforkError as e:
                r, alive = repr(e), False
            attempts.refused(f"leave segment {i + 1} of 40 MiB behind in a 64 MiB sandbox", alive, r)
            if not alive:
                return
        left = sh(sb, "cat /proc/sysvipc/shm | tail -n +2 | wc -l").stdout.strip()
        attempts.refused("segments outlive their creators", left == "0", f"{left} segments left")
        status = sb.status
        attempts.refused("the sandbox stays running", str(getattr(status, "value", status)) == "running", str(status))
