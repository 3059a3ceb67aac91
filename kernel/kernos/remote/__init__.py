"""A workspace is a git remote: push, pull and clone its history, audit chain and LLM store.

The floor above the audit chain and forks: a pull checks the remote's records
(``kernos.audit.verify``) and follows its prunes before anything lands.

* :mod:`kernos.remote.transfer`: :func:`~kernos.remote.transfer.push`,
  :func:`~kernos.remote.transfer.pull`, :func:`~kernos.remote.transfer.clone`
  and what travels (the contract, and the layout on the remote);
* :mod:`kernos.remote.config`: ``remotes.json``, this copy's remotes;
* :mod:`kernos.remote.git`: the staging repository and the git commands;
* :mod:`kernos.remote.pull`, :mod:`kernos.remote.quarantine`: what a pull fetched,
  kept aside and checked as hostile input;
* :mod:`kernos.remote.land`: landing it in one step a crash cannot leave half done;
* :mod:`kernos.remote.prune`: pushing and pulling over a ``kernos prune``;
* :mod:`kernos.remote.lease`, :mod:`kernos.remote.session`,
  :mod:`kernos.remote.autopush`, :mod:`kernos.remote.start`: one writer across
  machines, and a kernel's remote while it runs.
"""
