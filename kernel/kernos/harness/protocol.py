"""The harness protocol: requests a harness sends a Kernos kernel, and replies.

Transport.  Custom Jupyter shell messages, so that every reply goes to the
client that asked (the shell channel routes replies by identity, where a
comm's replies are broadcast on IOPub to every client), and so that requests
queue with ``execute_request``s on one channel::

    msg_type "kernos_request"   content REQUEST       (shell channel)
    msg_type "kernos_reply"     content REPLY         (shell channel, parent = the request)

While a request runs, the kernel may report how far a long step has got, on
IOPub (to every client; a client routes it by its parent)::

    msg_type "kernos_progress"  content PROGRESS      (IOPub, parent = the request)

    PROGRESS = {"v": 1, "what": "restore" | "checkout", "done": int, "total": int}

``done`` and ``total`` count bytes.  ``restore`` is the kernel's start-up
restore, which the first requests wait for; ``checkout`` is the ``checkout``
action loading a snapshot.  Messages are throttled (at most about ten a
second per request) and the last one of a step that completes has ``done ==
total``.  They precede the request's ``status: idle`` on IOPub, so a client
that waits for that idle has seen them all.  A client may ignore them.

The kernel commits requests as a group (``kernos.kernel.control``): a reply,
and the events and inspector notices of its op, are sent once a sync made
the op durable, which may be after the request's ``status: idle``.  Wait for
the reply on the shell channel, not for idle.

Committed events are pushed on the ``kernos.events`` comm target (see
``kernos.kernel.streams``); the ``events`` action below pulls them instead.
The kernel's ``kernel_info_reply`` carries ``{"kernos": {"protocol": 1, ...}}``
in its content so that a client can check the version before anything else.

A REQUEST is a JSON object::

    {"v": 1, "action": ACTION, ...the action's fields}

A REPLY is one of::

    {"v": 1, "status": "ok", "action": ACTION, "result": RESULT}
    {"v": 1, "status": "error", "action": ACTION | null,
     "error": {"kind": KIND, "message": TEXT, "data": {...}}}

``message`` names what was wrong and what to do.  ``kind`` is one of
:data:`ERROR_KINDS`; clients switch on it, never on the message.  A request
whose ``v`` is not :data:`VERSION` is refused with kind ``protocol`` (and
``data.supported``).  Unknown actions and unknown or mistyped fields are
refused with kind ``malformed``: fields are allowlisted per action.

``refused`` lets an adapter that refused a request before the kernel (the MCP
server checking a tool's arguments) give it the audit record a kernel-side
refusal gets.  ``log`` with ``principal`` is that principal's view of the
history (see ``HarnessService._log``).

Ops.  ``op``, ``grant``, ``revoke``, ``add_agent``, ``checkout``, ``reset`` and
``policy`` with ``set`` change the image: each runs as one op, serialized with
every other op and cell (one runs at a time, whichever client sent it).
Every op, committed or not, and every refused request has an audit record.
The result of ``op`` is an OP-RESULT (``kernos.harness.results.OpResult`` is its typed form)::

    {"status": "committed" | "rolled back" | "conflict" | "rejected"
               | "denied" | "failed" | "interrupted" | "vetoed",
     "op": int | null, "commit": str | null, "principal": str,
     "value": {"repr": str, "json": ANY} | null,   # "json" only when JSON-able
     "output": str,                                # what the code printed (bounded)
     "error": {"kind", "message", "data"} | null,
     "added": [str], "changed": [str], "deleted": [str],
     "events": [EVENT], "versions": {name: int | null},
     "duplicate": bool, "timings_ms": {str: float}}

A rolled-back op is an ``ok`` reply whose result says so: the request was
valid and was carried out as a transaction.  ``error`` replies are for
requests that could not be carried out at all.

Actions and their fields (``?`` marks an optional field):

``hello``
    -> ``{"protocol", "kernos", "workspace", "head": {"op", "commit"},
    "principals": [str], "actions": [str], "limits": {"max_request_bytes"}}``.
``op``  principal, code | tool + arguments?, key?, expect?, on_error?
    Run ``code`` as ``principal`` (``human`` runs ordinary Python in the
    user namespace; an agent runs the restricted dialect in its own
    namespace), or call registry tool ``tool`` with ``arguments`` (an object)
    as ``principal``.  The value of a final expression statement is the
    op's value.  ``key`` (a string, at most 200 characters) is an
    idempotency key: when a committed op already carries it, nothing runs
    and the result is that op's, with ``duplicate: true`` (and ``value``
    null: values are not recorded).  ``expect`` holds preconditions, checked
    atomically before the body runs::

        {"versions": {NAME: VERSION, ...}, "predicate": EXPRESSION?}

    A name's version (see ``objects``) rises each time an op commits a new
    value for it; version 0 means "no such name yet".  A stale version, or
    a predicate that is false, rejects
    the op with status ``conflict``: nothing runs, the result's ``versions``
    holds the current ones, and the rejection is recorded.  A precondition
    of version >= 1 on a name that does not exist is a ``precondition``
    error (nothing runs; recorded too).  The
    predicate runs as ``principal`` (restricted for agents).  ``on_error``
    is ``rollback`` (the default) or ``keep``: with ``keep``, human code that
    raises commits what it did before the error as an op marked failed (its
    result is ``committed`` with ``failed``: the error); agents' ops always
    roll back.
``versions``  names, principal?
    -> ``{"versions": {name: int | null}, "op": int}``: current versions
    (null: no such name); the cheap read before an op with preconditions.
``objects``  principal?, prefix?, query?, sort?, limit?, offset?, internal?
    -> ``{"objects": [OBJECT], "total": int}``.  OBJECT is
    ``{"name", "type", "size", "version", "op", "principal", "changed_at",
    "summary", "shape"}``; ``shape`` is ``[len]`` of a builtin container or string,
    a numpy array's or pandas object's shape, else null.  A placeholder a restore
    put in place of a value that could not be persisted has ``"type":
    "Unpersisted"`` and a summary that says what it stands for.  For an agent,
    only names it may read (``read:NAME``) and its own namespace (as
    ``ns:NAME``).  ``query`` keeps the objects whose name, type or principal
    contains it (ignoring case); ``total`` counts what is left.  ``sort`` is
    one of :data:`SORT_KEYS`, with a leading ``-`` for descending; the
    default is ``name``, and ties go by name.
    ``internal: false`` leaves out the image's own names (``kernos:...``: the
    agents, their namespaces, the random state), as the sidebar does.
``object``  name, principal?, preview_bytes?
    -> OBJECT plus ``"preview": {"repr", "json"?}`` bounded by
    ``preview_bytes`` (default 2,000; at most 100,000).
``grant``  agent, capability, limit?   (an op by ``human``)
    -> the grant: ``{"id", "principal", "capability", "limit", "used", ...}``.
``revoke``  agent, capability   (a capability or a grant id; an op by ``human``)
    -> ``{"revoked": [grant ids]}``.
``grants``  agent?  -> ``{"grants": [GRANT]}``.
``add_agent``  agent, limits?   (an op by ``human``)  -> ``{"agent": name}``.
``agents``  -> ``{"agents": [name]}``.
``tools``  principal?  -> ``{"tools": [{"name", "version", "schema",
    "description", "effect", "capability", "author"}]}``; for an agent, only
    the tools it may call.
``log``  limit?, all?  -> ``{"snapshots": [{"op", "commit", "when", "principal",
    "kind", "changes", "message", "bytes"}]}``, newest first; ``bytes`` is
    the image's size at that snapshot (the sum of its objects' sizes).
    ``all: true`` (the human's log only) lists the ops that wrote no snapshot
    too, from the audit log, each with ``"outcome"`` (``read-only``,
    ``failed``, ``denied``, ...) and ``"error"``, and ``"commit": null``; a
    snapshot's entry then has ``"outcome": "committed"``.
``show``  ref?  -> one snapshot: op, commit, principal, code, names.  ``@N`` of an
    op that wrote no snapshot (it only read, or rolled back) answers from its audit
    record: ``"commit": null``, its ``code`` (null if sealed), ``"outcome"`` and
    ``"error"``.
``diff``  a, b?  -> ``{"a", "b", "added", "changed", "deleted"}`` (each a list
    of ``{"name", "type", "summary"}``).
``checkout``  ref   (an op by ``human``) -> an OP-RESULT plus ``"checkout":
    {"ref", "commit", "op", "names", "bytes"}``.
``fork``  dest, ref?   (by ``human`` only: it names no principal, and agent code cannot
    send requests) -> ``kernos.fork.Forked`` as JSON (``{"source", "dest", "commit",
    "op", "genesis", "forked_from", "linked", "copied", "tail_objects"}``) plus
    ``"open": {"env": {"KERNOS_WORKSPACE": dest}}``.  A new workspace made from
    snapshot ``ref`` (default ``HEAD``) of this kernel's workspace, which it only
    reads; not an op.  ``dest`` is a *name*, not a path: 1-100 letters, digits,
    ``.``, ``_`` and ``-`` (not starting with ``.``), resolved beside this
    workspace's directory; anything else is refused (``invalid``).
``loop``  do, agent?, step?, every_ms?, max_iterations?, plan?, pending?, reason?, since_op?
    An agent's loop (``kernos.agents.loop``), by ``human`` only (it names no
    principal, and agent code cannot send requests).  ``do`` is ``start``
    (``agent`` and ``step``, agent source, required; ``every_ms``,
    ``max_iterations``, ``plan``, ``pending`` optional), ``pause``, ``resume``,
    ``stop`` (``agent`` required, ``reason`` optional with ``stop``), each one
    op -> ``{"loop": LOOP, "op", "commit"}``; or ``status`` (no op; ``agent``
    optional) -> ``{"loops": [LOOP]}``.  LOOP is ``{"agent", "status",
    "iteration", "plan", "pending" (a count), "every_ms", "max_iterations",
    "last_op", "reason", "started_op", "output"}``: ``output`` is what the last
    committed iteration printed, ``{"op", "iteration", "text", "cut"}`` (at most
    2,000 characters; ``cut`` counts those left out), or null; it is kept in
    the kernel's memory only (``kernos.agents.loop``), so a restarted kernel
    has none yet.  With ``agent`` and ``since_op``, LOOP adds ``outputs``: the
    outputs still held (the last 16 iterations) of the iterations committed
    after op ``since_op``, oldest first.
``events``  since?, op?, topic?, principal?, limit?
    -> ``{"events": [EVENT], "cursor": int}``: committed events from the
    durable log, oldest first.
``audit``  principal?, status?, topic?, limit?  -> ``{"records": [RECORD]}``.
``status``  -> ``{"workspace", "head", "names", "bytes", "ops", "audit": {"index", "hash"},
    "commits": {"small", "syncs", "unfolded"}}``: the small commits this kernel made through
    its commit tail, the syncs that made them durable (fewer when ops were grouped) and the
    frames not yet folded into git.
``stats``  limit?  -> ``{"ops": [OPSTAT], "image_bytes": int, "history_bytes": int}``:
    the last ``limit`` ops (default 500), oldest first, from the audit log.
    OPSTAT is ``{"op", "status", "principal", "kind", "at", "ms",
    "image_bytes", "history_bytes"}``: ``ms`` is the op's wall time from
    begin to its record, and the two sizes (null for ops that did not
    commit, and for ops recorded before Kernos kept them) are the image's
    size and the history's size on disk after the op.
``recall``  query, principal?, k?, kinds?  -> ``{"memories": [MEMORY]}``: what
    ``principal`` (default the human) may recall (``kernos.memory``; an agent needs
    ``memory:read``).  MEMORY is ``{"kind", "principal", "title", "text", "score", "op",
    "name", "at", "status", "matched"}``, best first (``matched``: ``text``, ``meaning`` or
    ``both``, see ``kernos.memory.vectors``).
``remember``  fact, principal?, tags?   (an op by ``principal``; an agent needs
    ``memory:write``) -> ``{"fact": {"id", "text", "tags", "op", "at"}, "op", "commit"}``.
``memory``  command   (``stats`` or ``rebuild``) -> the index's entries per kind, the chain
    head it was built to, its path and size, and ``embeddings``: ``{"on", "model",
    "dimensions", "vectors"}`` (recall by meaning; ``vectors``: entries that have one).
``files_read``  path, principal?, encoding?  -> ``{"path", "encoding", "data", "bytes",
    "op", "commit"}``; ``files_exists``  path, principal? -> ``{"path", "exists", ...}``;
    ``files_list``  prefix?, principal?, limit? -> ``{"paths", "total", ...}``;
    ``files_write`` / ``files_append``  path, data, principal?, encoding?, key? ->
    ``{"path", "bytes", "files", "op", "commit"}``; ``files_delete``  path, principal?,
    key? -> ``{"path", "deleted", "files", "op", "commit"}``.  Files in the workspace's
    files root, under the principal's ``file:read:GLOB`` / ``file:write:GLOB`` grants
    (``kernos.agents.files``); each request is one op of ``principal``, the reads too (an
    op that changes nothing: audited, no snapshot).  ``encoding`` is ``utf-8`` (the
    default) or ``base64``.  A refusal rolls the op back: ``denied``, ``invalid`` (a bad
    path), ``unknown_file``.  See ``kernos.harness.file_requests``.
``session_items``, ``session_add``, ``session_pop``, ``session_clear``, ``session_list``
    A principal's conversation items (JSON objects) in the image: reads, and changes that
    are one op of that principal each.  See ``kernos.harness.session_requests``.
``checkpoint_*`` (put, writes, get, list, delete, copy, prune, delete_runs): a principal's
graph checkpoints in the image, each change an op of it (``kernos.harness.checkpoint_requests``).

``policy``  agent, set?, principal?
    -> ``{"agent", "policy": {figure: int}, "own": {figure: int}}``: the agent's
    effective circuit-breaker policy (its own tightened by its ancestors') and
    its own.  With ``set`` (``{"failures": 3, "repeats": null, ...}``: the
    figures of ``kernos.agents.supervisor.Policy``; null lifts one) it is an op by
    ``human`` that merges them in, and the result adds ``op`` and ``commit``.  A
    ``principal`` other than ``human`` is refused (``denied``): only the human
    sets policies; a sub-agent's may only be tighter than its parent's
    (``invalid``).
``circuit``  agent?
    -> ``{"circuits": {agent: CIRCUIT | null}, "safe": {agent: op | null}}`` (every
    agent, or the one named): CIRCUIT is ``{"policy", "limit", "figures", "message",
    "op", "at", "announced"}``, why its circuit is open; null when it is closed.
    ``safe`` is the op of the agent's checkpoint tagged safe (what ``reset`` with
    ``restore`` goes back to), null when it has none (such a reset is refused).
``reset``  agent, restore?, principal?   (an op by ``human``)
    -> ``{"agent", "was_open": policy | null, "restored_from": op | null, "op",
    "commit"}``: closes the agent's circuit and zeroes its counts; with
    ``restore`` its namespace goes back to its checkpoint tagged safe.  Refused
    (``denied``) for any ``principal`` but ``human``.

Limits: a request over ``max_request_bytes`` (the kernel's
``KERNOS_MAX_SOURCE_BYTES``, 4 MiB by default) is refused with kind
``oversized`` before it is parsed further.

This module is the pure part: parsing and validating requests.  It imports
nothing from Jupyter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernos.errors import KernosError
from kernos.harness.checkpoint_fields import CHECKPOINT_CHANGES, CHECKPOINT_FIELDS

__all__ = [
    "ACTIONS",
    "ERROR_KINDS",
    "FILE_ACTIONS",
    "FILE_ENCODINGS",
    "INTERRUPT_REPLY",
    "INTERRUPT_REQUEST",
    "LOOP_DOS",
    "MUTATING",
    "PROGRESS_TYPE",
    "REPLY_TYPE",
    "REQUEST_TYPE",
    "SESSION_CHANGES",
    "SORT_KEYS",
    "VERSION",
    "ProtocolError",
    "Request",
    "error_reply",
    "ok_reply",
    "parse_request",
]

VERSION = 1
REQUEST_TYPE = "kernos_request"
REPLY_TYPE = "kernos_reply"
INTERRUPT_REQUEST = "kernos_interrupt_request"
"""On the control channel: interrupt the running op named by ``op`` or ``key`` (see
``kernos.kernel.interrupts``); answered with :data:`INTERRUPT_REPLY`."""
INTERRUPT_REPLY = "kernos_interrupt_reply"
PROGRESS_TYPE = "kernos_progress"
MAX_KEY_CHARS = 200
MAX_NAME_CHARS = 200
MAX_PREVIEW_BYTES = 100_000
MAX_PATH_CHARS = 1024
"""A file request's ``path`` or ``prefix`` (``kernos.agents.files.MAX_PATH``)."""
FILE_ENCODINGS = ("utf-8", "base64")
"""How a file request's ``data`` holds the bytes: UTF-8 text, or base64 (any bytes)."""

ERROR_KINDS = frozenset({
    "malformed",          # not a valid request: unknown action, unknown or mistyped field
    "protocol",           # another protocol version
    "oversized",          # over the size limit
    "unknown_principal",  # no principal of that name
    "unknown_tool",       # no tool of that name visible to the principal
    "unknown_name",       # no object of that name
    "unknown_ref",        # no snapshot of that reference
    "unknown_file",       # no file at that path in the files root
    "precondition",       # a precondition that cannot be evaluated (a missing name, ...)
    "denied",             # the principal lacks the capability for this request
    "invalid",            # a well-formed request the runtime refuses (a bad grant, ...)
    "workspace",          # the kernel has no usable workspace
    "internal",           # a bug in Kernos: the message says what to report
})

_STR = (str,)
_INT = (int,)
_OBJ = (dict,)
_LIST = (list,)


@dataclass(frozen=True, kw_only=True)
class _Field:
    types: tuple[type, ...]
    required: bool = False


def _f(types: tuple[type, ...], required: bool = False) -> _Field:
    return _Field(types=types, required=required)


# Per action: its allowlisted fields.  ``v`` and ``action`` are implied.
ACTIONS: dict[str, dict[str, _Field]] = {
    "hello": {},
    "op": {"principal": _f(_STR, True), "code": _f(_STR), "tool": _f(_STR),
           "arguments": _f(_OBJ), "key": _f(_STR), "expect": _f(_OBJ),
           "on_error": _f(_STR)},
    "versions": {"names": _f(_LIST, True), "principal": _f(_STR)},
    "objects": {"principal": _f(_STR), "prefix": _f(_STR), "query": _f(_STR),
                "sort": _f(_STR), "limit": _f(_INT), "offset": _f(_INT),
                "internal": _f((bool,))},
    "object": {"name": _f(_STR, True), "principal": _f(_STR), "preview_bytes": _f(_INT)},
    "grant": {"agent": _f(_STR, True), "capability": _f(_STR, True),
              "limit": _f((int, str))},
    "revoke": {"agent": _f(_STR, True), "capability": _f(_STR, True)},
    "grants": {"agent": _f(_STR)},
    "add_agent": {"agent": _f(_STR, True), "limits": _f(_OBJ)},
    "agents": {},
    "tools": {"principal": _f(_STR)},
    "log": {"limit": _f(_INT), "principal": _f(_STR), "all": _f((bool,))},
    "show": {"ref": _f(_STR)},
    "diff": {"a": _f(_STR, True), "b": _f(_STR)},
    "checkout": {"ref": _f(_STR, True)},
    "fork": {"dest": _f(_STR, True), "ref": _f(_STR)},
    "loop": {"do": _f(_STR, True), "agent": _f(_STR), "step": _f(_STR), "every_ms": _f(_INT),
             "max_iterations": _f(_INT), "plan": _f((str, int, float, bool, list, dict)),
             "pending": _f(_LIST), "reason": _f(_STR), "since_op": _f(_INT)},
    "events": {"since": _f(_INT), "op": _f(_INT), "topic": _f(_STR), "principal": _f(_STR),
               "limit": _f(_INT)},
    "audit": {"principal": _f(_STR), "status": _f(_STR), "topic": _f(_STR), "limit": _f(_INT)},
    "status": {},
    "stats": {"limit": _f(_INT)},
    "recall": {"query": _f(_STR, True), "principal": _f(_STR), "k": _f(_INT),
               "kinds": _f(_LIST)},
    "remember": {"fact": _f(_STR, True), "principal": _f(_STR), "tags": _f(_LIST)},
    "memory": {"command": _f(_STR, True)},
    "refused": {"principal": _f(_STR, True), "via": _f(_STR, True), "what": _f(_STR, True),
                "problem": _f(_STR, True)},
    "policy": {"agent": _f(_STR, True), "set": _f(_OBJ), "principal": _f(_STR)},
    "circuit": {"agent": _f(_STR)},
    "reset": {"agent": _f(_STR, True), "restore": _f((bool,)), "principal": _f(_STR)},
    "files_read": {"path": _f(_STR, True), "principal": _f(_STR), "encoding": _f(_STR)},
    "files_exists": {"path": _f(_STR, True), "principal": _f(_STR)},
    "files_list": {"prefix": _f(_STR), "principal": _f(_STR), "limit": _f(_INT)},
    "files_write": {"path": _f(_STR, True), "data": _f(_STR, True), "principal": _f(_STR),
                    "encoding": _f(_STR), "key": _f(_STR)},
    "files_append": {"path": _f(_STR, True), "data": _f(_STR, True), "principal": _f(_STR),
                     "encoding": _f(_STR), "key": _f(_STR)},
    "files_delete": {"path": _f(_STR, True), "principal": _f(_STR), "key": _f(_STR)},
    "session_items": {"session": _f(_STR, True), "principal": _f(_STR), "limit": _f(_INT)},
    "session_add": {"session": _f(_STR, True), "items": _f(_LIST, True), "principal": _f(_STR),
                    "key": _f(_STR)},
    "session_pop": {"session": _f(_STR, True), "principal": _f(_STR)},
    "session_clear": {"session": _f(_STR, True), "principal": _f(_STR)},
    "session_list": {"principal": _f(_STR)},
    **{action: {"principal": _f(_STR), **{name: _f(*spec) for name, spec in fields.items()}}
       for action, fields in CHECKPOINT_FIELDS.items()},
}

SORT_KEYS = ("name", "type", "size", "version", "op", "principal", "changed_at")
"""What ``objects`` can sort by."""

FILE_ACTIONS = frozenset({"files_read", "files_exists", "files_list", "files_write",
                          "files_append", "files_delete"})
"""The file requests (``kernos.harness.file_requests``): each runs as an op, reads too."""
SESSION_CHANGES = frozenset({"session_add", "session_pop", "session_clear"})
"""The session requests that change a session (``kernos.harness.session_requests``)."""
MUTATING = frozenset({"op", "grant", "revoke", "add_agent", "checkout", "remember", "loop",
                      "policy", "reset"}) | FILE_ACTIONS | SESSION_CHANGES | CHECKPOINT_CHANGES
"""Actions that run as an op (and so wait for the op lock and write history)."""
LOOP_DOS = ("start", "pause", "resume", "stop", "status")
"""What the ``loop`` action does (``status`` reads; the others are ops)."""


class ProtocolError(KernosError):
    """A request that cannot be carried out; ``kind`` is one of :data:`ERROR_KINDS`."""

    def __init__(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.data = dict(data or {})

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": str(self), "data": self.data}


@dataclass(frozen=True, kw_only=True)
class Request:
    """A validated request: its action and its (allowlisted, type-checked) fields."""

    action: str
    fields: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


def _shown(value: object, limit: int = 60) -> str:
    """A bounded description of a hostile value, for an error message."""
    if isinstance(value, str):
        text = value if len(value) <= limit else value[:limit] + "..."
        return repr(text)
    if type(value) in (int, bool, float) or value is None:
        return repr(value)[:limit]
    return type(value).__name__


def parse_request(content: object) -> Request:
    """Validate a request's content, or raise :class:`ProtocolError` saying what is wrong."""
    if type(content) is not dict:
        raise ProtocolError("malformed", f"a request is a JSON object, not "
                            f"{type(content).__name__}; send "
                            '{"v": 1, "action": "hello"} to start')
    assert isinstance(content, dict)
    version = content.get("v")
    if version != VERSION:
        raise ProtocolError(
            "protocol", f"this kernel speaks version {VERSION} of the Kernos harness protocol, "
            f"and the request says {'no version' if version is None else _shown(version)}; "
            "upgrade the client (pip install -U kernos) or send \"v\": 1",
            {"supported": [VERSION]})
    action = content.get("action")
    if type(action) is not str or action not in ACTIONS:
        raise ProtocolError("malformed", f"unknown action {_shown(action)}; the actions are "
                            f"{', '.join(sorted(ACTIONS))}", {"actions": sorted(ACTIONS)})
    assert isinstance(action, str)
    spec = ACTIONS[action]
    unknown = sorted(str(key)[:40] for key in content if key not in spec and key not in (
        "v", "action"))
    if unknown:
        raise ProtocolError("malformed", f"{action}: unknown fields {unknown}; its fields are "
                            f"{sorted(spec) or 'none'}")
    fields: dict[str, Any] = {}
    for name, field in spec.items():
        if name not in content or content[name] is None:
            if field.required:
                raise ProtocolError("malformed", f"{action}: the field {name!r} is required")
            continue
        value = content[name]
        # Exact types: a bool is not an int here.
        if type(value) not in field.types:
            wanted = " or ".join(t.__name__ for t in field.types)
            raise ProtocolError("malformed", f"{action}: {name!r} must be {wanted}, not "
                                f"{type(value).__name__}")
        fields[name] = value
    _check_action(action, fields)
    return Request(action=action, fields=fields)


def _check_action(action: str, fields: dict[str, Any]) -> None:
    for name in ("principal", "agent", "name", "tool"):
        value = fields.get(name)
        if value is not None and not 0 < len(value) <= MAX_NAME_CHARS:
            raise ProtocolError("malformed", f"{action}: {name!r} must be 1 to "
                                f"{MAX_NAME_CHARS} characters")
    for name in ("limit", "offset", "since", "op"):
        value = fields.get(name)
        if value is not None and value < 0:
            raise ProtocolError("malformed", f"{action}: {name!r} must be >= 0, not {value}")
    if action == "op":
        has_code, has_tool = "code" in fields, "tool" in fields
        if has_code == has_tool:
            raise ProtocolError("malformed", "op: give exactly one of 'code' (source to run) "
                                "or 'tool' (a registry tool to call, with 'arguments')")
        if "arguments" in fields and not has_tool:
            raise ProtocolError("malformed", "op: 'arguments' go with 'tool', not 'code'")
        key = fields.get("key")
        if key is not None and not 0 < len(key) <= MAX_KEY_CHARS:
            raise ProtocolError("malformed", f"op: 'key' must be 1 to {MAX_KEY_CHARS} "
                                "characters")
        if "expect" in fields:
            fields["expect"] = _parse_expect(fields["expect"])
        if fields.get("on_error") not in (None, "rollback", "keep"):
            raise ProtocolError("malformed", "op: 'on_error' is 'rollback' or 'keep', not "
                                f"{_shown(fields['on_error'])}")
    if action == "objects":
        sort = fields.get("sort")
        if sort is not None and sort.removeprefix("-") not in SORT_KEYS:
            raise ProtocolError("malformed", f"objects: 'sort' is one of {', '.join(SORT_KEYS)} "
                                f"(a leading '-' for descending), not {_shown(sort)}")
        query = fields.get("query")
        if query is not None and len(query) > MAX_NAME_CHARS:
            raise ProtocolError("malformed", f"objects: 'query' is at most {MAX_NAME_CHARS} "
                                "characters")
    if action == "versions":
        names = fields["names"]
        if not names or len(names) > 1000 or any(type(name) is not str or not name
                                                 for name in names):
            raise ProtocolError("malformed", "versions: 'names' must be a list of 1 to 1000 "
                                "non-empty strings")
    if action == "object":
        preview = fields.get("preview_bytes")
        if preview is not None and not 0 <= preview <= MAX_PREVIEW_BYTES:
            raise ProtocolError("malformed", f"object: 'preview_bytes' must be 0 to "
                                f"{MAX_PREVIEW_BYTES}")
    if action == "add_agent":
        limits = fields.get("limits") or {}
        if any(type(value) is not int for value in limits.values()):
            raise ProtocolError("malformed", "add_agent: 'limits' maps limit names to ints")
    if action == "loop":
        _check_loop(fields)
    if action in FILE_ACTIONS:
        _check_files(action, fields)
    if action == "events" and "since" in fields and "op" in fields:
        raise ProtocolError("malformed", "events: give either 'since' or 'op', not both")


def _check_loop(fields: dict[str, Any]) -> None:
    do = fields["do"]
    if do not in LOOP_DOS:
        raise ProtocolError("malformed", f"loop: 'do' is one of {', '.join(LOOP_DOS)}, not "
                            f"{_shown(do)}")
    if do != "status" and "agent" not in fields:
        raise ProtocolError("malformed", f"loop: do={do} needs 'agent' (whose loop)")
    allowed = {"start": {"step", "every_ms", "max_iterations", "plan", "pending"},
               "stop": {"reason"}, "status": {"since_op"}}.get(do, set())
    extra = sorted(name for name in ("step", "every_ms", "max_iterations", "plan", "pending",
                                     "reason", "since_op")
                   if name in fields and name not in allowed)
    if extra:
        raise ProtocolError("malformed", f"loop: {extra} do not go with do={do}")
    if "since_op" in fields and "agent" not in fields:
        raise ProtocolError("malformed", "loop: since_op needs 'agent' (whose outputs)")
    if do == "start" and "step" not in fields:
        raise ProtocolError("malformed", "loop: do=start needs 'step' (the agent source each "
                            "iteration runs)")


def _check_files(action: str, fields: dict[str, Any]) -> None:
    for name in ("path", "prefix"):
        value = fields.get(name)
        if value is not None and len(value) > MAX_PATH_CHARS:
            raise ProtocolError("malformed", f"{action}: {name!r} is at most "
                                f"{MAX_PATH_CHARS} characters, not {len(value):,}")
    if "path" in fields and not fields["path"]:
        raise ProtocolError("malformed", f"{action}: 'path' is empty; give a path relative "
                            "to the files root, like 'reports/r.md'")
    encoding = fields.get("encoding")
    if encoding is not None and encoding not in FILE_ENCODINGS:
        raise ProtocolError("malformed", f"{action}: 'encoding' is one of "
                            f"{', '.join(FILE_ENCODINGS)}, not {_shown(encoding)}")
    key = fields.get("key")
    if key is not None and not 0 < len(key) <= MAX_KEY_CHARS:
        raise ProtocolError("malformed", f"{action}: 'key' must be 1 to {MAX_KEY_CHARS} "
                            "characters")


def _parse_expect(expect: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(str(key)[:40] for key in expect if key not in ("versions", "predicate"))
    if unknown:
        raise ProtocolError("malformed", f"op: unknown fields in 'expect': {unknown}; they are "
                            "'versions' and 'predicate'")
    versions = expect.get("versions") or {}
    if type(versions) is not dict or len(versions) > 1000:
        raise ProtocolError("malformed", "op: 'expect.versions' maps names to versions "
                            "(at most 1000)")
    for name, version in versions.items():
        if type(version) is not int or version < 0 or not name:
            raise ProtocolError("malformed", f"op: 'expect.versions' needs an int >= 0 for "
                                f"each name; {_shown(name)} has {_shown(version)}")
    predicate = expect.get("predicate")
    if predicate is not None and type(predicate) is not str:
        raise ProtocolError("malformed", "op: 'expect.predicate' is an expression (a string)")
    return {"versions": dict(versions), "predicate": predicate}


def ok_reply(action: str, result: dict[str, Any]) -> dict[str, Any]:
    return {"v": VERSION, "status": "ok", "action": action, "result": result}


def error_reply(action: str | None, error: ProtocolError) -> dict[str, Any]:
    return {"v": VERSION, "status": "error", "action": action, "error": error.to_json()}
