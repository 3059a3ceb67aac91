"""Headless op throughput and latency: one command, medians, baselines from the same run.

    python bench/harness_bench.py [--ops N] [--clients C]

1. *In-process (the core API).*  ``HarnessService.handle`` of a trivial op
   (``counter += 1``, durable commit) in a loop, on a fresh workspace:
   committed ops per second and the median latency.  Target: >= 1,000 ops/s.
2. *Through the protocol, one client.*  The round trip of the same trivial
   op sent by ``AsyncKernosClient.op`` to a real Kernos kernel, against a
   stock ipykernel's ``execute_request`` round trip for ``pass`` measured in
   the same run (the baseline).  Target: <= 1.3x.  The Kernos kernel's own
   ``execute_request`` of ``pass`` (a cell, also committed) is shown too.
3. *Eight clients.*  C clients connected to one kernel each send N/C
   trivial ops at once: committed ops per second overall, and the median
   latency each client sees (ops are serialized, so it grows with C).
   Target: >= 500 ops/s.  The same again on a kernel started with
   ``KERNOS_GROUP_COMMIT=off`` (each op syncs its own commit before the next
   runs) is the baseline for group commit.

Durability is as configured (``KERNOS_DURABILITY=process`` skips fsync).
``--sync-ms MS`` plays a slower disk in phase 3: every sync of the commit
tail takes MS milliseconds more (``KERNOS_PAUSE_AT=tail.sync:SECONDS``), for
both kernels; the figures are then labelled as simulated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from driver import KernelProcess


def ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def in_process(root: Path, ops: int) -> tuple[float, float]:
    from kernos import Image, Workspace
    from kernos.agents import AgentRuntime
    from kernos.harness.service import HarnessService

    with Workspace.open(root / "in-process") as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        service = HarnessService(image, AgentRuntime(image))
        request = {"v": 1, "action": "op", "principal": "human", "code": "counter += 1"}
        service.handle({**request, "code": "counter = 0"})
        samples = []
        started = time.perf_counter()
        for _ in range(ops):
            began = time.perf_counter()
            reply = service.handle(request).reply
            samples.append(time.perf_counter() - began)
            assert reply["result"]["status"] == "committed", reply
        elapsed = time.perf_counter() - started
    return ops / elapsed, ms(samples)


def cell_round_trip(root: Path, ops: int, kernel_name: str) -> float:
    """The median ``execute_request`` round trip of ``pass`` in a kernel of that name."""
    workspace = root / "cells" if kernel_name == "kernos" else None
    kernel = KernelProcess(kernel_name, run_dir=root, tag=kernel_name, workspace=workspace)
    try:
        for _ in range(5):
            kernel.run("pass")
        return statistics.median(kernel.run("pass").round_trip_ms for _ in range(ops))
    finally:
        kernel.stop(now=True)


async def one_client(root: Path, ops: int) -> float:
    from kernos.client import run_kernel

    async with run_kernel(root / "harness") as (_manager, client):
        await client.op("counter = 0")
        for _ in range(5):
            await client.op("counter += 1")
        samples = []
        for _ in range(ops):
            began = time.perf_counter()
            result = await client.op("counter += 1")
            samples.append(time.perf_counter() - began)
            assert result.committed, result
    return ms(samples)


async def many_clients(workspace: Path, ops: int, clients: int,
                       env: dict[str, str]) -> dict[str, float]:
    from kernos.client import AsyncKernosClient, run_kernel

    async with run_kernel(workspace, env=env) as (_manager, client):
        await client.op("counter = 0")
        connected = [await AsyncKernosClient.connect(workspace) for _ in range(clients)]
        latencies: list[float] = []

        async def work(each: AsyncKernosClient) -> None:
            for _ in range(max(1, ops // clients)):
                began = time.perf_counter()
                result = await each.op("counter += 1")
                latencies.append(time.perf_counter() - began)
                assert result.committed, result

        started = time.perf_counter()
        await asyncio.gather(*(work(each) for each in connected))
        elapsed = time.perf_counter() - started
        for each in connected:
            await each.close()
        commits = (await client.status())["commits"]
    return {"ops_s": len(latencies) / elapsed, "ms": ms(latencies),
            "per_sync": commits["small"] / max(1, commits["syncs"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="ops per measurement (200)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (8)")
    parser.add_argument("--sync-ms", type=float, default=0.0,
                        help="play a disk whose syncs take this much longer (phase 3)")
    args = parser.parse_args()
    mode = os.environ.get("KERNOS_DURABILITY", "full")
    print(f"durability: {mode}; {args.ops} ops per measurement; load average "
          f"{os.getloadavg()[0]:.2f}\n")
    slow = {"KERNOS_PAUSE_AT": f"tail.sync:{args.sync_ms / 1000}"} if args.sync_ms else {}
    with tempfile.TemporaryDirectory(prefix="kernos-harness-bench-") as tmp:
        root = Path(tmp)
        rate, latency = in_process(root, args.ops)
        stock = cell_round_trip(root, args.ops, "python3")
        cell = cell_round_trip(root, args.ops, "kernos")
        one = asyncio.run(one_client(root, args.ops))
        grouped = asyncio.run(many_clients(root / "grouped", args.ops, args.clients, slow))
        single = asyncio.run(many_clients(root / "single", args.ops, args.clients,
                                          {**slow, "KERNOS_GROUP_COMMIT": "off"}))
    disk = f", syncs {args.sync_ms:g} ms slower (simulated)" if args.sync_ms else ""
    rows = [
        ("in-process trivial op (core API)", f"{rate:7.0f} ops/s", f"{latency:6.2f} ms",
         "target >= 1000 ops/s"),
        ("stock ipykernel execute_request 'pass'", "", f"{stock:6.2f} ms", "baseline"),
        ("kernos execute_request 'pass' (a cell)", "", f"{cell:6.2f} ms",
         f"{cell / stock:.2f}x stock"),
        ("kernos client op 'counter += 1', 1 client", f"{1000 / one:7.0f} ops/s",
         f"{one:6.2f} ms", f"{one / stock:.2f}x stock (target 1.3x)"),
        (f"kernos client ops, {args.clients} clients at once{disk}",
         f"{grouped['ops_s']:7.0f} ops/s", f"{grouped['ms']:6.2f} ms",
         f"median latency; {grouped['per_sync']:.1f} ops per sync; target >= 500 ops/s"),
        (f"  the same, KERNOS_GROUP_COMMIT=off{disk}",
         f"{single['ops_s']:7.0f} ops/s", f"{single['ms']:6.2f} ms",
         f"{single['per_sync']:.1f} ops per sync; group commit "
         f"{grouped['ops_s'] / single['ops_s']:.2f}x this"),
    ]
    width = max(len(row[0]) for row in rows)
    for name, throughput, median, note in rows:
        print(f"{name:<{width}}  {throughput:>12}  {median:>10}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
