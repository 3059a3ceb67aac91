/**
 * Follows one notebook's or console's session: decides whether its kernel is
 * Kernos, keeps an inspector comm open to it across restarts and kernel
 * changes, and relays notices and restore progress.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { InspectorConnection } from './connection';
import { describeError } from './dom';
import {
  IHello,
  IProgress,
  KernosRequestError,
  Notice,
  PROGRESS_MSG_TYPE,
  PROTOCOL_VERSION,
  RequestFields
} from './tokens';

/** Where the followed session stands. */
export type SessionState =
  | { kind: 'no-kernel' }
  | { kind: 'checking' }
  | { kind: 'not-kernos'; name: string }
  | { kind: 'connecting' }
  | { kind: 'restarting' }
  | { kind: 'ready'; hello: IHello }
  | { kind: 'error'; message: string };

/** Statuses after which the kernel's comms are gone (a restart clears them). */
const LOST = new Set<Kernel.Status>(['restarting', 'autorestarting', 'dead']);

export class KernosSession {
  constructor(readonly context: ISessionContext) {
    context.kernelChanged.connect(this._onKernelChanged, this);
    context.statusChanged.connect(this._onStatus, this);
    context.iopubMessage.connect(this._onIOPub, this);
    void this._connect();
  }

  get state(): SessionState {
    return this._state;
  }

  get stateChanged(): ISignal<this, SessionState> {
    return this._stateChanged;
  }

  /** Notices from the kernel, and restore progress seen on IOPub. */
  get noticed(): ISignal<this, Notice> {
    return this._noticed;
  }

  /** A problem worth a line in the panel (a closed comm, a refused message). */
  get problem(): ISignal<this, string> {
    return this._problem;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  request<T = any>(action: string, fields?: RequestFields): Promise<T> {
    if (!this._connection || this._state.kind !== 'ready') {
      return Promise.reject(
        new KernosRequestError('disconnected', 'the Kernos kernel is not connected', action)
      );
    }
    return this._connection.request<T>(action, fields);
  }

  /** Check the kernel and open the comm again (after an error). */
  reconnect(): void {
    if (!this._disposed) {
      void this._connect();
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._generation += 1;
    this._dropConnection();
    this.context.kernelChanged.disconnect(this._onKernelChanged, this);
    this.context.statusChanged.disconnect(this._onStatus, this);
    this.context.iopubMessage.disconnect(this._onIOPub, this);
    Signal.clearData(this);
  }

  /** Check the current kernel and, when it is Kernos, open the inspector comm. */
  private async _connect(): Promise<void> {
    const generation = ++this._generation;
    this._dropConnection();
    this._lost = false;
    const kernel = this.context.session?.kernel ?? null;
    if (!kernel) {
      this._setState({ kind: 'no-kernel' });
      return;
    }
    this._setState({ kind: 'checking' });
    let info: KernelMessage.IInfoReply | undefined;
    try {
      info = await kernel.info;
    } catch {
      info = undefined;
    }
    if (generation !== this._generation) {
      return;
    }
    const kernos = (info as unknown as Record<string, unknown> | undefined)?.kernos as
      | { protocol?: number }
      | undefined;
    if (!kernos || typeof kernos !== 'object') {
      const name = kernel.name || info?.implementation || 'unknown';
      this._setState({ kind: 'not-kernos', name });
      return;
    }
    if (kernos.protocol !== undefined && kernos.protocol !== PROTOCOL_VERSION) {
      this._setState({
        kind: 'error',
        message:
          `this kernel speaks version ${String(kernos.protocol)} of the Kernos protocol and ` +
          `this panel speaks version ${PROTOCOL_VERSION}; install matching versions of kernos`
      });
      return;
    }
    this._setState({ kind: 'connecting' });
    const connection = new InspectorConnection(kernel);
    this._connection = connection;
    connection.noticed.connect((_, notice) => this._noticed.emit(notice), this);
    connection.problem.connect((_, message) => this._problem.emit(message), this);
    try {
      const hello = await connection.open();
      if (generation !== this._generation) {
        return;
      }
      this._setState({ kind: 'ready', hello });
    } catch (error) {
      if (generation !== this._generation) {
        return;
      }
      if (error instanceof KernosRequestError && error.kind === 'disconnected' && this._lost) {
        return; // a restart took the comm away; the kernel's idle reconnects
      }
      this._setState({ kind: 'error', message: describeError(error) });
    }
  }

  private _dropConnection(): void {
    if (this._connection) {
      // Disposing clears the connection's signals, and with them our handlers.
      this._connection.dispose();
      this._connection = null;
    }
  }

  private _setState(state: SessionState): void {
    this._state = state;
    this._stateChanged.emit(state);
  }

  private _onKernelChanged(): void {
    void this._connect();
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (LOST.has(status)) {
      if (!this._lost) {
        this._lost = true;
        this._generation += 1;
        this._dropConnection();
        if (this._state.kind !== 'not-kernos' && this._state.kind !== 'no-kernel') {
          this._setState(
            status === 'dead'
              ? { kind: 'error', message: 'the kernel died; restart it to inspect its image' }
              : { kind: 'restarting' }
          );
        }
      }
      return;
    }
    if (this._lost && status === 'idle') {
      void this._connect();
    }
  }

  private _onIOPub(_: ISessionContext, msg: KernelMessage.IMessage): void {
    if ((msg.header.msg_type as string) !== PROGRESS_MSG_TYPE) {
      return;
    }
    const content = msg.content as unknown as IProgress & { v?: number };
    if (typeof content.done !== 'number' || typeof content.total !== 'number') {
      return;
    }
    this._noticed.emit({
      type: 'progress',
      what: String(content.what),
      done: content.done,
      total: content.total
    });
  }

  private _connection: InspectorConnection | null = null;
  private _disposed = false;
  private _generation = 0;
  private _lost = false;
  private _state: SessionState = { kind: 'checking' };
  private _stateChanged = new Signal<this, SessionState>(this);
  private _noticed = new Signal<this, Notice>(this);
  private _problem = new Signal<this, string>(this);
}
