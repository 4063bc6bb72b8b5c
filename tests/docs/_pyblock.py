"""Runs a page's Python blocks, in order, in one namespace (started by _runners.py).

Reads one JSON request a line from the file descriptor given as argv[1]:
``{"file": PATH, "name": "page.md:LINE"}``; runs the code in PATH as if it were that page's
lines, then answers ``{"ok": true}`` or ``{"ok": false, "error": TRACEBACK}`` as one JSON
line on the descriptor argv[2]. The blocks' own output goes to this process's stdout and
stderr. Runs until its input ends.
"""

import json
import os
import sys
import traceback


def main() -> None:
    requests = os.fdopen(int(sys.argv[1]), "r")
    answers = os.fdopen(int(sys.argv[2]), "w")
    namespace = {"__name__": "__main__"}
    for line in requests:
        req = json.loads(line)
        with open(req["file"]) as f:
            source = f.read()
        print(f"----- {req['name']}", flush=True)
        try:
            exec(compile(source, req["name"].rsplit(":", 1)[0], "exec"), namespace)
            answer = {"ok": True}
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures of the block too
            # Without this file's own frame: the traceback starts in the page.
            answer = {"ok": False, "error": "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))}
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
