/**
 * History: the image's snapshots, a diff between two of them, checkout
 * (after the user confirms), and fork: a new workspace, named by the user,
 * made beside this one from a snapshot (`kernos fork`; the kernel checks the
 * name and makes it beside its own workspace).
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';

import { clear, describeError, formatBytes, formatTime, h, shortCommit, text } from '../dom';
import { IDiff, IDiffEntry, IShown, ISnapshot, IView, MAX_SNAPSHOTS, Requester } from '../tokens';
import {
  annotateFiles, changeNames, changeParts, fileList, ForkBody, IForked, outcomeLabel, WidgetBody
} from './history-parts';

const HEADERS = ['', 'Op', 'What'];

/** Where the view reports a checkout's outcome (the panel's status line). */
export type StatusReporter = (message: string, isError: boolean, op?: number | null) => void;

/** Runs a JupyterLab command (the panel's `app.commands.execute`), if the panel has one. */
export type CommandRunner = (command: string, args: Record<string, unknown>) => Promise<unknown>;

/** One row: a snapshot, or (`log` with `all`) an op that wrote none (commit ''). */
type IEntry = ISnapshot;

const CHECKOUT = /^checkout ([0-9a-f]{7,40})\b/;
/** A cell run as an agent, in a history written before the headline skipped the magic. */
const AGENT_CELL = /^%%agent (\S+)(?: \(\+(\d+) lines?\))?$/;
/** How many ops' code the view keeps (an op's code never changes). */
const CODE_CACHE = 100;

export class HistoryView implements IView {
  readonly node: HTMLElement;

  constructor(
    private readonly _request: Requester,
    private readonly _report: StatusReporter,
    private readonly _execute: CommandRunner | null = null
  ) {
    this._body = h('tbody');
    this._message = h('div', { className: 'kernos-view-message' });
    this._diff = h('div', { className: 'kernos-diff', testid: 'kernos-diff' });
    this._forked = h('div', { className: 'kernos-forked', testid: 'kernos-forked' });
    const hint = h('div', {
      className: 'kernos-hint',
      text: 'Click an op for its code and actions; tick two to compare them.'
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
          { className: 'kernos-table kernos-history-table', testid: 'kernos-history' },
          h('colgroup', {},
            h('col', { className: 'kernos-col-select' }),
            h('col', { className: 'kernos-col-op' }),
            h('col', {})),
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
      const result = await this._request<{ snapshots: IEntry[] }>('log', {
        limit: MAX_SNAPSHOTS,
        all: true
      });
      if (generation !== this._generation) {
        return;
      }
      this._message.textContent = '';
      // An op that wrote no snapshot has no commit: '' here.
      const entries = result.snapshots.map(entry => ({ ...entry, commit: entry.commit ?? '' }));
      const commits = new Set(entries.map(entry => entry.commit).filter(Boolean));
      this._chosen = this._chosen.filter(commit => commits.has(commit));
      this._draw(entries);
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
    this._expanded = null;
    this._code.clear();
    clear(this._body);
    clear(this._diff);
    clear(this._forked);  // a fork of the previous kernel's workspace
    this._message.textContent = '';
  }

  /** Show op `op`: expand its row and scroll it into view (a cell's badge asks for this). */
  async reveal(op: number): Promise<void> {
    this._expanded = op;
    await this.refresh();
    const row = this._body.querySelector<HTMLElement>(`tr[data-op="${op}"]`);
    row?.scrollIntoView({ block: 'nearest' });
  }

  private _draw(entries: IEntry[]): void {
    clear(this._body);
    const snapshots = entries.filter(entry => entry.commit);
    this._order = new Map(snapshots.map((snapshot, index) => [snapshot.commit, index]));
    this._opOf = new Map(snapshots.map(snapshot => [snapshot.commit, snapshot.op]));
    const head = snapshots[0]?.commit ?? null;
    // The snapshot the head checked out, if the newest snapshot is a checkout.
    const checkedOut = head ? this._checkedOutBy(snapshots[0]) : null;
    for (const entry of entries) {
      this._drawRow(entry, entry.commit !== '' && entry.commit === head,
                    checkedOut !== null && entry.commit === checkedOut);
    }
    if (entries.length === 0) {
      this._body.append(
        h('tr', { className: 'kernos-empty' },
          h('td', { text: 'No ops yet.', attrs: { colspan: String(HEADERS.length) } }))
      );
    }
  }

  /** The commit a checkout snapshot made the image equal to (its message names it). */
  private _checkedOutBy(entry: IEntry): string | null {
    const match = CHECKOUT.exec(entry.message ?? '');
    if (!match) {
      return null;
    }
    for (const commit of this._order.keys()) {
      if (commit.startsWith(match[1])) {
        return commit;
      }
    }
    return null;
  }

  /** What an op did, as a person reads it: a checkout names the op it went back to. */
  private _what(entry: IEntry): string {
    const message = entry.message ?? '';
    const match = CHECKOUT.exec(message);
    if (match) {
      for (const [commit, op] of this._opOf) {
        if (commit.startsWith(match[1])) {
          return `checkout → op ${text(op)}`;
        }
      }
    }
    const agent = AGENT_CELL.exec(message);
    if (agent) {
      const lines = Number(agent[2] ?? 0);
      return `agent code (${lines} line${lines === 1 ? '' : 's'})`;
    }
    return message;
  }

  private _drawRow(entry: IEntry, isHead: boolean, isCheckedOut: boolean): void {
    const snapshot = entry.commit !== '';
    const op = entry.op;
    const expanded = op !== null && op === this._expanded;
    const selectCell = h('td', { className: 'kernos-select-cell' });
    if (snapshot) {
      const select = h('input', {
        className: 'kernos-diff-select',
        testid: 'kernos-diff-select',
        attrs: { type: 'checkbox', 'aria-label': `Compare op ${text(op)}` },
        title: `Compare op ${text(op)} (tick two)`
      });
      select.checked = this._chosen.includes(entry.commit);
      select.addEventListener('click', event => event.stopPropagation());
      select.addEventListener('change', () => this._choose(entry.commit, select.checked));
      selectCell.append(select);
    }

    const markers = h('span', { className: 'kernos-markers' });
    if (isHead) {
      markers.append(h('span', { className: 'kernos-marker kernos-marker-head', testid: 'kernos-head',
                                 text: 'head', title: 'The image is this snapshot now' }));
    }
    if (isCheckedOut) {
      markers.append(h('span', { className: 'kernos-marker kernos-marker-checked-out',
                                 testid: 'kernos-checked-out', text: 'checked out',
                                 title: 'The head is a checkout of this snapshot' }));
    }
    const outcome = snapshot ? '' : text(entry.outcome, 'no snapshot');
    const rolledBack = !snapshot && outcome !== 'read-only';
    const changes = h('span', { className: 'kernos-changes', testid: 'kernos-changes' },
      ...changeParts(entry));
    changes.title = changeNames(entry) || 'It changed only the image’s own kernos: names';
    const meta = h('div', { className: 'kernos-row-meta' },
      h('span', { className: 'kernos-principal', text: text(entry.principal) }),
      snapshot ? changes : h('span', {
        className: 'kernos-outcome', testid: 'kernos-outcome', text: outcomeLabel(outcome),
        title: entry.error ?? ''
      }),
      markers,
      // Secondary, for wider sidebars: when, and the commit.
      h('span', { className: 'kernos-when kernos-mid', text: formatTime(entry.when).slice(11) }),
      ...(snapshot ? [h('span', { className: 'kernos-commit kernos-wide', text: shortCommit(entry.commit) })] : []));
    const what = this._what(entry);
    const row = h(
      'tr',
      {
        className: [snapshot ? '' : 'kernos-no-snapshot', rolledBack ? 'kernos-rolled-back' : '',
                    expanded ? 'kernos-selected' : ''].filter(Boolean).join(' '),
        attrs: { 'data-op': text(op, ''), 'data-commit': entry.commit ?? '',
                 'aria-expanded': String(expanded), ...(snapshot ? {} : { 'data-outcome': outcome }) },
        title: `op ${text(op)}${snapshot ? ` · ${shortCommit(entry.commit)}` : ''} · ` +
          `${text(entry.principal)} · ${formatTime(entry.when)}\nClick for its code and actions`
      },
      selectCell,
      h('td', { className: 'kernos-numeric kernos-op-cell', text: text(op) }),
      h('td', { className: 'kernos-what-cell' },
        h('div', { className: 'kernos-message', text: what }),
        meta)
    );
    row.tabIndex = 0;
    const toggle = () => {
      this._expanded = expanded ? null : op;
      void this.refresh();
    };
    row.addEventListener('click', toggle);
    row.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        toggle();
      }
    });
    this._body.append(row);
    if (expanded) {
      this._body.append(this._detail(entry, outcome));
    }
  }

  /** The expanded row: the op's full code, who and when, its outcome, and its actions. */
  private _detail(entry: IEntry, outcome: string): HTMLTableRowElement {
    const snapshot = entry.commit !== '';
    const code = h('pre', { className: 'kernos-code', testid: 'kernos-op-code', text: 'Loading…' });
    const facts = h('div', { className: 'kernos-detail-facts' },
      h('div', { text: `op ${text(entry.op)} by ${text(entry.principal)} · ${formatTime(entry.when)}` }),
      h('div', {
        testid: 'kernos-op-outcome',
        text: snapshot
          ? `committed · commit ${shortCommit(entry.commit)} · image ${formatBytes(entry.bytes ?? null)}`
          : outcome === 'read-only'
            ? 'read-only: it changed nothing, so it wrote no snapshot'
            : `${outcomeLabel(outcome)}: nothing of it was kept` + (entry.error ? ` · ${entry.error}` : '')
      }));
    const names = changeNames(entry);
    const body = h('td', { attrs: { colspan: String(HEADERS.length) } }, facts);
    if (names) {
      body.append(h('div', { className: 'kernos-detail-names', testid: 'kernos-op-names', text: names }));
    }
    const files = snapshot ? fileList(entry) : null;
    if (files) {
      body.append(files);
    }
    body.append(code);
    void this._loadCode(snapshot ? entry.commit : `@${text(entry.op, '')}`, code, files);
    if (snapshot) {
      const checkout = h('button', {
        className: 'kernos-button kernos-checkout', testid: 'kernos-checkout', text: 'Check out',
        title: `Check out op ${text(entry.op)} (${shortCommit(entry.commit)})`, attrs: { type: 'button' }
      });
      checkout.addEventListener('click', event => {
        event.stopPropagation();
        void this._checkout(entry);
      });
      const fork = h('button', {
        className: 'kernos-button kernos-fork', testid: 'kernos-fork', text: 'Fork…',
        title: `Fork op ${text(entry.op)} into a new workspace`, attrs: { type: 'button' }
      });
      fork.addEventListener('click', event => {
        event.stopPropagation();
        void this._fork(entry);
      });
      body.append(h('div', { className: 'kernos-row-actions' }, checkout, fork));
    }
    return h('tr', { className: 'kernos-history-detail', attrs: { 'data-detail-op': text(entry.op, '') } }, body);
  }

  /** `ref`'s code into `into` (and its files' sizes and diffs into `files`): a commit,
   * or `@N` for an op that wrote no snapshot. */
  private async _loadCode(ref: string, into: HTMLElement, files: HTMLElement | null = null): Promise<void> {
    let shown = this._code.get(ref);
    if (shown === undefined) {
      try {
        shown = await this._request<IShown>('show', { ref });
      } catch (error) {
        into.textContent = `Could not read the code: ${describeError(error)}`;
        return;
      }
      this._code.set(ref, shown);
      while (this._code.size > CODE_CACHE) {
        this._code.delete(this._code.keys().next().value as string);
      }
    }
    into.textContent = shown.code ? shown.code : '(no code shown: an op the runtime ran, or sealed code)';
    if (files && shown.files) {
      annotateFiles(files, shown.files);
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
        text: `op ${text(this._opOf.get(diff.a) ?? null, shortCommit(diff.a))} → op ` +
          `${text(this._opOf.get(diff.b) ?? null, shortCommit(diff.b))}`,
        title: `${shortCommit(diff.a)} → ${shortCommit(diff.b)}`
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
    // The image's own names (grants, agents, the random state) are counted, not listed.
    const mine = (entries: IDiffEntry[]) => entries.filter(entry => !entry.name.startsWith('kernos:'));
    for (const entry of mine(diff.added)) {
      add('+', 'added', entry, describe(entry));
    }
    for (const entry of mine(diff.changed)) {
      add('~', 'changed', entry, `${text(entry.before, '')} → ${text(entry.after, '')}`);
    }
    for (const entry of mine(diff.deleted)) {
      add('−', 'deleted', entry, describe(entry));
    }
    const internal = [...diff.added, ...diff.changed, ...diff.deleted].length -
      list.childElementCount;
    const files = diff.files ?? [];
    if (!list.childElementCount) {
      list.append(h('li', { className: 'kernos-empty',
                            text: files.length ? 'No differences in your names; files:' : 'No differences in your names or files.' }));
    }
    const signs: Record<string, string> = { added: '+', changed: '~', deleted: '−' };
    for (const change of files) {
      const size = change.change === 'added' ? formatBytes(change.after)
        : change.change === 'deleted' ? `was ${formatBytes(change.before)}`
          : `${formatBytes(change.before)} → ${formatBytes(change.after)}`;
      list.append(h('li', { className: `kernos-diff-${change.change} kernos-diff-file`,
                            attrs: { 'data-path': change.path, 'data-change': change.change },
                            title: change.diff ?? change.note ?? '' },
        h('span', { className: 'kernos-diff-sign', text: signs[change.change] ?? '?' }),
        h('span', { className: 'kernos-diff-name kernos-file-path', text: change.path }),
        h('span', { className: 'kernos-diff-detail', text: `file · ${size}` })));
    }
    if (internal) {
      list.append(h('li', {
        className: 'kernos-diff-internal',
        text: `and ${internal} of the image’s own kernos: name${internal === 1 ? '' : 's'}`,
        title: 'Grants, agents, their namespaces, the random state'
      }));
    }
    this._diff.append(list);
  }

  private async _checkout(snapshot: IEntry): Promise<void> {
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

  private async _fork(snapshot: IEntry): Promise<void> {
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
      clear(this._forked);
      this._forked.append(h('div', { text: `Forked op ${text(made.op)} (${short}) into ${made.dest}.` }));
      if (this._execute) {
        const open = h('button', {
          className: 'kernos-button kernos-open-fork', testid: 'kernos-open-fork', text: 'Open',
          title: 'A new notebook bound to the fork, on a Kernos kernel', attrs: { type: 'button' }
        });
        const execute = this._execute;
        open.addEventListener('click', () => {
          execute('kernos:open-fork', { path: made.dest }).catch(error =>
            this._report(`Could not open the fork: ${describeError(error)}`, true));
        });
        this._forked.append(open);
      } else {
        this._forked.append(h('div', { text: `kernos log -w ${made.dest}` }));
      }
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
  private _opOf = new Map<string, number | null>();
  private _expanded: number | null = null;
  private _code = new Map<string, IShown>();
  private _generation = 0;
  private _diffGeneration = 0;
}
