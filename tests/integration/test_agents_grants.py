"""Agents through a real kernel: grants, revocation, delegation, vetoed ops and budgets.

Every cell here is a real ``execute_request``: ``%%agent NAME`` cells run agent
code, ``%kernos grant/revoke/grants`` and the notebook's ``agents`` object are
the human's side, and state is read back in later cells.  A denial must veto
the op it happened in (even when agent code catches it), and no malformed
amount may change a budget.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from agents_support import (
    agent,
    committed,
    denials,
    error_text,
    fails,
    grant_row,
    grants,
    names_of,
    used,
)

pytestmark = pytest.mark.kernel


# -- grant, use, revoke -------------------------------------------------------------------

def test_revocation_takes_effect_at_the_next_access(kernel: Any) -> None:
    committed(kernel, "data = {'k': 1, 'nested': {'v': 7}}\n"
                      "%kernos agent add alice\n%kernos grant alice read:data")
    assert grants(kernel, "alice")["g1"]["capability"] == "read:data"
    result = committed(kernel, agent("alice", "view = read('data')\n"
                                              "print(view['k'], view['nested']['v'])"))
    assert result.stdout == "1 7\n"

    # Revoked in the middle of an op: the very next access through the view fails.
    result = fails(kernel, "agents.run('alice', \"print('before', view['k'])\")\n"
                           "agents.revoke('alice', 'read:data')\n"
                           "agents.run('alice', \"print('after', view['k'])\")",
                   "CapabilityDenied", "'alice'", "'read:data'")
    assert "before 1" in result.stdout and "after" not in result.stdout
    assert grants(kernel, "alice")["g1"]["active"] is True  # that op rolled back

    # Revoked in an op of its own: the view alice kept (in her namespace) fails later.
    revoked = committed(kernel, "%kernos revoke alice read:data")
    assert revoked.stdout.strip() == "Revoked g1."
    revoke_op = revoked.kernos["op"]
    fails(kernel, agent("alice", "print(view['k'])"), "CapabilityDenied", "'read:data'")
    fails(kernel, agent("alice", "print(view.copy())"), "CapabilityDenied", "'read:data'")
    fails(kernel, agent("alice", "print(read('data'))"), "CapabilityDenied", "'read:data'")
    row = grant_row(committed(kernel, "%kernos grants").stdout, "g1")
    assert row["state"] == f"revoked (op {revoke_op})"
    assert row["principal"] == "alice" and row["source"] == "human"
    assert kernel.value("data") == {"k": 1, "nested": {"v": 7}}

    # The view is a name and a path, not a copy: a new grant makes it work again.
    committed(kernel, "data['nested']['v'] = 8\n%kernos grant alice read:data")
    assert committed(kernel, agent("alice", "print(view['nested']['v'])")).stdout == "8\n"


def test_spawn_delegate_attenuate_and_cascade(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos agent add bob\n"
                      "%kernos grant alice spend:USD 50\n%kernos grant alice agents:spawn\n"
                      "%kernos grant bob spend:USD 20")
    assert set(grants(kernel)) == {"g1", "g2", "g3"}
    result = committed(kernel, agent("alice", "helper = spawn('helper')\nprint(helper)\n"
                                              "print(spend(5, 'USD'))"))
    assert result.stdout == "alice/helper\n45\n"
    assert kernel.value("repr(agents)").startswith("<Kernos agents: alice, alice/helper, bob;")
    assert grants(kernel, "alice/helper") == {}  # a sub-agent starts with nothing

    # Attenuation above what is left of the parent grant is denied.
    fails(kernel, agent("alice", "delegate('g1', helper, 46)"),
          "CapabilityDenied", "grant g1 has only 45 left")
    # Delegating a grant alice does not hold (bob's), or to a non-sub-agent, is denied.
    fails(kernel, agent("alice", "delegate('g3', helper, 1)"),
          "CapabilityDenied", "no such active grant is held by this principal")
    fails(kernel, agent("alice", "delegate('g1', 'bob', 1)"),
          "CapabilityDenied", "grants can only be delegated to your sub-agents")
    fails(kernel, agent("alice", "delegate('g1', 'alice', 1)"),
          "CapabilityDenied", "sub-agents")
    assert set(grants(kernel)) == {"g1", "g2", "g3"}

    result = committed(kernel, agent("alice", "d = delegate('g1', helper, 10)\n"
                                              "print(d['id'], d['limit'], d['parent'])"))
    assert result.stdout == "g4 10 g1\n"
    derived = grants(kernel, "alice/helper")["g4"]
    assert (derived["capability"], derived["granted_by"]) == ("spend:USD", "alice")

    # The helper spends within its attenuated limit, not beyond it.
    assert committed(kernel, agent("alice/helper", "print(spend(3, 'USD'))")).stdout == "7\n"
    fails(kernel, agent("alice/helper", "spend(8, 'USD')"),
          "CapabilityDenied", "8 asked, 7 left of grant g4")
    assert used(kernel, "g4") == "3"
    # The helper cannot pass its grant upwards, nor bob revoke what alice delegated.
    fails(kernel, agent("alice/helper", "delegate('g4', 'alice', 1)"),
          "CapabilityDenied", "sub-agents")
    fails(kernel, agent("bob", "revoke('g4')"), "CapabilityDenied", "revoke g4")
    assert grants(kernel)["g4"]["active"] is True

    # What the helper spent counts against the grant it was derived from, too.
    table = committed(kernel, "%kernos grants").stdout
    assert grant_row(table, "g1") == {
        "principal": "alice", "capability": "spend:USD", "budget": "8/50", "source": "human",
        "op": "1", "state": "active"}
    assert grant_row(table, "g4") == {
        "principal": "alice/helper", "capability": "spend:USD", "budget": "3/10",
        "source": "alice (g1)", "op": grant_row(table, "g4")["op"], "state": "active"}

    # Revoking the parent grant revokes the derived one with it.
    revoked = committed(kernel, "%kernos revoke alice g1")
    assert revoked.stdout.strip() == "Revoked g1, g4."
    revoke_op = revoked.kernos["op"]
    fails(kernel, agent("alice/helper", "spend(1, 'USD')"), "CapabilityDenied", "'spend:USD'")
    fails(kernel, agent("alice", "spend(1, 'USD')"), "CapabilityDenied", "'spend:USD'")
    fails(kernel, agent("alice", "delegate('g1', helper, 1)"),
          "CapabilityDenied", "no such active grant")
    table = committed(kernel, "%kernos grants").stdout
    assert grant_row(table, "g1")["state"] == f"revoked (op {revoke_op})"
    assert grant_row(table, "g4")["state"] == f"revoked (op {revoke_op})"
    assert grant_row(table, "g4")["budget"] == "3/10"
    assert grant_row(table, "g2")["state"] == "active"  # agents:spawn is untouched
    assert grant_row(table, "g3") == {
        "principal": "bob", "capability": "spend:USD", "budget": "0/20", "source": "human",
        "op": "1", "state": "active"}
    helper_table = committed(kernel, "%kernos grants alice/helper").stdout
    assert grant_row(helper_table, "g4")["principal"] == "alice/helper"
    assert [line.split()[0] for line in helper_table.splitlines()[1:]] == ["g4"]


def test_delegated_budget_counts_against_the_parent_grant(kernel: Any) -> None:
    """Delegating cannot multiply a budget: alice (50 USD) and two helpers spend 50 in all."""
    committed(kernel, "%kernos agent add alice\n%kernos grant alice spend:USD 50\n"
                      "%kernos grant alice agents:spawn")
    committed(kernel, agent("alice", "one = spawn('one')\ntwo = spawn('two')"))
    # Each step in an op of its own, so that a refusal rolls back only that step.
    steps = [agent("alice", "delegate('g1', one, 50)"),
             agent("alice", "delegate('g1', two, 50)"),
             agent("alice/one", "spend(50, 'USD')"),
             agent("alice/two", "spend(50, 'USD')"),
             agent("alice", "spend(50, 'USD')")]
    spent = 0
    for step in steps:
        if kernel.run(step).committed and "spend(" in step:
            spent += 50
    assert spent == 50, f"the human granted 50 USD in all; {spent} were spent"


# -- a denial vetoes the whole op -----------------------------------------------------------

def test_a_caught_denial_rolls_back_the_whole_op(kernel: Any) -> None:
    committed(kernel, "shared = [1, 2]\ntarget = 'orig'\n%kernos agent add alice\n"
                      "%kernos grant alice spend:USD 50\n%kernos grant alice write:target\n"
                      "%kernos grant alice write:shared")
    committed(kernel, agent("alice", "mine = 1\nlst = [1]\nprint(spend(5, 'USD'))"))
    before = names_of(kernel, "alice")
    assert before == {"mine": 1, "lst": [1]}
    assert used(kernel, "g1") == "5"
    assert denials(kernel.workspace) == []

    result = kernel.run(agent("alice", "\n".join([
        "mine = 2", "lst.append(2)", "extra = 'new'",
        "print('left', spend(7, 'USD'))",
        "write('target', 'changed')",
        "read('shared').append(3)",
        "try:",
        "    read('secret')",
        "except CapabilityDenied as error:",
        "    print('caught:', error)",
        "print('went on', mine, lst, read('shared').copy())",
    ])))
    assert result.status == "error", result.stdout
    assert result.rolled_back, result.kernos
    assert [error["ename"] for error in result.errors] == ["OpVetoed"], error_text(result)
    assert "'alice' was denied 'read:secret'" in result.errors[0]["evalue"]
    assert "Nothing it did was kept" in result.errors[0]["evalue"]
    # The code did run to its end (the denial was caught)...
    assert "left 38\n" in result.stdout
    assert "caught: 'alice' does not hold the capability 'read:secret'" in result.stdout
    assert "went on 2 [1, 2] [1, 2, 3]\n" in result.stdout
    # ...and yet nothing of it was kept.
    assert names_of(kernel, "alice") == before
    assert kernel.value("(target, shared)") == ("orig", [1, 2])
    assert used(kernel, "g1") == "5"
    logged = denials(kernel.workspace)
    assert len(logged) == 1
    assert logged[0]["op"] == result.kernos["op"]
    assert (logged[0]["principal"], logged[0]["capability"]) == ("alice", "read:secret")
    # The agent goes on from the state before the vetoed op.
    result = committed(kernel, agent("alice", "lst.append(9)\nprint(mine, lst, "
                                              "spend(1, 'USD'))"))
    assert result.stdout == "1 [1, 9] 44\n"


# -- budgets cannot be corrupted ------------------------------------------------------------

BAD_SPENDS = [
    ("-1", "the amount -1 is negative"),
    ("Decimal('NaN')", "the amount NaN is not finite"),
    ("Decimal('-Infinity')", "the amount -Infinity is not finite"),
    ("10**30", "is over the maximum of 1000000000000000"),
    ("True", "must be an int or a decimal.Decimal, not bool"),
    ("1.5", "must be an int or a decimal.Decimal, not float"),
    ("'5'", "must be an int or a decimal.Decimal, not str"),
]


def test_malformed_spends_change_no_budget(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos grant alice spend:USD 50\n"
                      "%kernos grant alice agents:spawn")
    committed(kernel, agent("alice", "helper = spawn('helper')\nprint(spend(5, 'USD'))"))
    for amount, problem in BAD_SPENDS:
        fails(kernel, agent("alice", f"spend({amount}, 'USD')"), "InvalidGrant", problem)
        assert used(kernel, "g1") == "5", amount
    fails(kernel, agent("alice", "spend(1, 5)"), "InvalidGrant", "spend() takes a unit (a str)")
    # Caught, a malformed spend still vetoes the op: the valid spend after it is undone.
    result = kernel.run(agent("alice", "try:\n    spend(-1, 'USD')\nexcept Exception as e:\n"
                                       "    print('caught', e)\nprint('left', spend(1, 'USD'))"))
    assert result.rolled_back and result.errors[-1]["ename"] == "OpVetoed", error_text(result)
    assert "'alice' was denied 'a well-formed request'" in result.errors[-1]["evalue"]
    assert "caught the amount -1 is negative" in result.stdout and "left 44" in result.stdout
    assert used(kernel, "g1") == "5"
    # Delegation limits are checked the same way; no grant is created.
    for limit, problem in [("Decimal('NaN')", "the limit NaN is not finite"),
                           ("-1", "the limit -1 is negative"),
                           ("1.5", "not float"), ("True", "not bool"),
                           ("10**30", "over the maximum")]:
        fails(kernel, agent("alice", f"delegate('g1', helper, {limit})"), "InvalidGrant",
              problem)
    assert set(grants(kernel)) == {"g1", "g2"}
    assert used(kernel, "g1") == "5"


MAGIC_LIMITS = [
    ("-1", "the limit -1 is negative"),
    ("NaN", "the limit NaN is not finite"),
    ("inf", "the limit Infinity is not finite"),
    ("1e30", "the limit 1E+30 is over the maximum of 1000000000000000"),
    ("1000000000000001", "is over the maximum"),
    ("abc", "'abc' is not an amount"),
]
API_LIMITS = [
    ("-3", "the limit -3 is negative"),
    ("decimal.Decimal('NaN')", "the limit NaN is not finite"),
    ("decimal.Decimal('Infinity')", "the limit Infinity is not finite"),
    ("10**30", "is over the maximum of 1000000000000000"),
    ("S('5')", "must be an int or a decimal.Decimal, not S"),
    ("I(5)", "must be an int or a decimal.Decimal, not I"),
    ("True", "must be an int or a decimal.Decimal, not bool"),
    ("1.5", "must be an int or a decimal.Decimal, not float"),
    ("float('inf')", "not float"),
    ("'5'", "must be an int or a decimal.Decimal, not str"),
]


def test_malformed_grant_limits_are_refused(kernel: Any) -> None:
    committed(kernel, "import decimal\nclass S(str):\n    pass\nclass I(int):\n    pass\n"
                      "%kernos agent add alice\n%kernos grant alice spend:USD 50")
    before = grants(kernel)
    for text, problem in MAGIC_LIMITS:
        fails(kernel, f"%kernos grant alice spend:EUR {text}", "InvalidGrant", problem)
    fails(kernel, "%kernos grant alice spend:EUR", "UsageError", "needs an amount")
    for expression, problem in API_LIMITS:
        fails(kernel, f"agents.grant('alice', 'spend:EUR', {expression})", "InvalidGrant",
              problem)
    fails(kernel, "agents.grant('alice', 'read:x', 5)", "InvalidGrant", "takes no limit")
    assert grants(kernel) == before
    # A decimal typed in the magic is an exact Decimal, never a float.
    committed(kernel, "%kernos grant alice spend:EUR 0.1")
    assert grants(kernel)["g2"]["limit"] == "0.1"
    result = committed(kernel, agent("alice", "print(spend(Decimal('0.1'), 'EUR'))"))
    assert result.stdout == "0.0\n"


def test_str_subclasses_are_refused_as_capability_or_unit(kernel: Any) -> None:
    committed(kernel, "class S(str):\n    pass\n%kernos agent add alice\n"
                      "%kernos grant alice spend:USD 50\n"
                      "agents.register_tool('unit', lambda: S('USD'), schema={'type': 'object'},"
                      " description='a unit that is a str subclass')\n"
                      "%kernos grant alice call:unit")
    before = grants(kernel)
    fails(kernel, "agents.grant('alice', S('spend:EUR'), 5)", "InvalidGrant",
          "a capability is a string like 'call:search', not S")
    fails(kernel, "agents.revoke('alice', S('spend:USD'))", "InvalidGrant", "not S")
    fails(kernel, "agents.revoke('alice', S('g1'))", "InvalidGrant", "not S")
    # A host str subclass cannot reach agent code, so it cannot be spent with.
    fails(kernel, agent("alice", "print(call('unit'))"), "BoundaryError",
          "a S cannot pass from the host to agent code")
    fails(kernel, agent("alice", "spend(1, call('unit'))"), "BoundaryError", "a S cannot pass")
    # Nor can agent code make one.
    fails(kernel, agent("alice", "class T(str):\n    pass"), "TypeError",
          "agent classes can derive only from agent classes and the allowed exceptions, "
          "not 'str'")
    fails(kernel, agent("alice", "class N(int):\n    pass"), "TypeError", "not 'int'")
    assert grants(kernel) == before
    assert used(kernel, "g1") == "0"


def test_a_str_subclass_agent_name_is_named_as_the_problem(kernel: Any) -> None:
    """Not "There is no agent 'alice' (agents: alice)": the message names the type."""
    committed(kernel, "class S(str):\n    pass\n%kernos agent add alice")
    for cell in ["agents.grant(S('alice'), 'spend:EUR', 5)", "agents.run(S('alice'), 'x = 1')"]:
        result = kernel.run(cell)
        assert result.status == "error" and result.rolled_back
        message = result.errors[-1]["evalue"]
        assert "There is no agent 'alice'" not in message, message
        assert re.search(r"\bS\b", message), message  # the type that was given
    assert grants(kernel) == {}
