"""A small ext4 filesystem on a loop device, for tests that fill a daemon's data dir."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

MIB = 1 << 20


class SmallFs:
    """An ext4 filesystem on a loop device, mounted at ``mnt``."""

    def __init__(self, mnt: Path, image: Path):
        self.mnt, self.image = mnt, image
        self.filler = mnt / "filler"

    def free(self) -> int:
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize

    def used(self) -> int:
        st = os.statvfs(self.mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Takes all free space but ``leave`` bytes with the filler (as far as ext4 lets)."""
        with open(self.filler, "ab") as f:
            for _ in range(64):
                want = self.free() - leave
                if want <= 0:
                    break
                try:
                    os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, want)
                except OSError:
                    leave += MIB  # metadata needs room too: ask for a little less
            f.flush()
            os.fsync(f.fileno())

    def unfill(self) -> None:
        self.filler.unlink(missing_ok=True)
        os.sync()


def stop_disk_servers(under: Path) -> None:
    """Kills the disk servers serving disks stored under ``under``. They outlive their
    daemon by design; one left by a daemon that died mid-test keeps the filesystem busy
    (and its loop device attached) for good. The daemon's own leak checks run before."""
    marker = str(under).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"sandfork-disk") and any(marker in a for a in argv):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


@contextlib.contextmanager
def small_fs(size_mib: int = 512) -> Iterator[SmallFs]:
    """A fresh small filesystem at ``<root>/data`` (the daemon's data dir); unmounted, its
    loop device detached and its image removed whatever happens."""
    work = Path(tempfile.mkdtemp(prefix="sfdf-img-"))
    root = Path(tempfile.mkdtemp(prefix="sfdf-"))
    image, mnt = work / "fs.img", root / "data"
    mnt.mkdir()
    try:
        with open(image, "wb") as f:
            f.truncate(size_mib * MIB)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
        yield SmallFs(mnt, image)
    finally:
        stop_disk_servers(mnt)
        for _ in range(50):
            if not mounted(mnt):
                break
            subprocess.run(["umount", str(mnt)], capture_output=True)
            if mounted(mnt):
                time.sleep(0.2)
        if mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            subprocess.run(["losetup", "-d", line.split(":")[0]], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
