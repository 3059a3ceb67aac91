/**
 * Objects: the image's names, filtered, sorted and paged by the kernel, with
 * a bounded preview of the selected one.
 */

import { clear, debounce, describeError, formatBytes, formatTime, h, text } from '../dom';
import {
  ICommittedNotice,
  IObjectDetail,
  IObjectRow,
  IView,
  PAGE_SIZE,
  PREVIEW_BYTES,
  Requester
} from '../tokens';

interface IColumn {
  key: string;
  label: string;
  cell: (row: IObjectRow) => string;
  numeric?: boolean;
  /** Shown only when the sidebar is wide enough (style/base.css, `kernos-wide`). */
  wide?: boolean;
  /** Not a sort key of the kernel's. */
  unsorted?: boolean;
}

const COLUMNS: IColumn[] = [
  { key: 'name', label: 'Name', cell: row => row.name },
  { key: 'type', label: 'Type', cell: row => shortType(row.type) },
  { key: 'summary', label: 'Value', cell: row => text(row.summary, ''), unsorted: true },
  { key: 'size', label: 'Size', cell: row => formatBytes(row.size), numeric: true, wide: true },
  { key: 'version', label: 'Ver', cell: row => text(row.version), numeric: true, wide: true },
  { key: 'op', label: 'Op', cell: row => text(row.op), numeric: true, wide: true },
  { key: 'principal', label: 'Who', cell: row => text(row.principal), wide: true },
  { key: 'changed_at', label: 'Changed', cell: row => formatTime(row.changed_at), wide: true }
];

/** `pandas.core.frame.DataFrame` -> `DataFrame` (the full name is in the tooltip). */
function shortType(type: string | null | undefined): string {
  const full = text(type);
  return full.includes('.') ? full.slice(full.lastIndexOf('.') + 1) : full;
}

export class ObjectsView implements IView {
  readonly node: HTMLElement;

  constructor(private readonly _request: Requester) {
    this._filter = h('input', {
      className: 'kernos-filter',
      testid: 'kernos-filter',
      attrs: { type: 'search', placeholder: 'Filter by name, type or principal', 'aria-label': 'Filter objects' }
    });
    this._filter.addEventListener(
      'input',
      debounce(() => {
        this._offset = 0;
        void this.refresh();
      }, 250)
    );
    this._internal = h('input', {
      className: 'kernos-internal-toggle',
      testid: 'kernos-show-internal',
      attrs: { type: 'checkbox', 'aria-label': "Show the image's own kernos: names" }
    });
    this._internal.addEventListener('change', () => {
      this._offset = 0;
      void this.refresh();
    });
    this._head = h('tr');
    this._body = h('tbody');
    const table = h(
      'table',
      { className: 'kernos-table', testid: 'kernos-objects' },
      h('thead', {}, this._head),
      this._body
    );
    this._prev = h('button', { className: 'kernos-button', testid: 'kernos-prev', text: '‹ Prev', attrs: { type: 'button' } });
    this._next = h('button', { className: 'kernos-button', testid: 'kernos-next', text: 'Next ›', attrs: { type: 'button' } });
    this._page = h('span', { className: 'kernos-page', testid: 'kernos-page', text: '0 of 0' });
    this._prev.addEventListener('click', () => this._turn(-1));
    this._next.addEventListener('click', () => this._turn(1));
    this._preview = h('div', { className: 'kernos-preview', testid: 'kernos-preview' });
    this._message = h('div', { className: 'kernos-view-message' });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-objects-view' },
      h('div', { className: 'kernos-objects-bar' },
        this._filter,
        h('label', { className: 'kernos-internal-label', title: "The image's own names: agents, their namespaces, the random state" },
          this._internal, 'kernos:')),
      h('div', { className: 'kernos-table-wrap' }, table),
      h('div', { className: 'kernos-pager' }, this._prev, this._page, this._next),
      this._message,
      this._preview
    );
    this._drawHead();
    this._drawPager(0, 0);
  }

  async refresh(): Promise<void> {
    const generation = ++this._generation;
    const query = this._filter.value.trim();
    try {
      const result = await this._request<{ objects: IObjectRow[]; total: number }>('objects', {
        query: query || undefined,
        sort: this._sort,
        limit: PAGE_SIZE,
        offset: this._offset,
        internal: this._internal.checked
      });
      if (generation !== this._generation) {
        return;
      }
      if (result.objects.length === 0 && this._offset > 0 && result.total > 0) {
        // The page emptied (names deleted): go to the last page that has rows.
        this._offset = Math.max(0, Math.floor((result.total - 1) / PAGE_SIZE) * PAGE_SIZE);
        return this.refresh();
      }
      this._message.textContent = '';
      this._drawRows(result.objects);
      this._drawPager(result.objects.length, result.total);
    } catch (error) {
      if (generation === this._generation) {
        this._message.textContent = `Could not list objects: ${describeError(error)}`;
      }
    }
  }

  async committed(notice: ICommittedNotice): Promise<void> {
    await this.refresh();
    const selected = this._selected;
    if (selected === null) {
      return;
    }
    if (notice.deleted.includes(selected)) {
      this._showGone(selected);
    } else if (notice.changed.includes(selected) || notice.added.includes(selected)) {
      await this._showPreview(selected);
    }
  }

  clear(): void {
    this._generation += 1;
    this._selected = null;
    this._offset = 0;
    clear(this._body);
    clear(this._preview);
    this._message.textContent = '';
    this._drawPager(0, 0);
  }

  private _drawHead(): void {
    clear(this._head);
    const key = this._sort.replace(/^-/, '');
    const descending = this._sort.startsWith('-');
    for (const column of COLUMNS) {
      const sorted = column.key === key;
      if (column.unsorted) {
        this._head.append(h('th', { className: 'kernos-value-cell', text: column.label }));
        continue;
      }
      const th = h('th', {
        className: [sorted ? 'kernos-sorted' : '', column.wide ? 'kernos-wide' : ''].filter(Boolean).join(' '),
        text: column.label + (sorted ? (descending ? ' ▼' : ' ▲') : ''),
        attrs: {
          'data-sort': column.key,
          'aria-sort': sorted ? (descending ? 'descending' : 'ascending') : 'none',
          role: 'columnheader',
          title: `Sort by ${column.label.toLowerCase()}`
        }
      });
      const sort = () => {
        this._sort = sorted && !descending ? `-${column.key}` : column.key;
        this._offset = 0;
        this._drawHead();
        void this.refresh();
      };
      th.tabIndex = 0;
      th.addEventListener('click', sort);
      th.addEventListener('keydown', event => {
        if (event.key === 'Enter' || event.key === ' ') {
          event.preventDefault();
          sort();
        }
      });
      this._head.append(th);
    }
  }

  private _drawRows(rows: IObjectRow[]): void {
    clear(this._body);
    for (const row of rows) {
      const tr = h('tr', {
        attrs: { 'data-name': row.name },
        title: `${row.name}: ${text(row.type)}, changed in op ${text(row.op)} by ` +
          `${text(row.principal)} (version ${text(row.version)}, ${formatBytes(row.size)})`
      });
      if (row.name === this._selected) {
        tr.classList.add('kernos-selected');
      }
      for (const column of COLUMNS) {
        const value = column.cell(row);
        tr.append(
          h('td', {
            className: [column.numeric ? 'kernos-numeric' : '', column.wide ? 'kernos-wide' : '',
                        column.unsorted ? 'kernos-value-cell' : ''].filter(Boolean).join(' '),
            text: value,
            title: column.key === 'size' && typeof row.size === 'number' ? `${row.size} bytes`
              : column.key === 'type' ? text(row.type) : value
          })
        );
      }
      const select = () => {
        for (const other of this._body.querySelectorAll('tr.kernos-selected')) {
          other.classList.remove('kernos-selected');
        }
        tr.classList.add('kernos-selected');
        void this._showPreview(row.name);
      };
      tr.tabIndex = 0;
      tr.addEventListener('mousedown', event => event.preventDefault()); // no scroll on focus
      tr.addEventListener('click', () => {
        tr.focus({ preventScroll: true });
        select();
      });
      tr.addEventListener('keydown', event => {
        if (event.key === 'Enter' || event.key === ' ') {
          event.preventDefault();
          select();
        }
      });
      this._body.append(tr);
    }
    if (rows.length === 0) {
      const filtered = this._filter.value.trim() !== '';
      this._body.append(
        h('tr', { className: 'kernos-empty' },
          h('td', {
            text: filtered ? 'No object matches the filter.' : 'The image holds no objects yet.',
            attrs: { colspan: String(COLUMNS.length) }
          }))
      );
    }
  }

  private _drawPager(shown: number, total: number): void {
    this._total = total;
    const first = shown ? this._offset + 1 : 0;
    const last = this._offset + shown;
    this._page.textContent = shown ? `${first}–${last} of ${total}` : `0 of ${total}`;
    this._prev.disabled = this._offset <= 0;
    this._next.disabled = this._offset + PAGE_SIZE >= total;
  }

  private _turn(direction: number): void {
    const offset = this._offset + direction * PAGE_SIZE;
    if (offset < 0 || offset >= Math.max(this._total, 1)) {
      return;
    }
    this._offset = offset;
    void this.refresh();
  }

  private async _showPreview(name: string): Promise<void> {
    this._selected = name;
    const generation = ++this._previewGeneration;
    clear(this._preview);
    this._preview.append(h('div', { className: 'kernos-preview-title', text: name }));
    try {
      const detail = await this._request<IObjectDetail>('object', {
        name,
        preview_bytes: PREVIEW_BYTES
      });
      if (generation !== this._previewGeneration) {
        return;
      }
      clear(this._preview);
      this._preview.append(
        h('div', { className: 'kernos-preview-title', text: detail.name }),
        h('div', {
          className: 'kernos-preview-meta',
          text:
            `${text(detail.type)} · ${formatBytes(detail.size)} · version ${text(detail.version)}` +
            ` · op ${text(detail.op)} · ${text(detail.principal)}`
        }),
        h('pre', { className: 'kernos-preview-repr', text: text(detail.preview?.repr, '') })
      );
    } catch (error) {
      if (generation === this._previewGeneration) {
        this._preview.append(
          h('div', { className: 'kernos-error', text: `No preview: ${describeError(error)}` })
        );
      }
    }
  }

  private _showGone(name: string): void {
    this._previewGeneration += 1;
    clear(this._preview);
    this._preview.append(
      h('div', { className: 'kernos-preview-title', text: name }),
      h('div', { className: 'kernos-preview-meta', text: 'Deleted by the last op.' })
    );
  }

  private _filter: HTMLInputElement;
  private _internal: HTMLInputElement;
  private _head: HTMLTableRowElement;
  private _body: HTMLTableSectionElement;
  private _prev: HTMLButtonElement;
  private _next: HTMLButtonElement;
  private _page: HTMLSpanElement;
  private _preview: HTMLDivElement;
  private _message: HTMLDivElement;
  private _sort = 'name';
  private _offset = 0;
  private _total = 0;
  private _selected: string | null = null;
  private _generation = 0;
  private _previewGeneration = 0;
}
