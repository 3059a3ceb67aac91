/**
 * Plot: the image's size and the history's size over ops, and each op's
 * latency, drawn as SVG from the `stats` action.  The drawing is as wide as
 * the sidebar (one unit a pixel, redrawn when the sidebar is resized), so its
 * labels keep their size at any width instead of shrinking with a viewBox.
 */

import { clear, describeError, formatBytes, h } from '../dom';
import { IOpStat, IStats, IView, Requester } from '../tokens';

const SVG = 'http://www.w3.org/2000/svg';
/** The width drawn before the view is laid out (a hidden tab has none). */
const WIDTH = 320;
const MIN_WIDTH = 180;
const CHART_HEIGHT = 110;
const GAP = 34;
const LEFT = 48;
const RIGHT = 8;
const TOP = 18;

interface ISeries {
  key: 'image_bytes' | 'history_bytes' | 'ms';
  label: string;
  className: string;
}

const SIZES: ISeries[] = [
  { key: 'image_bytes', label: 'image size', className: 'kernos-plot-image' },
  { key: 'history_bytes', label: 'history size', className: 'kernos-plot-history' }
];
const LATENCY: ISeries = { key: 'ms', label: 'op latency (ms)', className: 'kernos-plot-latency' };

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {},
  content?: string
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) {
    node.setAttribute(name, String(value));
  }
  if (content !== undefined) {
    node.textContent = content;
  }
  return node;
}

export class PlotView implements IView {
  readonly node: HTMLElement;

  constructor(private readonly _request: Requester) {
    this._figure = h('div', { className: 'kernos-plot', testid: 'kernos-plot' });
    this._summary = h('div', { className: 'kernos-plot-summary' });
    this._message = h('div', { className: 'kernos-view-message' });
    this.node = h(
      'div',
      { className: 'kernos-view kernos-plot-view' },
      this._message,
      this._summary,
      this._figure
    );
    this._resize = new ResizeObserver(() => {
      if (this._stats && Math.abs(this._measure() - this._drawnWidth) > 4) {
        this._draw(this._stats);
      }
    });
    this._resize.observe(this._figure);
  }

  async refresh(): Promise<void> {
    const generation = ++this._generation;
    try {
      const stats = await this._request<IStats>('stats', { limit: 500 });
      if (generation !== this._generation) {
        return;
      }
      this._message.textContent = '';
      this._draw(stats);
    } catch (error) {
      if (generation === this._generation) {
        this._message.textContent = `Could not read stats: ${describeError(error)}`;
      }
    }
  }

  async committed(): Promise<void> {
    await this.refresh();
  }

  clear(): void {
    this._generation += 1;
    this._stats = null;
    clear(this._figure);
    this._summary.textContent = '';
    this._message.textContent = '';
  }

  /** The figure's width in pixels (WIDTH before it is laid out). */
  private _measure(): number {
    const width = Math.floor(this._figure.clientWidth);
    return width > 0 ? Math.max(MIN_WIDTH, width) : WIDTH;
  }

  private _draw(stats: IStats): void {
    clear(this._figure);
    this._stats = stats;
    const width = this._measure();
    this._drawnWidth = width;
    const ops = stats.ops.filter(stat => typeof stat.op === 'number');
    this._summary.textContent =
      `Image ${formatBytes(stats.image_bytes)} · history ${formatBytes(stats.history_bytes)}` +
      ` · ${ops.length} ops`;
    const height = TOP + CHART_HEIGHT * 2 + GAP + 24;
    const root = svg('svg', {
      class: 'kernos-plot-svg',
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: 'img',
      'aria-label': 'Image and history size, and op latency, over ops'
    });
    if (ops.length === 0) {
      root.append(svg('text', { x: LEFT, y: TOP + 20, class: 'kernos-plot-empty' }, 'No ops yet.'));
      this._figure.append(root);
      return;
    }
    const first = ops[0].op as number;
    const last = ops[ops.length - 1].op as number;
    const x = (op: number) =>
      LEFT + (last === first ? (width - LEFT - RIGHT) / 2 : ((op - first) / (last - first)) * (width - LEFT - RIGHT));
    this._chart(root, ops, SIZES, TOP, width, x, formatBytes, 'size');
    this._chart(root, ops, [LATENCY], TOP + CHART_HEIGHT + GAP, width, x, ms => `${Math.round(ms)} ms`, 'latency');
    const axisY = TOP + CHART_HEIGHT * 2 + GAP;
    root.append(
      svg('text', { x: LEFT, y: axisY + 16, class: 'kernos-plot-axis' }, `op ${first}`),
      svg('text', { x: width - RIGHT, y: axisY + 16, class: 'kernos-plot-axis', 'text-anchor': 'end' }, `op ${last}`)
    );
    this._figure.append(root);
  }

  private _chart(
    root: SVGSVGElement,
    ops: IOpStat[],
    series: ISeries[],
    top: number,
    width: number,
    x: (op: number) => number,
    format: (value: number) => string,
    name: string
  ): void {
    const values = ops.flatMap(stat =>
      series.map(one => stat[one.key]).filter((value): value is number => typeof value === 'number')
    );
    const max = Math.max(1, ...values);
    const y = (value: number) => top + CHART_HEIGHT - (value / max) * CHART_HEIGHT;
    const group = svg('g', { class: `kernos-plot-chart kernos-plot-chart-${name}` });
    group.append(
      svg('line', { x1: LEFT, y1: top + CHART_HEIGHT, x2: width - RIGHT, y2: top + CHART_HEIGHT, class: 'kernos-plot-rule' }),
      svg('line', { x1: LEFT, y1: top, x2: LEFT, y2: top + CHART_HEIGHT, class: 'kernos-plot-rule' }),
      svg('text', { x: LEFT - 4, y: top + 4, class: 'kernos-plot-axis', 'text-anchor': 'end' }, format(max)),
      svg('text', { x: LEFT - 4, y: top + CHART_HEIGHT, class: 'kernos-plot-axis', 'text-anchor': 'end' }, format(0))
    );
    let legendX = LEFT;
    for (const one of series) {
      const points = ops
        .filter(stat => typeof stat[one.key] === 'number')
        .map(stat => `${x(stat.op as number).toFixed(1)},${y(stat[one.key] as number).toFixed(1)}`);
      const line = svg('polyline', { points: points.join(' '), class: `kernos-plot-line ${one.className}` });
      line.dataset.testid = one.className;
      line.dataset.points = String(points.length);
      group.append(line);
      if (points.length === 1) {
        const [px, py] = points[0].split(',');
        group.append(svg('circle', { cx: px, cy: py, r: 2.5, class: `kernos-plot-dot ${one.className}` }));
      }
      const legend = svg('text', { x: legendX + 12, y: top - 6, class: 'kernos-plot-legend' }, one.label);
      group.append(
        svg('rect', { x: legendX, y: top - 14, width: 9, height: 9, class: `kernos-plot-swatch ${one.className}` }),
        legend
      );
      legendX += 12 + one.label.length * 6.5 + 14;
    }
    root.append(group);
  }

  private _resize: ResizeObserver;
  private _stats: IStats | null = null;
  private _drawnWidth = 0;
  private _figure: HTMLDivElement;
  private _summary: HTMLDivElement;
  private _message: HTMLDivElement;
  private _generation = 0;
}
