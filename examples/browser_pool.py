#!/usr/bin/env python3
"""Browser pool: log a headless browser in once, memory-checkpoint it, fork N workers that
carry on logged in.

A small web app, served inside the sandbox, keeps its sessions in memory; Chromium, driven
by Playwright, logs in through the app's form and holds the session cookie in memory only
(a session cookie: no profile file on disk has it). The memory checkpoint captures the app,
the browser and its driver, with the file locks Chromium holds on its profile. Each fork
asks its browser for a page behind the login: the answer shows the session carried over,
and a logout in one fork leaves the others logged in. The file locks are counted in the
source and in a fork: the same, including the byte-range locks Chromium holds on SQLite
databases it also maps into memory (the CRIU of scripts/setup takes them again after
restoring the mappings; see docs/checkpoints.md).

Run with the daemon up: python3 examples/browser_pool.py [--workers N] [--image browser]
(the built-in `browser` image, Debian + Python + Chromium + Playwright, is built on first
use: a few minutes, once).
"""
import argparse
import contextlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sandfork import CheckpointType, Sandbox

# The web app: a login form, sessions in memory, pages only for the logged in.
APP = r"""
import http.server, secrets, urllib.parse
SESSIONS = {}
class App(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def user(self):
        for part in self.headers.get("Cookie", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == "session" and value in SESSIONS:
                return value, SESSIONS[value]
        return None, None
    def answer(self, code, body, headers=()):
        self.send_response(code)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(body.encode())
    def do_GET(self):
        if self.path == "/login":
            return self.answer(200, "<form method=post action=/login><input name=user>"
                                    "<input name=password type=password><button id=go>Log in</button></form>")
        sid, who = self.user()
        if who is None:
            return self.answer(302, "", [("Location", "/login")])
        if self.path == "/logout":
            SESSIONS.pop(sid)
            return self.answer(200, "<p id=who>logged out</p>")
        self.answer(200, f"<p id=who>logged in as {who}</p><p id=path>{self.path}</p>")
    def do_POST(self):
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        if form.get("password") != ["s3cret"]:
            return self.answer(403, "<p id=who>wrong password</p>")
        sid = secrets.token_hex(16)
        SESSIONS[sid] = form["user"][0]
        self.answer(303, "", [("Location", "/home"), ("Set-Cookie", f"session={sid}; HttpOnly; Path=/")])
http.server.ThreadingHTTPServer(("127.0.0.1", 8080), App).serve_forever()
"""

# The browser: logs in once, then opens the pages it is asked for (one path per
# connection on a loopback port) and answers with what the page says.
BROWSER = r"""
import socket, sys, urllib.request, time
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:8080/login", timeout=1); break
    except OSError:
        time.sleep(0.1)
from playwright.sync_api import sync_playwright
pw = sync_playwright().start()
browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                             args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
page = browser.new_page()
page.goto("http://127.0.0.1:8080/login")
page.fill("input[name=user]", sys.argv[1])
page.fill("input[name=password]", "s3cret")
page.click("#go")
page.wait_for_selector("#path")
server = socket.create_server(("127.0.0.1", 7001))
print("ready:", page.inner_text("#who"), flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        page.goto("http://127.0.0.1:8080" + conn.recv(4096).decode())
        conn.sendall(page.inner_text("body").replace("\n", " ").encode())
"""
# Run inside a sandbox: counts the file locks its processes hold (Chromium's profile).
LOCKS = "cat /proc/[0-9]*/fdinfo/* 2>/dev/null | grep -c '^lock:'"
# Run inside a sandbox: asks the browser for one page and prints what it showed.
ASK = ("import socket,sys; s=socket.create_connection(('127.0.0.1',7001)); "
       "s.sendall(sys.argv[1].encode()); print(s.recv(65536).decode())")


def wait_ready(proc, timeout=180.0):
    """Blocks until the browser process printed "ready"."""
    deadline, seen, stream = time.monotonic() + timeout, "", proc.output(follow=True)
    with contextlib.closing(stream):
        for event in stream:
            seen += event.data
            if "ready" in seen or time.monotonic() > deadline:
                break
    if "ready" not in seen:
        raise RuntimeError(f"the browser did not log in: {seen[-800:]!r}")
    return seen.strip()


def ask(sb, path):
    r = sb.run("python3", ["-c", ASK, path], timeout=60)
    if r.exit_code != 0:
        raise RuntimeError(f"{sb.sandbox_id}: asking for {path} failed: {r.stderr[-500:]}")
    return r.stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="browser", help="an image with python3, Chromium and Playwright")
    ap.add_argument("-n", "--workers", type=int, default=10)
    ap.add_argument("--user", default="alice", help="who the browser logs in as")
    args = ap.parse_args()
    t, snap, forks = time.monotonic(), None, []
    base = Sandbox.create(image=args.image, memory_mb=2048, allow_internet_access=False)
    try:
        base.start_process("python3", ["-c", APP])                      # 1. the web app
        print(wait_ready(base.start_process("python3", ["-c", BROWSER, args.user])))  # 2. log in once
        locks = base.run("sh", ["-c", LOCKS]).stdout.strip()
        t_setup = time.monotonic()
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)  # 3. app + browser + locks
        base.terminate()
        t_snap = time.monotonic()
        forks = snap.fork(args.workers)                                 # 4. N warm browsers
        forks.raise_for_errors()
        t_fork = time.monotonic()
        with ThreadPoolExecutor(args.workers) as pool:                  # 5. each asks for a page
            pages = list(pool.map(lambda i: ask(forks[i], f"/orders/{i}"), range(len(forks))))
        t_run = time.monotonic()
        for i, page in enumerate(pages):
            if f"logged in as {args.user}" not in page or f"/orders/{i}" not in page:
                raise RuntimeError(f"fork {i} is not logged in: {page!r}")
            print(f"fork {i}: {page}")
        fork_locks = forks[0].run("sh", ["-c", LOCKS]).stdout.strip()
        print(f"file locks: {locks} held in the source, {fork_locks} in a fork")
        if len(forks) > 1:                                              # 6. forks are independent
            out = ask(forks[0], "/logout")
            still = ask(forks[1], "/orders/again")
            if "logged out" not in out or f"logged in as {args.user}" not in still:
                raise RuntimeError(f"a logout in one fork reached another: {out!r} / {still!r}")
            print("logged out in fork 0; fork 1 is still logged in")
        print(f"timings: setup {t_setup - t:.2f}s, checkpoint {t_snap - t_setup:.2f}s "
              f"({snap.size_bytes / 2**20:.0f} MiB), fork {len(forks)} {t_fork - t_snap:.2f}s, "
              f"pages {t_run - t_fork:.2f}s")
    finally:                                                            # 7. clean up, even on failure
        for sb in [base, *forks]:
            with contextlib.suppress(Exception):
                sb.terminate()
        if snap is not None:
            snap.delete()
    print("browser_pool ok")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"browser_pool failed: {e}", file=sys.stderr)
        sys.exit(1)
