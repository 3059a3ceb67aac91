"""``kernos checkout --gateway``: the workspace lives on the gateway's host, so the checkout
is an op in a kernel started there for the command (as ``run --gateway`` does)."""

from __future__ import annotations

import json

import pytest

from gateway_support import Gateway, through

pytestmark = [pytest.mark.kernel]


def test_checkout_through_the_gateway_is_an_op_in_a_kernel_there(gateway: Gateway) -> None:
    first = through(gateway, "run", "-w", "rewind", "--json", "level = 'first'")
    assert first.returncode == 0, first.stderr
    op = json.loads(first.stdout)["op"]
    assert through(gateway, "run", "-w", "rewind", "level = 'second'").returncode == 0
    done = through(gateway, "checkout", "-w", "rewind", "--json", f"@{op}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "committed" and result["op"] > op
    assert result["checkout"]["commit"] == json.loads(first.stdout)["commit"]
    done = through(gateway, "run", "-w", "rewind", "--json", "level")
    assert json.loads(done.stdout)["value"]["json"] == "first"
    missing = through(gateway, "checkout", "-w", "rewind", "@999")
    assert missing.returncode == 2, missing.stderr
    assert "'@999' names no snapshot in " in missing.stderr
    assert "Traceback" not in missing.stderr
    assert not (gateway.root.parent / "rewind").exists()  # a name under the root, not a path
    assert gateway.api("/api/kernels") == []  # each command's kernel was shut down
