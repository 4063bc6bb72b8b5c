"""Per-process attributes (holder "attrs"): working directory, umask, resource limits,
nice value and the environment it was started with (ST_ENV, given by the test)."""

import os
import resource
import sys

from stlib import Holder, ask, emit, ready_info

CWD = "/tmp/st/cwd-orig"
UMASK = 0o027
LIMITS = {"NOFILE": (1234, 4321), "NPROC": (4567, 5678), "STACK": (4 << 20, resource.RLIM_INFINITY)}
NICE = 5


def hold():
    os.makedirs(CWD, exist_ok=True)
    h = Holder("attrs")
    os.chdir(CWD)
    os.umask(UMASK)
    for name, value in LIMITS.items():
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), value)
    os.nice(NICE)

    def own(tag):
        old = os.umask(0o077)
        os.umask(old)
        out = {"cwd": os.getcwd(), "umask": old, "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
               "env": os.environ.get("ST_ENV"), "nice": os.nice(0)}  # fmt: skip
        os.makedirs(f"/tmp/st/cwd-{tag}", exist_ok=True)
        os.chdir(f"/tmp/st/cwd-{tag}")
        os.umask(0o077)
        resource.setrlimit(resource.RLIMIT_NOFILE, (1111, 4321))
        return out

    h.handlers["own"] = own
    h.ready()
    h.serve()


def limits_of(pid):
    wanted = {"Max open files": "NOFILE", "Max processes": "NPROC", "Max stack size": "STACK"}
    out = {}
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            for label, name in wanted.items():
                if line.startswith(label):
                    soft, hard = line[len(label) :].split()[:2]
                    out[name] = [resource.RLIM_INFINITY if v == "unlimited" else int(v) for v in (soft, hard)]
    return out


def check(tag):
    pid = ready_info("attrs")["pid"]
    with open(f"/proc/{pid}/status") as f:
        umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    with open(f"/proc/{pid}/environ", "rb") as f:
        environ = dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    with open(f"/proc/{pid}/stat") as f:
        nice = int(f.read().rsplit(")", 1)[1].split()[16])
    emit({
        "proc": {"cwd": os.readlink(f"/proc/{pid}/cwd"), "umask": umask, "limits": limits_of(pid), "nice": nice,
                 "ST_ENV": environ.get("ST_ENV"), "fork_vars": sorted(k for k in environ if k.startswith("SANDFORK_FORK"))},
        "own": ask("attrs", "own", tag),
        "expected": {"cwd": CWD, "umask": UMASK, "limits": {k: list(v) for k, v in LIMITS.items()}, "nice": NICE},
        "my_fork_vars": sorted(k for k in os.environ if k.startswith("SANDFORK_FORK")),
    })  # fmt: skip


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
