"""The baseline: dill's whole-module snapshot of the same namespace.

``dill.dump_module`` / ``dill.load_module`` is what a notebook user reaches for
to save and restore a session today, so every Kernos figure is set against it
in the same run, on the same machine, at the same moment.

This file is both the parent-side API (:func:`measure_dump`,
:func:`measure_load`, :func:`measure_imports`) and the script that runs in the
child processes, so each measurement happens in a process of its own:

* ``dump``: build the namespace in a runtime module (``types.ModuleType``) by
  running every workload cell in its globals, then time
  ``dill.dump_module(file, module=...)``;
* ``load``: in a fresh interpreter that has imported only dill, time
  ``dill.load_module(file)`` (numpy and pandas are imported by the load, as a
  restoring Kernos kernel imports them too);
* ``imports``: time ``import numpy, pandas`` alone, to show how much of both
  restores is just that.

Each child prints one JSON object on its last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DumpResult", "measure_dump", "measure_imports", "measure_load"]

MODULE_NAME = "kernos_bench_ns"
CHILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class DumpResult:
    seconds: float
    file_bytes: int
    namespace_rss: int
    """Resident memory of the child once the namespace is built (before the dump)."""
    peak_rss: int
    """Peak resident memory of the child, dump included."""


def _child(args: list[str]) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} baseline failed "
                           f"(exit {done.returncode}):\n{done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure_dump(scale: float, file: Path) -> DumpResult:
    """Build the namespace and ``dill.dump_module`` it to ``file``, in a child process."""
    data = _child(["dump", "--scale", repr(scale), "--file", str(file)])
    return DumpResult(seconds=data["seconds"], file_bytes=data["file_bytes"],
                      namespace_rss=data["namespace_rss"], peak_rss=data["peak_rss"])


def measure_load(file: Path, scale: float) -> float:
    """Seconds ``dill.load_module(file)`` takes in a fresh interpreter (checked)."""
    return float(_child(["load", "--scale", repr(scale), "--file", str(file)])["seconds"])


def measure_imports() -> float:
    """Seconds ``import numpy, pandas`` takes in a fresh interpreter."""
    return float(_child(["imports"])["seconds"])


# -- the child side ------------------------------------------------------------


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _dump(scale: float, file: Path) -> dict[str, Any]:
    import dill
    from workload import Workload

    module = types.ModuleType(MODULE_NAME)
    for cell in Workload.at_scale(scale).cells():
        exec(compile(cell.code, f"<{cell.label}>", "exec"), module.__dict__)
    namespace_rss = _proc_status("VmRSS")
    started = time.perf_counter()
    dill.dump_module(str(file), module=module)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "file_bytes": file.stat().st_size,
            "namespace_rss": namespace_rss, "peak_rss": _proc_status("VmHWM")}


def _load(scale: float, file: Path) -> dict[str, Any]:
    import dill

    started = time.perf_counter()
    module = dill.load_module(str(file))
    seconds = time.perf_counter() - started

    from workload import Workload

    check = Workload.at_scale(scale).check_code()
    printed: list[str] = []
    exec(compile(check, "<check>", "exec"),
         {**module.__dict__, "print": lambda *values: printed.extend(map(str, values))})
    if printed != ["True"]:
        raise SystemExit(f"dill.load_module restored a different namespace: {printed}")
    return {"seconds": seconds}


def _imports() -> dict[str, Any]:
    started = time.perf_counter()
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    return {"seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One dill baseline measurement (a child "
                                                 "process of bench/run.py).")
    parser.add_argument("what", choices=("dump", "load", "imports"))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--file", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.what == "imports":
        result = _imports()
    elif args.file is None:
        parser.error(f"{args.what} needs --file")
    elif args.what == "dump":
        result = _dump(args.scale, args.file)
    else:
        result = _load(args.scale, args.file)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
