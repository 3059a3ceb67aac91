"""What an inspector's refresh costs with 10,000 objects in the image.

    python bench/inspector_bench.py [--objects N] [--repeat R]

An inspector refreshes after every committed op.  It asks for one page of
objects (50, filtered and sorted in the kernel), the history (``log``), the
per-op stats (``stats``) and the grants; it never fetches every object.
The baseline, measured in the same run, is what an inspector without paging
would do: fetch all N objects (``objects`` with no limit).  Each figure is
the median of R runs of ``HarnessService.handle`` on the real image, plus
the JSON encoding a comm would do.  The refresh target: under 100 ms, so
the panel and widget stay responsive.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any


def median_ms(call: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    from kernos import Image, Workspace
    from kernos.agents import AgentRuntime
    from kernos.harness.service import HarnessService

    with tempfile.TemporaryDirectory() as root, \
            Workspace.open(Path(root) / "ws") as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        source = (f"for i in range({args.objects}):\n"
                  "    globals()[f'obj_{i:05d}'] = {'i': i, 'tags': ['x'] * (i % 7)}")
        op = image.begin(source=source)
        exec(source, module.__dict__)
        op.commit()
        for step in range(20):  # some history for log and stats
            op = image.begin(source=f"obj_{step:05d} = {step}")
            module.__dict__[f"obj_{step:05d}"] = step
            op.commit()
        service = HarnessService(image, AgentRuntime(image))

        def ask(**request: Any) -> None:
            reply = service.handle({"v": 1, **request}).reply
            assert reply["status"] == "ok", reply
            json.dumps(reply)

        rows = [
            ("objects page (by name)", lambda: ask(action="objects", limit=50)),
            ("objects page (-size)", lambda: ask(action="objects", sort="-size", limit=50)),
            ("objects page (query)", lambda: ask(action="objects", query="obj_09", limit=50,
                                                 sort="-changed_at")),
            ("log (last 100)", lambda: ask(action="log", limit=100)),
            ("stats (last 500 ops)", lambda: ask(action="stats")),
            ("grants + agents", lambda: (ask(action="grants"), ask(action="agents"))),
        ]
        figures = {name: median_ms(call, args.repeat) for name, call in rows}
        baseline = median_ms(lambda: ask(action="objects"), args.repeat)
        refresh = (figures["objects page (by name)"] + figures["log (last 100)"]
                   + figures["stats (last 500 ops)"] + figures["grants + agents"])
        print(f"{len(image.meta):,} objects in the image; medians of {args.repeat} runs")
        for name, value in figures.items():
            print(f"  {name:<26} {value:8.2f} ms")
        print(f"  {'baseline: all objects':<26} {baseline:8.2f} ms")
        print(f"a full refresh (page + log + stats + grants): {refresh:.2f} ms, "
              f"{refresh / baseline:.2f}x the unpaged objects listing alone "
              f"(target: under 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
