// The console: a hash router over three views, and the login page any 401 leads to.

import "./style.css";
import { ApiError, json, setToken, token } from "./api";
import { sandboxesView } from "./views/sandboxes";
import { snapshotsView } from "./views/snapshots";
import { sandboxView } from "./views/sandbox";
import type { View } from "./views/view";

const app = document.getElementById("app")!;
const logout = document.getElementById("logout") as HTMLButtonElement;
let leave: (() => void) | undefined;

const routes: [RegExp, View][] = [
  [/^#\/?$/, sandboxesView],
  [/^#\/snapshots$/, snapshotsView],
  [/^#\/sandboxes\/([^/]+)$/, sandboxView],
];

async function route(): Promise<void> {
  leave?.();
  leave = undefined;
  app.replaceChildren();
  const hash = location.hash || "#/";
  const match = routes.map(([re, view]) => [re.exec(hash), view] as const).find(([m]) => m);
  if (!match) {
    app.textContent = "No such page.";
    return;
  }
  try {
    leave = await match[1](app, match[0]![1] ? decodeURIComponent(match[0]![1]) : undefined);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return login();
    app.replaceChildren(message(e instanceof Error ? e.message : String(e)));
  }
}

function message(text: string): HTMLElement {
  const p = document.createElement("p");
  p.className = "error";
  p.textContent = text;
  return p;
}

/** The login page: nothing of the daemon's is shown until a token is accepted. */
function login(): void {
  setToken(null);
  logout.hidden = true;
  app.innerHTML = `<form class="login"><h1>Log in</h1>
    <label>API token <input type="password" name="token" autocomplete="current-password" required></label>
    <button type="submit">Log in</button><p class="error" hidden></p></form>`;
  const form = app.querySelector("form")!;
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setToken((form.elements.namedItem("token") as HTMLInputElement).value);
    try {
      await json("GET", "/v1/sandboxes");
      logout.hidden = false;
      void route();
    } catch (e) {
      setToken(null);
      const err = form.querySelector(".error") as HTMLElement;
      err.hidden = false;
      err.textContent = e instanceof ApiError && e.status === 401 ? "That token is not accepted." : String(e);
    }
  });
}

logout.addEventListener("click", () => {
  setToken(null);
  login();
});
logout.hidden = !token();
window.addEventListener("hashchange", () => void route());
void route();
