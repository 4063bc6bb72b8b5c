"""An interactive bash on a pseudo-terminal (holder "pty" keeps the master) with a
background job (`sleep 100007 &`) under job control."""

import os
import pty
import re
import select
import sys
import time

from stlib import Holder, ask, emit, proc_stat, ready_info

counter = [0]


def talk(master, line, timeout=10.0):
    """Types ``line`` and returns what the shell printed up to a marker printed after it."""
    counter[0] += 1
    marker = f"__END_{counter[0]}__"
    typed = marker[:4] + '""' + marker[4:]  # the echoed input line does not contain the marker
    os.write(master, f'{line}; echo "{typed}"\n'.encode())
    data = b""
    deadline = time.monotonic() + timeout
    while marker.encode() not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([master], [], [], left)[0]:
            return data.decode(errors="replace") + "<timeout>"
        data += os.read(master, 4096)
    return data.decode(errors="replace").split(marker)[0]


def hold():
    h = Holder("pty")
    pid, master = pty.fork()
    if pid == 0:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TERM": "dumb", "PS1": "$ ", "HOME": "/root"}
        os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
    talk(master, "stty -echo")
    out = talk(master, "sleep 100007 & echo JOB=$!")
    job = int(re.search(r"JOB=(\d+)", out).group(1))
    h.handlers["talk"] = lambda line: talk(master, line)
    h.ready(shell=pid, job=job, tty=os.ttyname(os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NOCTTY)))
    h.serve()


def check(tag):
    info = ready_info("pty")
    out = {"info": info, "shell_stat": proc_stat(info["shell"]), "job_stat": proc_stat(info["job"])}
    with open(f"/proc/{info['shell']}/stat") as f:
        out["shell_tpgid"] = int(f.read().rsplit(")", 1)[1].split()[5])
    out["answer"] = ask("pty", "talk", f"echo PID=$$ V=$V TTY=$(tty); jobs -l; V={tag}")
    out["answer_after"] = ask("pty", "talk", "echo V=$V")
    emit(out)


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
