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
  (``pip install 'kernos[langgraph]'``).

This package imports nothing, so that importing one integration never needs
another's framework.
"""
