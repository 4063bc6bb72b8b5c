#!/usr/bin/env python3
"""Turns benchmark JSON lines into a section of docs/BENCHMARKS.md.

Usage: report.py SECTION "COMMAND" < results.jsonl
Each input line: {"suite", "name", "value", "unit", "baseline"?, "baseline_name"?, "ratio"?,
"p99"?, "target"?}. The section between <!-- begin SECTION --> and <!-- end SECTION --> is
replaced (or appended), so each suite can be re-run on its own.
"""
import json
import os
import platform
import sys
import time

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "BENCHMARKS.md")
HEADER = "# Benchmarks\n\nEvery figure is a median measured in one run next to its baseline on the same machine;\nratios are sandfork ÷ baseline for throughput (higher is better) and for latency (lower is better), as the unit says.\nRegenerate a section with the command shown above its table.\n"


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} × {cpu}, {mem:.0f} GiB, Linux {platform.release()}"


def fmt(v):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 999.5 else f"{v:,.0f}"
    return str(v)


def table(rows) -> str:
    out = ["| benchmark | sandfork | p99 | baseline | ratio | target |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        unit = r.get("unit", "")
        base = r.get("baseline")
        # A baseline that could not be measured says why in its name.
        base_s = f"{fmt(base)} {unit} ({r.get('baseline_name', '')})" if base is not None else r.get("baseline_name", "")
        p99 = f"{fmt(r['p99'])} {unit}" if r.get("p99") is not None else ""
        out.append(f"| {r['name']} | {fmt(r['value'])} {unit} | {p99} | {base_s} | "
                   f"{fmt(r.get('ratio'))} | {r.get('target', '')} |")
    return "\n".join(out)


def main() -> None:
    section, command = sys.argv[1], sys.argv[2]
    rows = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
    if not rows:
        sys.exit(f"report.py: no results for {section}")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = (f"<!-- begin {section} -->\n## {section}\n\n`{command}` — {when}, {machine()}\n\n"
            f"{table(rows)}\n<!-- end {section} -->\n")
    text = open(DOC).read() if os.path.exists(DOC) else HEADER
    begin, end = f"<!-- begin {section} -->", f"<!-- end {section} -->\n"
    if begin in text and end in text:
        a = text.index(begin)
        b = text.index(end) + len(end)
        text = text[:a] + body + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + body
    open(DOC, "w").write(text)
    print(table(rows))


if __name__ == "__main__":
    main()
