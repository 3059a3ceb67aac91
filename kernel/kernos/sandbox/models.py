"""What ``run_code`` returns, shaped like ``e2b_code_interpreter.models``, and the mapping
from a Kernos op's result onto it.

The classes keep E2B's names, fields and methods (``Execution.text``,
``Result.formats()``, ``Result["png"]``, ``to_json``, the ``_repr_*_`` hooks, so
that a notebook displays a ``Result`` as E2B's does); ``Execution`` also carries
the Kernos facts of its op (``status``, ``op``, ``commit``, ``principal``).

:func:`execution_from_op` is the one mapping from an
:class:`~kernos.harness.results.OpResult`:

- ``output`` (what the op printed; the kernel captures stdout and stderr into
  one text) → ``logs.stdout``, one entry per line with its line ending, as
  E2B gives one entry per write; ``logs.stderr`` stays empty (see the package
  docstring);
- ``value`` (the final expression's bounded repr, and its JSON when it is
  plain data) → the main :class:`Result` (``is_main_result``, ``text`` the
  repr, ``json`` the JSON of a dict or list); a final expression whose value
  is None gives no result, as in IPython;
- ``error`` (any op that did not commit) → :class:`ExecutionError` whose
  ``name`` is the exception's class name (``ZeroDivisionError``,
  ``CapabilityDenied``, ``OpVetoed``, ``AgentCodeRejected``, ...), ``value``
  its message and ``traceback`` the text the kernel sends (it sends no frames:
  ``"Name: value"``);
- ``op`` → ``execution_count`` (the op number: it rises across sandboxes on
  one workspace, as a kernel's execution count does across cells).

:func:`result_from_bundle` maps a Jupyter MIME bundle (``display_data`` /
``execute_result`` content) onto a :class:`Result`, as E2B's server does.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernos.harness.results import OpResult

__all__ = ["MIME_FIELDS", "Execution", "ExecutionError", "Logs", "OutputMessage", "Result",
           "execution_from_op", "result_from_bundle"]

MIME_FIELDS: dict[str, str] = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript",
}
"""Jupyter MIME types → :class:`Result` fields (E2B's names); other types go to ``extra``."""

_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json",
            "javascript", "data", "chart")


@dataclass
class OutputMessage:
    """One chunk of output, as the ``on_stdout`` / ``on_stderr`` callbacks get it."""

    line: str
    timestamp: int
    """Unix epoch in nanoseconds (when the sandbox received it)."""
    error: bool = False
    """True for stderr."""

    def __str__(self) -> str:
        return self.line


@dataclass
class ExecutionError:
    """Why a cell did not commit: ``name`` (the exception's class), ``value``, ``traceback``."""

    name: str
    value: str
    traceback: str

    def to_json(self) -> str:
        return jsonlib.dumps({"name": self.name, "value": self.value,
                              "traceback": self.traceback})


@dataclass(repr=False)
class Result:
    """One output of a cell: the main result (its final expression) or a display."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    """Base64, as Jupyter and E2B carry it."""
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    data: dict[str, Any] | None = None
    chart: Any = None
    is_main_result: bool = False
    """True for the cell's final expression; displays are not main results."""
    extra: dict[str, Any] | None = None
    """Other MIME types of the bundle, by MIME type."""

    def __getitem__(self, item: str) -> Any:
        return getattr(self, item)

    def formats(self) -> list[str]:
        """The formats this result has (E2B's names, then ``extra``'s MIME types)."""
        found = [name for name in _FORMATS if getattr(self, name)]
        return found + list(self.extra or {})

    def __str__(self) -> str:
        return self.__repr__()

    def __repr__(self) -> str:
        if self.text:
            return f"Result({self.text})"
        return "Result(Formats: " + ", ".join(self.formats()) + ")"

    def _repr_html_(self) -> str | None:
        return self.html

    def _repr_markdown_(self) -> str | None:
        return self.markdown

    def _repr_svg_(self) -> str | None:
        return self.svg

    def _repr_png_(self) -> str | None:
        return self.png

    def _repr_jpeg_(self) -> str | None:
        return self.jpeg

    def _repr_pdf_(self) -> str | None:
        return self.pdf

    def _repr_latex_(self) -> str | None:
        return self.latex

    def _repr_json_(self) -> Any:
        return self.json

    def _repr_javascript_(self) -> str | None:
        return self.javascript


@dataclass(repr=False)
class Logs:
    """What the cell printed: lists of strings, one per chunk."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Logs(stdout: {self.stdout}, stderr: {self.stderr})"

    def to_json(self) -> str:
        return jsonlib.dumps({"stdout": self.stdout, "stderr": self.stderr})


@dataclass(repr=False)
class Execution:
    """The outcome of one ``run_code``: one op of the sandbox's principal."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    """The op's number."""
    status: str = "committed"
    """The op's status: committed, rolled back, denied, vetoed, interrupted, ..."""
    op: int | None = None
    commit: str | None = None
    """The snapshot the op wrote (None if it did not commit)."""
    principal: str | None = None

    def __repr__(self) -> str:
        return (f"Execution(Results: {self.results}, Logs: {self.logs}, "
                f"Error: {self.error})")

    @property
    def text(self) -> str | None:
        """The main result's text (the final expression's repr), if any."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @property
    def committed(self) -> bool:
        return self.status == "committed"

    def to_json(self) -> str:
        results = [{**{name: result[name] for name in result.formats()
                       if name in _FORMATS and name != "chart"},
                    "text": result.text} for result in self.results]
        return jsonlib.dumps({"results": results, "logs": self.logs.to_json(),
                              "error": self.error.to_json() if self.error else None})


def result_from_bundle(bundle: Mapping[str, Any], *, is_main_result: bool = False) -> Result:
    """A :class:`Result` from a Jupyter MIME bundle (``{"text/html": ..., ...}``).

    Known MIME types fill E2B's fields; any other goes to ``extra`` under its
    MIME type.  A JSON value given as text is parsed."""
    result = Result(is_main_result=is_main_result)
    extra: dict[str, Any] = {}
    for mime, content in bundle.items():
        name = MIME_FIELDS.get(mime)
        if name is None:
            extra[mime] = content
            continue
        if name == "json" and isinstance(content, str):
            try:
                content = jsonlib.loads(content)
            except ValueError:
                extra[mime] = content
                continue
        if isinstance(content, list) and name != "json":  # nbformat's multiline strings
            content = "".join(str(part) for part in content)
        setattr(result, name, content)
    result.extra = extra or None
    return result


def _lines(text: str) -> Iterator[str]:
    yield from text.splitlines(keepends=True)


def execution_from_op(result: OpResult,
                      outputs: Iterable[tuple[str, Mapping[str, Any]]] = ()) -> Execution:
    """The :class:`Execution` of one op's result (see the module docstring).

    ``outputs``: what the op's code published on IOPub, in order, as
    ``(msg_type, content)``: a ``display_data`` is a :class:`Result` (before the
    main result), an ``execute_result`` the main result, a ``stream`` a log entry."""
    execution = Execution(execution_count=result.op, status=result.status, op=result.op,
                          commit=result.commit, principal=result.principal)
    main: Result | None = None
    for kind, content in outputs:
        if kind in ("display_data", "update_display_data"):
            execution.results.append(result_from_bundle(content.get("data") or {}))
        elif kind == "execute_result":
            main = result_from_bundle(content.get("data") or {}, is_main_result=True)
        elif kind == "stream":
            logs = execution.logs.stderr if content.get("name") == "stderr" else \
                execution.logs.stdout
            logs.append(str(content.get("text", "")))
    execution.logs.stdout.extend(_lines(result.output))
    if main is None:
        main = _main_result(result)
    if main is not None:
        execution.results.append(main)
    if result.error is not None and not result.committed:
        execution.error = error_from_op(result)
    return execution


def _main_result(result: OpResult) -> Result | None:
    """The final expression's value as the main result (None gives none, as in IPython)."""
    value = result.value
    if value is None or (value.has_json and value.json is None):
        return None
    main = Result(text=value.repr, is_main_result=True)
    if value.has_json and isinstance(value.json, (dict, list)):
        main.json = value.json
    return main


def error_from_op(result: OpResult) -> ExecutionError:
    """The :class:`ExecutionError` of an op that did not commit."""
    assert result.error is not None
    info = result.error
    name = str(info.data.get("type") or info.kind.title().replace(" ", ""))
    value = info.message
    prefix = f"{name}: "
    if value.startswith(prefix):
        value = value[len(prefix):]
    op = "the op" if result.op is None else f"op {result.op}"
    status = result.status or info.kind
    traceback = f"{name}: {value}\n({op}: {status}; rolled back, nothing it did was kept)"
    return ExecutionError(name=name, value=value, traceback=traceback)
