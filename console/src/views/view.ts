// What every view is, and what it may use of the page around it.

/** A view draws into its element and returns what stops its timers and streams. */
export type View = (root: HTMLElement, param: string | undefined) => Promise<() => void>;

/** Shows a short message in the page's toast line for four seconds. */
export function toast(message: string): void {
  const el = document.getElementById("toast")!;
  el.textContent = message;
  el.hidden = false;
  setTimeout(() => (el.hidden = true), 4000);
}
