/**
 * What each cell of a notebook on a Kernos kernel did, and whether its
 * outputs still match the image.
 *
 * **Badges.**  Every executed code cell gets a one-line footer under its
 * outputs, from its execute_reply's `metadata.kernos`: "op 12 · committed",
 * "op 13 · read-only: no change", "op 14 · rolled back", "op 15 · denied,
 * rolled back".  Clicking it shows the op in the sidebar's History
 * (`kernos:show-op`).  The facts are kept in the cell's own metadata
 * (`metadata.kernos`, {@link ICellOutcome}), so a reopened notebook shows them
 * again, marked "earlier session" when the kernel that ran the cell is gone.
 *
 * **Stale markers.**  One rule: *a cell's outputs are stale once a name its
 * code reached (read or wrote) has been changed by anything but running this
 * notebook's cells* — an op from elsewhere (another client, `kernos run`, an
 * agent's loop, the sidebar), a checkout (from anywhere, this notebook's
 * `%kernos checkout` too), or a restore that lost the cell's op.  Concretely:
 *
 * - a `committed` notice (the inspector comm) for an op that is not one of
 *   this notebook's cells (its `request` is not an execute_request this
 *   notebook sent) marks the cells whose recorded `names` meet the op's
 *   changes: "x changed by op 14 (bob)";
 * - a notice with `checkout`, whoever sent it, does the same: "x, y changed
 *   by op 15 (checkout of op 3)";
 * - a cell running when the kernel died never committed: "the kernel stopped
 *   while it ran";
 * - whenever a kernel is (re)connected, cells whose op is above the last op the
 *   workspace recorded were lost with the old kernel: "kernel restored to op
 *   9; op 12 was lost"; and what changed since this notebook's newest op,
 *   while it was not looking (a diff from that op's commit to the head), marks
 *   the cells that reached it.
 *
 * Running the cell again clears its marker (its new reply replaces
 * `metadata.kernos`).  The image's own values (`kernos:agents`, an agent's
 * namespace `kernos:ns:NAME`) count only for cells that reached them by name
 * (`%kernos agent add`, `%%agent`).  Every string shown comes from the kernel or
 * the notebook file and is rendered as text only.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import type { Cell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { PanelLayout, Widget } from '@lumino/widgets';

import { KernosSession } from './session';
import { IDiff, IDiffEntry, Notice } from './tokens';

/** The cell metadata key, and the command a badge runs. */
export const CELL_METADATA_KEY = 'kernos';
export const SHOW_OP_COMMAND = 'kernos:show-op';

/** What `metadata.kernos` of a code cell holds. */
export interface ICellOutcome {
  /** The op the cell ran as (null: it got none, or it never finished). */
  op: number | null;
  /** committed, rolled back, rejected, or unfinished (the kernel stopped while it ran). */
  status: string;
  /** For a rollback: why (rolled back, interrupted, denied, vetoed, failed). */
  outcome?: string;
  /** Committed, but it changed nothing (no snapshot of its own). */
  unchanged?: boolean;
  /** Committed although its code raised (`%kernos on-error keep`). */
  failed?: boolean;
  /** The snapshot that was the image after it (for a read-only op, the one before). */
  commit?: string | null;
  /** The global names its code reached (null: any name). */
  names?: string[] | null;
  /** The Jupyter session id of the kernel process that ran it. */
  kernel?: string;
  /** Why its outputs no longer match the image (absent while they do). */
  stale?: string;
}

const LOST = new Set<Kernel.Status>(['restarting', 'autorestarting', 'dead']);
/** Requests remembered as this notebook's (a cell's notice may come after its reply). */
const REMEMBERED = 2000;

/** Read a cell's `metadata.kernos`, or null when it holds nothing usable. */
export function outcomeOf(value: unknown): ICellOutcome | null {
  if (!value || typeof value !== 'object') {
    return null;
  }
  const data = value as Record<string, unknown>;
  if (typeof data.status !== 'string') {
    return null;
  }
  const names = Array.isArray(data.names)
    ? data.names.filter((name): name is string => typeof name === 'string')
    : null;
  return {
    op: typeof data.op === 'number' ? data.op : null,
    status: data.status,
    outcome: typeof data.outcome === 'string' ? data.outcome : undefined,
    unchanged: data.unchanged === true,
    failed: data.failed === true,
    commit: typeof data.commit === 'string' ? data.commit : null,
    names,
    kernel: typeof data.kernel === 'string' ? data.kernel : undefined,
    stale: typeof data.stale === 'string' ? data.stale : undefined
  };
}

/** The facts worth keeping from an execute_reply's `metadata.kernos`. */
export function outcomeOfReply(report: Record<string, unknown>, kernel: string): ICellOutcome {
  const outcome: ICellOutcome = {
    op: typeof report.op === 'number' ? report.op : null,
    status: typeof report.status === 'string' ? report.status : 'unknown',
    kernel
  };
  if (typeof report.outcome === 'string' && report.outcome !== report.status) {
    outcome.outcome = report.outcome;
  }
  if (report.unchanged === true) {
    outcome.unchanged = true;
  }
  if (report.failed && typeof report.failed === 'object') {
    outcome.failed = true;
  }
  if (typeof report.commit === 'string') {
    outcome.commit = report.commit;
  }
  if (Array.isArray(report.names)) {
    outcome.names = report.names.filter((name): name is string => typeof name === 'string');
  } else if (report.names === null) {
    outcome.names = null;
  }
  return outcome;
}

/** "op 12 · committed", "op 14 · denied, rolled back", ... */
export function describe(outcome: ICellOutcome): string {
  const op = outcome.op === null ? '' : `op ${outcome.op} · `;
  switch (outcome.status) {
    case 'committed':
      if (outcome.failed) {
        return `${op}kept, marked failed`;
      }
      return outcome.unchanged ? `${op}read-only: no change` : `${op}committed`;
    case 'rolled back':
      return outcome.outcome && outcome.outcome !== 'rolled back' && outcome.outcome !== 'failed'
        ? `${op}${outcome.outcome}, rolled back`
        : `${op}rolled back`;
    case 'rejected':
      return 'not run: no op';
    case 'unfinished':
      return 'never committed';
    default:
      return `${op}${outcome.status}`;
  }
}

/** Whether a cell's outputs depend on the image as it was after its op. */
function holdsState(outcome: ICellOutcome): boolean {
  return outcome.status === 'committed' && outcome.op !== null;
}

const SYSTEM_PREFIX = 'kernos:';
const AGENT_NAMESPACE = 'kernos:ns:';
/** How the image's own values read to a user (as kernos.op.shown_name says them). */
const SYSTEM_NAMES: Record<string, string> = {
  'kernos:agents': 'the agents and their grants',
  'kernos:events': 'the event subscriptions',
  'kernos:effects': 'the pending effects',
  'kernos:supervisor': "the agents' loops and circuits",
  'kernos:random': "the random generators' state",
  'kernos:embeddings': 'the memory settings'
};

/**
 * The names of `changed` that the cell reached.  A cell that could reach any name
 * (`exec`, an unknown magic) reached every name of the user's namespace, not the
 * image's own values (`kernos:...`), which only the agent runtime changes and then
 * names in the cell's reach itself.
 */
export function reachedBy(outcome: ICellOutcome, changed: string[]): string[] {
  if (outcome.names === null || outcome.names === undefined) {
    return changed.filter(name => !name.startsWith(SYSTEM_PREFIX));
  }
  const reached = new Set(outcome.names);
  return changed.filter(name => reached.has(name));
}

/** A name as a user reads it: an agent's namespace is that agent's variables. */
export function shownName(name: string): string {
  if (name.startsWith(AGENT_NAMESPACE)) {
    return `${name.slice(AGENT_NAMESPACE.length)}'s variables`;
  }
  return SYSTEM_NAMES[name] ?? name;
}

/** "x", "x, y", "x, y, z and 4 more". */
export function listNames(names: string[]): string {
  const shown = names.slice(0, 3).map(shownName).join(', ');
  return names.length > 3 ? `${shown} and ${names.length - 3} more` : shown;
}

/** The footer under one code cell. */
class CellBadge extends Widget {
  constructor(private readonly _show: (op: number) => void) {
    super();
    this.addClass('kernos-cell-outcome');
    this.node.dataset.testid = 'kernos-cell-badge';
    this._button = document.createElement('button');
    this._button.className = 'kernos-cell-outcome-badge';
    this._button.type = 'button';
    this._button.addEventListener('click', () => {
      if (this._op !== null) {
        this._show(this._op);
      }
    });
    this.node.appendChild(this._button);
    this.hide();
  }

  render(outcome: ICellOutcome | null, currentKernel: string | null): void {
    const node = this.node;
    if (!outcome) {
      this._op = null;
      this.hide();
      for (const key of ['op', 'status', 'outcome', 'stale', 'earlier', 'readonly']) {
        delete node.dataset[key];
      }
      return;
    }
    this._op = outcome.op;
    const earlier =
      outcome.kernel !== undefined && currentKernel !== null && outcome.kernel !== currentKernel;
    let label = describe(outcome);
    const tips = [`${label[0].toUpperCase()}${label.slice(1)}.`];
    if (outcome.status === 'unfinished') {
      label = 'stale: never committed';
    } else if (outcome.stale) {
      label = `${outcome.op === null ? '' : `op ${outcome.op} · `}stale: ${outcome.stale}`;
    }
    if (outcome.stale) {
      tips.push(
        `Its outputs no longer match the image: ${outcome.stale}. Run it again to refresh them.`
      );
    }
    if (earlier) {
      label += ' · earlier session';
      tips.push('It ran in an earlier kernel session (the image was restored since).');
    }
    if (outcome.op !== null) {
      tips.push('Click to show the op in the Kernos history.');
    }
    this._button.textContent = label;
    this._button.title = tips.join('\n');
    this._button.disabled = outcome.op === null;
    node.dataset.op = outcome.op === null ? '' : String(outcome.op);
    node.dataset.status = outcome.status;
    node.dataset.outcome = outcome.outcome ?? '';
    node.dataset.stale = outcome.stale || outcome.status === 'unfinished' ? 'true' : 'false';
    node.dataset.earlier = earlier ? 'true' : 'false';
    node.dataset.readonly = outcome.unchanged ? 'true' : 'false';
    this.show();
  }

  private _button: HTMLButtonElement;
  private _op: number | null = null;
}

/** The badges and stale markers of one notebook. */
export class CellOutcomes {
  constructor(
    private readonly _panel: NotebookPanel,
    private readonly _show: (op: number) => void
  ) {
    const context = _panel.sessionContext;
    this._session = new KernosSession(context);
    this._session.noticed.connect((_, notice) => this._onNotice(notice), this);
    this._session.stateChanged.connect((_, state) => {
      if (state.kind === 'ready') {
        void this._reconcile();
      }
    }, this);
    context.kernelChanged.connect(this._onKernelChanged, this);
    context.statusChanged.connect(this._onStatus, this);
    this._onKernelChanged();
    const notebook = _panel.content;
    notebook.modelChanged.connect(this._watchModel, this);
    this._watchModel();
    _panel.disposed.connect(() => this.dispose());
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._kernel?.anyMessage.disconnect(this._onMessage, this);
    this._session.dispose();
    for (const badge of this._badges.values()) {
      badge.dispose();
    }
    this._badges.clear();
  }

  // -- cells and their badges ------------------------------------------------------------

  private _watchModel(): void {
    const model = this._panel.content.model;
    if (model && !this._watched.has(model)) {
      this._watched.add(model);
      model.cells.changed.connect(() => this._attachAll(), this);
    }
    this._attachAll();
  }

  /** Give every code cell widget a badge (new cells, and cells whose widget was replaced). */
  private _attachAll(): void {
    for (const cell of this._panel.content.widgets) {
      if (cell.model.type !== 'code' || this._badges.has(cell)) {
        continue;
      }
      const badge = new CellBadge(this._show);
      this._badges.set(cell, badge);
      const place = () => {
        if (cell.isDisposed || badge.isDisposed) {
          return;
        }
        const layout = cell.layout as PanelLayout;
        // Under the outputs, above the (empty) cell footer JupyterLab keeps last.
        layout.insertWidget(Math.max(layout.widgets.length - 1, 0), badge);
        this._render(cell);
      };
      void cell.ready.then(place);
      const model = cell.model; // a disposed cell has none
      const onMetadata = () => this._render(cell);
      model.metadataChanged.connect(onMetadata);
      cell.disposed.connect(() => {
        model.metadataChanged.disconnect(onMetadata);
        this._badges.delete(cell);
        badge.dispose();
      });
    }
  }

  private _render(cell: Cell): void {
    const badge = this._badges.get(cell);
    if (!badge || cell.isDisposed) {
      return;
    }
    const outcome = outcomeOf(cell.model.getMetadata(CELL_METADATA_KEY));
    badge.render(outcome, this._kernelSession);
    const stale = !!outcome && (!!outcome.stale || outcome.status === 'unfinished');
    cell.toggleClass('kernos-stale', stale);
  }

  private _renderAll(): void {
    for (const cell of this._badges.keys()) {
      this._render(cell);
    }
  }

  // -- replies -------------------------------------------------------------------------------

  private _onKernelChanged(): void {
    this._kernel?.anyMessage.disconnect(this._onMessage, this);
    this._kernel = this._panel.sessionContext.session?.kernel ?? null;
    this._kernel?.anyMessage.connect(this._onMessage, this);
  }

  private _onMessage(_: Kernel.IKernelConnection, args: Kernel.IAnyMessageArgs): void {
    const msg = args.msg;
    if (args.direction === 'send') {
      if (msg.header.msg_type === 'execute_request') {
        const cellId = (msg.metadata as Record<string, unknown>)?.cellId;
        this._remember(msg.header.msg_id, typeof cellId === 'string' ? cellId : null);
      }
      return;
    }
    const session = msg.header.session;
    if (session && session !== this._kernelSession) {
      this._kernelSession = session;
      this._renderAll();
    }
    if (msg.header.msg_type !== 'execute_reply') {
      return;
    }
    const request = (msg.parent_header as KernelMessage.IHeader | undefined)?.msg_id;
    if (!request || !this._pending.has(request)) {
      return;
    }
    const cellId = this._pending.get(request) ?? null;
    this._pending.delete(request);
    const report = (msg.metadata as Record<string, unknown>)?.kernos;
    if (!cellId) {
      return;
    }
    if (!report || typeof report !== 'object') {
      // Another kernel ran it: an earlier Kernos badge no longer describes its outputs.
      this._cell(cellId)?.deleteMetadata(CELL_METADATA_KEY);
      return;
    }
    this._write(cellId, outcomeOfReply(report as Record<string, unknown>, session));
  }

  private _remember(request: string, cellId: string | null): void {
    this._pending.set(request, cellId);
    this._cellOf.set(request, cellId);
    if (this._cellOf.size > REMEMBERED) {
      const oldest = this._cellOf.keys().next().value;
      if (oldest !== undefined) {
        this._cellOf.delete(oldest);
      }
    }
  }

  private _onStatus(_: unknown, status: Kernel.Status): void {
    if (!LOST.has(status) || this._pending.size === 0) {
      return;
    }
    // The kernel went away with these cells running (or queued): none of them committed.
    for (const cellId of this._pending.values()) {
      const cell = cellId ? this._cell(cellId) : null;
      if (!cell) {
        continue;
      }
      const before = outcomeOf(cell.getMetadata(CELL_METADATA_KEY));
      this._write(cellId!, {
        op: null,
        status: 'unfinished',
        kernel: this._kernelSession ?? before?.kernel,
        stale: 'the kernel stopped while it ran, so nothing it did was committed'
      });
    }
    this._pending.clear();
  }

  // -- stale markers -------------------------------------------------------------------------

  private _onNotice(notice: Notice): void {
    if (notice.type !== 'committed') {
      return;
    }
    const own = notice.request !== undefined && this._cellOf.has(notice.request);
    if (own && !notice.checkout) {
      return; // this notebook's own cells, run forward: the notebook's usual state
    }
    const changed = [...notice.added, ...notice.changed, ...notice.deleted];
    const except = own ? this._cellOf.get(notice.request!) ?? null : null;
    if (notice.checkout) {
      const target =
        notice.checkout.op !== null ? `op ${notice.checkout.op}` : String(notice.checkout.ref);
      this._markStale(
        changed,
        names => `${listNames(names)} changed by op ${notice.op} (checkout of ${target})`,
        except
      );
    } else {
      const who = notice.principal === 'human' ? 'human, outside this notebook' : notice.principal;
      this._markStale(changed, names => `${listNames(names)} changed by op ${notice.op} (${who})`);
    }
  }

  /** Mark the cells that reached any of `changed`, saying why (keeps an earlier reason). */
  private _markStale(
    changed: string[],
    why: (names: string[]) => string,
    except: string | null = null
  ): void {
    const model = this._panel.content.model;
    if (!model || changed.length === 0) {
      return;
    }
    for (const cell of model.cells) {
      const outcome = outcomeOf(cell.getMetadata(CELL_METADATA_KEY));
      if (!outcome || !holdsState(outcome) || outcome.stale || cell.id === except) {
        continue;
      }
      const names = reachedBy(outcome, changed);
      if (names.length) {
        this._write(cell.id, { ...outcome, stale: why(names) });
      }
    }
  }

  /** After a (re)connection: what the workspace lost with a dead kernel, or changed meanwhile. */
  private async _reconcile(): Promise<void> {
    const model = this._panel.content.model;
    if (!model) {
      return;
    }
    const generation = ++this._reconciling;
    let status: { head?: { op?: number | null; commit?: string | null }; ops?: number };
    try {
      status = await this._session.request('status');
    } catch {
      return; // the kernel has no usable workspace; its cells say why
    }
    if (generation !== this._reconciling || this._disposed) {
      return;
    }
    const recorded = typeof status.ops === 'number' ? status.ops : null;
    const headOp = status.head?.op ?? 0;
    const headCommit = status.head?.commit ?? null;
    let newest: ICellOutcome | null = null;
    for (const cell of model.cells) {
      const outcome = outcomeOf(cell.getMetadata(CELL_METADATA_KEY));
      if (!outcome || !holdsState(outcome)) {
        continue;
      }
      if (recorded !== null && outcome.op! > recorded) {
        if (!outcome.stale) {
          this._write(cell.id, {
            ...outcome,
            stale: `kernel restored to op ${headOp}; op ${outcome.op} was lost`
          });
        }
      } else if (outcome.commit && (!newest || outcome.op! > newest.op!)) {
        newest = outcome;
      }
    }
    if (!newest || !headCommit || newest.commit === headCommit || headOp <= newest.op!) {
      return;
    }
    let diff: IDiff;
    try {
      diff = await this._session.request<IDiff>('diff', { a: newest.commit!, b: headCommit });
    } catch {
      return; // that snapshot is gone (pruned, or another workspace): nothing to compare
    }
    if (generation !== this._reconciling || this._disposed) {
      return;
    }
    const names = (entries: IDiffEntry[] | undefined) => (entries ?? []).map(entry => entry.name);
    const changed = [...names(diff.added), ...names(diff.changed), ...names(diff.deleted)];
    this._markStale(
      changed,
      found => `${listNames(found)} changed after op ${newest!.op}, by ops not in this notebook`
    );
  }

  // -- metadata --------------------------------------------------------------------------------

  private _cell(cellId: string) {
    const model = this._panel.content.model;
    if (!model) {
      return null;
    }
    for (const cell of model.cells) {
      if (cell.id === cellId) {
        return cell;
      }
    }
    return null;
  }

  private _write(cellId: string, outcome: ICellOutcome): void {
    const cell = this._cell(cellId);
    if (!cell || cell.type !== 'code') {
      return;
    }
    const stored: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(outcome)) {
      if (value !== undefined && value !== false) {
        stored[key] = value;
      }
    }
    cell.setMetadata(CELL_METADATA_KEY, stored as any);
  }

  private _badges = new Map<Cell, CellBadge>();
  private _cellOf = new Map<string, string | null>();
  private _disposed = false;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _kernelSession: string | null = null;
  private _pending = new Map<string, string | null>();
  private _reconciling = 0;
  private _session: KernosSession;
  private _watched = new WeakSet<object>();
}

export const cellOutcomes: JupyterFrontEndPlugin<void> = {
  id: 'kernos-jupyterlab:cells',
  description: 'Shows what each cell did (its op) and marks outputs the image no longer matches.',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app: JupyterFrontEnd, notebooks: INotebookTracker) => {
    const show = (op: number) => {
      void app.commands.execute(SHOW_OP_COMMAND, { op });
    };
    notebooks.widgetAdded.connect((_, panel) => {
      new CellOutcomes(panel, show);
    });
  }
};
