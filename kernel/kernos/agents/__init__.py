"""Agents as principals: capability grants, contained agent code, tools.

The core of it (no Jupyter here):

* ``capabilities`` and ``registry``: grants and their rules, principals,
  tool versions (persisted in the image as ``kernos:agents``);
* ``policy``, ``guards``, ``api`` and ``boundary``: the restricted dialect
  agent code is compiled in, the allowlists it runs under, the calls it can
  make, and what may cross between it and the host;
* ``limits``: time, memory, recursion and output bounds, and the watchdog;
* ``context``: who runs, in which op, and :class:`~kernos.agents.context.Runtime`,
  the interface the runtime offers the modules below it;
* ``namespace``: the runtime's names in the image (the registry's, each
  agent's namespace);
* ``supervisor``, ``_tools``, ``_llm``, ``_events``, ``_memory``: the
  runtime's seams (circuit breakers, tools, models, events, memory), which
  know the runtime only through that interface;
* ``runtime``: :class:`AgentRuntime`, which composes them and runs all of it
  inside the image's ops;
* ``files`` and ``globs``: :class:`FileAccess`, a principal's file operations
  under its ``file:`` grants (agent code's ``files``, the harness's, MCP's);
* ``loop``: an agent's loop in the image, one op per iteration;
* ``human``: :class:`Agents`, the human's Python API (``agents`` in a
  notebook).
"""

from kernos.agents import api as _api  # noqa: F401 - fills the agent builtins
from kernos.agents import loop as _loop  # noqa: F401 - and the loop builtins
from kernos.agents.capabilities import Grant
from kernos.agents.files import FileAccess, FileLimitExceeded
from kernos.agents.human import Agents
from kernos.agents.limits import Limits
from kernos.agents.registry import HUMAN, Registry, ToolVersion
from kernos.agents.runtime import AgentRuntime, RunResult

__all__ = ["HUMAN", "AgentRuntime", "Agents", "FileAccess", "FileLimitExceeded", "Grant",
           "Limits", "Registry", "RunResult", "ToolVersion"]
