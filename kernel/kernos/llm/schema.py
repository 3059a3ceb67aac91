"""The JSON schemas of tool arguments, and the check of arguments against one.

A tool (``kernos.agents.registry``) declares its arguments as an object
schema with typed properties; an LLM's tool call (``kernos.llm._calls``)
names a tool and gives arguments.  Both floors check with these two
functions, so they live here, below both:

- :func:`check_schema` returns the schema when it is one this kernel
  understands (``type: object``, plain-identifier properties each with a
  JSON ``type``, ``required`` naming properties) and raises
  :class:`~kernos.errors.InvalidGrant` naming the problem otherwise;
- :func:`check_arguments` raises :class:`TypeError` naming the problem
  unless the arguments fit a checked schema.
"""

from __future__ import annotations

from typing import Any

from kernos.errors import InvalidGrant

__all__ = ["check_arguments", "check_schema"]

_SCHEMA_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})


def check_schema(schema: object, *, tool: str) -> dict[str, Any]:
    """A JSON schema for tool arguments: an object schema with typed properties."""
    def bad(problem: str) -> InvalidGrant:
        return InvalidGrant(f"the schema of tool {tool!r} is malformed: {problem}. Give "
                            "{'type': 'object', 'properties': {NAME: {'type': ...}}, "
                            "'required': [...]}")

    if type(schema) is not dict:
        raise bad(f"it is a {type(schema).__name__}, not a dict")
    assert isinstance(schema, dict)
    if schema.get("type") != "object":
        raise bad("its 'type' must be 'object'")
    properties = schema.get("properties", {})
    if type(properties) is not dict:
        raise bad("'properties' must be a dict")
    for key, spec in properties.items():
        if type(key) is not str or not key.isidentifier() or key.startswith("_"):
            raise bad(f"property {key!r} is not a plain identifier")
        if type(spec) is not dict or type(spec.get("type")) is not str or (
                spec["type"] not in _SCHEMA_TYPES):
            raise bad(f"property {key!r} needs a 'type' among {sorted(_SCHEMA_TYPES)}")
    required = schema.get("required", [])
    if type(required) is not list or any(
            type(name) is not str or name not in properties for name in required):
        raise bad("'required' must list names from 'properties'")
    extra = set(schema) - {"type", "properties", "required", "description",
                           "additionalProperties"}
    if extra:
        raise bad(f"unsupported keys {sorted(extra)}")
    return schema


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,), "null": (type(None),),
}


def check_arguments(tool: str, schema: dict[str, Any], arguments: dict[str, object]) -> None:
    """TypeError naming the problem unless ``arguments`` fit ``schema`` (a checked schema)."""
    properties = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        raise TypeError(f"tool {tool!r} needs {', '.join(missing)}")
    for key, value in arguments.items():
        if key not in properties:
            raise TypeError(f"tool {tool!r} takes no argument {key!r}")
        expected = _JSON_TYPES[properties[key]["type"]]
        if type(value) not in expected or (type(value) is bool and bool not in expected):
            raise TypeError(f"tool {tool!r}: {key} must be a "
                            f"{properties[key]['type']}, not {type(value).__name__}")
