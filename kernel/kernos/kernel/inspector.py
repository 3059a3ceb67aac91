"""The ``kernos.inspector`` comm target, and the kernel's inspector backend.

The JupyterLab panel (and any frontend) opens a comm on the target
``kernos.inspector`` with open data ``{"v": 1}``.  The kernel answers on
the comm with::

    {"v": 1, "type": "hello", "hello": HELLO}

where HELLO is the result of the harness ``hello`` action.  Then the
frontend sends requests, each with an id of its choosing::

    {"v": 1, "id": INT, "request": REQUEST}

REQUEST is a harness protocol request (``kernos.harness.protocol``), run as
``human``; only the actions in ``kernos.inspector.backend.ALLOWED`` (reads,
and ``checkout``) are served.  The answer is::

    {"v": 1, "type": "reply", "id": INT, "reply": REPLY}

with REPLY exactly as a ``kernos_reply`` carries it.  The kernel also pushes
the notices of ``kernos.inspector.backend`` (``committed``, ``rolled_back``,
``progress``) to every open inspector comm, as ``{"v": 1, **NOTICE}``:
after every op that finishes, whoever ran it (a cell, a harness request,
the widget, the panel), and never while an op runs, except ``progress``
during a checkout.  A message that is not a valid envelope gets::

    {"v": 1, "type": "error", "error": TEXT}

Comm messages are handled after the running op (the kernel serializes them
against ops), so a request never sees a half-done op.

While the kernel restores its image at start-up, a request that waits for
the restore (a cell, a comm open, a harness request) gets ``kernos_progress``
IOPub messages (``{"v": 1, "what": "restore", "done", "total"}``, parent =
the waiting request), so a frontend can show progress before any comm opens.
"""
