"""The MCP server's own tools: their names, schemas and descriptions.

Built-in tool names start with ``kernos-``.  Registry tool names are lowercase
letters, digits and ``_`` (``kernos.agents.registry``), so the two can never
collide: every registry tool can be offered under its own name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BUILTINS", "PREFIX", "Builtin"]

PREFIX = "kernos-"

_NAME = {"type": "string", "minLength": 1, "maxLength": 200}
_REF = {"type": "string", "minLength": 1, "maxLength": 200,
        "description": "A commit id or prefix, HEAD, HEAD~N, or @N for op N."}
_PATH = {"type": "string", "minLength": 1, "maxLength": 1024,
         "description": "A path relative to the workspace's files root, like 'reports/r.md' "
                        "(no '..', not absolute)."}
_ENCODING = {"type": "string", "enum": ["utf-8", "base64"]}
_DATA = {"type": "string", "maxLength": 4_000_000,
         "description": "What to write: text, or base64 bytes with encoding 'base64'."}
_KEY = {"type": "string", "minLength": 1, "maxLength": 200,
        "description": "An idempotency key: a resend with the same key changes nothing."}
_FILES = ("Files live in the workspace's files root and are part of the image: they commit "
          "and roll back with the op. An agent needs a file:read:GLOB grant to read a path "
          "and file:write:GLOB to change it (its own agents/NAME/ subtree needs none).")
_DATA_ENCODING = {**_ENCODING, "description": "utf-8 (the default): data is text; base64: "
                                              "data is base64-encoded bytes."}
_PUT = {"path": _PATH, "data": _DATA, "encoding": _DATA_ENCODING, "key": _KEY}


@dataclass(frozen=True, kw_only=True)
class Builtin:
    """One of the server's own tools."""

    name: str
    """The MCP tool name (``kernos-...``)."""
    description: str
    """What it does, for the model that picks tools."""
    schema: dict[str, Any]
    """Its JSON input schema."""
    read_only: bool
    """True when it never changes the image."""
    human_only: bool = False
    """Offered only when the server runs as ``human``."""


def _object_schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


BUILTINS: tuple[Builtin, ...] = (
    Builtin(
        name="kernos-op",
        description=(
            "Run one op in the Kernos image, as this server's principal: either Python code "
            "(the human runs ordinary Python in the shared namespace; an agent runs the "
            "restricted dialect in its own namespace) or a call of a registry tool with its "
            "arguments. The op commits completely, as a new snapshot, or rolls back "
            "completely. The value of a final expression is returned. 'key' makes the op "
            "idempotent (a resend with the same key runs nothing); 'expect_versions' and "
            "'predicate' are preconditions checked before anything runs (a stale version "
            "gives status 'conflict'; read versions with kernos-object)."),
        schema=_object_schema({
            "code": {"type": "string", "description": "Python source to run as one op."},
            "tool": {"type": "string", "minLength": 1, "maxLength": 200,
                     "description": "A registry tool to call instead of code."},
            "arguments": {"type": "object", "description": "The tool's arguments."},
            "key": {"type": "string", "minLength": 1, "maxLength": 200,
                    "description": "An idempotency key."},
            "expect_versions": {
                "type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                "description": "Names and the versions they must still have (0: must not "
                               "exist yet)."},
            "predicate": {"type": "string",
                          "description": "An expression that must be true for the op to run."},
        }),
        read_only=False),
    Builtin(
        name="kernos-objects",
        description=(
            "List the objects (top-level names) in the image that this principal may read, "
            "sorted by name: type, size, version, the op that last changed it and a short "
            "summary."),
        schema=_object_schema({
            "prefix": {"type": "string", "description": "Only names starting with this."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000,
                      "description": "At most this many (default 100)."},
            "offset": {"type": "integer", "minimum": 0,
                       "description": "Skip this many first (for paging)."},
        }),
        read_only=True),
    Builtin(
        name="kernos-object",
        description=(
            "Describe one object of the image and preview its value (a bounded repr, and the "
            "value as JSON when it is plain JSON data). Also readable as the resource "
            "kernos://objects/{name}."),
        schema=_object_schema({
            "name": {**_NAME, "description": "The object's name."},
            "preview_bytes": {"type": "integer", "minimum": 0, "maximum": 100_000,
                              "description": "Bound of the preview (default 2000)."},
        }, ("name",)),
        read_only=True),
    Builtin(
        name="kernos-log",
        description="The history: committed snapshots, newest first (op, commit, when, who, "
                    "which names changed, the first line of the code). An agent sees the "
                    "snapshots that changed names it may read, or that its own ops made, "
                    "with only those names, and the code of its own ops only.",
        schema=_object_schema({
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000,
                      "description": "At most this many snapshots (default 20)."},
        }),
        read_only=True),
    Builtin(
        name="kernos-show",
        description="One snapshot of the history: its op, principal, code and names.",
        schema=_object_schema({"ref": {**_REF, "description": f"{_REF['description']} "
                                                              "Default HEAD."}}),
        read_only=True, human_only=True),
    Builtin(
        name="kernos-diff",
        description="The names added, changed and deleted between two snapshots (b defaults "
                    "to HEAD).",
        schema=_object_schema({"a": _REF, "b": _REF}, ("a",)),
        read_only=True, human_only=True),
    Builtin(
        name="kernos-checkout",
        description=(
            "Make the image equal to an earlier snapshot. This is a new op (history is never "
            "rewritten), so it can itself be undone by checking out the snapshot before it."),
        schema=_object_schema({"ref": _REF}, ("ref",)),
        read_only=False, human_only=True),
    Builtin(
        name="kernos-events",
        description=(
            "Committed events from the durable log, oldest first, after a cursor ('since', a "
            "sequence number) or after an op ('op'). Returns the events and the cursor to pass "
            "as 'since' next time. An agent sees the events its own ops emitted."),
        schema=_object_schema({
            "since": {"type": "integer", "minimum": 0,
                      "description": "Events after this sequence number (a cursor)."},
            "op": {"type": "integer", "minimum": 0,
                   "description": "Events of the ops after op N."},
            "topic": {"type": "string", "minLength": 1,
                      "description": "A topic pattern: orders.*, orders.**"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000,
                      "description": "At most this many events (default 100)."},
        }),
        read_only=True),
    Builtin(
        name="kernos-recall",
        description=(
            "Search this principal's memory (full text, best first): its past ops (code, "
            "results, events, LLM exchanges), the facts it stored with kernos-remember, its "
            "own names and the names it may read. An agent needs the memory:read grant."),
        schema=_object_schema({
            "query": {"type": "string", "minLength": 1, "maxLength": 4096,
                      "description": "Words to look for (plain words; no query syntax)."},
            "k": {"type": "integer", "minimum": 1, "maximum": 100,
                  "description": "At most this many memories (default 5)."},
            "kinds": {"type": "array", "description": "Only these layers: working, "
                                                      "episodic, semantic."},
        }, ("query",)),
        read_only=True),
    Builtin(
        name="kernos-remember",
        description=(
            "Store a fact in this principal's memory, as an op (it commits as a new snapshot "
            "and can be recalled later with kernos-recall). An agent needs the memory:write "
            "grant. Never store personal data in a fact: it could not be erased."),
        schema=_object_schema({
            "fact": {"type": "string", "minLength": 1, "maxLength": 8192,
                     "description": "The fact, as plain text."},
            "tags": {"type": "array", "description": "Names to file it under (letters, "
                                                     "digits, _ . -)."},
        }, ("fact",)),
        read_only=False),
    Builtin(
        name="kernos-files-read",
        description=f"Read one file, as this principal. {_FILES} A file that is not UTF-8 "
                    "text must be read with encoding 'base64'.",
        schema=_object_schema({"path": _PATH, "encoding": {
            **_ENCODING, "description": "utf-8 (the default): the text; base64: the bytes."}},
            ("path",)),
        read_only=True),
    Builtin(
        name="kernos-files-list",
        description=f"List the files under a prefix, as this principal, sorted. {_FILES}",
        schema=_object_schema({
            "prefix": {"type": "string", "maxLength": 1024,
                       "description": "Only paths starting with this (default: all)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100_000,
                      "description": "At most this many paths (default 10000)."}}),
        read_only=True),
    Builtin(
        name="kernos-files-exists",
        description=f"Whether a file exists at a path, as this principal. {_FILES}",
        schema=_object_schema({"path": _PATH}, ("path",)),
        read_only=True),
    Builtin(
        name="kernos-files-write",
        description=f"Write a whole file (made or replaced), as one op of this principal "
                    f"that commits as a new snapshot. {_FILES}",
        schema=_object_schema(_PUT, ("path", "data")),
        read_only=False),
    Builtin(
        name="kernos-files-append",
        description=f"Append to a file (made if missing), as one op of this principal. "
                    f"{_FILES}",
        schema=_object_schema(_PUT, ("path", "data")),
        read_only=False),
    Builtin(
        name="kernos-files-delete",
        description=f"Delete a file, as one op of this principal. {_FILES}",
        schema=_object_schema({"path": _PATH, "key": _KEY}, ("path",)),
        read_only=False),
    Builtin(
        name="kernos-loop",
        description=(
            "Agents' loops (each iteration of a loop is one op, run as its agent between "
            "other ops): 'status' shows them (status, iteration, pending work, what the last "
            "committed iteration printed); 'pause', 'resume' and 'stop' change one, and "
            "'start' starts one with agent code as its step, each an op by the human. Only "
            "a server running as the human may change a loop; an agent's server reads its "
            "own loop only."),
        schema=_object_schema({
            "do": {"type": "string", "enum": ["status", "pause", "resume", "stop", "start"],
                   "description": "What to do."},
            "agent": {**_NAME, "description": "Whose loop (all of them, for 'status', "
                                              "when left out)."},
            "step": {"type": "string", "minLength": 1, "maxLength": 100_000,
                     "description": "'start' only: the agent code each iteration runs."},
            "every_ms": {"type": "integer", "minimum": 0, "maximum": 86_400_000,
                         "description": "'start' only: milliseconds between iterations."},
            "max_iterations": {"type": "integer", "minimum": 1,
                               "description": "'start' only: finish after this many."},
            "pending": {"type": "array", "description": "'start' only: the work items "
                                                        "(plain data)."},
            "reason": {"type": "string", "maxLength": 500,
                       "description": "'stop' only: why."},
        }, ("do",)),
        read_only=False),
)
