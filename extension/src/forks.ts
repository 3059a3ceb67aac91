/**
 * Open a fork from JupyterLab: a new notebook bound to the fork's workspace.
 *
 * The notebook is written (through the contents API) with
 * `metadata.kernos.workspace` = the fork's absolute path and a Kernos
 * kernelspec before it is opened, so the kernel JupyterLab starts for it reads
 * the binding at start-up (`kernos.store.binding`) and runs on the fork.  The
 * kernel checks the path (an existing Kernos workspace of this user); this
 * side only refuses what cannot be a path.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Contents, KernelSpec } from '@jupyterlab/services';

/** The command, and its arguments. */
export const OPEN_FORK_COMMAND = 'kernos:open-fork';

export interface IOpenForkArgs {
  /** The fork's workspace directory, an absolute path on the kernel's machine. */
  path: string;
  /** The kernelspec to run it on (default: `kernos`). */
  kernel?: string;
  /** The directory, relative to the server's root, to make the notebook in (default: the root). */
  directory?: string;
}

/** Tries at a free notebook name before giving up. */
const NAME_TRIES = 100;

/**
 * Where the notebook goes: `trial-a.ipynb`, else `trial-a-2.ipynb`, ...: the first name
 * not taken in `directory`, unless a notebook there is bound to this fork already (then
 * that one is opened again: a second kernel on the fork would find it locked).
 */
async function placeFor(
  contents: Contents.IManager,
  directory: string,
  base: string,
  workspace: string
): Promise<{ path: string; exists: boolean }> {
  for (let attempt = 1; attempt <= NAME_TRIES; attempt++) {
    const name = `${base}${attempt === 1 ? '' : `-${attempt}`}.ipynb`;
    const path = directory ? `${directory}/${name}` : name;
    let model: Contents.IModel;
    try {
      model = await contents.get(path, { content: true, type: 'notebook' });
    } catch {
      return { path, exists: false }; // not there: ours
    }
    const bound = (model.content as { metadata?: { kernos?: { workspace?: unknown } } } | null)
      ?.metadata?.kernos?.workspace;
    if (bound === workspace) {
      return { path, exists: true };
    }
  }
  throw new Error(`no free notebook name for ${base} in ${directory || 'the root'}`);
}

/** The notebook's name, from the fork directory's last part (safe characters only). */
export function notebookBase(path: string): string {
  const last = path.replace(/\/+$/, '').split('/').pop() ?? '';
  const safe = last.replace(/[^A-Za-z0-9._-]+/g, '-').replace(/^[.-]+/, '');
  return safe ? safe.slice(0, 80) : 'fork';
}

/** Make the bound notebook and open it; resolves with its path. */
export async function openFork(app: JupyterFrontEnd, args: IOpenForkArgs): Promise<string> {
  const workspace = args.path;
  if (typeof workspace !== 'string' || !workspace.startsWith('/') || workspace.includes('\0')) {
    throw new Error(`kernos:open-fork needs the fork's absolute path, not ${String(workspace)}`);
  }
  const manager = app.serviceManager;
  await manager.kernelspecs.ready;
  const specs = manager.kernelspecs.specs;
  const kernel = args.kernel && specs?.kernelspecs[args.kernel] ? args.kernel : 'kernos';
  const spec = specs?.kernelspecs[kernel];
  const directory = (args.directory ?? '').replace(/^\/+|\/+$/g, '');
  const { path, exists } = await placeFor(
    manager.contents,
    directory,
    notebookBase(workspace),
    workspace
  );
  if (!exists) {
    await manager.contents.save(path, {
      type: 'notebook',
      format: 'json',
      content: boundNotebook(workspace, kernel, spec)
    });
  }
  await app.commands.execute('docmanager:open', { path, factory: 'Notebook' });
  return path;
}

/** A new notebook bound to `workspace`, on kernelspec `kernel`. */
function boundNotebook(
  workspace: string,
  kernel: string,
  spec: KernelSpec.ISpecModel | undefined
): Record<string, unknown> {
  return {
    cells: [
      {
        cell_type: 'markdown',
        id: 'kernos-fork-note',
        metadata: {},
        source:
          `This notebook runs on the fork \`${workspace}\`: its kernel opens that workspace ` +
          '(`metadata.kernos.workspace`), not the workspace the fork was made from.'
      },
      {
        cell_type: 'code',
        id: 'first',
        execution_count: null,
        metadata: {},
        outputs: [],
        source: ''
      }
    ],
    metadata: {
      kernelspec: {
        name: kernel,
        display_name: spec?.display_name ?? 'Kernos',
        language: spec?.language ?? 'python'
      },
      kernos: { workspace }
    },
    nbformat: 4,
    nbformat_minor: 5
  };
}
