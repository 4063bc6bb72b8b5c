"""Create a sandbox, run commands, move files, and clean up.

    SANDFORK_URL=unix:///var/lib/sandfork/sandfork.sock python3 quickstart.py
"""

from sandfork import Sandbox


def main() -> None:
    with Sandbox.create(image="busybox", memory_mb=256) as sb:
        print("sandbox", sb.id, sb.status)
        r = sb.run("sh", ["-c", "echo hello from $(hostname); exit 3"])
        print(repr(r.stdout), "exit", r.exit_code)

        sb.write_file("/work/input.txt", "3\n1\n2\n")
        print(sb.run("sort", ["/work/input.txt"]).stdout)  # lines joined with "\n"

        for event in sb.stream("sh", ["-c", "for i in 1 2 3; do echo tick $i; sleep 0.3; done"]):
            print(event.stream, event.data, end="")

        server = sb.start_process("sh", ["-c", "while :; do date; sleep 1; done"])
        print("background pid", server.pid, server.status)
        server.kill()
        print("exited with signal", server.wait().signal)


if __name__ == "__main__":
    main()
