/**
 * DOM helpers.  Text from the kernel is hostile (agent code chose it): it
 * only ever reaches the page through text nodes and attribute values, never
 * as markup.
 */

export interface IElementOptions {
  className?: string;
  testid?: string;
  text?: string;
  title?: string;
  attrs?: Record<string, string>;
}

/** A new element with text children (strings become text nodes). */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  options: IElementOptions = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (options.className) {
    node.className = options.className;
  }
  if (options.testid) {
    node.dataset.testid = options.testid;
  }
  if (options.text !== undefined) {
    node.textContent = options.text;
  }
  if (options.title !== undefined) {
    node.title = options.title;
  }
  for (const [name, value] of Object.entries(options.attrs ?? {})) {
    node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(child);
  }
  return node;
}

/** Remove every child of `node`. */
export function clear(node: Node): void {
  while (node.firstChild) {
    node.removeChild(node.firstChild);
  }
}

/** A value from the kernel as display text (never markup). */
export function text(value: unknown, missing = '—'): string {
  if (value === null || value === undefined || value === '') {
    return missing;
  }
  if (typeof value === 'string') {
    return value;
  }
  if (typeof value === 'number' || typeof value === 'boolean') {
    return String(value);
  }
  return bounded(safeJSON(value), 400);
}

/** At most `limit` characters of `value`, with an ellipsis when cut. */
export function bounded(value: string, limit: number): string {
  return value.length <= limit ? value : value.slice(0, limit) + '…';
}

function safeJSON(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

const UNITS = ['B', 'kB', 'MB', 'GB', 'TB'];

/** A byte count for people: 1.2 MB. */
export function formatBytes(bytes: number | null | undefined): string {
  if (typeof bytes !== 'number' || !isFinite(bytes)) {
    return '—';
  }
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : 1;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

/** An ISO timestamp as "YYYY-MM-DD HH:MM:SS". */
export function formatTime(value: string | null | undefined): string {
  if (typeof value !== 'string' || !value) {
    return '—';
  }
  return value.replace('T', ' ').slice(0, 19);
}

/** A commit's short form, as git shows it. */
export function shortCommit(commit: string | null | undefined): string {
  return typeof commit === 'string' && commit ? commit.slice(0, 7) : '—';
}

/** Run `callback` once input has paused for `wait` ms. */
export function debounce(callback: () => void, wait: number): () => void {
  let timer: number | undefined;
  return () => {
    window.clearTimeout(timer);
    timer = window.setTimeout(callback, wait);
  };
}

/** A message for a caught error (no stack traces in the panel). */
export function describeError(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return text(error, 'unknown error');
}
