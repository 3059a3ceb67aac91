/**
 * The History tab's parts that are not the view itself: how a row says what
 * became of an op and what it changed, and the bodies of its dialogs.
 */

import { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { formatBytes, h } from '../dom';
import { IFileChange, ISnapshot } from '../tokens';

/** An op that wrote no snapshot, in words: `read-only`, or `rolled back (failed)`. */
export function outcomeLabel(outcome: string | undefined): string {
  switch (outcome) {
    case undefined:
    case 'committed':
      return '';
    case 'read-only':
      return 'read-only';
    case 'died':
      return 'rolled back (kernel died)';
    case 'voided':
      return 'voided';
    case 'rolled back':
      return 'rolled back';
    default:
      return `rolled back (${outcome})`;
  }
}

/** A dialog body built from DOM nodes (showDialog takes a widget or a string). */
export class WidgetBody extends Widget {
  constructor(content: HTMLElement) {
    super();
    this.node.append(content);
  }
}

/** What the kernel's `fork` action made (kernos.fork.Forked). */
export interface IForked {
  dest: string;
  commit: string;
  op: number | null;
}

/** The fork dialog's body: what happens, and the new workspace's name. */
export class ForkBody extends Widget implements Dialog.IBodyWidget<string> {
  constructor(explanation: string) {
    super();
    this._input = h('input', {
      className: 'kernos-fork-name',
      testid: 'kernos-fork-name',
      attrs: { type: 'text', 'aria-label': 'Name of the new workspace', placeholder: 'name' }
    });
    this.node.append(
      h(
        'div',
        { className: 'kernos-dialog-body' },
        h('p', { text: explanation }),
        h('p', { text: "Its name: letters, digits, '.', '_' or '-'." }),
        this._input
      )
    );
  }

  getValue(): string {
    return this._input.value;
  }

  private _input: HTMLInputElement;
}

/** `+2 ~1 −1` for a row. */
export function changeParts(entry: ISnapshot): HTMLElement[] {
  const parts: HTMLElement[] = [];
  const count = (names: string[] | undefined) => userNames(names).length;
  const added = count(entry.changes?.added);
  const changed = count(entry.changes?.changed);
  const deleted = count(entry.changes?.deleted);
  if (added) {
    parts.push(h('span', { className: 'kernos-change-added', text: `+${added}` }));
  }
  if (changed) {
    parts.push(h('span', { className: 'kernos-change-changed', text: `~${changed}` }));
  }
  if (deleted) {
    parts.push(h('span', { className: 'kernos-change-deleted', text: `−${deleted}` }));
  }
  const files = fileCounts(entry);
  if (files) {
    parts.push(h('span', {
      className: 'kernos-change-files', testid: 'kernos-change-files', text: files,
      title: fileNames(entry)
    }));
  }
  if (!parts.length) {
    // A grant, an agent added, a draw from random: only the image's own names changed.
    parts.push(h('span', { className: 'kernos-change-none', text: 'internal' }));
  }
  return parts;
}

/** `added x, y · changed z` for the expanded row (the image's own names left out). */
export function changeNames(entry: ISnapshot): string {
  const said: string[] = [];
  for (const [label, names] of [
    ['added', entry.changes?.added],
    ['changed', entry.changes?.changed],
    ['deleted', entry.changes?.deleted]
  ] as [string, string[] | undefined][]) {
    const shown = userNames(names);
    if (shown.length) {
      said.push(`${label} ${shown.slice(0, 12).join(', ')}${shown.length > 12 ? ', …' : ''}`);
    }
  }
  return said.join(' · ');
}

/** The names a person bound: the image's own (`kernos:...`) left out. */
function userNames(names: string[] | undefined): string[] {
  return (names ?? []).filter(name => !name.startsWith('kernos:'));
}

/** How many files of each kind: `[+, ~, −]`, in that order. */
const FILE_KINDS: [string, string][] = [['added', '+'], ['changed', '~'], ['deleted', '−']];

/** `files +2 ~1` for a row whose op changed tracked files, else ''. */
export function fileCounts(entry: ISnapshot): string {
  const said = FILE_KINDS.map(([kind, sign]) => {
    const count = (entry.files as Record<string, string[] | undefined> | undefined)?.[kind]?.length ?? 0;
    return count ? `${sign}${count}` : '';
  }).filter(Boolean);
  return said.length ? `files ${said.join(' ')}` : '';
}

/** `+ out.csv, ~ plots/a.png` (the row's tooltip). */
function fileNames(entry: ISnapshot): string {
  const said: string[] = [];
  for (const [kind, sign] of FILE_KINDS) {
    for (const path of (entry.files as Record<string, string[] | undefined> | undefined)?.[kind] ?? []) {
      said.push(`${sign} ${path}`);
    }
  }
  return said.slice(0, 20).join('\n') + (said.length > 20 ? `\n… and ${said.length - 20} more` : '');
}

/** How many file lines an expanded row shows before folding the rest. */
export const FILES_SHOWN = 8;

/** `out.csv` and `plots/2026` for `plots/2026/out.csv` (`KEY:dir` in another tracked directory). */
function splitPath(path: string): [string, string] {
  const cut = Math.max(path.lastIndexOf('/'), path.indexOf(':'));
  return cut < 0 ? [path, ''] : [path.slice(cut + 1), path.slice(0, cut)];
}

/**
 * The expanded row's list of the files the op changed, one line each: sign, the
 * file's name then its directory (dimmed, cut with an ellipsis at narrow widths;
 * the whole path is the tooltip), and later its size and a `diff` toggle
 * (`annotateFiles`). The first FILES_SHOWN are shown, the rest folded under
 * `N more files`.
 */
export function fileList(entry: ISnapshot): HTMLElement | null {
  const items: HTMLElement[] = [];
  for (const [kind, sign] of FILE_KINDS) {
    const paths = [...((entry.files as Record<string, string[] | undefined> | undefined)?.[kind] ?? [])].sort();
    for (const path of paths) {
      const [name, directory] = splitPath(path);
      items.push(h('li', { className: `kernos-file kernos-file-${kind}`,
                           attrs: { 'data-path': path, 'data-change': kind } },
        h('span', { className: 'kernos-diff-sign', text: sign }),
        h('span', { className: 'kernos-file-path', title: `${kind}: ${path}` },
          h('span', { className: 'kernos-file-name', text: name }),
          ...(directory ? [h('span', { className: 'kernos-file-dir', text: ` ${directory}` })] : []))));
    }
  }
  if (!items.length) {
    return null;
  }
  const list = h('ul', { className: 'kernos-file-list' }, ...items.slice(0, FILES_SHOWN));
  const node = h('div', { className: 'kernos-op-files', testid: 'kernos-op-files' },
    h('div', { className: 'kernos-op-files-title', text: fileCounts(entry) }), list);
  const rest = items.slice(FILES_SHOWN);
  if (rest.length) {
    const more = h('details', { className: 'kernos-file-more' },
      h('summary', { text: `${rest.length} more file${rest.length === 1 ? '' : 's'}` }),
      h('ul', { className: 'kernos-file-list' }, ...rest));
    more.addEventListener('click', event => event.stopPropagation());
    node.append(more);
  }
  return node;
}

/** Add each file's size and, for a small text file, a `diff` toggle, from `show`. */
export function annotateFiles(node: HTMLElement, changes: IFileChange[]): void {
  const byPath = new Map(changes.map(change => [change.path, change]));
  for (const item of node.querySelectorAll<HTMLElement>('li.kernos-file')) {
    const change = byPath.get(item.dataset.path ?? '');
    if (!change || item.querySelector('.kernos-file-size')) {
      continue;
    }
    const size = change.change === 'added' ? formatBytes(change.after)
      : change.change === 'deleted' ? `was ${formatBytes(change.before)}`
        : `${formatBytes(change.before)} → ${formatBytes(change.after)}`;
    item.append(h('span', { className: 'kernos-file-size', text: size,
                            title: change.note ?? (change.diff ? '' : 'no text diff') }));
    if (change.diff) {
      const text = h('pre', { className: 'kernos-code kernos-file-diff', text: change.diff });
      text.hidden = true;
      const toggle = h('button', {
        className: 'kernos-file-diff-toggle', text: 'diff', title: `Show the diff of ${change.path}`,
        attrs: { type: 'button', 'aria-expanded': 'false' }
      });
      toggle.addEventListener('click', event => {
        event.stopPropagation();
        text.hidden = !text.hidden;
        toggle.setAttribute('aria-expanded', String(!text.hidden));
      });
      item.append(toggle, text);
    } else if (change.note) {
      item.append(h('span', { className: 'kernos-file-note', text: change.note }));
    }
  }
}
