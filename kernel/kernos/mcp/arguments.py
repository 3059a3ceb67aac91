"""Checking an MCP tool call's arguments against the tool's JSON schema, before anything runs.

Pure: no MCP, no kernel.  It covers the subset of JSON Schema that Kernos uses,
for its own tools and for registry tools (``kernos.agents.registry.check_schema``
allows an object schema whose properties each have a ``type``): ``type``,
``properties``, ``required`` and, per property, ``type`` (a name or a list of
names), ``enum``, ``minimum``, ``maximum``, ``minLength``, ``maxLength`` and an
``additionalProperties`` schema for object values.  Unknown arguments are always
refused, as the kernel refuses them.  Keywords outside the subset are left to
the kernel, which checks the call again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BadArguments", "check_arguments", "json_type", "signature"]

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


class BadArguments(ValueError):
    """A tool call's arguments do not fit its schema; the message says what and how to fix it."""


def json_type(value: object) -> str:
    """The JSON type name of a decoded JSON value (``integer`` for ints, never for bools)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _fits(value: object, type_name: str) -> bool:
    expected = _PYTHON_TYPES.get(type_name)
    if expected is None:
        return True  # a type this subset does not know: the kernel decides
    if isinstance(value, bool):
        return type_name == "boolean"
    return isinstance(value, expected)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(name: str, spec: dict[str, Any], optional: bool) -> str:
    kind = spec.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else str(kind)
    return f"{name} ({kind}{', optional' if optional else ''})"


def _a(type_name: str) -> str:
    return f"an {type_name}" if type_name[:1] in "aeiou" else f"a {type_name}"


def signature(schema: dict[str, Any]) -> str:
    """A one-line summary of what a schema takes: ``code (string), key (string, optional)``."""
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    if not properties:
        return "no arguments"
    return ", ".join(_describe(name, spec if isinstance(spec, dict) else {},
                               name not in required) for name, spec in properties.items())


def _check_value(where: str, value: object, spec: dict[str, Any]) -> str | None:
    """What is wrong with ``value`` for ``spec``, or None."""
    wanted = spec.get("type")
    if wanted is not None:
        names = wanted if isinstance(wanted, list) else [wanted]
        if not any(_fits(value, str(name)) for name in names):
            return (f"{where} must be {' or '.join(_a(str(name)) for name in names)}, not "
                    f"{_a(json_type(value))} ({_shown(value)})")
    if "enum" in spec and value not in spec["enum"]:
        return f"{where} must be one of {spec['enum']}, not {_shown(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in spec and value < spec["minimum"]:
            return f"{where} must be >= {spec['minimum']}, not {value}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"{where} must be <= {spec['maximum']}, not {value}"
    if isinstance(value, str):
        if "minLength" in spec and len(value) < spec["minLength"]:
            return f"{where} must have at least {spec['minLength']} characters"
        if "maxLength" in spec and len(value) > spec["maxLength"]:
            return f"{where} must have at most {spec['maxLength']} characters, not {len(value)}"
    extra = spec.get("additionalProperties")
    if isinstance(value, dict) and isinstance(extra, dict):
        for key, item in value.items():
            problem = _check_value(f"{where}[{key!r}]", item, extra)
            if problem:
                return problem
    return None


def check_arguments(tool: str, schema: dict[str, Any], arguments: object) -> dict[str, Any]:
    """The arguments, checked against ``schema``; raise :class:`BadArguments` naming the problem.

    ``None`` (no arguments sent) counts as ``{}``.
    """
    if arguments is None:
        arguments = {}
    takes = f"{tool} takes {signature(schema)}"
    if not isinstance(arguments, dict):
        raise BadArguments(f"{tool}: the arguments must be an object, not "
                           f"{_a(json_type(arguments))}. {takes}.")
    properties: dict[str, Any] = schema.get("properties") or {}
    unknown = sorted(str(key) for key in arguments if key not in properties)
    if unknown:
        raise BadArguments(f"{tool}: unknown argument{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(repr(key[:40]) for key in unknown[:10])}. {takes}.")
    missing = [name for name in schema.get("required") or [] if name not in arguments]
    if missing:
        raise BadArguments(f"{tool}: the argument{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(repr(name) for name in missing)} "
                           f"{'are' if len(missing) > 1 else 'is'} required. {takes}.")
    for name, value in arguments.items():
        spec = properties[name]
        problem = _check_value(repr(name), value, spec if isinstance(spec, dict) else {})
        if problem:
            raise BadArguments(f"{tool}: {problem}. {takes}.")
    return dict(arguments)
