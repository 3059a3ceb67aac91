"""Writes that find the disk full: one error that says so, and where, and what to do.

Every writer of the workspace (the commit tail, packs, the ref, the audit
log and its payloads, the effect journal, the LLM store) lets an ``OSError``
with ENOSPC or EDQUOT out only as :class:`~kernos.errors.DiskFull`, after it
has put back what it had started to write.  ``then`` says what became of the
operation; the message adds where space is short and how much is left.

On tmpfs a full disk fails the ``write`` itself: nothing was written, the
writer undoes nothing durable, and the next write can succeed once space is
freed.  On ext4 space is reserved at ``write`` too (delayed allocation keeps
a reservation), so a full disk also shows there; an ``fsync`` that fails says
the page cache holds data the disk never took, which the tail treats as a
lost sync (``Tail.sync_error``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from kernos.errors import DiskFull, is_disk_full

__all__ = ["NOTHING_COMMITTED", "NOTHING_WRITTEN", "NOT_FOLDED", "reporting_full_disk"]

NOTHING_WRITTEN = "Nothing was written."
NOTHING_COMMITTED = "Nothing was committed: the image is as the last committed op left it."

NOT_FOLDED = ("The commits in the commit tail are durable there and stay; folding them into "
              "git is tried again later.")


@contextlib.contextmanager
def reporting_full_disk(path: str | os.PathLike[str], what: str, *, needed: int | None = None,
                        then: str = NOTHING_WRITTEN) -> Iterator[None]:
    """Turn an ENOSPC or EDQUOT raised inside into :class:`DiskFull` for ``path``."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as error:
        if not is_disk_full(error):
            raise
        raise DiskFull.from_os_error(error, path=path, what=what, needed=needed,
                                     then=then) from error
