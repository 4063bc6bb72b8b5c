"""Renders docs/SECURITY.md from the attempts recorded by the suite (see conftest.py)."""

from __future__ import annotations

import datetime
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List

# The threat model, the boundary, the review's findings and the fuzzing notes: prose kept
# beside the suite and copied into the report ahead of what the run found.
THREAT_MODEL = Path(__file__).with_name("threat-model.md")

PROMISES = OrderedDict(
    [
        ("host files", "A sandbox cannot read or write host files outside its own disk."),
        ("host processes", "A sandbox cannot see, signal or ptrace host processes or another sandbox's, nor enter other namespaces."),
        ("devices", "A sandbox cannot create device nodes or mount the host's disks or any block device."),
        ("kernel", "A sandbox cannot load kernel modules, write /proc/sys or /sys, set the clock or change the host's hostname."),
        ("cgroups", "A sandbox cannot leave its cgroup or raise its own limits."),
        ("daemon API and agent sockets", "A sandbox cannot reach the daemon's API socket or another sandbox's agent socket, nor redirect the daemon to a host socket."),
        ("network", "A sandbox cannot reach the host's services or another sandbox over the network, nor open raw or packet sockets."),
        ("resources", "A sandbox cannot exhaust the host or hurt its neighbours: fork bombs, memory hogs, disk and inode fill, output floods, exec storms."),
        ("file API", "File API paths resolve inside the sandbox; bad paths and sizes get a clear 4xx, never a 500."),
        ("host side", "What a sandbox leaves on the host (its disk's mounts, the data directory, core dumps) gives no host user anything: mounts are nosuid,nodev, the data directory is root's alone, no core is ever dumped."),
        ("image builds", "An image build step (a package's install script) runs confined like any sandbox: it cannot reach host files, host processes, host devices or the host's network."),
        ("egress", "In every network mode a sandbox cannot reach link-local addresses (the cloud metadata server), the host's networks or private ranges unless its owner allowed them explicitly."),
        ("snapshot files", "An imported snapshot file is refused unless signed with the daemon's key (or, for filesystem snapshots only, explicitly trusted), whatever kind its manifest declares; an imported disk is checked before the host mounts it."),
        ("secrets", "Secrets reach the sandbox's processes but no snapshot, export, record or world-readable file."),
        ("agent impostor", "A sandbox that replaces or impersonates its agent gets no more from the daemon than an error: replies are bounded and timed out, the daemon stays responsive and small."),
        ("host disk", "The API cannot fill the host's disk: imports and pulls are capped, creates, imports, pulls and unpacks keep a free-space floor, registry bodies are read bounded."),
        ("registry trust", "A registry a pull names cannot send the daemon (by its token realm or a redirect) to a guarded address unless it is at one of that class itself, nor from TLS to plain HTTP, nor get credentials sent to another host."),
        ("API listener", "The TCP listener bounds connections and cuts off slow clients; a non-loopback listener needs TLS."),
        ("host-wide effects", "Running sandfork changes nothing host-wide beyond its own table, mounts and namespaces: no host forwarding policy of accept, a runc with the known escape fixes, and cleanup that converges beside other host tools (ip netns)."),
    ]
)


FIXED = [
    (
        "tests/security/test_escape_classes.py::test_cgroup_escapes",
        "the tmpfs runc mounts at /sys/fs/cgroup above the (read-only) cgroup v1 hierarchies was writable, so a "
        "sandbox could make directories there that look like cgroups. /sys/fs/cgroup is now a read-only path "
        "(crates/runtime/src/oci.rs); memory checkpoints and forks keep it read-only.",
    ),
    (
        "tests/security/test_host_files.py::test_daemon_data_dir_not_visible",
        "the embedded agent was written into the data directory, and a sandbox's mount table showed that path as "
        "the source of its /.sandfork/agent mount. The agent now lives in /run/sandfork/agent, named by digest "
        "(crates/agent-embed).",
    ),
    (
        "tests/security/test_resources.py::test_sysv_shm_cannot_outlive_its_processes",
        "System V shared memory segments outlived the processes that made them; a static program filling a few "
        "of them in a 64 MiB sandbox OOM-killed its agent. Sandboxes now run with `kernel.shm_rmid_forced = 1` "
        "in their IPC namespace (crates/runtime/src/oci.rs), so a segment goes with its last process.",
    ),
    (
        "tests/security/test_resources.py::test_output_flood",
        "a non-streamed exec printing NUL bytes took ~0.9 GiB of daemon memory (the 64 MiB cap per stream "
        "counted raw bytes; the JSON answer, built whole, escapes each control byte into six). The cap now counts "
        "bytes of the answer (crates/server/src/api/exec.rs); the daemon's peak stays under +256 MiB.",
    ),
    (
        "tests/security/test_resources.py::test_tmpfs_fill",
        "/dev and /dev/shm were 64 MiB tmpfs whatever `memory_mb` was; their pages are charged to the sandbox's "
        "memory cgroup and cannot be reclaimed, so filling either in a 64 MiB sandbox OOM-killed the agent (pid 1): "
        "the sandbox stayed `running` while every exec got 503. They are now sized to an eighth of the memory, at most "
        "64 MiB (crates/runtime/src/oci.rs).",
    ),
]

RESIDUAL = """\
- If the agent dies anyway (killed by the OOM killer when the sandbox's own processes hold
  the memory, say), the daemon's liveness watch marks the sandbox `failed` with the reason
  within about a second and removes it; neighbours are unaffected
  (tests/reliability/test_sandbox_faults.py). Shielding the agent from the OOM killer
  (`oom_score_adj = -1000`) needs CAP_SYS_RESOURCE on the host, which these hosts lack.
- ptrace is allowed within a sandbox (its pid namespace confines it); CPU time is limited
  by quota but not isolated from side channels; the FUSE disk server runs as root on the
  host and parses block requests from the kernel only, never from the sandbox.
- Page merging (`memory_merge`, on by default so that forks share memory) is a timing side
  channel between sandboxes on one host: a write to a merged page takes a copy-on-write
  fault, so a sandbox can tell whether a page of exactly the same 4 KiB content exists in
  another sandbox. It reveals nothing of a page it cannot already guess whole (a key, a
  token of enough entropy); it can confirm a guessed page (a known file's version, a
  low-entropy value alone in a page). Hosts whose sandboxes belong to tenants who must not
  learn that of each other run with `memory_merge = false`; forks then copy their
  parent's memory.
- A sandbox with `internet` can leak data through the names it asks its resolver, which
  forwards them upstream, unless its `allow_out` names hosts (then only allowed names go
  upstream) or it denies 0.0.0.0/0 (then none do). A denied wildcard blocks the addresses
  answers have shown; a denied name's addresses are looked up every minute.
"""


def render(results: List[dict], exitstatus: int) -> str:
    by_promise: Dict[str, List[dict]] = OrderedDict((p, []) for p in PROMISES)
    for r in results:
        by_promise.setdefault(r["promise"], []).append(r)
    tried = sum(len(r["items"]) for r in results)
    refused = sum(i["refused"] for r in results for i in r["items"])
    lines = [
        "# Security",
        "",
        "Generated by `python3 -m pytest -q tests/security --security-report=docs/SECURITY.md`"
        f" on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC from"
        " `tests/security/threat-model.md` and the run — edit those, not this file.",
        "",
        THREAT_MODEL.read_text().rstrip(),
        "",
        "## Probes",
        "",
        "Every attempt below runs from inside a busybox sandbox as root; after every test the",
        "suite checks that a host marker file is unchanged, that a neighbour sandbox still",
        "answers exec, keeps its file and its background process, and that the daemon lives",
        "(that check is counted as one attempt per test).",
        "",
        f"**{tried} attempts tried, {refused} refused**, in {len(results)} tests.",
        "",
        "| promise | tests | attempts | refused |",
        "|---|---|---|---|",
    ]
    for promise, rs in by_promise.items():
        n = sum(len(r["items"]) for r in rs)
        k = sum(i["refused"] for r in rs for i in r["items"])
        lines.append(f"| {promise} | {len(rs)} | {n} | {k} |")
    lines += ["", "### Open findings", ""]
    failing = [r for r in results if any(not i["refused"] for i in r["items"])]
    if not failing:
        lines.append("None: every attempt was refused.")
    for r in failing:
        what = "; ".join(f"{i['what']} (`{_clip(i['detail'])}`)" for i in r["items"] if not i["refused"])
        known = f" Known, marked xfail: {r['xfail']}." if r.get("xfail") else ""
        lines.append(f"- `{r['test']}`.{known} Not refused: {what}")
    lines += ["", "### Fixed findings", ""]
    lines += [f"- `{test}`: {text}" for test, text in FIXED]
    lines += ["", "### Residual risks seen while testing", "", RESIDUAL]
    lines += ["", "### Promises and the tests that enforce them", ""]
    for promise, rs in by_promise.items():
        lines += [f"#### {promise}", "", PROMISES.get(promise, ""), ""]
        for r in rs:
            n, k = len(r["items"]), sum(i["refused"] for i in r["items"])
            lines.append(f"- `{r['test']}` — {r['doc'].splitlines()[0] if r['doc'] else ''} ({k}/{n} refused)")
            for i in r["items"]:
                mark = "refused" if i["refused"] else "**NOT REFUSED**"
                lines.append(f"  - {i['what']}: {mark}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _clip(text: str) -> str:
    return " ".join(text.split()).replace("`", "'")[:300]
