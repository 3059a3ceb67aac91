/**
 * Agents: every agent's loop (pause, resume, stop), its circuit breaker
 * (policy, why it is open, reset) and the memory index (counts per layer, and
 * a search: recall as the human or as a chosen agent).  The buttons send the
 * kernel's `loop` (pause, resume, stop) and `reset` actions, each an op by `human`;
 * their committed notice refreshes this view.  Every string shown came from
 * agent code: it only ever becomes text.  A loop shows what its last committed
 * iteration printed; a reset offers "restore" only for an agent with a
 * checkpoint tagged safe (the `circuit` action's `safe`).
 */

import { clear, describeError, h, text } from '../dom';
import { ICircuit, ILoop, IMemory, IMemoryStats, ITrip, IView, Requester } from '../tokens';
import { StatusReporter } from './history';

// Three columns each: the sidebar is narrow, and the buttons must stay in view.
const LOOP_HEADERS = ['Agent', 'Loop', ''];
const CIRCUIT_HEADERS = ['Agent', 'Circuit', ''];
const MEMORY_HEADERS = ['Memory', 'Text'];
const RECALL_K = 10;

export class AgentsView implements IView {
  readonly node: HTMLElement;

  constructor(
    private readonly _request: Requester,
    private readonly _report: StatusReporter
  ) {
    this._loops = h('tbody');
    this._circuits = h('tbody');
    this._results = h('tbody');
    this._message = h('div', { className: 'kernos-view-message' });
    this._counts = h('div', { className: 'kernos-memory-counts', testid: 'kernos-memory-counts' });
    this._query = h('input', {
      className: 'kernos-memory-query',
      testid: 'kernos-memory-query',
      attrs: { type: 'search', 'aria-label': 'Recall', placeholder: 'words to recall…' }
    });
    this._as = h('select', {
      className: 'kernos-memory-as',
      testid: 'kernos-memory-as',
      attrs: { 'aria-label': 'Recall as' }
    });
    this._as.append(h('option', { text: 'human', attrs: { value: 'human' } }));
    const search = h('button', {
      className: 'kernos-button',
      testid: 'kernos-memory-search',
      text: 'Search',
      attrs: { type: 'button' }
    });
    search.addEventListener('click', () => void this._search());
    this._query.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        void this._search();
      }
    });
    this._found = h('div', { className: 'kernos-view-message', testid: 'kernos-memory-found' });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-agents-view' },
      this._message,
      h('h3', { className: 'kernos-section', text: 'Loops' }),
      table('kernos-loops', LOOP_HEADERS, this._loops),
      h('h3', { className: 'kernos-section', text: 'Circuits' }),
      table('kernos-circuits', CIRCUIT_HEADERS, this._circuits),
      h('h3', { className: 'kernos-section', text: 'Memory' }),
      this._counts,
      h('div', { className: 'kernos-memory-search' }, this._query, this._as, search),
      this._found,
      table('kernos-memory-results', MEMORY_HEADERS, this._results)
    );
  }

  async refresh(): Promise<void> {
    const generation = ++this._generation;
    try {
      const [loops, trips, memory] = await Promise.all([
        this._request<{ loops: ILoop[] }>('loop', { do: 'status' }),
        this._request<{ circuits: Record<string, ITrip | null>; safe?: Record<string, number | null> }>(
          'circuit'
        ),
        this._request<IMemoryStats>('memory', { command: 'stats' })
      ]);
      const agents = Object.keys(trips.circuits ?? {}).sort();
      const policies = await Promise.all(
        agents.map(agent => this._request<{ policy: ICircuit['policy'] }>('policy', { agent }))
      );
      if (generation !== this._generation) {
        return;
      }
      const circuits: ICircuit[] = agents.map((agent, index) => ({
        agent,
        policy: policies[index].policy ?? {},
        circuit: trips.circuits[agent] ?? null,
        safe: trips.safe?.[agent] ?? null
      }));
      this._message.textContent = '';
      this._drawLoops(loops.loops, circuits);
      this._drawCircuits(circuits);
      this._drawCounts(memory.entries);
    } catch (error) {
      if (generation === this._generation) {
        this._message.textContent = `Could not read loops, circuits or memory: ${describeError(error)}`;
      }
    }
    if (this._searched) {
      await this._search();
    }
  }

  async committed(): Promise<void> {
    await this.refresh();
  }

  clear(): void {
    this._generation += 1;
    this._searchGeneration += 1;
    this._searched = false;
    for (const node of [this._loops, this._circuits, this._results, this._counts]) {
      clear(node);
    }
    this._message.textContent = '';
    this._found.textContent = '';
  }

  private _drawLoops(loops: ILoop[], circuits: ICircuit[]): void {
    clear(this._loops);
    // A loop is tripped when its agent's circuit is open (the circuit is not in the image).
    const trips = new Map(circuits.map(entry => [entry.agent, entry.circuit ?? null]));
    for (const loop of loops) {
      const trip = trips.get(loop.agent) ?? null;
      const tripped = trip !== null;
      const live = loop.status === 'running' || loop.status === 'paused';
      const actions = h('td', { className: 'kernos-row-actions' });
      if (live) {
        if (loop.status === 'running') {
          actions.append(this._button('Pause', 'kernos-loop-pause', loop.agent, () =>
            this._setLoop(loop.agent, 'pause')));
        } else {
          actions.append(this._button('Resume', 'kernos-loop-resume', loop.agent, () =>
            this._setLoop(loop.agent, 'resume')));
        }
        actions.append(this._button('Stop', 'kernos-loop-stop', loop.agent, () =>
          this._setLoop(loop.agent, 'stop')));
      }
      this._loops.append(
        h(
          'tr',
          {
            className: tripped ? 'kernos-tripped' : '',
            attrs: { 'data-agent': loop.agent, 'data-status': loop.status, 'data-tripped': String(tripped) }
          },
          h('td', { text: loop.agent }),
          h(
            'td',
            {},
            h('strong', {
              className: 'kernos-loop-status',
              text: tripped ? `${loop.status}, tripped (${text(trip?.policy)})` : text(loop.status)
            }),
            h('div', {
              className: 'kernos-hint kernos-loop-figures',
              text: `iteration ${text(loop.iteration)} · ${text(loop.pending)} pending · last op ${text(loop.last_op)}`
            }),
            h('div', { className: 'kernos-loop-reason', text: text(loop.reason ?? trip?.message, '') }),
            ...(loop.output
              ? [
                  h('pre', {
                    className: 'kernos-loop-output',
                    testid: 'kernos-loop-output',
                    text: loop.output.text + (loop.output.cut ? `\n[cut: ${text(loop.output.cut)} more characters]` : ''),
                    attrs: { 'aria-label': `${loop.agent}'s last output (op ${text(loop.output.op)})` }
                  })
                ]
              : [])
          ),
          actions
        )
      );
    }
    if (!loops.length) {
      this._loops.append(empty('No loops: start one with agents.loop(NAME, step).', LOOP_HEADERS.length));
    }
  }

  private _drawCircuits(circuits: ICircuit[]): void {
    clear(this._circuits);
    const chosen = this._as.value;
    clear(this._as);
    this._as.append(h('option', { text: 'human', attrs: { value: 'human' } }));
    for (const entry of circuits) {
      this._as.append(h('option', { text: entry.agent, attrs: { value: entry.agent } }));
      const trip = entry.circuit;
      const policy = Object.entries(entry.policy ?? {})
        .map(([name, value]) => `${name}=${text(value)}`)
        .join(', ');
      const actions = h('td', { className: 'kernos-row-actions' });
      if (trip) {
        const safe = entry.safe;
        const restore = h('input', {
          testid: 'kernos-circuit-restore',
          attrs: { type: 'checkbox', 'aria-label': `restore ${entry.agent}'s safe checkpoint` }
        });
        // No checkpoint tagged safe: nothing to restore, so the box cannot be ticked.
        restore.disabled = safe === null;
        actions.append(
          this._button('Reset', 'kernos-circuit-reset', entry.agent, () =>
            this._reset(entry.agent, restore.checked && !restore.disabled)),
          h(
            'label',
            {
              className: 'kernos-restore',
              title:
                safe === null
                  ? `${entry.agent} has no checkpoint tagged safe: agents.checkpoint(NAME, safe=True) takes one`
                  : `put the namespace back to its safe checkpoint (op ${safe})`
            },
            restore,
            safe === null ? 'restore (none)' : `restore op ${safe}`
          )
        );
      }
      this._circuits.append(
        h(
          'tr',
          { className: trip ? 'kernos-tripped' : '', attrs: { 'data-agent': entry.agent, 'data-open': String(!!trip) } },
          h('td', { text: entry.agent }),
          h(
            'td',
            { className: 'kernos-circuit-state' },
            h('strong', { text: trip ? `open: ${text(trip.policy)}` : 'closed' }),
            h('div', { className: 'kernos-hint', text: `policy: ${policy || 'none'}` }),
            ...(trip
              ? [
                  h('div', { className: 'kernos-circuit-message', text: text(trip.message) }),
                  h('div', { className: 'kernos-hint', text: text(trip.figures) })
                ]
              : [])
          ),
          actions
        )
      );
    }
    if ([...this._as.options].some(option => option.value === chosen)) {
      this._as.value = chosen;
    }
    if (!circuits.length) {
      this._circuits.append(empty('No agents yet.', CIRCUIT_HEADERS.length));
    }
  }

  private _drawCounts(counts: Record<string, number>): void {
    this._counts.textContent =
      'Entries: ' +
      ['working', 'episodic', 'semantic'].map(kind => `${kind} ${text(counts?.[kind] ?? 0)}`).join(', ');
  }

  private async _search(): Promise<void> {
    const query = this._query.value.trim();
    const generation = ++this._searchGeneration;
    if (!query) {
      this._searched = false;
      clear(this._results);
      this._found.textContent = '';
      return;
    }
    this._searched = true;
    const principal = this._as.value || 'human';
    try {
      const found = await this._request<{ memories: IMemory[] }>('recall', {
        query,
        principal,
        k: RECALL_K
      });
      if (generation !== this._searchGeneration) {
        return;
      }
      clear(this._results);
      const results = found.memories ?? [];
      this._found.textContent = results.length
        ? `${results.length} recalled as ${principal}`
        : `Nothing that ${principal} may read matches.`;
      for (const memory of results) {
        this._results.append(
          h(
            'tr',
            { attrs: { 'data-kind': memory.kind } },
            h(
              'td',
              {},
              h('strong', { text: memory.title }),
              h('div', {
                className: 'kernos-hint',
                text: [memory.kind, memory.op === null || memory.op === undefined ? '' : `op ${memory.op}`,
                  memory.principal].filter(part => part).join(' · ')
              })
            ),
            h('td', { className: 'kernos-memory-text', text: memory.text, title: memory.text })
          )
        );
      }
    } catch (error) {
      if (generation === this._searchGeneration) {
        clear(this._results);
        this._found.textContent = `Recall as ${principal} refused: ${describeError(error)}`;
      }
    }
  }

  private _button(label: string, testid: string, agent: string, act: () => Promise<void>): HTMLButtonElement {
    const button = h('button', {
      className: 'kernos-button',
      testid,
      text: label,
      attrs: { type: 'button', 'aria-label': `${label} ${agent}` }
    });
    button.addEventListener('click', () => {
      button.disabled = true;
      void act().finally(() => {
        button.disabled = false;
      });
    });
    return button;
  }

  private async _setLoop(agent: string, what: 'pause' | 'resume' | 'stop'): Promise<void> {
    try {
      const done = await this._request<{ loop: ILoop; op: number }>('loop', { do: what, agent });
      this._report(`${agent}'s loop is ${text(done.loop?.status)} (op ${text(done.op)})`, false, done.op);
    } catch (error) {
      this._report(`Could not ${what} ${agent}'s loop: ${describeError(error)}`, true);
    }
  }

  private async _reset(agent: string, restore: boolean): Promise<void> {
    try {
      const done = await this._request<{ restored_from: number | null; op: number }>('reset', {
        agent,
        restore
      });
      const restored = done.restored_from;
      this._report(
        `${agent}'s circuit is closed (op ${text(done.op)})` +
          (restored !== null && restored !== undefined ? `; its namespace is back to op ${restored}` : ''),
        false,
        done.op
      );
    } catch (error) {
      this._report(`Could not reset ${agent}'s circuit: ${describeError(error)}`, true);
    }
  }

  private _loops: HTMLTableSectionElement;
  private _circuits: HTMLTableSectionElement;
  private _results: HTMLTableSectionElement;
  private _message: HTMLDivElement;
  private _counts: HTMLDivElement;
  private _query: HTMLInputElement;
  private _as: HTMLSelectElement;
  private _found: HTMLDivElement;
  private _searched = false;
  private _generation = 0;
  private _searchGeneration = 0;
}

function table(testid: string, headers: string[], body: HTMLTableSectionElement): HTMLElement {
  return h(
    'div',
    { className: 'kernos-table-wrap' },
    h(
      'table',
      { className: 'kernos-table', testid },
      h('thead', {}, h('tr', {}, ...headers.map(label => h('th', { text: label })))),
      body
    )
  );
}

function empty(message: string, columns: number): HTMLTableRowElement {
  return h('tr', { className: 'kernos-empty' }, h('td', { text: message, attrs: { colspan: String(columns) } }));
}
