"""sandfork's side of Ray: placement of sandboxes on the cluster's nodes and the cluster's
sandbox directory, in Ray's own state store (docs/scale-out.md).

Run by the gateway as ``python3 helper.py ADDRESS NODE_IP``: a Ray driver on the
gateway's own Ray node, answering JSON lines on stdin with JSON lines on stdout, each
request ``{"id": N, "op": ..., ...}`` answered by ``{"id": N, "ok": true, "result": ...}``
or ``{"id": N, "ok": false, "error": "..."}``, several at once.

Every sandbox holds a placement group of one bundle, ``{"sandfork_slot": 1, "memory":
its memory}``, with ``STRICT_PACK`` and a soft target node: Ray reserves the slot on the
node that already caches the sandbox's snapshot when that node has room, elsewhere when it
is full, and frees it when the group is removed.
"""

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import ray
from ray.experimental import internal_kv as kv
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

SLOT = "sandfork_slot"
NAMESPACE = "sandfork"
LABEL = "sandfork.io/"

_out = threading.Lock()


def answer(msg):
    line = json.dumps(msg, separators=(",", ":"))
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def nodes(_req):
    available = ray._private.state.available_resources_per_node()
    out = []
    for n in ray.nodes():
        labels = n.get("Labels") or {}
        host = labels.get(LABEL + "api-host")
        if not host:
            continue  # a Ray node that is not a sandfork node (the gateway's own)
        node_id = n["NodeID"]
        out.append({
            "id": node_id,
            "alive": bool(n.get("Alive")),
            "ip": n.get("NodeManagerAddress"),
            "name": labels.get(LABEL + "node", node_id[:12]),
            "api": "%s://%s:%s" % (labels.get(LABEL + "api-scheme", "http"), host, labels.get(LABEL + "api-port", "7070")),
            "slots": int(n.get("Resources", {}).get(SLOT, 0)),
            "free": int(available.get(node_id, {}).get(SLOT, 0)),
        })
    return out


def place(req):
    """One placement group per sandbox; each waits up to ``timeout`` seconds for room."""
    count = int(req["count"])
    prefer = list(req.get("prefer") or [])
    bundle = {SLOT: 1.0}
    if req.get("memory_mb"):
        bundle["memory"] = float(req["memory_mb"]) * 1024 * 1024
    # Only on the nodes the gateway trusts: a Ray node that merely labels itself a sandfork
    # node gets no placement.
    only = [n for n in (req.get("only") or []) if all(c in "0123456789abcdef" for c in n)]
    if not only:
        return [{"error": "no trusted sandfork node"} for _ in range(count)]
    selector = [{"ray.io/node-id": "in(%s)" % ",".join(only)}]
    groups = []
    for i in range(count):
        target = prefer[i % len(prefer)] if prefer else None
        groups.append(placement_group([bundle], strategy="STRICT_PACK", lifetime="detached", _soft_target_node_id=target, bundle_label_selector=selector))
    out = []
    for pg in groups:
        if pg.wait(timeout_seconds=float(req.get("timeout", 10))):
            table = placement_group_table(pg)
            node = (table.get("bundles_to_node_id") or {}).get(0)
            out.append({"pg": pg.id.hex(), "node": node})
        else:
            remove_placement_group(pg)
            out.append({"error": "no node has a free sandbox slot%s" % (" and %d MiB of memory" % req["memory_mb"] if req.get("memory_mb") else "")})
    return out


def release(req):
    for h in req.get("pgs") or []:
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(h))))
        except Exception:  # already gone
            pass
    return None


def groups(_req):
    """Every detached placement group this helper made, with its node and state."""
    out = {}
    for pg_id, info in (placement_group_table() or {}).items():
        if info.get("state") == "REMOVED":
            continue
        out[pg_id] = {"state": info.get("state"), "node": (info.get("bundles_to_node_id") or {}).get(0)}
    return out


def kv_put(req):
    kv._internal_kv_put(req["key"], req["value"], overwrite=True, namespace=NAMESPACE)
    return None


def kv_get(req):
    v = kv._internal_kv_get(req["key"], namespace=NAMESPACE)
    return v.decode() if v is not None else None


def kv_del(req):
    kv._internal_kv_del(req["key"], namespace=NAMESPACE)
    return None


def kv_list(req):
    keys = kv._internal_kv_list(req.get("prefix", ""), namespace=NAMESPACE) or []
    out = {}
    for k in keys:
        v = kv._internal_kv_get(k, namespace=NAMESPACE)
        if v is not None:
            out[k.decode() if isinstance(k, bytes) else k] = v.decode()
    return out


OPS = {"nodes": nodes, "place": place, "release": release, "groups": groups,
       "kv_put": kv_put, "kv_get": kv_get, "kv_del": kv_del, "kv_list": kv_list}


def handle(req):
    try:
        op = OPS.get(req.get("op"))
        if op is None:
            raise ValueError("unknown op %r" % req.get("op"))
        answer({"id": req.get("id"), "ok": True, "result": op(req)})
    except Exception as e:  # every failure is the caller's to report
        answer({"id": req.get("id"), "ok": False, "error": "%s: %s" % (type(e).__name__, e)})


def main():
    address, node_ip = sys.argv[1], sys.argv[2]
    ray.init(address=address, _node_ip_address=node_ip, namespace=NAMESPACE,
             logging_level="ERROR", log_to_driver=False, configure_logging=False)
    answer({"id": None, "ok": True, "result": "ready"})
    pool = ThreadPoolExecutor(max_workers=16)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            answer({"id": None, "ok": False, "error": "bad request: %s" % e})
            continue
        pool.submit(handle, req)
    pool.shutdown(wait=False)


if __name__ == "__main__":
    main()
