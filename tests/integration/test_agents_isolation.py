"""Agents through a real kernel: namespaces are isolated from each other and from the human.

Each agent keeps its names in a namespace of its own (``kernos:ns:NAME`` in the
image).  Another agent cannot see them, the human namespace never receives
them, and an agent reaches the human's names only through ``read``/``write``
grants, never by name.  The human can look at an agent's names with
``agents.namespace(NAME)``, read-only.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents_support import agent, committed, denials, fails, names_of

pytestmark = pytest.mark.kernel

ALICE = """\
target = 'alice-local'
secret = 's3cret'
items = [1, 2]
def helper():
    return secret
print(target, helper())
"""


def test_agents_and_the_human_do_not_share_names(kernel: Any) -> None:
    committed(kernel, "data = {'k': 1}\ntarget = 'human'\n"
                      "%kernos agent add alice\n%kernos agent add bob")
    assert committed(kernel, agent("alice", ALICE)).stdout == "alice-local s3cret\n"

    # alice's names do not exist for bob...
    for name in ("secret", "items", "helper", "target"):
        fails(kernel, agent("bob", f"print({name})"), "NameError",
              f"name '{name}' is not defined")
    # ...and bob's own `secret` is his: alice's is untouched.
    committed(kernel, agent("bob", "secret = 'bob'\nitems = []"))
    assert names_of(kernel, "bob") == {"secret": "bob", "items": []}
    assert committed(kernel, agent("alice", "print(helper(), items)")).stdout == "s3cret [1, 2]\n"

    # The human namespace holds no agent names; alice's `target` is not the human's.
    assert kernel.value("target") == "human"
    assert kernel.value("[n for n in ('secret', 'items', 'helper') if n in globals()]") == []
    # The human sees alice's names through agents.namespace, and cannot change them there.
    assert kernel.value("sorted(agents.namespace('alice'))") == [
        "helper", "items", "secret", "target"]
    assert kernel.value("(agents.namespace('alice')['target'], agents.namespace('alice')"
                        "['secret'], agents.namespace('bob')['secret'])") == (
        "alice-local", "s3cret", "bob")
    fails(kernel, "agents.namespace('alice')['secret'] = 'changed'", "TypeError",
          "does not support item assignment")
    assert kernel.value("agents.namespace('alice')['secret']") == "s3cret"
    # Rebinding the human's `target` does not touch alice's, nor the other way round.
    committed(kernel, "target = 'human-2'")
    committed(kernel, agent("alice", "target = 'alice-2'"))
    assert kernel.value("target") == "human-2"
    assert kernel.value("agents.namespace('alice')['target']") == "alice-2"

    # Human names are not in scope for agents, and without grants they are denied.
    for name in ("data", "agents", "get_ipython"):
        fails(kernel, agent("alice", f"print({name})"), "NameError",
              f"name '{name}' is not defined")
    fails(kernel, agent("alice", "read('data')"), "CapabilityDenied", "'alice'", "'read:data'")
    fails(kernel, agent("alice", "write('target', 'x')"), "CapabilityDenied", "'write:target'")
    fails(kernel, agent("alice", "write('brand_new', 1)"), "CapabilityDenied",
          "'write:brand_new'")
    assert kernel.value("(data, target, 'brand_new' in globals())") == (
        {"k": 1}, "human-2", False)
    assert [(d["principal"], d["capability"]) for d in denials(kernel.workspace)] == [
        ("alice", "read:data"), ("alice", "write:target"), ("alice", "write:brand_new")]


def test_a_read_grant_gives_a_view_not_a_reference(kernel: Any) -> None:
    committed(kernel, "data = {'k': 1, 'rows': [1, 2]}\n%kernos agent add alice\n"
                      "%kernos grant alice read:data")
    result = committed(kernel, agent("alice", "view = read('data')\nmine = view.copy()\n"
                                              "mine['k'] = 99\nmine['rows'].append(3)\n"
                                              "print(view['k'], view['rows'].copy(), mine)"))
    assert result.stdout == "1 [1, 2] {'k': 99, 'rows': [1, 2, 3]}\n"
    assert kernel.value("data") == {"k": 1, "rows": [1, 2]}
    # Reading is not writing: the view's mutators need write:data.
    fails(kernel, agent("alice", "view['k'] = 2"), "CapabilityDenied", "'write:data'")
    fails(kernel, agent("alice", "view['rows'].append(3)"), "CapabilityDenied", "'write:data'")
    fails(kernel, agent("alice", "write('data', {})"), "CapabilityDenied", "'write:data'")
    assert kernel.value("data") == {"k": 1, "rows": [1, 2]}
    # The human's later changes show through the view: it holds a name, not a copy.
    committed(kernel, "data['k'] = 5")
    assert committed(kernel, agent("alice", "print(view['k'], mine['k'])")).stdout == "5 99\n"
    # With write:data the view's mutators change the human's object.
    committed(kernel, "%kernos grant alice write:data")
    committed(kernel, agent("alice", "view['rows'].append(4)\nview['k'] = 6"))
    assert kernel.value("data") == {"k": 6, "rows": [1, 2, 4]}


HIDDEN = ["kernos:ns:alice", "kernos:agents", "agents", "get_ipython", "__builtins__", "In",
          "_ih", "exit"]


def test_a_wildcard_read_grant_reaches_only_human_names(kernel: Any) -> None:
    committed(kernel, "data = {'k': 1}\n%kernos agent add alice\n%kernos agent add bob\n"
                      "%kernos grant bob read:*")
    committed(kernel, agent("alice", "secret = 's3cret'"))
    assert committed(kernel, agent("bob", "print(read('data')['k'])")).stdout == "1\n"
    for name in HIDDEN:
        fails(kernel, agent("bob", f"read({name!r})"), "KeyError",
              f"there is no {name!r} to read")
    fails(kernel, "%kernos grant bob read:kernos:ns:alice", "InvalidGrant", "bad target")


def test_a_wildcard_write_grant_reaches_only_human_names(kernel: Any) -> None:
    committed(kernel, "%kernos agent add carol\n%kernos grant carol write:*")
    committed(kernel, agent("carol", "write('plain', [1, 2])"))
    assert kernel.value("plain") == [1, 2]
    for name in ("agents", "get_ipython", "__builtins__", "exit"):
        result = kernel.run(agent("carol", f"write({name!r}, 'pwned')"))
        assert result.status == "error" and result.rolled_back, (name, result.kernos)
    assert kernel.value("type(agents).__name__") == "Agents"
    assert committed(kernel, "print('still', 'serving')").stdout == "still serving\n"
