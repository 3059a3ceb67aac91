/**
 * Plot: the image's size and the history's size over ops, and each op's
 * latency, drawn as SVG from the `stats` action.
 */

import { clear, describeError, formatBytes, h } from '../dom';
import { IOpStat, IStats, IView, Requester } from '../tokens';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 320;
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
    clear(this._figure);
    this._summary.textContent = '';
    this._message.textContent = '';
  }

  private _draw(stats: IStats): void {
    clear(this._figure);
    const ops = stats.ops.filter(stat => typeof stat.op === 'number');
    this._summary.textContent =
      `Image ${formatBytes(stats.image_bytes)} · history ${formatBytes(stats.history_bytes)}` +
      ` · ${ops.length} ops`;
    const height = TOP + CHART_HEIGHT * 2 + GAP + 24;
    const root = svg('svg', {
      class: 'kernos-plot-svg',
      viewBox: `0 0 ${WIDTH} ${height}`,
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
      LEFT + (last === first ? (WIDTH - LEFT - RIGHT) / 2 : ((op - first) / (last - first)) * (WIDTH - LEFT - RIGHT));
    this._chart(root, ops, SIZES, TOP, x, formatBytes, 'size');
    this._chart(root, ops, [LATENCY], TOP + CHART_HEIGHT + GAP, x, ms => `${Math.round(ms)} ms`, 'latency');
    const axisY = TOP + CHART_HEIGHT * 2 + GAP;
    root.append(
      svg('text', { x: LEFT, y: axisY + 16, class: 'kernos-plot-axis' }, `op ${first}`),
      svg('text', { x: WIDTH - RIGHT, y: axisY + 16, class: 'kernos-plot-axis', 'text-anchor': 'end' }, `op ${last}`)
    );
    this._figure.append(root);
  }

  private _chart(
    root: SVGSVGElement,
    ops: IOpStat[],
    series: ISeries[],
    top: number,
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
      svg('line', { x1: LEFT, y1: top + CHART_HEIGHT, x2: WIDTH - RIGHT, y2: top + CHART_HEIGHT, class: 'kernos-plot-rule' }),
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

  private _figure: HTMLDivElement;
  private _summary: HTMLDivElement;
  private _message: HTMLDivElement;
  private _generation = 0;
}
