"""What a client without credentials learns from the daemon's refusals (issue finding 8).

A port request without credentials, or with credentials that do not open the port, is
answered the same whatever the path (or the Host of a host-routed request) names: an
existing sandbox by id or by name, one that does not exist, a port it does not expose.
Neither the status nor the body tells a name exists, nor gives its id.
"""

from __future__ import annotations

import secrets
from typing import Dict, List, Optional, Tuple

import pytest
from test_review_findings import Api


def ask(d, path: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, bytes]:
    return Api(d).call("GET", path, headers={"Host": "localhost", **(headers or {})}, timeout=30)


@pytest.mark.promise("daemon API and agent sockets")
def test_unauthenticated_port_answers_do_not_tell_what_exists(attempts, daemon) -> None:
    """Without credentials, with a wrong token, and with another sandbox's token: one
    answer each for an existing sandbox (by id, by name, by host), a missing one, and a
    port that is not exposed; no answer holds the sandbox's id or name."""
    from sandfork import Sandbox

    name = f"sfsec-hidden-{secrets.token_hex(4)}"
    with Sandbox.create(memory_mb=64, name=name) as sb, Sandbox.create(memory_mb=64) as other:
        sb.update(exposed_ports=[8000])
        targets: List[Tuple[str, str, Dict[str, str]]] = [
            ("by id", f"/v1/sandboxes/{sb.id}/ports/8000/", {}),
            ("by name", f"/v1/sandboxes/{name}/ports/8000/", {}),
            ("a missing name", f"/v1/sandboxes/sfsec-nope-{secrets.token_hex(3)}/ports/8000/", {}),
            ("a missing id", "/v1/sandboxes/sb-0000000000000000/ports/8000/", {}),
            ("a port not exposed", f"/v1/sandboxes/{sb.id}/ports/9/", {}),
            ("by host", "/", {"Host": f"8000-{sb.id}.localhost"}),
            ("a missing one by host", "/", {"Host": "8000-sfsec-nope.localhost"}),
        ]
        creds = {
            "no credentials": {},
            "a wrong token": {"X-Sandfork-Access-Token": "nope"},
            "another sandbox's token": {"X-Sandfork-Access-Token": other.port_token()},
        }
        for cred, extra in creds.items():
            answers = {what: ask(daemon, path, {**hdrs, **extra}) for what, path, hdrs in targets}
            distinct = {a for a in answers.values()}
            attempts.refused(f"{cred}: one answer for every target", len(distinct) == 1, repr(answers))
            status, body = next(iter(answers.values()))
            attempts.refused(f"{cred}: refused ({status})", status in (401, 403), repr(body))
            leaked = [w for w, (_, b) in answers.items() if sb.id.encode() in b or name.encode() in b]
            attempts.refused(f"{cred}: no answer names the sandbox", not leaked, repr(answers))
        # With the sandbox's own token, the details are there (the caller may open it).
        status, body = ask(daemon, f"/v1/sandboxes/{sb.id}/ports/9/", {"X-Sandfork-Access-Token": sb.port_token()})
        attempts.refused("the owner's token still learns the port is not exposed", status == 403 and b"not exposed" in body, repr(body))
