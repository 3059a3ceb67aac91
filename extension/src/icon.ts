import { LabIcon } from '@jupyterlab/ui-components';

/** A stacked-snapshots mark: the image and its history. */
const SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M4 4h11a2 2 0 0 1 2 2v11a2 2 0 0 1-2 2H4a2 2 0 0 1-2-2V6a2 2 0 0 1 2-2zm2.2 3v9h2v-3.3l1.1-1.2 2.9 4.5h2.4l-3.9-5.9 3.6-3.1H11.5L8.2 10.1V7z"/>
    <path d="M19 7h1a2 2 0 0 1 2 2v11a2 2 0 0 1-2 2H9a2 2 0 0 1-2-2v-1h2v1h11V9h-1z"/>
  </g>
</svg>`;

export const kernosIcon = new LabIcon({ name: 'kernos-jupyterlab:inspector', svgstr: SVG });
