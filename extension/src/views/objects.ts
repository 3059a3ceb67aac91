/**
 * Objects: the image's names, filtered, sorted and paged by the kernel, as a
 * variable inspector shows them: name, type, shape, a short value, and who
 * changed it in which op.  A narrow sidebar shows name, type and value (the
 * rest on hover, and in the row a click expands with a bounded preview); the
 * image's own `kernos:` names are left out unless asked for.
 */

import { clear, debounce, describeError, formatBytes, formatTime, h, text } from '../dom';
import {
  ICommittedNotice,
  IObjectDetail,
  IObjectRow,
  IView,
  PAGE_SIZE,
  PLACEHOLDER_TYPE,
  PREVIEW_BYTES,
  Requester
} from '../tokens';

/** Which sidebar widths show a column (style/base.css: `kernos-mid`, `kernos-wide`). */
type Shown = 'always' | 'mid' | 'wide';

interface IColumn {
  key: string;
  label: string;
  cell: (row: IObjectRow) => string;
  shown: Shown;
  numeric?: boolean;
  /** The kernel's sort key, if the column sorts. */
  sort?: string;
}

const COLUMNS: IColumn[] = [
  { key: 'name', label: 'Name', cell: row => row.name, shown: 'always', sort: 'name' },
  { key: 'type', label: 'Type', cell: row => typeLabel(row), shown: 'always', sort: 'type' },
  { key: 'shape', label: 'Shape', cell: row => shapeLabel(row.shape), shown: 'mid' },
  { key: 'value', label: 'Value', cell: row => valueLabel(row), shown: 'always' },
  { key: 'size', label: 'Size', cell: row => formatBytes(row.size), shown: 'wide', numeric: true, sort: 'size' },
  { key: 'changed', label: 'Changed', cell: row => changedLabel(row), shown: 'wide', sort: 'op' }
];

function isPlaceholder(row: IObjectRow): boolean {
  return row.type === PLACEHOLDER_TYPE;
}

/** `pandas.core.frame.DataFrame` -> `DataFrame` (the full name is in the tooltip). */
function shortType(type: string | null | undefined): string {
  const full = text(type);
  return full.includes('.') ? full.slice(full.lastIndexOf('.') + 1) : full;
}

function typeLabel(row: IObjectRow): string {
  return isPlaceholder(row) ? 'placeholder' : shortType(row.type);
}

/** `3×4` for a shape, `12` for a length, '' for neither. */
function shapeLabel(shape: number[] | null | undefined): string {
  return Array.isArray(shape) && shape.length ? shape.join('×') : '';
}

function valueLabel(row: IObjectRow): string {
  return text(row.summary, '');
}

/** `op 3 · human`: the op that last changed the name, and who ran it. */
function changedLabel(row: IObjectRow): string {
  return `op ${text(row.op)} · ${text(row.principal)}`;
}

/** Everything a row holds, in words: its tooltip at any width. */
function describeRow(row: IObjectRow): string {
  const shape = shapeLabel(row.shape);
  const what = isPlaceholder(row)
    ? text(row.summary)
    : `${text(row.type)}${shape ? ` (${shape})` : ''}, ${formatBytes(row.size)}`;
  return `${row.name}: ${what}\nchanged in op ${text(row.op)} by ${text(row.principal)}` +
    ` (version ${text(row.version)}, ${formatTime(row.changed_at)})`;
}

export class ObjectsView implements IView {
  readonly node: HTMLElement;

  constructor(private readonly _request: Requester) {
    this._filter = h('input', {
      className: 'kernos-filter',
      testid: 'kernos-filter',
      attrs: { type: 'search', placeholder: 'Filter', 'aria-label': 'Filter objects by name, type or principal' }
    });
    this._filter.title = 'Filter by name, type or principal';
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
      { className: 'kernos-table kernos-objects-table', testid: 'kernos-objects' },
      h('thead', {}, this._head),
      this._body
    );
    this._prev = h('button', { className: 'kernos-button', testid: 'kernos-prev', text: '‹ Prev', attrs: { type: 'button' } });
    this._next = h('button', { className: 'kernos-button', testid: 'kernos-next', text: 'Next ›', attrs: { type: 'button' } });
    this._page = h('span', { className: 'kernos-page', testid: 'kernos-page', text: '0 of 0' });
    this._prev.addEventListener('click', () => this._turn(-1));
    this._next.addEventListener('click', () => this._turn(1));
    this._preview = h('div', { className: 'kernos-preview', testid: 'kernos-preview' });
    this._detail = h('tr', { className: 'kernos-object-detail' },
      h('td', { attrs: { colspan: String(COLUMNS.length) } }, this._preview));
    this._message = h('div', { className: 'kernos-view-message' });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-objects-view' },
      h('div', { className: 'kernos-objects-bar' },
        this._filter,
        h('label', {
          className: 'kernos-internal-label',
          title: "Show the image's own names (kernos:…): the agents, their namespaces, the random state"
        }, this._internal, 'kernos:')),
      h('div', { className: 'kernos-table-wrap' }, table),
      h('div', { className: 'kernos-pager' }, this._prev, this._page, this._next),
      this._message
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
      const classes = [`kernos-col-${column.key}`, shownClass(column.shown),
                       column.numeric ? 'kernos-numeric' : ''];
      if (!column.sort) {
        this._head.append(h('th', { className: classes.filter(Boolean).join(' '), text: column.label }));
        continue;
      }
      const sortKey = column.sort;
      const sorted = sortKey === key;
      const th = h('th', {
        className: [...classes, sorted ? 'kernos-sorted' : ''].filter(Boolean).join(' '),
        text: column.label + (sorted ? (descending ? ' ▼' : ' ▲') : ''),
        attrs: {
          'data-sort': sortKey,
          'aria-sort': sorted ? (descending ? 'descending' : 'ascending') : 'none',
          role: 'columnheader',
          title: `Sort by ${column.key === 'changed' ? 'the op that changed it' : column.label.toLowerCase()}`
        }
      });
      const sort = () => {
        this._sort = sorted && !descending ? `-${sortKey}` : sortKey;
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
    let selectedShown = false;
    for (const row of rows) {
      const tr = h('tr', {
        className: isPlaceholder(row) ? 'kernos-placeholder' : '',
        attrs: {
          'data-name': row.name,
          'data-version': text(row.version, ''),
          'data-op': text(row.op, ''),
          'data-type': text(row.type, '')
        },
        title: describeRow(row)
      });
      for (const column of COLUMNS) {
        const value = column.cell(row);
        const td = h('td', {
          className: [`kernos-col-${column.key}`, shownClass(column.shown),
                      column.numeric ? 'kernos-numeric' : ''].filter(Boolean).join(' '),
          text: value
        });
        if (column.key === 'type') {
          // Narrow sidebars have no Shape column: the type carries it (`list 3`).
          const shape = shapeLabel(row.shape);
          if (shape) {
            td.append(h('span', { className: 'kernos-type-shape', text: ` ${shape}` }));
          }
        }
        tr.append(td);
      }
      const select = () => this._select(row.name, tr);
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
        } else if (event.key === 'Escape') {
          this._collapse();
        }
      });
      this._body.append(tr);
      if (row.name === this._selected) {
        tr.classList.add('kernos-selected');
        tr.setAttribute('aria-expanded', 'true');
        this._body.append(this._detail);
        selectedShown = true;
      }
    }
    if (!selectedShown) {
      this._detail.remove();
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

  /** Expand `name`'s row: its preview goes in a row below it. */
  private _select(name: string, tr: HTMLTableRowElement): void {
    for (const other of this._body.querySelectorAll('tr.kernos-selected')) {
      other.classList.remove('kernos-selected');
      other.removeAttribute('aria-expanded');
    }
    tr.classList.add('kernos-selected');
    tr.setAttribute('aria-expanded', 'true');
    tr.after(this._detail);
    if (this._selected !== name || !this._preview.childElementCount) {
      void this._showPreview(name);
    }
  }

  private _collapse(): void {
    this._selected = null;
    this._previewGeneration += 1;
    for (const other of this._body.querySelectorAll('tr.kernos-selected')) {
      other.classList.remove('kernos-selected');
      other.removeAttribute('aria-expanded');
    }
    this._detail.remove();
    clear(this._preview);
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

  private _closeButton(): HTMLButtonElement {
    const close = h('button', {
      className: 'kernos-close', testid: 'kernos-preview-close', text: '×',
      title: 'Close (Escape)', attrs: { type: 'button', 'aria-label': 'Close the preview' }
    });
    close.addEventListener('click', event => {
      event.stopPropagation();
      this._collapse();
    });
    return close;
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
      const shape = shapeLabel(detail.shape);
      const facts = isPlaceholder(detail)
        ? [text(detail.summary)]
        : [text(detail.type), ...(shape ? [`shape ${shape}`] : []), formatBytes(detail.size)];
      clear(this._preview);
      this._preview.append(
        h('div', { className: 'kernos-preview-head' },
          h('span', { className: 'kernos-preview-title', text: detail.name }),
          this._closeButton()),
        h('div', { className: 'kernos-preview-meta', text: facts.join(' · ') }),
        h('div', {
          className: 'kernos-preview-meta',
          testid: 'kernos-preview-changed',
          text: `changed in op ${text(detail.op)} by ${text(detail.principal)} · ` +
            `version ${text(detail.version)} · ${formatTime(detail.changed_at)}`
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
    // Its row is gone: the note stays at the top of the table until another is chosen.
    if (!this._detail.isConnected) {
      this._body.prepend(this._detail);
    }
  }

  private _filter: HTMLInputElement;
  private _internal: HTMLInputElement;
  private _head: HTMLTableRowElement;
  private _body: HTMLTableSectionElement;
  private _prev: HTMLButtonElement;
  private _next: HTMLButtonElement;
  private _page: HTMLSpanElement;
  private _preview: HTMLDivElement;
  private _detail: HTMLTableRowElement;
  private _message: HTMLDivElement;
  private _sort = 'name';
  private _offset = 0;
  private _total = 0;
  private _selected: string | null = null;
  private _generation = 0;
  private _previewGeneration = 0;
}

function shownClass(shown: Shown): string {
  return shown === 'always' ? '' : `kernos-${shown}`;
}
