/**
 * Kernos's outputs in a notebook, rendered by the extension:
 *
 * - `application/vnd.kernos.inspector+json`: the inspector that
 *   `kernos.inspect()` displays.  The bundle also carries the ipywidget (for
 *   frontends without this extension), but in JupyterLab the inspector is a
 *   Kernos panel bound to the notebook's session: it follows the kernel
 *   through restarts and renders again when the notebook is reopened, where a
 *   widget's model would be gone with the kernel that made it.
 * - `application/vnd.kernos.notice+json`: a notice that is not an error (a
 *   value that cannot persist, a placeholder after a restore), shown as a
 *   quiet note rather than in stderr's colours.
 *
 * Both renderers are safe: they render text nodes only, from JSON, and the
 * inspector reads the image through the same requests as the sidebar.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Message } from '@lumino/messaging';
import { Panel, Widget } from '@lumino/widgets';

import { h } from './dom';
import { KernosPanel } from './panel';

export const INSPECTOR_MIME = 'application/vnd.kernos.inspector+json';
export const NOTICE_MIME = 'application/vnd.kernos.notice+json';

/** Ahead of the widget manager's renderer (rank -10), so Lab draws the panel. */
const RANK = -20;

type SessionFinder = (node: HTMLElement) => ISessionContext | null;

/** The inspector under a cell: a Kernos panel following that notebook's kernel. */
class InlineInspector extends Panel implements IRenderMime.IRenderer {
  constructor(private readonly _find: SessionFinder) {
    super();
    this.addClass('kernos-inline');
    this.node.dataset.testid = 'kernos-inline';
    this._panel = new KernosPanel();
    this.addWidget(this._panel);
  }

  async renderModel(_model: IRenderMime.IMimeModel): Promise<void> {
    this._bind();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._bind();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._panel.dispose();
    super.dispose();
  }

  /** Follow the session of the notebook (or console) this output sits in. */
  private _bind(): void {
    if (!this.isAttached) {
      return;
    }
    this._panel.follow(this._find(this.node));
  }

  private readonly _panel: KernosPanel;
}

/** A notice that is not an error: one quiet line. */
class Notice extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('kernos-notice');
    this.node.dataset.testid = 'kernos-notice';
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[NOTICE_MIME] as { kind?: unknown; text?: unknown } | undefined;
    const text = typeof data?.text === 'string' ? data.text : String(model.data['text/plain'] ?? '');
    const kind = typeof data?.kind === 'string' ? data.kind : 'notice';
    this.node.replaceChildren(h('span', { className: 'kernos-notice-text', text }));
    this.node.dataset.kind = kind;
  }
}

export const outputs: JupyterFrontEndPlugin<void> = {
  id: 'kernos-jupyterlab:outputs',
  description: "Renders Kernos's inspector and notices in notebook outputs.",
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [INotebookTracker, IConsoleTracker],
  activate: (
    _app: JupyterFrontEnd,
    rendermime: IRenderMimeRegistry,
    notebooks: INotebookTracker | null,
    consoles: IConsoleTracker | null
  ) => {
    const find: SessionFinder = node => {
      const notebook = notebooks?.find(panel => panel.node.contains(node));
      if (notebook) {
        return notebook.sessionContext;
      }
      const console = consoles?.find(panel => panel.node.contains(node));
      return console ? console.sessionContext : null;
    };
    rendermime.addFactory(
      { safe: true, mimeTypes: [INSPECTOR_MIME], createRenderer: () => new InlineInspector(find) },
      RANK
    );
    rendermime.addFactory({ safe: true, mimeTypes: [NOTICE_MIME], createRenderer: () => new Notice() }, RANK);
  }
};
