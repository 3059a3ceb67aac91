"""LLM calls in a real kernel process: recorded in the audit and the store, one budget raced.

Every answer is litellm's ``mock_response``: nothing reaches a network.  A
mock answer reports 10 prompt and 20 completion tokens; the prompts here
count at least 10 tokens, so a call's worst case (prompt + ``max_tokens``)
always covers what it reports, and a budget is never overshot.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kernos.client import AsyncKernosClient, run_kernel

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

BUDGET = 1000
PROMPT = "Please answer briefly: what colour is the sea on a clear and sunny day, {}?"


def _op_records(workspace: Path) -> list[dict[str, Any]]:
    lines = (workspace / "audit" / "chain.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["type"] == "op"]


def _agent_call(number: int, *, fail: bool) -> str:
    code = (f"a = llm('gpt-4o-mini', [{{'role': 'user', 'content': {PROMPT.format(number)!r}}}],"
            " max_tokens=40, mock_response='Blue.')\n"
            "answers = [a['content'], a['usage']['total_tokens']]\n")
    if fail:
        code += "raise ValueError('the op fails after its call')\n"
    return code


def test_an_agent_op_calls_llm_and_the_call_is_recorded(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    here = kernel.run("import kernos; print(kernos.__file__)")
    assert here.stdout.strip() == str(Path(__file__).parents[2] / "kernel/kernos/__init__.py")
    setup = kernel.run("agents.add('alice')\n"
                       f"agents.grant('alice', 'llm:gpt-4o-mini', {BUDGET})")
    assert setup.committed, setup.errors
    cell = kernel.run("agents.run('alice', " + repr(_agent_call(1, fail=False)) + ")")
    assert cell.committed, cell.errors
    record = _op_records(workspace)[-1]
    assert record["status"] == "committed"
    assert kernel.value("agents.namespace('alice')['answers']") == ["Blue.", 30]
    [call] = record["llm"]
    assert (call["principal"], call["model"], call["cached"]) == ("alice", "gpt-4o-mini", False)
    assert call["tokens"]["total_tokens"] == 30 and call["cost"] == "0.0000135"
    store = workspace / "llm"
    answer = json.loads((store / "objects" / f"{call['response']}.json").read_text())
    assert answer["answer"]["content"] == "Blue." and answer["request"] == call["request"]
    request = json.loads((store / "objects" / f"{call['request']}.json").read_text())
    assert request["params"]["mock_response"] == "Blue."
    assert (store / "recordings" / call["request"]).read_text() == call["response"]
    # the same op again: answered from the recording, charged the same, one more record
    again = kernel.run("agents.run('alice', " + repr(_agent_call(1, fail=True)) + ")")
    assert again.rolled_back or again.kernos.get("status") == "failed"
    failed = _op_records(workspace)[-1]
    assert failed["status"] == "failed" and failed["llm"][0]["cached"] is True
    assert kernel.value("agents.grants('alice')[0]['used']") == "60"  # the rollback kept it


def test_two_clients_race_llm_calls_against_one_budget(tmp_path: Path) -> None:
    """Two clients, one agent, one 1,000-token grant; some ops fail after their calls."""
    workspace = tmp_path / "ws"
    env = {"KERNOS_DURABILITY": "process", "KERNOS_LLM_MODE": "off"}

    async def main() -> list[list[str]]:
        async with run_kernel(workspace, env=env) as (_manager, owner):
            await owner.add_agent("alice")
            await owner.grant("alice", "llm:gpt-4o-mini", BUDGET)
            clients = [await AsyncKernosClient.connect(workspace) for _ in range(2)]

            async def work(client: AsyncKernosClient, offset: int) -> list[str]:
                statuses = []
                for number in range(offset, offset + 24):
                    result = await client.op(_agent_call(number, fail=number % 3 == 0),
                                             principal="alice")
                    statuses.append(result.status)
                return statuses

            try:
                return list(await asyncio.gather(work(clients[0], 0), work(clients[1], 100)))
            finally:
                for client in clients:
                    await client.close()

    statuses = asyncio.run(main())
    assert all(statuses), statuses
    records = [record for record in _op_records(workspace) if record["principal"] == "alice"]
    assert len(records) == 48
    charged = sum(call["tokens"]["total_tokens"] for record in records
                  for call in record.get("llm", []) if "tokens" in call)
    ledger = [json.loads(line) for line in (workspace / "llm" / "calls.jsonl").read_text()
              .splitlines()]
    settled = sum(entry["tokens"] for entry in ledger if entry["type"] == "settle")
    assert charged == settled <= BUDGET
    assert settled > BUDGET - 80, "the clients stopped while budget was left"
    over = [record for record in records
            if any(call.get("error") == "LLMBudgetExceeded" for call in record.get("llm", []))]
    assert over, "no op ran into the budget"
    for record in over:  # each violation rolled its op back, and its record says why
        assert record["status"] == "vetoed" and record["commit"] is None
        assert "LLM budget exceeded" in record["error"]["message"]
    committed = [record for record in records if record["status"] == "committed"]
    assert committed and all(record["llm"][0]["tokens"]["total_tokens"] == 30
                             for record in committed)
    assert os.environ.get("OPENAI_API_KEY", "sk-none") not in \
        (workspace / "llm" / "calls.jsonl").read_text()
