"""The file API with hostile paths: .., absolute host paths, symlinks outside, huge sizes, non-UTF-8 names."""

from __future__ import annotations

import pytest
from conftest import MAX_UPLOAD_BYTES, out_of, sh

pytestmark = pytest.mark.promise("file API")


def _call(fn, *args, **kw):
    """(outcome, value): "ok", a 4xx status, or "500"/"broken"."""
    from sandfork import SandforkError

    try:
        return "ok", fn(*args, **kw)
    except SandforkError as e:
        if e.status is not None and 400 <= e.status < 500:
            return e.status, None
        return f"bad {e.status}", repr(e)


def test_dotdot_and_absolute_host_paths(attempts, sandbox, host, daemon) -> None:
    """Paths with .. stay inside; the host marker path reads/writes the sandbox's own file; relative paths are 400."""
    own = sh(sandbox, "cat /etc/passwd").stdout_bytes
    for path in ("/../../../../etc/passwd", "/etc/../../etc/./passwd", "/tmp/../../../../../../etc/passwd"):
        outcome, data = _call(sandbox.read_file, path)
        attempts.refused(f"read {path}", outcome == "ok" and data == own, f"{outcome} {data!r:.80}")
    outcome, data = _call(sandbox.read_file, str(host.marker))
    attempts.refused("read the host marker by path", outcome == 404, f"{outcome} {data!r:.80}")
    outcome, _ = _call(sandbox.write_file, str(host.marker), b"pwned")
    attempts.refused("write the host marker by path", host.marker.read_bytes() == host.marker_text, str(outcome))
    for path in ("etc/passwd", "../etc/passwd", "", "\x00/etc/passwd", "/" + "a" * 5000):
        outcome, _ = _call(sandbox.read_file, path)
        attempts.refused(f"read {path[:20]!r}", outcome == 400, str(outcome))
    outcome, _ = _call(sandbox.write_file, f"/../../..{daemon.data_dir}/escaped", b"pwned")
    attempts.refused("write into the daemon's data dir via ..", not (daemon.data_dir / "escaped").exists(), str(outcome))


def test_symlinks_pointing_outside(attempts, sandbox, host, daemon) -> None:
    """Symlinks to outside resolve inside the sandbox: its own /etc/shadow, never a host file."""
    r = sh(sandbox, f"echo sandbox-shadow > /etc/shadow; ln -sf /etc/shadow /tmp/x; ln -sf {host.marker} /tmp/m; ln -sfn {daemon.data_dir} /tmp/d; ln -sfn / /tmp/root")
    assert r.exit_code == 0, out_of(r)
    outcome, data = _call(sandbox.read_file, "/tmp/x")
    attempts.refused("read symlink -> /etc/shadow", outcome == "ok" and data == b"sandbox-shadow\n", f"{outcome} {data!r:.80}")
    outcome, data = _call(sandbox.read_file, "/tmp/m")
    attempts.refused("read symlink -> host marker path", outcome == 404, f"{outcome} {data!r:.80}")
    outcome, _ = _call(sandbox.write_file, "/tmp/m", b"pwned")
    attempts.refused("write through symlink -> host marker path", host.marker.read_bytes() == host.marker_text, str(outcome))
    outcome, _ = _call(sandbox.write_file, "/tmp/d/escaped", b"pwned")
    attempts.refused("write through symlink -> daemon data dir", not (daemon.data_dir / "escaped").exists(), str(outcome))
    for call, path in ((sandbox.list_dir, "/tmp/d"), (sandbox.stat, "/tmp/root/../../tmp/m"), (sandbox.list_dir, "/proc/1/root/tmp")):
        outcome, value = _call(call, path)
        attempts.refused(f"{call.__name__} {path}", outcome in ("ok", 404) and str(daemon.data_dir) not in repr(value), f"{outcome} {value!r:.120}")
    outcome, _ = _call(sandbox.remove, "/tmp/m")
    attempts.refused("remove the symlink, not its target", host.marker.exists(), str(outcome))


def test_huge_sizes(attempts, sandbox, daemon) -> None:
    """Uploads past the limit are 413 and keep the old file; endless files (/dev/zero) stream without buffering."""
    sandbox.write_file("/tmp/keep", b"old")
    outcome, _ = _call(sandbox.write_file, "/tmp/keep", b"\0" * (MAX_UPLOAD_BYTES + (1 << 20)))
    attempts.refused("upload past max_upload_bytes", outcome == 413, str(outcome))
    attempts.refused("replace the file with a refused upload", sandbox.read_file("/tmp/keep") == b"old", "")
    got = 0
    for chunk in sandbox.iter_file("/dev/zero"):
        got += len(chunk)
        if got >= 64 << 20:
            break
    attempts.refused("read /dev/zero streams (first 64 MiB)", got >= 64 << 20, str(got))
    ok = sh(sandbox, "echo alive")
    attempts.refused("the sandbox answers after an abandoned endless read", ok.stdout.strip() == "alive", out_of(ok))


def test_non_utf8_names(attempts, sandbox) -> None:
    """Non-UTF-8 names in listings and in request paths: work or a clear 4xx, never a 500."""
    from sandfork import SandforkError

    r = sh(sandbox, "mkdir -p /tmp/n && touch \"$(printf '/tmp/n/bad\\377\\376name')\" && ls /tmp/n | wc -l")
    assert r.stdout.strip() == "1", out_of(r)
    outcome, listing = _call(sandbox.list_dir, "/tmp/n")
    attempts.refused("list a dir with a non-UTF-8 name", outcome == "ok" or (isinstance(outcome, int) and outcome < 500), f"{outcome} {listing!r:.120}")
    route = f"/v1/sandboxes/{sandbox.id}/files"
    for method, suffix in (("GET", ""), ("GET", "/stat"), ("PUT", ""), ("DELETE", ""), ("GET", "/list")):
        try:
            status, _ = sandbox.client.request(method, f"{route}{suffix}?path=%2Ftmp%2Fn%2Fbad%FF%FEname", body=b"x" if method == "PUT" else None)
        except SandforkError as e:
            status = e.status
        attempts.refused(f"{method} files{suffix} with a non-UTF-8 path", status is not None and status < 500, str(status))
