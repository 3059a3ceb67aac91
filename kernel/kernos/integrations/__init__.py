"""Kernos under agent frameworks: each framework's plug-in point, mapped onto Kernos.

One module per framework, each an optional extra that ``pip install kernos``
does not pull: importing a module without its framework raises an ImportError
that names the extra to install.  Each maps the framework's own interface onto
Kernos ops, principals and grants, through a real kernel (``kernos.client``),
never a store of its own:

* ``kernos.integrations.openai_agents``: the OpenAI Agents SDK's ``Session``
  (``KernosSession``) and a function tool that runs Python as an agent op
  (``pip install 'kernos[openai-agents]'``);
* ``kernos.integrations.langgraph``: LangGraph's checkpointer
  (``pip install 'kernos[langgraph]'``);
* ``kernos.integrations.pydantic_ai``: a Pydantic AI toolset (``run_python`` and
  the agent's Kernos tools, each call an agent op) and the message history in
  the image (``pip install 'kernos[pydantic-ai]'``);
* ``kernos.integrations.smolagents``: a code executor for smolagents'
  ``CodeAgent``, each code action an agent op in the agent's namespace
  (``pip install 'kernos[smolagents]'``).

``_kernel`` (either client, from sync or async code) and ``_code`` (model code
as one agent op, and the answer the model reads) are what they share.

This package imports nothing, so that importing one integration never needs
another's framework.
"""
