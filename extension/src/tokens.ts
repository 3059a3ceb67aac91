/**
 * The shapes of the `kernos.inspector` comm and of the harness protocol
 * replies the panel reads (see kernos/kernel/inspector.py and
 * kernos/harness/protocol.py).  Every string in them comes from code that
 * ran in the image, agent code included: render with textContent only.
 */

/** The comm target the kernel registers. */
export const COMM_TARGET = 'kernos.inspector';

/** The version of the comm envelope and of the harness protocol. */
export const PROTOCOL_VERSION = 1;

/** The IOPub message type a restoring or checking-out kernel reports on. */
export const PROGRESS_MSG_TYPE = 'kernos_progress';

/** Rows per page in the objects view. */
export const PAGE_SIZE = 50;

/** Bytes of preview asked for a selected object. */
export const PREVIEW_BYTES = 2000;

/** Events kept in the events view (the newest). */
export const MAX_EVENTS = 200;

/** Snapshots shown in the history view (the newest). */
export const MAX_SNAPSHOTS = 200;

export type JSONPrimitive = string | number | boolean | null;

/** A harness request's fields besides `v` and `action`. */
export type RequestFields = Record<string, string | number | boolean | string[] | undefined>;

/** The one function all kernel traffic goes through (mocked in tests). */
export type Requester = <T = any>(
  action: string,
  fields?: RequestFields
) => Promise<T>;

export interface IHead {
  op: number | null;
  commit: string | null;
}

export interface IHello {
  protocol: number;
  kernos: string;
  workspace: string;
  head: IHead;
  principals: string[];
  actions: string[];
}

export interface IErrorInfo {
  kind: string;
  message: string;
  data?: Record<string, unknown>;
}

export interface IReply {
  v: number;
  status: 'ok' | 'error';
  action: string | null;
  result?: any;
  error?: IErrorInfo;
}

export interface ICommittedNotice {
  type: 'committed';
  op: number;
  commit: string;
  principal: string;
  added: string[];
  changed: string[];
  deleted: string[];
  events: number;
  /** A notebook cell's op: the msg_id of its execute_request (absent for other ops). */
  request?: string;
  /** An op that checked out a snapshot: what it made the image equal to. */
  checkout?: ICheckedOut;
}

/** The snapshot a checkout made the image equal to. */
export interface ICheckedOut {
  ref: string | null;
  op: number | null;
  commit: string | null;
}

export interface IRolledBackNotice {
  type: 'rolled_back';
  op: number | null;
  principal: string;
  error: string | null;
  /** A notebook cell's op: the msg_id of its execute_request (absent for other ops). */
  request?: string;
}

export interface IProgress {
  what: 'restore' | 'checkout' | string;
  done: number;
  total: number;
}

export interface IProgressNotice extends IProgress {
  type: 'progress';
}

export type Notice = ICommittedNotice | IRolledBackNotice | IProgressNotice;

export interface IObjectRow {
  name: string;
  type: string;
  size: number | null;
  version: number | null;
  op: number | null;
  principal: string | null;
  changed_at: string | null;
  summary?: string | null;
  /** `[len]` of a builtin container or string, an array's or frame's shape, else null. */
  shape?: number[] | null;
}

/** The type a restore gives a placeholder for a value that could not be persisted. */
export const PLACEHOLDER_TYPE = 'Unpersisted';

export interface IObjectDetail extends IObjectRow {
  preview?: { repr?: string; json?: unknown };
}

export interface IEvent {
  seq: number;
  topic: string;
  principal: string;
  op: number | null;
  commit?: string | null;
  at?: string | null;
  payload?: unknown;
}

export interface IGrant {
  id: string;
  principal: string;
  capability: string;
  limit: string | null;
  used: string | null;
  remaining: string | null;
  active: boolean;
  revoked_op: number | null;
}

export interface ISnapshot {
  op: number | null;
  commit: string;
  when: string | null;
  principal: string | null;
  kind: string | null;
  message: string | null;
  bytes?: number | null;
  /** The names the op added, changed and deleted (the image's own `kernos:` ones too). */
  changes?: { added?: string[]; changed?: string[]; deleted?: string[] };
  /** The tracked files the op added, changed and deleted (kernos.files): paths relative
   * to the files root, or `KEY:path` in another tracked directory. */
  files?: { added?: string[]; changed?: string[]; deleted?: string[] };
  /** With `log`'s `all`: `committed` for a snapshot, else what became of the op
   * (`read-only`, `failed`, `denied`, ...; kernos.audit.oplog). */
  outcome?: string;
  error?: string | null;
}

/** The `show` action's answer: a snapshot, or (`@N`, commit null) an op that wrote none. */
export interface IShown {
  commit: string | null;
  op: number | null;
  principal: string | null;
  kind: string | null;
  committed_at: string | null;
  message: string | null;
  code: string | null;
  outcome?: string;
  error?: string | null;
  /** The tracked files the op changed, with sizes and small text files' diffs. */
  files?: IFileChange[];
}

/** A tracked file an op changed, or that differs between two snapshots
 * (kernos.files.reading.FileChange). */
export interface IFileChange {
  path: string;
  change: 'added' | 'changed' | 'deleted';
  before: number | null;
  after: number | null;
  diff: string | null;
  note: string | null;
}

export interface IDiffEntry {
  name: string;
  type?: string | null;
  summary?: string | null;
  before?: string | null;
  after?: string | null;
}

export interface IDiff {
  a: string;
  b: string;
  added: IDiffEntry[];
  changed: IDiffEntry[];
  deleted: IDiffEntry[];
  files?: IFileChange[];
}

export interface IOpStat {
  op: number | null;
  status: string | null;
  principal: string | null;
  kind: string | null;
  at: string | null;
  ms: number | null;
  image_bytes: number | null;
  history_bytes: number | null;
}

export interface IStats {
  ops: IOpStat[];
  image_bytes: number | null;
  history_bytes: number | null;
}

/** Why an agent's circuit is open (the `circuit` action; kernos.agents.supervisor.Trip). */
export interface ITrip {
  policy: string;
  limit: number;
  figures: Record<string, unknown>;
  message: string;
  op: number | null;
  at: string | null;
  announced?: boolean;
}

/** An agent's loop (LoopState.describe(), from the `loop` action's `status`). */
export interface ILoop {
  agent: string;
  status: string;
  iteration: number;
  pending: number;
  last_op: number | null;
  reason: string | null;
  /** What the last committed iteration printed (kept in the kernel's memory only). */
  output?: ILoopOutput | null;
}

/** One iteration's printed output: at most 2,000 characters, `cut` counts those left out. */
export interface ILoopOutput {
  op: number;
  iteration: number;
  text: string;
  cut: number;
}

/** An agent's effective circuit-breaker policy (the `policy` action) and its circuit. */
export interface ICircuit {
  agent: string;
  policy: Record<string, number | boolean>;
  circuit: ITrip | null;
  /** The op of its checkpoint tagged safe (what a reset with restore goes back to), or null. */
  safe: number | null;
}

/** One recalled memory. */
export interface IMemory {
  kind: string;
  title: string;
  op: number | null;
  principal: string;
  name: string | null;
  at: string | null;
  status: string | null;
  text: string;
}

/** The `memory` action's `stats`: the index's entries per layer. */
export interface IMemoryStats {
  entries: Record<string, number>;
}

/** A view of the panel: one tab's content. */
export interface IView {
  /** The view's root element. */
  readonly node: HTMLElement;
  /** Ask the kernel again and redraw. */
  refresh(): Promise<void>;
  /** Forget everything shown (a new kernel, or none). */
  clear(): void;
  /** Called after a committed op, while the view is visible. */
  committed?(notice: ICommittedNotice): Promise<void>;
}

/** An error reply from the kernel, or a failure to reach it. */
export class KernosRequestError extends Error {
  constructor(
    readonly kind: string,
    message: string,
    readonly action: string | null = null
  ) {
    super(message);
    this.name = 'KernosRequestError';
  }
}
