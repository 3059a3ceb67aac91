"""Looking at the image: the inspector widget and its backend.

``kernos.inspect()`` (or ``%kernos inspect``) displays an ipywidgets
inspector of the running kernel's image, with tabs for objects, events,
capabilities, history and a plot.  It reads through a
:class:`~kernos.inspector.backend.Backend` only (the harness protocol, as
``human``), so it holds no reference to anything in the image.

The widget is :class:`kernos.inspector.widget.Inspector` (``Inspector(backend)``,
with a :class:`ServiceBackend` outside a kernel); it lives in its own module so
that importing this package does not import ipywidgets.
"""

from __future__ import annotations

from kernos.inspector.backend import ALLOWED, Backend, ServiceBackend

__all__ = ["ALLOWED", "Backend", "ServiceBackend"]
