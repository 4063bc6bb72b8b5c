#!/usr/bin/env python3
"""Print a fixture (.jsonl) as a compact request/response listing.

    python show.py fixtures/python-0.5.161/lifecycle.jsonl [-H]   (-H: include headers)
"""
import json
import sys

SKIP = {"traceparent", "user-agent", "accept-encoding", "content-length"}


def main() -> None:
    show_headers = "-H" in sys.argv
    for path in [a for a in sys.argv[1:] if a != "-H"]:
        t0 = None
        print(f"# {path}")
        for line in open(path):
            r = json.loads(line)
            q = "&".join(f"{k}={v}" for k, v in r["query"])
            t0 = t0 if t0 is not None else r["t_ms"]
            print(f"{r['seq']:3} +{r['t_ms'] - t0:6}ms {r['method']:6} {r['path']}{'?' + q if q else ''}  {json.dumps(r['body'])[:400] if r['body'] else ''}")
            if show_headers:
                print("       " + "; ".join(f"{k}: {v}" for k, v in r["headers"] if k.lower() not in SKIP))
            resp = r.get("response") or {}
            body = resp.get("body") or resp.get("sse") or resp.get("ws_frames")
            print(f"       -> {resp.get('status')} {json.dumps(body)[:600] if body else ''}")


if __name__ == "__main__":
    main()
