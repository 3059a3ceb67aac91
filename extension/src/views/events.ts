/**
 * Events: the newest committed events from the durable log (oldest at the
 * top, newest at the bottom), filtered by topic and principal.
 */

import { bounded, clear, debounce, describeError, formatTime, h, text } from '../dom';
import { ICommittedNotice, IEvent, IView, MAX_EVENTS, Requester } from '../tokens';

/** Events asked for per request while catching up with the log. */
const BATCH = 1000;
/** Requests at most per catch-up (the log is read oldest first). */
const MAX_BATCHES = 100;

export class EventsView implements IView {
  readonly node: HTMLElement;

  constructor(private readonly _request: Requester) {
    this._topic = h('input', {
      className: 'kernos-input',
      testid: 'kernos-events-topic',
      attrs: { type: 'search', placeholder: 'Topic', 'aria-label': 'Filter events by topic (orders.* for a prefix)' },
      title: 'Filter by topic: orders.created, or orders.* for every orders. topic'
    });
    this._principal = h('input', {
      className: 'kernos-input',
      testid: 'kernos-events-principal',
      attrs: { type: 'search', placeholder: 'Principal', 'aria-label': 'Filter events by principal' }
    });
    const reload = debounce(() => void this.refresh(), 250);
    this._topic.addEventListener('input', reload);
    this._principal.addEventListener('input', reload);
    this._list = h('ol', { className: 'kernos-events', testid: 'kernos-events' });
    this._message = h('div', { className: 'kernos-view-message' });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-events-view' },
      h('div', { className: 'kernos-toolbar' }, this._topic, this._principal),
      this._message,
      this._list
    );
  }

  /** Read the log again from the start, with the current filters. */
  async refresh(): Promise<void> {
    const generation = ++this._generation;
    this._events = [];
    this._cursor = undefined;
    await this._catchUp(generation);
  }

  async committed(notice: ICommittedNotice): Promise<void> {
    if (notice.events > 0) {
      await this._catchUp(this._generation);
    }
  }

  clear(): void {
    this._generation += 1;
    this._events = [];
    this._cursor = undefined;
    clear(this._list);
    this._message.textContent = '';
  }

  private async _catchUp(generation: number): Promise<void> {
    const topic = this._topic.value.trim() || undefined;
    const principal = this._principal.value.trim() || undefined;
    try {
      for (let batch = 0; batch < MAX_BATCHES; batch++) {
        const result = await this._request<{ events: IEvent[]; cursor: number }>('events', {
          since: this._cursor,
          topic,
          principal,
          limit: BATCH
        });
        if (generation !== this._generation) {
          return;
        }
        this._events = this._events.concat(result.events).slice(-MAX_EVENTS);
        this._cursor = result.cursor;
        if (result.events.length < BATCH) {
          break;
        }
      }
      this._message.textContent = '';
      this._draw();
    } catch (error) {
      if (generation === this._generation) {
        this._message.textContent = `Could not read events: ${describeError(error)}`;
      }
    }
  }

  private _draw(): void {
    const atBottom =
      this._list.scrollHeight - this._list.scrollTop - this._list.clientHeight < 24;
    clear(this._list);
    for (const event of this._events) {
      this._list.append(
        h(
          'li',
          {
            className: 'kernos-event',
            attrs: { 'data-seq': String(event.seq), 'data-op': text(event.op, '') },
            title: formatTime(event.at)
          },
          h('span', { className: 'kernos-event-op', text: `op ${text(event.op)}` }),
          h('span', { className: 'kernos-event-topic', text: event.topic }),
          h('span', { className: 'kernos-event-principal', text: event.principal }),
          h('span', {
            className: 'kernos-event-payload',
            text: bounded(text(event.payload, ''), 300)
          })
        )
      );
    }
    if (this._events.length === 0) {
      const filtered = this._topic.value.trim() || this._principal.value.trim();
      this._list.append(
        h('li', {
          className: 'kernos-empty',
          text: filtered ? 'No event matches the filters.' : 'No events yet.'
        })
      );
    }
    if (atBottom) {
      this._list.scrollTop = this._list.scrollHeight;
    }
  }

  private _topic: HTMLInputElement;
  private _principal: HTMLInputElement;
  private _list: HTMLOListElement;
  private _message: HTMLDivElement;
  private _events: IEvent[] = [];
  private _cursor: number | undefined = undefined;
  private _generation = 0;
}
