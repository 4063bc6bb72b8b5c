#!/usr/bin/env python3
"""Runs the integration suites (integrations/*/tests) with the real frameworks.

The frameworks live in a venv outside the repository, ``$SANDFORK_INTEGRATIONS_VENV``
(default /var/cache/sandfork/integrations/venv, made with ``--system-site-packages`` so
the repository's test dependencies are there). It is made when missing, and the pinned
versions of requirements.txt plus this repository's SDK and provider packages (editable)
are installed into it when they are not there yet — the only step that needs the
package index. Then each suite runs in a pytest of its own; all run, and the exit status
is non-zero if any failed.

The Harbor suite (harbor_sandfork) needs Python >= 3.12: its tests run here, and Harbor
runs in a Debian 13 tool root that harbor_sandfork/harbor_root.py makes (cached under
/var/cache/sandfork/harbor; debootstrap and pip on the first run).

    python3 integrations/run_tests.py                 # every suite
    python3 integrations/run_tests.py inspect_sandfork -k eval
    python3 integrations/run_tests.py --install-only  # prints the venv's python
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENV = Path(os.environ.get("SANDFORK_INTEGRATIONS_VENV", "/var/cache/sandfork/integrations/venv"))
SUITES = ["inspect_sandfork", "agents_sandfork", "harbor_sandfork"]
# Installed into the venv. harbor_sandfork is not: Harbor needs Python >= 3.12, so its suite
# runs Harbor in a tool root of its own (harbor_sandfork/harbor_root.py) and needs only
# the SDK here.
EDITABLE = {"sandfork": REPO / "sdk" / "python", **{name: HERE / name for name in ("inspect_sandfork", "agents_sandfork")}}
INSTALL_TIMEOUT = 1800


def pins() -> Dict[str, str]:
    out = {}
    for line in (HERE / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip()] = version.strip()
    return out


PROBE = """
import importlib.metadata as m, importlib.util, json, sys
pins, editable = json.loads(sys.argv[1]), json.loads(sys.argv[2])
bad = []
for name, version in pins.items():
    try:
        got = m.version(name)
    except m.PackageNotFoundError:
        got = None
    if got != version:
        bad.append(name + "==" + version)
for module, path in editable.items():
    spec = importlib.util.find_spec(module)
    if spec is None or not (spec.origin or "").startswith(path):
        bad.append(module + " (editable, from " + path + ")")
print(json.dumps(bad))
"""


def venv_python() -> Path:
    return VENV / "bin" / "python"


def missing() -> List[str]:
    import json

    py = venv_python()
    if not py.exists():
        return ["venv"]
    editable = {name: str(path) for name, path in EDITABLE.items()}
    try:
        out = subprocess.run([str(py), "-c", PROBE, json.dumps(pins()), json.dumps(editable)], capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip() or '["probe"]')
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ["probe"]


def run(cmd: List[str], what: str) -> None:
    print(f"== {what}: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, timeout=INSTALL_TIMEOUT)
    if done.returncode != 0:
        sys.exit(f"installing {what} failed (exit {done.returncode}): {' '.join(cmd)}")


def ensure_venv() -> Path:
    """The venv's python, with the pinned frameworks and this repository's packages."""
    todo = missing()
    if not todo:
        return venv_python()
    print(f"== the integrations venv {VENV} lacks: {', '.join(todo)}", flush=True)
    if not venv_python().exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], "a venv")
    pip = [str(venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(pip + ["-r", str(HERE / "requirements.txt")], "the frameworks")
    editables: List[str] = []
    for path in EDITABLE.values():
        editables += ["-e", str(path)]
    run(pip + editables, "the SDK and the provider packages")
    left = missing()
    if left:
        sys.exit(f"after installing, the integrations venv still lacks: {', '.join(left)}")
    return venv_python()


def main(argv: List[str]) -> int:
    py = ensure_venv()
    if argv[:1] == ["--install-only"]:
        print(py)
        return 0
    suites = [a for a in argv if a in SUITES] or SUITES
    extra = [a for a in argv if a not in SUITES]
    failed = []
    for suite in suites:
        tests = HERE / suite / "tests"
        print(f"== pytest {tests.relative_to(REPO)}", flush=True)
        rc = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests), *extra], cwd=REPO).returncode
        if rc != 0:
            failed.append(suite)
    if failed:
        print(f"failed integration suites: {' '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
