/**
 * kernos-jupyterlab: a left-sidebar panel that inspects the Kernos image of
 * the active notebook's or console's kernel.
 */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { cellOutcomes, SHOW_OP_COMMAND } from './cells';
import { IOpenForkArgs, OPEN_FORK_COMMAND, openFork } from './forks';
import { kernosIcon } from './icon';
import { outputs } from './inline';
import { KernosPanel } from './panel';

/** The sidebar's widget id (also its layout-restorer key). */
export const PANEL_ID = 'kernos-inspector';

const inspector: JupyterFrontEndPlugin<void> = {
  id: 'kernos-jupyterlab:inspector',
  description: 'A sidebar that shows the Kernos image of the active notebook or console.',
  autoStart: true,
  requires: [ILabShell],
  optional: [INotebookTracker, IConsoleTracker, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell,
    notebooks: INotebookTracker | null,
    consoles: IConsoleTracker | null,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new KernosPanel((command, args) =>
      app.commands.execute(command, args as any));
    panel.id = PANEL_ID;
    panel.title.icon = kernosIcon;
    panel.title.caption = 'Kernos';
    labShell.add(panel, 'left', { rank: 950, type: 'Kernos' });
    restorer?.add(panel, PANEL_ID);

    // The widget whose session the panel follows: the last active notebook or
    // console, kept while another kind of widget (an editor, a terminal) is active.
    let followed: Widget | null = null;

    const sessionOf = (widget: Widget | null): ISessionContext | null => {
      if (!widget) {
        return null;
      }
      const notebook = notebooks?.find(candidate => candidate === widget);
      if (notebook) {
        return notebook.sessionContext;
      }
      const console = consoles?.find(candidate => candidate === widget);
      return console ? console.sessionContext : null;
    };

    const follow = (widget: Widget | null, context: ISessionContext | null) => {
      if (followed && followed !== widget) {
        followed.disposed.disconnect(onDisposed);
      }
      followed = widget;
      if (widget && !widget.isDisposed) {
        widget.disposed.connect(onDisposed);
      }
      panel.follow(context);
    };

    const onDisposed = (widget: Widget) => {
      if (widget === followed) {
        follow(null, null);
        update();
      }
    };

    const update = () => {
      const current = labShell.currentWidget;
      const context = sessionOf(current);
      if (context) {
        follow(current, context);
      } else if (!followed || followed.isDisposed) {
        follow(null, null);
      }
    };

    labShell.currentChanged.connect(update);
    notebooks?.currentChanged.connect(update);
    consoles?.currentChanged.connect(update);
    void app.restored.then(update);

    // A cell's badge (cells.ts) shows its op in the sidebar's History.
    app.commands.addCommand(SHOW_OP_COMMAND, {
      label: 'Show the Op in the Kernos History',
      execute: args => {
        labShell.activateById(PANEL_ID);
        const op = Number(args.op);
        if (Number.isInteger(op)) {
          panel.showOp(op);
        }
      }
    });

    // A new notebook bound to a fork's workspace (forks.ts), opened on a Kernos kernel.
    app.commands.addCommand(OPEN_FORK_COMMAND, {
      label: 'Open the Fork in a New Notebook',
      execute: args => {
        const current = notebooks?.currentWidget?.context.path ?? '';
        const directory = current.includes('/') ? current.slice(0, current.lastIndexOf('/')) : '';
        return openFork(app, {
          directory,
          ...(args as unknown as IOpenForkArgs)
        });
      }
    });
  }
};

export default [inspector, outputs, cellOutcomes];
