/**
 * History: the image's snapshots, a diff between two of them, checkout
 * (after the user confirms), and fork: a new workspace, named by the user,
 * made beside this one from a snapshot (`kernos fork`; the kernel checks the
 * name and makes it beside its own workspace).
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { clear, describeError, formatBytes, formatTime, h, shortCommit, text } from '../dom';
import { IDiff, IDiffEntry, ISnapshot, IView, MAX_SNAPSHOTS, Requester } from '../tokens';

const HEADERS = ['', 'Op', '', 'Principal', 'Message', 'Size', 'When'];

/** Where the view reports a checkout's outcome (the panel's status line). */
export type StatusReporter = (message: string, isError: boolean, op?: number | null) => void;

export class HistoryView implements IView {
  readonly node: HTMLElement;

  constructor(
    private readonly _request: Requester,
    private readonly _report: StatusReporter
  ) {
    this._body = h('tbody');
    this._message = h('div', { className: 'kernos-view-message' });
    this._diff = h('div', { className: 'kernos-diff', testid: 'kernos-diff' });
    this._forked = h('div', { className: 'kernos-forked', testid: 'kernos-forked' });
    const hint = h('div', {
      className: 'kernos-hint',
      text: 'Select two snapshots to compare them.'
    });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-history-view' },
      this._message,
      h(
        'div',
        { className: 'kernos-table-wrap' },
        h(
          'table',
          { className: 'kernos-table', testid: 'kernos-history' },
          h('thead', {}, h('tr', {}, ...HEADERS.map(label => h('th', { text: label })))),
          this._body
        )
      ),
      hint,
      this._diff,
      this._forked
    );
  }

  async refresh(): Promise<void> {
    const generation = ++this._generation;
    try {
      const result = await this._request<{ snapshots: ISnapshot[] }>('log', {
        limit: MAX_SNAPSHOTS
      });
      if (generation !== this._generation) {
        return;
      }
      this._message.textContent = '';
      const commits = new Set(result.snapshots.map(snapshot => snapshot.commit));
      this._chosen = this._chosen.filter(commit => commits.has(commit));
      this._draw(result.snapshots);
    } catch (error) {
      if (generation === this._generation) {
        this._message.textContent = `Could not read the history: ${describeError(error)}`;
      }
    }
  }

  async committed(): Promise<void> {
    await this.refresh();
  }

  clear(): void {
    this._generation += 1;
    this._chosen = [];
    clear(this._body);
    clear(this._diff);
    this._message.textContent = '';
  }

  private _draw(snapshots: ISnapshot[]): void {
    clear(this._body);
    this._order = new Map(snapshots.map((snapshot, index) => [snapshot.commit, index]));
    for (const snapshot of snapshots) {
      const select = h('input', {
        className: 'kernos-diff-select',
        testid: 'kernos-diff-select',
        attrs: { type: 'checkbox', 'aria-label': `Compare op ${text(snapshot.op)}` }
      });
      select.checked = this._chosen.includes(snapshot.commit);
      select.addEventListener('change', () => this._choose(snapshot.commit, select.checked));
      const checkout = h('button', {
        className: 'kernos-button kernos-checkout',
        testid: 'kernos-checkout',
        text: 'Check out',
        title: `Check out op ${text(snapshot.op)} (${shortCommit(snapshot.commit)})`,
        attrs: { type: 'button' }
      });
      checkout.addEventListener('click', event => {
        event.stopPropagation();
        void this._checkout(snapshot);
      });
      const fork = h('button', {
        className: 'kernos-button kernos-fork',
        testid: 'kernos-fork',
        text: 'Fork',
        title: `Fork op ${text(snapshot.op)} (${shortCommit(snapshot.commit)}) into a new workspace`,
        attrs: { type: 'button' }
      });
      fork.addEventListener('click', event => {
        event.stopPropagation();
        void this._fork(snapshot);
      });
      const bytes = snapshot.bytes;
      this._body.append(
        h(
          'tr',
          { attrs: { 'data-op': text(snapshot.op, ''), 'data-commit': snapshot.commit } },
          h('td', {}, select),
          h('td', { className: 'kernos-numeric', text: text(snapshot.op) }),
          h('td', { className: 'kernos-row-actions' }, checkout, fork),
          h('td', { text: text(snapshot.principal) }),
          h('td', { className: 'kernos-message', text: text(snapshot.message, ''), title: shortCommit(snapshot.commit) }),
          h('td', {
            className: 'kernos-numeric',
            text: formatBytes(bytes),
            title: typeof bytes === 'number' ? `${bytes} bytes` : ''
          }),
          h('td', { text: formatTime(snapshot.when) })
        )
      );
    }
    if (snapshots.length === 0) {
      this._body.append(
        h('tr', { className: 'kernos-empty' },
          h('td', { text: 'No snapshots yet.', attrs: { colspan: String(HEADERS.length) } }))
      );
    }
  }

  /** Keep the two most recently chosen snapshots; diff them when there are two. */
  private _choose(commit: string, chosen: boolean): void {
    this._chosen = this._chosen.filter(other => other !== commit);
    if (chosen) {
      this._chosen.push(commit);
    }
    while (this._chosen.length > 2) {
      this._chosen.shift();
    }
    for (const box of this._body.querySelectorAll<HTMLInputElement>('input.kernos-diff-select')) {
      const row = box.closest('tr');
      box.checked = !!row && this._chosen.includes(row.dataset.commit ?? '');
    }
    if (this._chosen.length === 2) {
      void this._showDiff();
    } else {
      this._diffGeneration += 1;
      clear(this._diff);
    }
  }

  private async _showDiff(): Promise<void> {
    const generation = ++this._diffGeneration;
    // Older first (the log is newest first, so the larger index is older).
    const [a, b] = [...this._chosen].sort(
      (x, y) => (this._order.get(y) ?? 0) - (this._order.get(x) ?? 0)
    );
    clear(this._diff);
    this._diff.append(h('div', { className: 'kernos-hint', text: 'Comparing…' }));
    try {
      const diff = await this._request<IDiff>('diff', { a, b });
      if (generation !== this._diffGeneration) {
        return;
      }
      this._drawDiff(diff);
    } catch (error) {
      if (generation === this._diffGeneration) {
        clear(this._diff);
        this._diff.append(
          h('div', { className: 'kernos-error', text: `Could not compare: ${describeError(error)}` })
        );
      }
    }
  }

  private _drawDiff(diff: IDiff): void {
    clear(this._diff);
    this._diff.append(
      h('div', {
        className: 'kernos-diff-title',
        text: `${shortCommit(diff.a)} → ${shortCommit(diff.b)}`
      })
    );
    const list = h('ul', { className: 'kernos-diff-list' });
    const add = (sign: string, kind: string, entry: IDiffEntry, detail: string) => {
      list.append(
        h(
          'li',
          { className: `kernos-diff-${kind}`, attrs: { 'data-name': entry.name, 'data-change': kind } },
          h('span', { className: 'kernos-diff-sign', text: sign }),
          h('span', { className: 'kernos-diff-name', text: entry.name }),
          h('span', { className: 'kernos-diff-detail', text: detail })
        )
      );
    };
    // A summary usually names the type already; show the type alone otherwise.
    const describe = (entry: IDiffEntry) => text(entry.summary || entry.type);
    for (const entry of diff.added) {
      add('+', 'added', entry, describe(entry));
    }
    for (const entry of diff.changed) {
      add('~', 'changed', entry, `${text(entry.before, '')} → ${text(entry.after, '')}`);
    }
    for (const entry of diff.deleted) {
      add('−', 'deleted', entry, describe(entry));
    }
    if (!list.childElementCount) {
      list.append(h('li', { className: 'kernos-empty', text: 'No differences.' }));
    }
    this._diff.append(list);
  }

  private async _checkout(snapshot: ISnapshot): Promise<void> {
    const short = shortCommit(snapshot.commit);
    const body = h(
      'div',
      { className: 'kernos-dialog-body' },
      h('p', {
        text:
          `Check out op ${text(snapshot.op)} (${short})? The image goes back to that ` +
          'snapshot as a new op; history is kept, so you can check out the current head again.'
      }),
      h('p', { className: 'kernos-message', text: text(snapshot.message, '') })
    );
    const result = await showDialog({
      title: 'Check out snapshot',
      body: new WidgetBody(body),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Check out' })]
    });
    if (!result.button.accept) {
      return;
    }
    this._report(`Checking out op ${text(snapshot.op)} (${short})…`, false);
    try {
      const outcome = await this._request<any>('checkout', { ref: snapshot.commit });
      const checkedOut = outcome?.checkout ?? {};
      if (outcome?.status === 'committed') {
        const names = Array.isArray(checkedOut.names) ? checkedOut.names.length : checkedOut.names;
        this._report(
          `op ${text(outcome.op)} · ${shortCommit(outcome.commit)} · checked out op ` +
            `${text(checkedOut.op ?? snapshot.op)} (${shortCommit(checkedOut.commit ?? snapshot.commit)})` +
            (names !== undefined ? `, ${text(names)} names` : ''),
          false,
          typeof outcome.op === 'number' ? outcome.op : null
        );
      } else {
        const why = outcome?.error?.message ?? outcome?.status ?? 'unknown outcome';
        this._report(`Checkout of ${short} did not commit: ${text(why)}`, true);
      }
    } catch (error) {
      this._report(`Checkout of ${short} failed: ${describeError(error)}`, true);
    }
  }

  private async _fork(snapshot: ISnapshot): Promise<void> {
    const short = shortCommit(snapshot.commit);
    const body = new ForkBody(
      `Make a new workspace from op ${text(snapshot.op)} (${short}), beside this one. ` +
        'It shares this history and starts with its own audit chain; this image is not changed.'
    );
    const result = await showDialog({
      title: 'Fork snapshot',
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Fork' })],
      focusNodeSelector: 'input'
    });
    const name = (result.value ?? '').trim();
    if (!result.button.accept || !name) {
      return;
    }
    this._report(`Forking op ${text(snapshot.op)} (${short}) into ${name}…`, false);
    try {
      const made = await this._request<IForked>('fork', { ref: snapshot.commit, dest: name });
      const open = `KERNOS_WORKSPACE=${made.dest}`;
      clear(this._forked);
      this._forked.append(
        h('div', { text: `Forked op ${text(made.op)} (${short}) into ${made.dest}.` }),
        h('div', { text: 'Open it with a kernel started with ' }, h('code', { text: open }))
      );
      this._report(`Forked op ${text(made.op)} (${short}) into ${made.dest}`, false);
    } catch (error) {
      this._report(`Fork of ${short} failed: ${describeError(error)}`, true);
    }
  }

  private _body: HTMLTableSectionElement;
  private _message: HTMLDivElement;
  private _diff: HTMLDivElement;
  private _forked: HTMLDivElement;
  private _chosen: string[] = [];
  private _order = new Map<string, number>();
  private _generation = 0;
  private _diffGeneration = 0;
}

/** A dialog body built from DOM nodes (showDialog takes a widget or a string). */
class WidgetBody extends Widget {
  constructor(content: HTMLElement) {
    super();
    this.node.append(content);
  }
}

/** What the kernel's `fork` action made (kernos.fork.Forked). */
interface IForked {
  dest: string;
  commit: string;
  op: number | null;
}

/** The fork dialog's body: what happens, and the new workspace's name. */
class ForkBody extends Widget implements Dialog.IBodyWidget<string> {
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
