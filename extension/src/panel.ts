/**
 * The Kernos sidebar: a status line, progress, and one tab per view of the
 * image of the active notebook's or console's kernel.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { clear, describeError, formatBytes, h, shortCommit, text } from './dom';
import { KernosSession, SessionState } from './session';
import {
  ICommittedNotice,
  IHead,
  IProgress,
  IView,
  KernosRequestError,
  Notice,
  RequestFields
} from './tokens';
import { AgentsView } from './views/agents';
import { CapabilitiesView } from './views/capabilities';
import { EventsView } from './views/events';
import { CommandRunner, HistoryView } from './views/history';
import { ObjectsView } from './views/objects';
import { PlotView } from './views/plot';

type TabName = 'objects' | 'events' | 'capabilities' | 'history' | 'plot' | 'agents';

const TABS: { name: TabName; label: string }[] = [
  { name: 'objects', label: 'Objects' },
  { name: 'events', label: 'Events' },
  { name: 'capabilities', label: 'Grants' },
  { name: 'history', label: 'History' },
  { name: 'plot', label: 'Plot' },
  { name: 'agents', label: 'Agents' }
];

/** How long a rolled-back note stays up. */
const NOTE_MS = 6000;

export class KernosPanel extends Widget {
  /**
   * `execute` runs a JupyterLab command (`app.commands.execute`): the History
   * tab's **Open** on a fork runs `kernos:open-fork`.  Without it (an inline
   * inspector), a fork is named, not opened.
   */
  constructor(execute: CommandRunner | null = null) {
    super();
    this.addClass('kernos-panel');
    const request = <T = any>(action: string, fields?: RequestFields): Promise<T> => {
      if (!this._session) {
        return Promise.reject(new KernosRequestError('disconnected', 'no kernel', action));
      }
      return this._session.request<T>(action, fields);
    };
    const report = (message: string, isError: boolean, op?: number | null) =>
      this._report(message, isError, op);
    this._views = {
      objects: new ObjectsView(request),
      events: new EventsView(request),
      capabilities: new CapabilitiesView(request),
      history: new HistoryView(request, report, execute),
      plot: new PlotView(request),
      agents: new AgentsView(request, report)
    };

    this._status = h('div', { className: 'kernos-status', testid: 'kernos-status', attrs: { role: 'status' } });
    this._progressBar = h('div', { className: 'kernos-progress-bar' });
    this._progressLabel = h('div', { className: 'kernos-progress-label' });
    this._progress = h(
      'div',
      {
        className: 'kernos-progress',
        testid: 'kernos-progress',
        attrs: { role: 'progressbar', 'aria-valuemin': '0', 'aria-valuemax': '100', 'aria-valuenow': '0' }
      },
      h('div', { className: 'kernos-progress-track' }, this._progressBar),
      this._progressLabel
    );
    this._progress.hidden = true;
    this._note = h('div', { className: 'kernos-note', testid: 'kernos-note', attrs: { 'aria-live': 'polite' } });
    this._note.hidden = true;
    this._notKernos = h('div', { className: 'kernos-not-kernos', testid: 'kernos-not-kernos' });
    this._notKernos.hidden = true;

    this._tabBar = h('div', { className: 'kernos-tabs', attrs: { role: 'tablist' } });
    this._tabButtons = new Map();
    for (const tab of TABS) {
      const button = h('button', {
        className: 'kernos-tab',
        testid: `kernos-tab-${tab.name}`,
        text: tab.label,
        attrs: { type: 'button', role: 'tab', 'aria-selected': 'false', 'data-tab': tab.name }
      });
      button.addEventListener('click', () => this._select(tab.name));
      button.title = tab.name === 'capabilities' ? 'Capabilities: who holds which grant' : tab.label;
      this._tabButtons.set(tab.name, button);
      this._tabBar.append(button);
    }
    this._viewArea = h('div', { className: 'kernos-view-area', attrs: { role: 'tabpanel' } });
    // Attached only while a Kernos kernel is connected, so that no view of a
    // previous kernel lingers in the page.
    this._body = h('div', { className: 'kernos-body' }, this._tabBar, this._viewArea);

    // The body sits in a slot that grows; progress and notes live in a footer
    // below it, so that when they come and go nothing above them moves.
    this._retry = h('button', {
      className: 'kernos-button kernos-retry',
      testid: 'kernos-retry',
      text: 'Retry',
      attrs: { type: 'button' }
    });
    this._retry.hidden = true;
    this._retry.addEventListener('click', () => this._session?.reconnect());
    this._main = h('div', { className: 'kernos-main' }, this._notKernos, this._retry);
    this.node.append(
      h(
        'div',
        { className: 'kernos-header' },
        h('h2', { className: 'kernos-title', text: 'Kernos' }),
        this._status
      ),
      this._main,
      h('div', { className: 'kernos-footer' }, this._progress, this._note)
    );
    this._select('objects');
    this._showState({ kind: 'no-kernel' });
  }

  /** Follow a notebook's or console's session (null: none is active). */
  follow(context: ISessionContext | null): void {
    if (this._session?.context === context) {
      return;
    }
    if (this._session) {
      this._session.dispose();
      this._session = null;
    }
    this._clearViews();
    this._hideProgress();
    if (!context) {
      this._showState({ kind: 'no-kernel' });
      return;
    }
    const session = new KernosSession(context);
    this._session = session;
    session.stateChanged.connect((_, state) => this._showState(state), this);
    session.noticed.connect((_, notice) => this._onNotice(notice), this);
    session.problem.connect((_, message) => this._showNote(message), this);
    this._showState(session.state);
  }

  dispose(): void {
    this._session?.dispose();
    this._session = null;
    window.clearTimeout(this._noteTimer);
    window.clearTimeout(this._progressTimer);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._refreshIfStale(this._active);
  }

  private _select(name: TabName): void {
    this._active = name;
    for (const [tab, button] of this._tabButtons) {
      const selected = tab === name;
      button.setAttribute('aria-selected', String(selected));
      button.classList.toggle('kernos-tab-active', selected);
    }
    clear(this._viewArea);
    this._viewArea.append(this._views[name].node);
    this._refreshIfStale(name);
  }

  private _refreshIfStale(name: TabName): void {
    if (!this._stale.has(name) || !this._ready || !this.isVisible) {
      return;
    }
    this._stale.delete(name);
    void this._views[name].refresh();
  }

  private _clearViews(): void {
    for (const view of Object.values(this._views) as IView[]) {
      view.clear();
    }
    this._stale = new Set(TABS.map(tab => tab.name));
  }

  private _showState(state: SessionState): void {
    const wasReady = this._ready;
    this._ready = state.kind === 'ready';
    this._notKernos.hidden = true;
    this._retry.hidden = state.kind !== 'error';
    if (this._ready) {
      this._main.append(this._body);
    } else {
      this._body.remove();
    }
    this._status.classList.remove('kernos-status-error');
    this._hold = null;
    switch (state.kind) {
      case 'no-kernel':
      case 'not-kernos': {
        this._notKernos.hidden = false;
        this._notKernos.textContent =
          state.kind === 'not-kernos'
            ? `The active kernel is not Kernos; it is “${state.name}”. Switch the notebook's ` +
              'kernel to Kernos (kernelspec “kernos”) to inspect its image.'
            : this._session === null
              ? 'No notebook or console is open. Open one that runs the Kernos kernel ' +
                '(“Kernos (Python 3)” in the launcher) to inspect its image.'
              : 'This notebook has no kernel. Choose the Kernos kernel (Kernel › Change ' +
                'Kernel…) to inspect its image.';
        this._status.textContent = '';
        this._hideProgress();
        break;
      }
      case 'checking':
      case 'connecting':
        this._status.textContent = 'Connecting to the kernel…';
        break;
      case 'restarting':
        this._status.textContent = 'The kernel is restarting…';
        break;
      case 'error':
        this._status.textContent = `Cannot inspect this kernel: ${state.message}`;
        this._status.classList.add('kernos-status-error');
        break;
      case 'ready':
        this._head = state.hello.head;
        this._showHead();
        if (!wasReady) {
          this._clearViews();
          this._refreshIfStale(this._active);
        }
        break;
    }
  }

  private _showHead(): void {
    this._status.classList.remove('kernos-status-error');
    const head = this._head;
    const op = head?.op ?? 0;
    this._status.textContent = head?.commit
      ? `op ${op} · ${shortCommit(head.commit)}`
      : `op ${op} · no snapshot yet`;
    this._status.title = head?.commit
      ? `The image is op ${op}'s snapshot, commit ${head.commit}`
      : 'No op has written a snapshot yet';
  }

  /** A message in the status line, kept until an op after `op` commits. */
  private _report(message: string, isError: boolean, op?: number | null): void {
    this._hold = op ?? this._head?.op ?? 0;
    this._status.textContent = message;
    this._status.title = message;
    this._status.classList.toggle('kernos-status-error', isError);
  }

  private _onNotice(notice: Notice): void {
    switch (notice.type) {
      case 'committed':
        this._onCommitted(notice);
        break;
      case 'rolled_back':
        this._showNote(
          `op ${text(notice.op, '?')} by ${text(notice.principal)} rolled back` +
            (notice.error ? `: ${notice.error}` : '')
        );
        // Circuits live outside the image: an op that did not commit counts
        // towards its agent's breaker, and may open it.
        this._stale.add('agents');
        if (this._active === 'agents') {
          this._refreshIfStale('agents');
        }
        break;
      case 'progress':
        this._showProgress(notice);
        break;
    }
  }

  /** Show op `op` in the History tab, its row expanded (a cell's badge asks for this). */
  showOp(op: number): void {
    this._select('history');
    const history = this._views.history as HistoryView;
    void history.reveal(op);
  }

  private _onCommitted(notice: ICommittedNotice): void {
    // An op that changed nothing wrote no snapshot: the head is still the last one's
    // (its op and commit), as `%kernos status` says.
    if (notice.commit !== this._head?.commit) {
      this._head = { op: notice.op, commit: notice.commit };
    }
    if (this._hold === null || notice.op > this._hold) {
      this._hold = null;
      this._showHead();
    }
    if (this._progressWhat === 'checkout') {
      this._hideProgress();
    }
    this._stale = new Set(TABS.map(tab => tab.name));
    if (!this._ready || !this.isVisible) {
      return;
    }
    this._stale.delete(this._active);
    const view = this._views[this._active];
    const refreshed = view.committed ? view.committed(notice) : view.refresh();
    refreshed.catch(error => this._showNote(describeError(error)));
  }

  private _showNote(message: string): void {
    this._note.textContent = message;
    this._note.title = message;
    this._note.hidden = false;
    window.clearTimeout(this._noteTimer);
    this._noteTimer = window.setTimeout(() => {
      this._note.hidden = true;
      this._note.textContent = '';
    }, NOTE_MS);
  }

  private _showProgress(progress: IProgress): void {
    window.clearTimeout(this._progressTimer);
    const total = Math.max(progress.total, 0);
    const done = Math.min(Math.max(progress.done, 0), total);
    const percent = total > 0 ? Math.floor((done / total) * 100) : 100;
    const what = progress.what === 'checkout' ? 'Checking out' : 'Restoring the image';
    this._progressWhat = progress.what;
    this._progress.hidden = false;
    this._progress.dataset.what = progress.what;
    this._progress.setAttribute('aria-valuenow', String(percent));
    this._progressBar.style.width = `${percent}%`;
    this._progressLabel.textContent =
      `${what}… ${percent}% (${formatBytes(done)} of ${formatBytes(total)})`;
    if (done >= total) {
      this._progressTimer = window.setTimeout(() => this._hideProgress(), 1500);
    }
  }

  private _hideProgress(): void {
    window.clearTimeout(this._progressTimer);
    this._progressWhat = null;
    this._progress.hidden = true;
  }

  private _session: KernosSession | null = null;
  private _views: Record<TabName, IView>;
  private _active: TabName = 'objects';
  private _stale = new Set<TabName>(TABS.map(tab => tab.name));
  private _ready = false;
  private _head: IHead | null = null;
  private _hold: number | null = null;
  private _status: HTMLDivElement;
  private _progress: HTMLDivElement;
  private _progressBar: HTMLDivElement;
  private _progressLabel: HTMLDivElement;
  private _progressWhat: string | null = null;
  private _progressTimer: number | undefined = undefined;
  private _note: HTMLDivElement;
  private _noteTimer: number | undefined = undefined;
  private _notKernos: HTMLDivElement;
  private _tabBar: HTMLDivElement;
  private _tabButtons: Map<TabName, HTMLButtonElement>;
  private _viewArea: HTMLDivElement;
  private _body: HTMLDivElement;
  private _main: HTMLDivElement;
  private _retry: HTMLButtonElement;
}
