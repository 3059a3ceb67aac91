"""The client's errors carry their facts and say what to do."""

from __future__ import annotations

from kernos.client import KernelDied, NoKernelRunning, RequestError, RequestTimeout
from kernos.client.errors import ClientError
from kernos.errors import KernosError


def test_request_error_from_an_error_reply() -> None:
    error = RequestError.from_reply({
        "v": 1, "status": "error", "action": "op",
        "error": {"kind": "unknown_principal", "message": "no principal 'eve'; add it first",
                  "data": {"principal": "eve"}}})
    assert (error.kind, error.action, error.data) == ("unknown_principal", "op",
                                                      {"principal": "eve"})
    assert "add it first" in str(error) and isinstance(error, ClientError)
    assert isinstance(error, KernosError)


def test_request_error_from_a_reply_missing_its_parts() -> None:
    error = RequestError.from_reply({"v": 1, "status": "error", "action": None, "error": 3})
    assert error.kind == "internal" and error.data == {} and error.action is None


def test_kernel_died_names_the_request_and_what_to_do() -> None:
    death = KernelDied.exited(4321)
    told = death.during("op")
    assert told.pid == 4321 and told.action == "op"
    assert "'op' request" in str(told) and "key=" in str(told) and "restart" in str(told)
    silent = KernelDied.silent(4321, 12.0).during("versions")
    assert silent.silent_for == 12.0 and "heartbeat" in str(silent) and "'versions'" in str(
        silent)


def test_no_kernel_running_and_timeouts_say_what_to_do() -> None:
    missing = NoKernelRunning.missing("/ws", "/ws/kernel.json")
    assert missing.workspace == "/ws" and "run_kernel" in str(missing)
    assert "not running" in str(NoKernelRunning.stale("/ws", "/ws/kernel.json", 7))
    timeout = RequestTimeout("op", 2.5)
    assert isinstance(timeout, TimeoutError) and "2.5 s" in str(timeout)
