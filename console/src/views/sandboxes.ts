// Every sandbox, with state, labels, image, age and live CPU and memory; create one.

import { json, type Sandbox, type Stats } from "../api";
import { age, bytes, h, labels } from "../dom";
import { toast, type View } from "./view";

export const sandboxesView: View = async (root) => {
  const body = h("tbody");
  const image = h("input", { name: "image", value: "busybox", "aria-label": "image" });
  const create = h("form", { class: "inline", onsubmit: (ev) => void onCreate(ev) }, image, h("button", { type: "submit" }, "Create sandbox"));
  root.append(
    h("h1", {}, "Sandboxes"),
    create,
    h("table", { class: "list" }, h("thead", {}, h("tr", {}, ...["id", "name", "state", "image", "labels", "age", "CPU", "memory"].map((t) => h("th", {}, t)))), body),
  );
  const cpuSeen = new Map<string, [number, number]>();

  async function onCreate(ev: Event): Promise<void> {
    ev.preventDefault();
    try {
      const sb = await json<Sandbox>("POST", "/v1/sandboxes", { image: image.value || undefined, memory_mb: 256 });
      location.hash = `#/sandboxes/${encodeURIComponent(sb.id)}`;
    } catch (e) {
      toast(String((e as Error).message));
    }
  }

  async function refresh(): Promise<void> {
    const { sandboxes } = await json<{ sandboxes: Sandbox[] }>("GET", "/v1/sandboxes");
    const rows = await Promise.all(
      sandboxes.map(async (s) => {
        let cpu = "—";
        let mem = "—";
        if (s.state === "running") {
          try {
            const st = await json<Stats>("GET", `/v1/sandboxes/${encodeURIComponent(s.id)}/stats`);
            const now = performance.now() / 1000;
            const before = cpuSeen.get(s.id);
            if (before) cpu = `${Math.max(0, ((st.cpu_seconds - before[0]) / (now - before[1])) * 100).toFixed(0)} %`;
            cpuSeen.set(s.id, [st.cpu_seconds, now]);
            mem = `${bytes(st.memory_bytes)} / ${bytes(st.memory_limit_bytes)}`;
          } catch {
            // it changed state meanwhile
          }
        }
        return h(
          "tr",
          { "data-id": s.id },
          h("td", {}, h("a", { href: `#/sandboxes/${encodeURIComponent(s.id)}` }, s.id)),
          h("td", {}, s.name ?? ""),
          h("td", { class: `state ${s.state}` }, s.state),
          h("td", {}, s.image),
          h("td", {}, labels(s.labels)),
          h("td", {}, age(s.created_at)),
          h("td", { class: "cpu" }, cpu),
          h("td", { class: "mem" }, mem),
        );
      }),
    );
    body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: "8" }, "No sandboxes yet."))]));
  }

  await refresh();
  const timer = setInterval(() => void refresh().catch(() => undefined), 2000);
  return () => clearInterval(timer);
};
