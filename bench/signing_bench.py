"""What signing the audit chain and checking pulls cost; one command.

    python bench/signing_bench.py [--ops N] [--records N] [--pull N]

In process, on the core (no kernel), fresh workspaces in $TMPDIR.  Each baseline
is measured in the same run:

1. *A trivial op* (``counter += 1``), signed as every op now is, against the same
   op with signing switched off (what a Kernos before signing did), interleaved, at
   the default durability: the median of each, and the difference.
2. *Appending a record* (``AuditLog.append``, no fsync): signed against unsigned.
3. *Verifying* a chain of ``--records`` records (``kernos.audit.verify``): signed
   against the same chain unsigned.
4. *A pull* of ``--pull`` new ops from a bare remote (everything fetched aside,
   checked, then landed) against ``git fetch`` of the same refs into a bare
   repository (the same bytes moved, with no check).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))

from remote_bench import open_image, run  # (bench/ is on the path: run as a script)

from kernos.audit import log as log_module
from kernos.audit import verify
from kernos.audit.log import AuditLog
from kernos.personal import Keyring
from kernos.remote.transfer import RemoteConfig, clone, pull, push
from kernos.store.identity import load_identity


@contextmanager
def unsigned() -> Iterator[None]:
    """Records appended in here carry no signature (as before signing existed)."""
    original = log_module.sign
    log_module.sign = lambda body, key: dict(body)  # type: ignore[assignment]
    try:
        yield
    finally:
        log_module.sign = original


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def ops(root: Path, count: int) -> tuple[float, float]:
    workspace, image, namespace = open_image(root / "ops")
    run(image, namespace, "counter = 0")
    signed_times, plain_times = [], []
    for _ in range(count):
        signed_times.append(timed(lambda: run(image, namespace, "counter += 1")))
        with unsigned():
            plain_times.append(timed(lambda: run(image, namespace, "counter += 1")))
    workspace.close()
    return statistics.median(signed_times), statistics.median(plain_times)


def appends(root: Path, count: int) -> tuple[float, float]:
    (root / "log").mkdir()
    log = AuditLog(root / "log", keyring=Keyring(root / "log" / "keys"), durable=False)
    log.ensure_genesis(None)
    body = {"type": "op", "op": 1, "kind": "cell", "principal": "human", "status": "failed",
            "error": "x", "code": {"sha256": "0" * 64, "text": "counter += 1"},
            "grants": {"used": [], "denied": []}, "changes": [], "events": [],
            "effects": [], "commit": None}
    signed_times, plain_times = [], []
    for _ in range(count):
        signed_times.append(timed(lambda: log.append(body)))
        with unsigned():
            plain_times.append(timed(lambda: log.append(body)))
    log.close()
    return statistics.median(signed_times), statistics.median(plain_times)


def chain(path: Path, records: int, *, signed: bool) -> None:
    workspace, image, namespace = open_image(path)
    run(image, namespace, "counter = 0")
    for _ in range(records):
        op = image.begin(source="1/0")
        op.abort(error=ZeroDivisionError("bench"))  # a record, no snapshot: the chain alone
    workspace.close()


def verify_times(root: Path, records: int) -> tuple[float, float]:
    chain(root / "signed", records, signed=True)
    with unsigned():
        chain(root / "plain", records, signed=False)
    signed = statistics.median(timed(lambda: verify(root / "signed")) for _ in range(3))
    plain = statistics.median(timed(lambda: verify(root / "plain")) for _ in range(3))
    return signed, plain


def pull_times(root: Path, count: int) -> tuple[float, float]:
    a, remote = root / "a", root / "a.git"
    workspace, image, namespace = open_image(a)
    run(image, namespace, "counter = 0")
    workspace.close()
    RemoteConfig.load(a).add("origin", str(remote))
    push(a)
    clone(str(remote), root / "b", trust=[load_identity(a).key_id])
    subprocess.run(["git", "clone", "--quiet", "--bare", "--no-local", str(remote),
                    str(root / "mirror.git")], check=True)
    workspace, image, namespace = open_image(a)
    for _ in range(count):
        run(image, namespace, "counter += 1")
    workspace.close()
    push(a)
    ours = timed(lambda: pull(root / "b"))
    theirs = timed(lambda: subprocess.run(
        ["git", "--git-dir", str(root / "mirror.git"), "fetch", "--quiet", str(remote),
         "+refs/heads/main:refs/heads/main", "+refs/kernos/*:refs/kernos/*"], check=True))
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="trivial ops of each kind")
    parser.add_argument("--records", type=int, default=10_000, help="records verified")
    parser.add_argument("--pull", type=int, default=200, help="ops a pull brings")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kernos-signing-bench-") as directory:
        root = Path(directory)
        signed, plain = ops(root, args.ops)
        print(f"trivial op (counter += 1), median of {args.ops} each, interleaved: signed "
              f"{signed * 1000:.2f} ms, unsigned {plain * 1000:.2f} ms "
              f"(+{(signed - plain) * 1000:.3f} ms, {signed / plain:.2f}x)")
        signed, plain = appends(root, args.ops * 10)
        print(f"AuditLog.append (no fsync), median of {args.ops * 10} each: signed "
              f"{signed * 1e6:.0f} us, unsigned {plain * 1e6:.0f} us "
              f"(+{(signed - plain) * 1e6:.0f} us, {signed / plain:.2f}x)")
        signed, plain = verify_times(root, args.records)
        print(f"kernos audit verify of {args.records} records, median of 3: signed "
              f"{signed:.2f} s, unsigned {plain:.2f} s ({signed / plain:.2f}x)")
        ours, theirs = pull_times(root, args.pull)
        print(f"pull of {args.pull} new ops (fetched aside, checked, landed): {ours:.2f} s; "
              f"git fetch of the same refs: {theirs:.2f} s ({ours / theirs:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
