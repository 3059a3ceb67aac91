"""A value a cell deletes or rebinds gives its memory back when that cell ends, through a
real kernel, as it does in a stock IPython session.

Two things once kept it an op longer: the finished op's participant held the namespace
as it had committed it, and a pickler's ``buffer_callback`` (a bound method) made the
pickler a cycle that kept every object it had pickled until the cyclic collector ran.
A 200 MB array deleted then lived on into the next cell: twice the memory, and the
next big allocation faulted fresh pages.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.kernel

RSS_MB = "int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) // 1024"


def test_a_deleted_or_rebound_big_array_gives_its_memory_back(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    assert kernel.run("import numpy as np\nbig = np.ones(25_000_000)").committed  # 200 MB
    with_big = kernel.value(RSS_MB)
    assert kernel.run("del big").committed
    after_del = kernel.value(RSS_MB)
    assert with_big - after_del >= 150, (with_big, after_del)
    assert kernel.run("big = np.ones(25_000_000)").committed
    assert kernel.run("big = np.zeros(10)").committed  # rebound: the old value goes
    after_rebind = kernel.value(RSS_MB)
    assert after_rebind - after_del <= 50, (after_del, after_rebind)
