"""Deterministic replay: re-run recorded ops in a fresh workspace, snapshot by snapshot.

* ``digest``: canonical digests of values, equal for equal states across
  processes, ``PYTHONHASHSEED`` values and object identities;
* ``difference``: where two values' digests part, as a short path;
* ``cells``: :class:`~kernos.replay.cells.CellCompiler`, which runs a
  notebook's cell as the kernel's IPython compiled it (its ``__future__``
  flags, top-level ``await``);
* ``driver``: :func:`replay`, which rebuilds an image from a workspace's
  audit log with recorded effect outcomes and reports the first divergence;
* ``report``: what a replay reports (:class:`Step`, :class:`Divergence`,
  :class:`ReplayReport`).
"""

from kernos.replay.driver import Divergence, ReplayReport, Step, replay

__all__ = ["Divergence", "ReplayReport", "Step", "replay"]
