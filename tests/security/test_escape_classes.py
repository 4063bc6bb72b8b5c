"""Known container-escape classes, tried from inside a sandbox as root: runc's
(/proc/self/exe overwrite, leaked file descriptors, mount and masked-path races), cgroup
escapes, kernel interfaces, and privileged operations one by one. Each attempt is named
after the attack it tries; the neighbour sandbox and the host marker are checked after
each test."""

from __future__ import annotations

import pytest
from conftest import out_of, sh

# ---------------------------------------------------------------- runc: /proc/self/exe


@pytest.mark.promise("host files")
def test_runc_binary_overwrite_through_proc_exe(attempts, sandbox) -> None:
    """CVE-2019-5736 class: the sandbox's init is the agent, bind-mounted read-only; no
    path through /proc leads to a host binary that can be written."""
    for target in ("/proc/self/exe", "/proc/1/exe", "/.sandfork/agent"):
        r = sh(sandbox, f"echo '#!/bin/sh' > {target} && echo wrote; true")
        attempts.refused(f"overwrite {target}", "wrote" not in r.stdout, out_of(r))
    r = sh(sandbox, "cp /bin/busybox /proc/1/exe && echo copied; true")
    attempts.refused("replace the init's binary by copy", "copied" not in r.stdout, out_of(r))
    r = sh(sandbox, "exec 3<>/proc/1/exe && echo opened; true")
    attempts.refused("open the init's binary read-write", "opened" not in r.stdout, out_of(r))
    r = sh(sandbox, "grep -q sandfork /proc/1/maps; ls -l /proc/1/exe | grep -c ' -> /.sandfork/agent'")
    attempts.refused("the init runs a host path", r.stdout.strip().endswith("1"), out_of(r))


# ------------------------------------------------------------- runc: leaked descriptors


@pytest.mark.promise("host files")
def test_no_leaked_host_descriptors(attempts, sandbox) -> None:
    """CVE-2024-21626 class: no process of the sandbox holds a descriptor or a working
    directory on a host path; `cd /proc/self/fd/N` leads nowhere outside."""
    r = sh(sandbox, "for p in /proc/[0-9]*; do ls -l $p/fd 2>/dev/null; done | sed -n 's/.* -> //p' | sort -u")
    leaked = [t for t in r.stdout.split() if t.startswith("/") and not t.startswith(("/dev/", "/proc/", "/tmp/", "/run/sandfork"))]
    attempts.refused("a descriptor on a host path in any sandbox process", not leaked, out_of(r))
    for n in range(3, 12):
        r = sh(sandbox, f"cd /proc/self/fd/{n} 2>/dev/null && cd ../../../../.. && ls /sys/fs/cgroup/unified 2>/dev/null | head -1 && pwd; true")
        attempts.refused(f"escape through the working directory of fd {n}", "/proc" not in r.stdout and r.stdout.strip() in ("", "/"), out_of(r))
    r = sh(sandbox, "for p in /proc/[0-9]*; do readlink $p/cwd; done | sort -u")
    attempts.refused("a process whose cwd is outside the sandbox root", all(c.startswith("/") for c in r.stdout.split()), out_of(r))


# ------------------------------------------------------ runc: mounts and masked paths


MASKED = ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
          "/proc/acpi", "/proc/scsi", "/sys/firmware", "/sys/kernel/debug", "/proc/interrupts"]
READ_ONLY = ["/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger",
             "/proc/sys/kernel/core_pattern", "/proc/sys/net/ipv4/ip_forward", "/sys/kernel/mm/ksm/run",
             "/proc/irq/default_smp_affinity", "/proc/sys/fs/file-max", "/sys/module/fuse/parameters/enable_uring",
             "/proc/sys/kernel/modprobe"]


@pytest.mark.promise("kernel")
def test_masked_paths_stay_masked(attempts, sandbox) -> None:
    """CVE-2025-31133 class: masked kernel files read as empty, and unmounting, replacing or
    bind-mounting over the mask is refused."""
    for path in MASKED:
        # A masked file reads as nothing; a masked directory lists nothing.
        r = sh(sandbox, f"[ -d {path} ] && ls -A {path} 2>/dev/null | head -3; [ -d {path} ] || head -c 64 {path} 2>/dev/null | wc -c")
        attempts.refused(f"read masked {path}", r.stdout.split() in ([], ["0"]), out_of(r))
    for path in MASKED[:5]:
        r = sh(sandbox, f"umount {path} 2>/dev/null && echo unmasked; mount --bind /tmp {path} 2>/dev/null && echo bound; true")
        attempts.refused(f"unmask {path}", "unmasked" not in r.stdout and "bound" not in r.stdout, out_of(r))


@pytest.mark.promise("kernel")
def test_read_only_kernel_interfaces(attempts, sandbox) -> None:
    """CVE-2025-52881 class: writes to /proc/sys, /proc/sysrq-trigger and /sys fail,
    directly and through symlinks planted to redirect them."""
    for path in READ_ONLY:
        r = sh(sandbox, f"echo 1 > {path} 2>/dev/null && echo wrote; true")
        attempts.refused(f"write {path}", "wrote" not in r.stdout, out_of(r))
    for path in READ_ONLY[:4]:
        r = sh(sandbox, f"ln -sf {path} /tmp/redirect && echo 1 > /tmp/redirect 2>/dev/null && echo wrote; true")
        attempts.refused(f"write {path} through a symlink", "wrote" not in r.stdout, out_of(r))


@pytest.mark.promise("devices")
def test_dev_console_and_dev_nodes_cannot_be_redirected(attempts, sandbox) -> None:
    """CVE-2025-52565 class: /dev entries cannot be turned into paths to kernel files."""
    for dev in ("/dev/console", "/dev/null", "/dev/ptmx", "/dev/full", "/dev/zero"):
        r = sh(sandbox, f"rm -f {dev} && ln -s /proc/sysrq-trigger {dev} && echo h > {dev} 2>/dev/null && echo wrote; true")
        attempts.refused(f"redirect {dev} to /proc/sysrq-trigger", "wrote" not in r.stdout, out_of(r))


# ------------------------------------------------------------------------ cgroups

CGROUP_WRITES = [
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "-1"),
    ("/sys/fs/cgroup/pids/pids.max", "max"),
    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1"),
    ("/sys/fs/cgroup/unified/cgroup.procs", "1"),
    ("/sys/fs/cgroup/memory/release_agent", "/tmp/x"),
    ("/sys/fs/cgroup/memory/notify_on_release", "1"),
    ("/sys/fs/cgroup/memory.max", "max"),
    ("/sys/fs/cgroup/pids.max", "max"),
    ("/sys/fs/cgroup/cgroup.subtree_control", "+memory"),
    ("/sys/fs/cgroup/cgroup.procs", "1"),
]


@pytest.mark.promise("cgroups")
def test_cgroup_escapes(attempts, sandbox) -> None:
    """Raising its own limits, release_agent, moving into another cgroup, mounting a
    cgroup hierarchy: all refused (cgroupfs is read-only and no CAP_SYS_ADMIN)."""
    for path, value in CGROUP_WRITES:
        r = sh(sandbox, f"[ -e {path} ] || exit 0; echo {value} > {path} 2>/dev/null && echo wrote; true")
        attempts.refused(f"write {value} to {path}", "wrote" not in r.stdout, out_of(r))
    for fs, opts in (("cgroup", "memory"), ("cgroup", "rdma"), ("cgroup2", "none")):
        r = sh(sandbox, f"mkdir -p /tmp/cg && mount -t {fs} -o {opts} x /tmp/cg 2>/dev/null && echo mounted; true")
        attempts.refused(f"mount a {fs} ({opts}) hierarchy", "mounted" not in r.stdout, out_of(r))
    r = sh(sandbox, "mkdir /sys/fs/cgroup/memory/escape 2>/dev/null && echo made; mkdir /sys/fs/cgroup/escape 2>/dev/null && echo made; true")
    attempts.refused("make a child cgroup", "made" not in r.stdout, out_of(r))


# ------------------------------------------------------------ privileged operations

PRIVILEGED = [
    ("load a kernel module", "insmod /lib/modules/x.ko || modprobe dummy"),
    ("swap on a file", "dd if=/dev/zero of=/tmp/sw bs=1k count=64 2>/dev/null; mkswap /tmp/sw >/dev/null && swapon /tmp/sw"),
    ("reboot the host", "reboot -f"),
    # busybox `date -s` exits 0 even when settimeofday fails: check the clock itself.
    ("set the clock", "date -s '2000-01-01 00:00:00'; [ \"$(date +%Y)\" = 2000 ]"),
    ("set the hardware clock", "hwclock -w"),
    ("change the hostname", "hostname pwned"),
    ("change the domainname", "domainname pwned"),
    ("write a sysctl", "sysctl -w kernel.panic=1"),
    ("add a network interface", "ip link add x type dummy"),
    ("change an address", "ip addr add 198.18.99.1/32 dev lo"),
    ("add a route", "ip route add 198.18.98.0/24 dev lo"),
    ("change a firewall rule", "iptables -A OUTPUT -j ACCEPT || nft add table ip x"),
    ("bind mount /", "mount --bind / /mnt"),
    ("remount / read-write elsewhere", "mount -o remount,rw /proc/sys"),
    ("pivot_root", "mkdir -p /tmp/new /tmp/new/old && pivot_root /tmp/new /tmp/new/old"),
    ("unshare a user namespace", "unshare -U true"),
    ("unshare a network namespace", "unshare -n true"),
    ("unshare a mount namespace", "unshare -m true"),
    ("nsenter the host's namespaces", "nsenter -t 1 -m -n -p true"),
    ("chroot out with a held directory", "mkdir -p /tmp/c && cd / && chroot /tmp/c /bin/sh -c 'cd ../../..; ls /sys/fs/cgroup/unified'"),
    ("open a raw socket", "ping -c 1 -W 1 127.0.0.1"),
    ("set a capability on a file", "setcap cap_sys_admin+ep /bin/busybox"),
    ("kexec a kernel", "kexec -l /bin/busybox"),
    ("read kernel memory", "head -c 16 /dev/mem || head -c 16 /dev/kmem || head -c 16 /dev/port"),
    ("read the kernel log", "dmesg | head -1 | grep -q ."),
    # /dev is the sandbox's own tmpfs: a plain file called kmsg is not the kernel log.
    ("write the kernel log", "[ -c /dev/kmsg ] && echo pwned > /dev/kmsg"),
    ("make a kernel log device", "mknod /tmp/kmsg c 1 11 && echo pwned > /tmp/kmsg"),
    ("make a disk device", "mknod /tmp/sda b 8 0 && head -c 512 /tmp/sda"),
    ("mount debugfs", "mount -t debugfs none /mnt"),
    ("mount securityfs", "mount -t securityfs none /mnt"),
    ("mount a bpf filesystem", "mount -t bpf none /mnt"),
    ("mount configfs", "mount -t configfs none /mnt"),
    ("quota on /", "quotaon /"),
    ("change a process's scheduler to real-time", "chrt -f 99 true"),
    ("lock all memory", "ulimit -l unlimited"),
    ("raise the open files limit", "ulimit -n 99999999"),
    ("ptrace a process of another user", "cat /proc/1/mem"),
]


@pytest.mark.promise("kernel")
@pytest.mark.parametrize("what,command", PRIVILEGED, ids=[p[0] for p in PRIVILEGED])
def test_privileged_operation(attempts, sandbox, what, command) -> None:
    """One privileged operation a sandbox's root must not have."""
    r = sh(sandbox, f"({command}) >/dev/null 2>&1 && echo DONE; true")
    attempts.refused(what, "DONE" not in r.stdout, out_of(r))
