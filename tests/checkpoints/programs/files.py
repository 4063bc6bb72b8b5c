"""Open files.

    python3 files.py hold     # holder "files": a file deleted while open, a file read up
                              # to an offset (ten fixed-width lines of a hundred), and a
                              # file written up to an offset
    python3 files.py bigghost # holder "bigghost": a 2 MiB file deleted while open
"""

import os
import sys

from stlib import Holder, ask, emit, ready_info

DIR = "/tmp/st/files"
LINE = 9  # "line 000\n"
CONTENT = b"deleted-but-open " * 64
BIG = 2 << 20  # default size: over CRIU's own ghost-limit (1 MiB), under the daemon's (64 MiB)


def hold():
    os.makedirs(DIR, exist_ok=True)
    h = Holder("files")
    deleted = os.open(f"{DIR}/deleted.txt", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(deleted, CONTENT)
    os.unlink(f"{DIR}/deleted.txt")
    with open(f"{DIR}/lines.txt", "w") as f:
        f.writelines(f"line {i:03d}\n" for i in range(100))
    reader = os.open(f"{DIR}/lines.txt", os.O_RDONLY)
    first = os.read(reader, 10 * LINE)
    writer = os.open(f"{DIR}/written.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(writer, b"AAAA")

    def use(tag):
        out = {
            "reader_offset": os.lseek(reader, 0, os.SEEK_CUR),
            "next_line": os.read(reader, LINE).decode().strip(),
            "deleted_link": os.readlink(f"/proc/self/fd/{deleted}"),
            "deleted_content_ok": os.pread(deleted, len(CONTENT) + 1, 0) == CONTENT,
            "deleted_size": os.fstat(deleted).st_size,
            "writer_offset": os.lseek(writer, 0, os.SEEK_CUR),
        }
        os.write(writer, tag.encode())
        os.pwrite(deleted, tag.encode(), 0)  # changes this sandbox's copy only
        return out

    h.handlers["use"] = use
    h.ready(first=first.decode().split("\n")[-2], fds={"deleted": deleted, "reader": reader, "writer": writer})
    h.serve()


def hold_big():
    os.makedirs(DIR, exist_ok=True)
    h = Holder(sys.argv[3] if len(sys.argv) > 3 else "bigghost")  # [size in MiB] [holder name]
    size = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else BIG
    fd = os.open(f"{DIR}/big.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(size >> 20):
        os.write(fd, b"B" * (1 << 20))
    os.unlink(f"{DIR}/big.bin")
    h.handlers["size"] = lambda: os.fstat(fd).st_size
    h.handlers["tail"] = lambda: os.pread(fd, 4, os.fstat(fd).st_size - 4).decode()
    h.ready(fd=fd)
    h.serve()


def check(tag):
    info = ready_info("files")
    out = ask("files", "use", tag)
    with open(f"{DIR}/written.txt") as f:
        out["written"] = f.read()
    with open(f"/proc/{info['pid']}/fd/{info['fds']['deleted']}", "rb") as f:
        out["deleted_via_proc"] = f.read(len(tag)).decode()
    out["first"] = info["first"]
    emit(out)


if __name__ == "__main__":
    {"hold": hold, "bigghost": hold_big}.get(sys.argv[1], lambda: check(sys.argv[2]))()
