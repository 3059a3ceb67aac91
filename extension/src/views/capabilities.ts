/**
 * Capabilities: every agent's grants, with limits, use and revocation.
 */

import { clear, describeError, h, text } from '../dom';
import { IGrant, IView, Requester } from '../tokens';

const HEADERS = ['Principal', 'Capability', 'Limit', 'Used', 'Left', 'Revoked'];
/** Columns shown only when the sidebar is wide enough; the row's tooltip has them all. */
const WIDE = [false, false, true, true, false, true];

export class CapabilitiesView implements IView {
  readonly node: HTMLElement;

  constructor(private readonly _request: Requester) {
    this._body = h('tbody');
    this._message = h('div', { className: 'kernos-view-message' });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-capabilities-view' },
      this._message,
      h(
        'div',
        { className: 'kernos-table-wrap' },
        h(
          'table',
          { className: 'kernos-table kernos-capabilities-table', testid: 'kernos-capabilities' },
          h('thead', {}, h('tr', {}, ...HEADERS.map((label, i) =>
            h('th', { text: label, className: WIDE[i] ? 'kernos-wide' : '' })))),
          this._body
        )
      )
    );
  }

  async refresh(): Promise<void> {
    const generation = ++this._generation;
    try {
      const [agents, grants] = await Promise.all([
        this._request<{ agents: string[] }>('agents'),
        this._request<{ grants: IGrant[] }>('grants')
      ]);
      if (generation !== this._generation) {
        return;
      }
      this._message.textContent = '';
      this._draw(agents.agents, grants.grants);
    } catch (error) {
      if (generation === this._generation) {
        this._message.textContent = `Could not read grants: ${describeError(error)}`;
      }
    }
  }

  async committed(): Promise<void> {
    await this.refresh();
  }

  clear(): void {
    this._generation += 1;
    clear(this._body);
    this._message.textContent = '';
  }

  private _draw(agents: string[], grants: IGrant[]): void {
    clear(this._body);
    const granted = new Set(grants.map(grant => grant.principal));
    const sorted = [...grants].sort(
      (a, b) =>
        a.principal.localeCompare(b.principal) || a.capability.localeCompare(b.capability)
    );
    for (const grant of sorted) {
      const revoked = !grant.active;
      const row = h(
        'tr',
        {
          className: revoked ? 'kernos-revoked' : '',
          attrs: {
            'data-principal': grant.principal,
            'data-capability': grant.capability,
            'data-grant': text(grant.id, '')
          }
        },
        h('td', { text: grant.principal }),
        h('td', { text: grant.capability }),
        h('td', { className: 'kernos-numeric kernos-wide', text: grant.limit === null ? 'unlimited' : text(grant.limit) }),
        h('td', { className: 'kernos-numeric kernos-wide', text: text(grant.used) }),
        h('td', { className: 'kernos-numeric', text: text(grant.remaining) }),
        h('td', {
          className: 'kernos-wide',
          text: revoked
            ? grant.revoked_op === null || grant.revoked_op === undefined
              ? 'revoked'
              : `revoked (op ${grant.revoked_op})`
            : ''
        })
      );
      row.title =
        `${grant.principal}: ${grant.capability}, limit ` +
        `${grant.limit === null ? 'unlimited' : text(grant.limit)}, used ${text(grant.used)}, ` +
        `left ${text(grant.remaining)}${revoked ? ', revoked' : ''}`;
      row.classList.toggle('kernos-revoked', !!revoked);
      this._body.append(row);
    }
    for (const agent of agents) {
      if (!granted.has(agent)) {
        this._body.append(
          h(
            'tr',
            { className: 'kernos-no-grants', attrs: { 'data-principal': agent } },
            h('td', { text: agent }),
            h('td', { text: 'no grants', attrs: { colspan: String(HEADERS.length - 1) } })
          )
        );
      }
    }
    if (this._body.childElementCount === 0) {
      this._body.append(
        h('tr', { className: 'kernos-empty' },
          h('td', { text: 'No agents yet.', attrs: { colspan: String(HEADERS.length) } }))
      );
    }
  }

  private _body: HTMLTableSectionElement;
  private _message: HTMLDivElement;
  private _generation = 0;
}
