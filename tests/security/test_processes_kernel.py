"""Host processes, devices, kernel modules, /proc/sys and /sys, time, hostname, cgroups."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import out_of, sh


@pytest.mark.promise("host processes")
def test_processes_only_its_own(attempts, sandbox, neighbour, daemon) -> None:
    """ps shows only the sandbox's processes; host pids and the neighbour's cannot be signalled or inspected."""
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        r = sh(sandbox, "ps -o pid,comm")
        names = {line.split()[1] for line in r.stdout.splitlines()[1:] if len(line.split()) > 1}
        attempts.refused("see host or neighbour processes with ps", names <= {"agent", "ps", "sh"}, out_of(r))
        for pid in (victim.pid, daemon.process.pid):
            r = sh(sandbox, f"kill -9 {pid}; echo rc=$?; cat /proc/{pid}/status 2>&1 | head -1")
            alive = victim.poll() is None and daemon.process.poll() is None
            attempts.refused(f"kill -9 host pid {pid}", alive and "rc=0" not in r.stdout, out_of(r))
        r = sh(sandbox, "kill -9 -1; echo rc=$?")
        time.sleep(0.5)
        attempts.refused("kill -9 -1 reaching beyond the sandbox", victim.poll() is None and daemon.process.poll() is None, out_of(r))
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.promise("host processes")
def test_ptrace_and_namespaces(attempts, sandbox) -> None:
    """Joining other namespaces (nsenter/unshare) and ptrace of pid 1's ancestors are refused."""
    r = sh(sandbox, "unshare -m -p -f true; echo rc=$?")
    attempts.refused("unshare new namespaces", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "nsenter -t 1 -m -u -n true 2>&1; echo rc=$?")
    attempts.refused("nsenter into pid 1 (own init: must still lack CAP_SYS_ADMIN)", "rc=0" not in r.stdout or "not found" in r.stdout, out_of(r))
    r = sh(sandbox, "grep Cap /proc/self/status")
    eff = int([ln for ln in r.stdout.splitlines() if ln.startswith("CapEff")][0].split()[1], 16)
    for bit, name in ((21, "SYS_ADMIN"), (19, "SYS_PTRACE"), (16, "SYS_MODULE"), (27, "MKNOD"), (13, "NET_RAW"), (12, "NET_ADMIN"), (25, "SYS_TIME")):
        attempts.refused(f"hold CAP_{name}", not eff & (1 << bit), hex(eff))


@pytest.mark.promise("devices")
def test_block_devices(attempts, sandbox) -> None:
    """No block devices are visible; mknod and mount of host disks are refused."""
    r = sh(sandbox, "ls /dev")
    devs = set(r.stdout.split())
    attempts.refused("see block devices in /dev", not any(d.startswith(("sd", "vd", "nvme", "loop", "xvd", "dm-")) for d in devs), out_of(r))
    for dev in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/loop0"):
        r = sh(sandbox, f"mkdir -p /mnt/h && mount {dev} /mnt/h; echo rc=$?")
        attempts.refused(f"mount {dev}", "rc=0" not in r.stdout, out_of(r))
    for name, kind, major, minor in (("sda", "b", 8, 0), ("vda", "b", 253, 0), ("loop0", "b", 7, 0), ("mem", "c", 1, 1), ("kmsg", "c", 1, 11)):
        r = sh(sandbox, f"mknod /tmp/{name} {kind} {major} {minor}; echo rc=$?")
        attempts.refused(f"mknod {kind} {major}:{minor}", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "mount -t proc proc /mnt/h; echo rc=$?; mount -t tmpfs t /mnt/h; echo rc=$?; mount -o remount,rw /sys; echo rc=$?")
    attempts.refused("mount proc/tmpfs or remount /sys", "rc=0" not in r.stdout, out_of(r))


@pytest.mark.promise("kernel")
def test_kernel_modules(attempts, sandbox) -> None:
    """No /lib/modules; insmod (init_module / finit_module) is refused."""
    r = sh(sandbox, "ls /lib/modules 2>&1; echo rc=$?")
    attempts.refused("find /lib/modules", "rc=0" not in r.stdout, out_of(r))
    sandbox.write_file("/tmp/evil.ko", b"\x7fELF" + os.urandom(4096))
    r = sh(sandbox, "insmod /tmp/evil.ko; echo rc=$?")
    attempts.refused("insmod a module", "rc=0" not in r.stdout and "not permitted" in (r.stdout + r.stderr).lower(), out_of(r))
    r = sh(sandbox, "modprobe -q dummy; echo rc=$?; rmmod loop; echo rc=$?")
    attempts.refused("modprobe / rmmod", "rc=0" not in r.stdout, out_of(r))


@pytest.mark.promise("kernel")
def test_proc_sys_and_sys_read_only(attempts, sandbox) -> None:
    """Writing /proc/sys/* and /sys/* is refused (the same value is written back, so success would be harmless)."""
    targets = ["/proc/sys/kernel/panic", "/proc/sys/vm/overcommit_memory", "/proc/sys/net/ipv4/ip_forward",
               "/proc/sys/kernel/core_pattern", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper",
               "/sys/module/loop/parameters/max_part"]  # fmt: skip
    for path in targets:
        r = sh(sandbox, f"[ -e {path} ] || {{ echo absent; exit 0; }}; v=$(cat {path} | sed 's/.*\\[\\(.*\\)\\].*/\\1/'); echo \"$v\" > {path}; echo rc=$?")
        attempts.refused(f"write {path}", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "echo 1 > /proc/sysrq-trigger.x 2>&1; touch /sys/x; echo rc=$?; mkdir /sys/fs/x; echo rc=$?")
    attempts.refused("create files in /sys", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "grep -E ' /proc/(sys|sysrq-trigger|bus|fs|irq) ' /proc/self/mountinfo")
    mounts = {ln.split()[4]: ln.split()[5].split(",")[0] for ln in r.stdout.splitlines()}
    attempts.refused("find /proc/sys, sysrq-trigger, bus, fs, irq mounted read-write", mounts.get("/proc/sys") == "ro" and set(mounts.values()) == {"ro"}, out_of(r))
    r = sh(sandbox, "[ -w /proc/sysrq-trigger ] && grep ' /proc/sysrq-trigger ' /proc/self/mountinfo | grep -qv ' ro,' && echo writable; ls -l /proc/sysrq-trigger")
    attempts.refused("open /proc/sysrq-trigger for writing", "writable" not in r.stdout, out_of(r))


@pytest.mark.promise("kernel")
def test_time_and_hostname(attempts, sandbox) -> None:
    """date -s and settimeofday are refused; hostname inside never changes the host's."""
    before = time.time()
    r = sh(sandbox, "date -s '2001-01-01 00:00:00'; date +%Y")
    # busybox date exits 0 after a refused settimeofday: judge by the error and the clock.
    refused = "not permitted" in r.stderr and r.stdout.split()[-1] != "2001" and abs(time.time() - before) < 30
    attempts.refused("date -s", refused, out_of(r))
    host_name = socket.gethostname()
    r = sh(sandbox, "hostname pwned-host; echo rc=$?; echo pwned > /proc/sys/kernel/hostname; echo rc=$?")
    attempts.refused("change the host's hostname", os.uname().nodename == host_name == socket.gethostname(), out_of(r))
    r = sh(sandbox, "echo pwned > /proc/sys/kernel/domainname; echo rc=$?")
    attempts.refused("domainname write", "rc=0" not in r.stdout, out_of(r))


def _host_limits(sandbox_id: str) -> dict:
    """The sandbox's limits and members as the host sees them (cgroup v1 or v2)."""
    names = ("pids.max", "memory.max", "cpu.max", "memory.limit_in_bytes", "cpu.cfs_quota_us", "cgroup.procs")
    found = {}
    for cg in Path("/sys/fs/cgroup").glob(f"**/sandfork/{sandbox_id}"):
        for name in names:
            if (cg / name).exists():
                found[str(cg / name)] = (cg / name).read_text() if name != "cgroup.procs" else len((cg / name).read_text().split())
    assert found, f"no host cgroup for {sandbox_id}"
    return found


@pytest.mark.promise("cgroups")
def test_cgroup_escape_and_limits(attempts, sandbox) -> None:
    """Moving out of the cgroup or raising its limits is refused (cgroupfs read-only)."""
    limits = _host_limits(sandbox.id)
    r = sh(sandbox, "cat /proc/self/mounts")
    cgroup_mounts = [ln.split() for ln in r.stdout.splitlines() if ln.split()[2].startswith("cgroup")]
    attempts.refused("find a cgroup hierarchy mounted read-write", all(m[3].split(",")[0] == "ro" for m in cgroup_mounts), out_of(r))
    # v2: /sys/fs/cgroup is the sandbox's cgroup; v1: one directory per controller under a tmpfs.
    script = ("for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/*/tasks; do "
              "[ -f $f ] && { echo $$ > $f; echo rc=$? $f; echo $$ > $f/../../cgroup.procs 2>/dev/null && echo rc=0 up; }; done; "
              "for f in /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory.swap.max "
              "/sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes /sys/fs/cgroup/cpu.max "
              "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/devices/devices.allow; do "
              "[ -f $f ] && ! grep -q \" $(dirname $f) tmpfs\" /proc/self/mounts && { echo a > $f; echo rc=$? $f; }; done; "
              "for d in /sys/fs/cgroup/*/; do mkdir $d/esc && echo rc=0 mkdir $d; done; true")  # fmt: skip
    r = sh(sandbox, script)
    attempts.refused("write cgroup.procs / tasks / limits / devices.allow / mkdir in cgroupfs", "rc=0" not in r.stdout and "rc=" in r.stdout, out_of(r))
    r = sh(sandbox, "mkdir -p /mnt/cg && mount -t cgroup2 none /mnt/cg; echo rc=$?")
    attempts.refused("mount a fresh cgroup2 hierarchy", "rc=0" not in r.stdout, out_of(r))
    after = _host_limits(sandbox.id)
    attempts.refused("change the limits or members the host sees", after == limits, f"{limits} -> {after}")
