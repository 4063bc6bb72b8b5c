// Snapshots as a lineage graph: which sandbox each checkpoint came from, and which
// sandboxes were restored or forked from it, drawn in generations left to right.

import { json, type Sandbox, type Snapshot } from "../api";
import { bytes, h } from "../dom";
import type { View } from "./view";

const SVG = "http://www.w3.org/2000/svg";
const W = 190;
const H = 44;
const GAP_X = 70;
const GAP_Y = 16;

interface Node {
  id: string;
  kind: "sandbox" | "snapshot";
  title: string;
  detail: string;
  parents: string[];
  href?: string;
}

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text?: string): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

/** The nodes of the lineage: sandboxes (live and ended) and snapshots, with their parents. */
export function lineage(sandboxes: Sandbox[], snapshots: Snapshot[]): Node[] {
  const known = new Set([...sandboxes.map((s) => s.id), ...snapshots.map((s) => s.id)]);
  const nodes: Node[] = snapshots.map((s) => ({
    id: s.id,
    kind: "snapshot",
    title: s.name ? `${s.name} (${s.type})` : `${s.id} (${s.type})`,
    detail: bytes(s.size_bytes),
    parents: s.source_sandbox_id && known.has(s.source_sandbox_id) ? [s.source_sandbox_id] : [],
  }));
  for (const s of sandboxes) {
    const parent = s.fork?.parent_snapshot_id ?? s.snapshot_id;
    nodes.push({
      id: s.id,
      kind: "sandbox",
      title: s.name ?? s.id,
      detail: s.fork ? `fork #${s.fork.index} · ${s.state}` : s.state,
      parents: parent && known.has(parent) ? [parent] : [],
      href: `#/sandboxes/${encodeURIComponent(s.id)}`,
    });
  }
  return nodes;
}

/** Lays the nodes out in generations (a node one column right of its parent). */
function draw(nodes: Node[]): SVGSVGElement {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const depth = new Map<string, number>();
  const depthOf = (n: Node, seen = new Set<string>()): number => {
    if (depth.has(n.id)) return depth.get(n.id)!;
    seen.add(n.id);
    const parent = n.parents.map((p) => byId.get(p)).find((p) => p && !seen.has(p.id));
    const d = parent ? depthOf(parent, seen) + 1 : 0;
    depth.set(n.id, d);
    return d;
  };
  nodes.forEach((n) => depthOf(n));
  // Only what belongs to a lineage: a snapshot, or a sandbox with a parent or a child.
  const hasChild = new Set(nodes.flatMap((n) => n.parents));
  const shown = nodes.filter((n) => n.kind === "snapshot" || n.parents.length || hasChild.has(n.id));
  const columns = new Map<number, Node[]>();
  for (const n of shown) columns.set(depth.get(n.id)!, [...(columns.get(depth.get(n.id)!) ?? []), n]);
  const pos = new Map<string, [number, number]>();
  for (const [d, col] of columns) col.forEach((n, i) => pos.set(n.id, [d * (W + GAP_X) + 10, i * (H + GAP_Y) + 10]));
  const width = Math.max(1, ...[...columns.keys()].map((d) => d + 1)) * (W + GAP_X);
  const height = Math.max(1, ...[...columns.values()].map((c) => c.length)) * (H + GAP_Y) + 20;
  const root = svg("svg", { class: "lineage", width, height, viewBox: `0 0 ${width} ${height}` });
  for (const n of shown) {
    for (const p of n.parents) {
      const from = pos.get(p);
      const to = pos.get(n.id)!;
      if (!from) continue;
      const [x1, y1, x2, y2] = [from[0] + W, from[1] + H / 2, to[0], to[1] + H / 2];
      root.append(svg("path", { class: "edge", d: `M${x1},${y1} C${x1 + GAP_X / 2},${y1} ${x2 - GAP_X / 2},${y2} ${x2},${y2}`, "data-from": p, "data-to": n.id }));
    }
  }
  for (const n of shown) {
    const [x, y] = pos.get(n.id)!;
    const g = svg("g", { class: `node ${n.kind}`, "data-id": n.id, transform: `translate(${x},${y})` });
    g.append(svg("rect", { width: W, height: H, rx: n.kind === "snapshot" ? 18 : 4 }));
    g.append(svg("text", { x: 10, y: 18 }, n.title.length > 26 ? n.title.slice(0, 25) + "…" : n.title));
    g.append(svg("text", { x: 10, y: 35, class: "detail" }, n.detail));
    if (n.href) {
      const a = svg("a", { href: n.href });
      a.append(g);
      root.append(a);
    } else root.append(g);
  }
  return root;
}

export const snapshotsView: View = async (root) => {
  const holder = h("div", { class: "graph" });
  root.append(h("h1", {}, "Snapshots"), holder);
  async function refresh(): Promise<void> {
    const [live, ended, snaps] = await Promise.all([
      json<{ sandboxes: Sandbox[] }>("GET", "/v1/sandboxes"),
      json<{ sandboxes: Sandbox[] }>("GET", "/v1/sandboxes?state=terminated"),
      json<{ snapshots: Snapshot[] }>("GET", "/v1/snapshots"),
    ]);
    // An ended sandbox is drawn only where a snapshot came from it: the rest (forks that
    // ran and went) would bury the lineage under dead ends.
    const sources = new Set(snaps.snapshots.map((s) => s.source_sandbox_id));
    const kept = ended.sandboxes.filter((s) => sources.has(s.id));
    const hidden = ended.sandboxes.length - kept.length;
    const nodes = lineage([...live.sandboxes, ...kept], snaps.snapshots);
    const note = hidden ? h("p", { class: "muted" }, `${hidden} ended sandbox${hidden === 1 ? "" : "es"} that made no snapshot not shown.`) : "";
    holder.replaceChildren(snaps.snapshots.length ? draw(nodes) : h("p", {}, "No snapshots yet: checkpoint a sandbox from its page."), note);
  }
  await refresh();
  const timer = setInterval(() => void refresh().catch(() => undefined), 2000);
  return () => clearInterval(timer);
};
