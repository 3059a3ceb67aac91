"""What the reader of the demonstration sees, and its checks.

Each step prints the code it sends (``_show``), the other requests it makes
(``_request``), and one ``[ok]`` line per claim it checked (``_check``); a claim
that does not hold raises :class:`DemoFailure`, which ends the demo with exit
status 1.  Nothing here talks to the kernel.
"""

from __future__ import annotations

from kernos.client import OpResult


class DemoFailure(Exception):
    pass


def _check(condition: bool, claim: str, detail: object = None) -> None:
    if not condition:
        raise DemoFailure(claim + (f" ({detail})" if detail is not None else ""))
    print(f"    [ok] {claim}\n")


def _short(commit: str | None) -> str:
    return (commit or "-")[:12]


def _outcome(result: OpResult) -> str:
    """One line: how an op ended, and what it changed or why it did not commit."""
    if result.committed:
        return ", ".join([f"op {result.op}", f"commit {_short(result.commit)}"] + [
            f"{what} {names}" for what, names in (("added", result.added),
                                                  ("changed", result.changed),
                                                  ("deleted", result.deleted)) if names])
    reason = result.error.message if result.error is not None else ""
    return f"op {result.op}: {reason}"


def _show(code: str, principal: str, result: OpResult) -> None:
    print(_prefixed(code, f"{principal:<5} | "))
    if result.output.strip():
        print(_prefixed(result.output, "Out   | "))
    if result.value is not None and result.value.repr != "None":
        print(_prefixed(result.value.repr, "Value | "))
    print(f"    ==> {result.status} ({_outcome(result)})\n")


def _prefixed(text: str, label: str) -> str:
    """``text`` indented, ``label`` on its first line and a bar on the others."""
    lines = text.rstrip("\n").splitlines() or [""]
    blank = " " * (len(label) - 2) + "| "
    return "\n".join(("    " + (label if number == 0 else blank) + line).rstrip()
                     for number, line in enumerate(lines))



def _request(call: str, answer: object = None) -> None:
    """Echo a harness request that is not an op of code (a grant, a read, ...)."""
    print(f"    client.{call}" + (f"  ->  {answer}" if answer is not None else ""))
