"""The agent dialect: RestrictedPython, narrowed further.

Agent code is compiled with RestrictedPython (names and attributes starting
with ``_`` refused; attribute, item, iteration and write access routed
through guards; no ``exec``/``eval``; no ``nonlocal``, ``async``, ``try*``).
On top of that this policy refuses, before anything runs:

* ``import`` and ``from ... import`` (modules reach agents only as the
  allowlisted wrappers in their builtins);
* a bare ``except:`` (it would swallow the runtime's limit breaches) and
  ``finally:`` (it would run agent code while a breach unwinds);
* an ``except`` clause naming anything but the allowed exception classes,
  and rebinding any builtin name (``ValueError = 5``, ``def len(...)``):
  otherwise matching a breach against the clause could itself raise, and an
  outer ``except Exception`` would catch that instead of the breach;
* ``global`` (an agent function rebinding namespace names behind the op's
  back) -- top-level assignments are how agents keep state;
* ``a ** b``, ``a * b`` and ``a << b`` go through ``_binop_``, which refuses
  results too large to build (``10 ** 10 ** 9``, ``"x" * 10 ** 10``) before
  the C code starts on them;
* special methods in classes other than ``__init__`` (``__eq__``,
  ``__del__`` and friends are how objects booby-trap the code that handles
  them);
* source over the size limit and syntax nested deeper than the depth
  limit (``compile`` itself overflows on ~500-term chains).
"""

from __future__ import annotations

import ast
import sys
import types
from typing import Any

from RestrictedPython.compile import compile_restricted_eval, compile_restricted_exec
from RestrictedPython.transformer import RestrictingNodeTransformer

from kernos.agents.guards import AGENT_BUILTINS, EXCEPTIONS
from kernos.errors import AgentCodeRejected

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_MAX_SOURCE", "compile_agent",
           "compile_agent_with_value"]

DEFAULT_MAX_SOURCE = 64 * 1024
DEFAULT_MAX_DEPTH = 60
_ALLOWED_SPECIAL_METHODS = frozenset({"__init__"})
_GUARDED_OPERATORS = {ast.Pow: "**", ast.Mult: "*", ast.LShift: "<<"}


class AgentPolicy(RestrictingNodeTransformer):
    """RestrictedPython's transformer with the Kernos agent restrictions added."""

    def visit_Import(self, node: ast.Import) -> Any:
        self.error(node, "imports are not available to agents; allowlisted modules are "
                         "already in scope (datetime, json, math, re, decimal)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        self.error(node, "imports are not available to agents")

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> Any:
        if node.type is None:
            self.error(node, "a bare 'except:' is not allowed; name the exceptions to catch")
        else:
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if not all(isinstance(name, ast.Name) and name.id in EXCEPTIONS
                       for name in names):
                self.error(node, "an 'except' clause may name only the exceptions agents "
                                 f"have: {', '.join(sorted(EXCEPTIONS))}")
        self._check_rebinding(node, node.name)
        return super().visit_ExceptHandler(node)

    def _check_rebinding(self, node: ast.AST, name: str | None) -> None:
        if name is not None and name in AGENT_BUILTINS:
            self.error(node, f"{name!r} is a builtin of agent code and cannot be rebound")

    def visit_Name(self, node: ast.Name) -> Any:
        if not isinstance(node.ctx, ast.Load):
            self._check_rebinding(node, node.id)
        return super().visit_Name(node)

    def visit_arg(self, node: ast.arg) -> Any:
        self._check_rebinding(node, node.arg)
        return super().visit_arg(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        self._check_rebinding(node, node.name)
        return super().visit_ClassDef(node)

    def visit_Try(self, node: ast.Try) -> Any:
        if node.finalbody:
            self.error(node, "'finally' is not available to agents; handle named "
                             "exceptions with 'except' instead")
        return super().visit_Try(node)

    def visit_Global(self, node: ast.Global) -> Any:
        self.error(node, "'global' is not allowed; keep state in top-level names")

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        node = self.node_contents_visit(node)
        symbol = _GUARDED_OPERATORS.get(type(node.op))
        if symbol is None:
            return node
        function = ast.copy_location(ast.Name("_binop_", ast.Load()), node)
        symbol_node = ast.copy_location(ast.Constant(symbol), node)
        call = ast.Call(func=function, args=[symbol_node, node.left, node.right], keywords=[])
        return ast.copy_location(call, node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        self._check_rebinding(node, node.name)
        if node.name.startswith("__") and node.name not in _ALLOWED_SPECIAL_METHODS:
            self.error(node, f"the special method {node.name!r} is not allowed "
                             "(only __init__)")
        return super().visit_FunctionDef(node)


def _depth(tree: ast.AST, limit: int) -> int:
    """The nesting depth of ``tree``, iteratively (so deep trees cannot overflow it)."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def compile_agent(source: object, *, principal: str, filename: str,
                  max_source: int = DEFAULT_MAX_SOURCE,
                  max_depth: int = DEFAULT_MAX_DEPTH) -> types.CodeType:
    """Compile agent source in the restricted dialect, or raise AgentCodeRejected."""
    tree = _parse(source, principal=principal, filename=filename, max_source=max_source,
                  max_depth=max_depth)
    return _restricted(tree, principal=principal, filename=filename, mode="exec")


def compile_agent_with_value(
    source: object, *, principal: str, filename: str, max_source: int = DEFAULT_MAX_SOURCE,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> tuple[types.CodeType, types.CodeType | None]:
    """Like :func:`compile_agent`, keeping the value of a final expression statement.

    Returns the code of the statements before it, and the code of that
    expression (compiled under the same policy, in ``eval`` mode), or None
    when the source does not end with an expression.
    """
    tree = _parse(source, principal=principal, filename=filename, max_source=max_source,
                  max_depth=max_depth)
    final: types.CodeType | None = None
    # RestrictedPython routes print through a collector it sets up at the top of
    # the *module*; an expression compiled apart from it cannot print.  A final
    # expression that prints stays a statement (its value is None anyway).
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not any(
            isinstance(node, ast.Name) and node.id == "print"
            for node in ast.walk(tree.body[-1])):
        last = tree.body.pop()
        assert isinstance(last, ast.Expr)
        expression = ast.Expression(body=last.value)
        final = _restricted(expression, principal=principal, filename=filename, mode="eval")
    return _restricted(tree, principal=principal, filename=filename, mode="exec"), final


def _parse(source: object, *, principal: str, filename: str, max_source: int,
           max_depth: int) -> ast.Module:
    if type(source) is not str:
        raise AgentCodeRejected(principal, [f"the code is a {type(source).__name__}, "
                                            "not a string"])
    assert isinstance(source, str)
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError:
        raise AgentCodeRejected(principal, ["the code is not valid UTF-8 text (it holds a "
                                            "lone surrogate)"]) from None
    if size > max_source:
        raise AgentCodeRejected(principal, [f"the code is {size:,} bytes, over the limit "
                                            f"of {max_source:,}"])
    # Parse with a small stack first: a pathological expression must fail here,
    # cleanly, not overflow the C stack inside the compiler.
    previous = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(previous, 2000))
        tree = ast.parse(source, filename=filename, mode="exec")
    except SyntaxError as error:
        raise AgentCodeRejected(principal, [f"line {error.lineno}: {error.msg}"]) from None
    except (RecursionError, MemoryError):
        raise AgentCodeRejected(principal, ["the code is nested too deeply to parse"]) from None
    except ValueError as error:  # for example a NUL byte
        raise AgentCodeRejected(principal, [f"the code cannot be parsed ({error})"]) from None
    finally:
        sys.setrecursionlimit(previous)
    depth = _depth(tree, max_depth)
    if depth > max_depth:
        raise AgentCodeRejected(principal, [f"the code is nested {depth}+ levels deep, over "
                                            f"the limit of {max_depth}"])
    return tree


def _restricted(tree: ast.Module | ast.Expression, *, principal: str, filename: str,
                mode: str) -> types.CodeType:
    compiler = compile_restricted_exec if mode == "exec" else compile_restricted_eval
    result = compiler(tree, filename=filename, policy=AgentPolicy)
    if result.errors or result.code is None:
        raise AgentCodeRejected(principal, list(result.errors) or ["it does not compile"])
    return result.code
