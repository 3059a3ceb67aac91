/**
 * One `kernos.inspector` comm: requests matched to replies by id, and the
 * notices the kernel pushes after every op.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import {
  COMM_TARGET,
  IHello,
  IReply,
  KernosRequestError,
  Notice,
  PROTOCOL_VERSION,
  RequestFields
} from './tokens';

interface IPending {
  action: string;
  resolve: (result: any) => void;
  reject: (error: Error) => void;
}

export class InspectorConnection {
  constructor(private readonly _kernel: Kernel.IKernelConnection) {}

  /** A notice the kernel pushed (committed, rolled_back, progress). */
  get noticed(): ISignal<this, Notice> {
    return this._noticed;
  }

  /** The kernel closed the comm, or sent a message it could not take. */
  get problem(): ISignal<this, string> {
    return this._problem;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Open the comm; resolves with the kernel's hello. */
  open(): Promise<IHello> {
    if (this._comm) {
      throw new Error('the inspector comm is already open');
    }
    const comm = this._kernel.createComm(COMM_TARGET);
    this._comm = comm;
    const hello = new Promise<IHello>((resolve, reject) => {
      this._hello = { action: 'hello', resolve, reject };
    });
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => this._onMessage(msg.content.data);
    comm.onClose = () => {
      this._comm = null;
      this._fail('the kernel closed the inspector comm');
      this._problem.emit('the kernel closed the inspector comm');
    };
    comm.open({ v: PROTOCOL_VERSION });
    return hello;
  }

  /** Send one harness request; resolves with its result, rejects with its error. */
  request<T = any>(action: string, fields: RequestFields = {}): Promise<T> {
    const comm = this._comm;
    if (this._disposed || !comm || comm.isDisposed) {
      return Promise.reject(
        new KernosRequestError('disconnected', 'not connected to the kernel', action)
      );
    }
    const request: Record<string, string | number | boolean | string[]> = {
      v: PROTOCOL_VERSION,
      action
    };
    for (const [name, value] of Object.entries(fields)) {
      if (value !== undefined) {
        request[name] = value;
      }
    }
    const id = this._nextId++;
    return new Promise<T>((resolve, reject) => {
      this._pending.set(id, { action, resolve, reject });
      try {
        comm.send({ v: PROTOCOL_VERSION, id, request });
      } catch (error) {
        this._pending.delete(id);
        reject(
          new KernosRequestError('disconnected', `could not send ${action}: ${error}`, action)
        );
      }
    });
  }

  /** Close the comm (when the kernel is still there) and fail what is pending. */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed) {
      comm.onClose = () => undefined;
      try {
        comm.close();
      } catch {
        // The kernel is gone already; nothing to tell it.
      }
    }
    this._fail('the connection to the kernel was closed');
    Signal.clearData(this);
  }

  private _onMessage(data: unknown): void {
    if (this._disposed || typeof data !== 'object' || data === null) {
      return;
    }
    const message = data as Record<string, any>;
    switch (message.type) {
      case 'hello': {
        const pending = this._hello;
        this._hello = null;
        if (!pending) {
          return;
        }
        if (message.error) {
          pending.reject(
            new KernosRequestError(
              String(message.error.kind ?? 'workspace'),
              String(message.error.message ?? 'the kernel has no usable workspace'),
              'hello'
            )
          );
        } else {
          pending.resolve(message.hello as IHello);
        }
        return;
      }
      case 'reply': {
        const pending = this._pending.get(message.id);
        if (!pending) {
          return;
        }
        this._pending.delete(message.id);
        const reply = message.reply as IReply;
        if (reply && reply.status === 'ok') {
          pending.resolve(reply.result);
        } else {
          const error = reply?.error;
          pending.reject(
            new KernosRequestError(
              String(error?.kind ?? 'internal'),
              String(error?.message ?? 'the kernel sent a malformed reply'),
              pending.action
            )
          );
        }
        return;
      }
      case 'committed':
      case 'rolled_back':
      case 'progress':
        this._noticed.emit(message as Notice);
        return;
      case 'error': {
        const text = String(message.error ?? 'the kernel refused a message');
        if (this._hello) {
          const pending = this._hello;
          this._hello = null;
          pending.reject(new KernosRequestError('protocol', text, 'hello'));
        }
        this._problem.emit(text);
        return;
      }
      default:
        return;
    }
  }

  private _fail(reason: string): void {
    const error = new KernosRequestError('disconnected', reason);
    if (this._hello) {
      this._hello.reject(error);
      this._hello = null;
    }
    for (const pending of this._pending.values()) {
      pending.reject(new KernosRequestError('disconnected', reason, pending.action));
    }
    this._pending.clear();
  }

  private _comm: Kernel.IComm | null = null;
  private _disposed = false;
  private _hello: IPending | null = null;
  private _nextId = 1;
  private _pending = new Map<number, IPending>();
  private _noticed = new Signal<this, Notice>(this);
  private _problem = new Signal<this, string>(this);
}
