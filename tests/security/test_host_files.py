"""Host files outside the sandbox disk: by path, through /proc/<pid>/root, through symlinks."""

from __future__ import annotations

import pytest
from conftest import out_of, sh

pytestmark = pytest.mark.promise("host files")


def test_marker_by_path_is_not_the_hosts(attempts, sandbox, host) -> None:
    """Reading the host marker by its host path finds nothing; writing there writes inside the sandbox only."""
    m = str(host.marker)
    r = sh(sandbox, f"cat {m}")
    attempts.refused(f"read {m}", host.marker_text.decode().strip() not in r.stdout, out_of(r))
    r = sh(sandbox, f"mkdir -p {host.marker.parent} && echo pwned > {m} && cat {m}")
    attempts.refused(f"write {m}", host.marker.read_bytes() == host.marker_text, out_of(r))


def test_marker_through_proc_root(attempts, sandbox, host) -> None:
    """/proc/1/root and /proc/*/root of every visible pid lead only to the sandbox's own root."""
    m = str(host.marker)
    r = sh(sandbox, f"for p in /proc/[0-9]*; do cat $p/root{m} 2>/dev/null; done; cat /proc/1/root{m}; true")
    attempts.refused("read marker via /proc/*/root", host.marker_text.decode().strip() not in r.stdout, out_of(r))
    r = sh(sandbox, f"for p in /proc/[0-9]*; do echo pwned > $p/root{m} 2>/dev/null; done; true")
    attempts.refused("write marker via /proc/*/root", host.marker.read_bytes() == host.marker_text, out_of(r))
    r = sh(sandbox, "ls /proc/1/root/ && cat /proc/1/root/etc/hostname")
    host_name = open("/etc/hostname").read().strip()
    attempts.refused("reach the host's root via /proc/1/root", r.exit_code == 0 and host_name not in r.stdout.split(), out_of(r))


def test_marker_through_symlinks(attempts, sandbox, host) -> None:
    """Symlinks (absolute, relative with many .., through /proc/self/root) resolve inside the sandbox."""
    m = str(host.marker)
    links = {"/tmp/abs": m, "/tmp/rel": "../../../../../../.." + m, "/tmp/proc": "/proc/self/root" + m, "/tmp/dir": str(host.root)}
    script = " ; ".join(f"ln -sf {t} {link}" for link, t in links.items())
    r = sh(sandbox, script + " ; cat /tmp/abs /tmp/rel /tmp/proc /tmp/dir/secret/marker.txt; true")
    attempts.refused("read marker via symlinks", host.marker_text.decode().strip() not in r.stdout, out_of(r))
    r = sh(sandbox, "for l in /tmp/abs /tmp/rel /tmp/proc /tmp/dir/secret/marker.txt; do echo pwned > $l; done; true")
    attempts.refused("write marker via symlinks", host.marker.read_bytes() == host.marker_text, out_of(r))


def test_daemon_data_dir_not_visible(attempts, sandbox, daemon) -> None:
    """The daemon's data directory (disks, runc state, other sandboxes) is not reachable by path."""
    r = sh(sandbox, f"ls {daemon.data_dir} {daemon.data_dir}/sandboxes 2>&1; ls /proc/1/root{daemon.data_dir} 2>&1; true")
    attempts.refused("list the daemon's data dir", "sandboxes" not in r.stdout.replace(f"{daemon.data_dir}/sandboxes", ""), out_of(r))
    r = sh(sandbox, "cat /proc/self/mountinfo")
    leaked = [ln for ln in r.stdout.splitlines() if str(daemon.data_dir) in ln.split()[3]]
    attempts.refused("find the data dir as a mount source", not leaked, "\n".join(leaked))
