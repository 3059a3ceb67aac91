/**
 * The History tab's parts that are not the view itself: how a row says what
 * became of an op and what it changed, and the bodies of its dialogs.
 */

import { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { h } from '../dom';
import { ISnapshot } from '../tokens';

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
