"""Kernos kernels through Jupyter Enterprise Gateway: throughput and the gateway's overhead.

    python bench/gateway.py [--ops N] [--workspaces W]

A real gateway on 127.0.0.1 is started with deploy/gateway's scripts (the tests'
``gateway_support``: ``.venv-gateway`` is made by scripts/gateway-env if missing).

1. *Per-op overhead.*  One client sends N trivial ops (``counter += 1``, durable
   commit) one after another to a local kernel (``KernosManager(path)``), then to a
   gateway kernel (``KernosManager(name, gateway=URL)``): the median round trip of
   each, the difference (the gateway's overhead per op) and the ratio.
2. *W workspaces at once.*  W kernels, each on its own workspace, each driven by its
   own client sending N ops, all at once: total committed ops per second through the
   gateway, and the same with W local kernels in the same run (the baseline).

Every op is checked to have committed.  Medians, since these machines are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gateway_support import USERNAME, Gateway, running_gateway  # noqa: E402
from kernos.client import AsyncKernosClient, KernosManager  # noqa: E402


async def timed_ops(client: AsyncKernosClient, ops: int) -> list[float]:
    result = await client.op("counter = 0")
    assert result.committed, result
    samples = []
    for _ in range(ops):
        began = time.perf_counter()
        result = await client.op("counter += 1")
        samples.append(time.perf_counter() - began)
        assert result.committed, result
    return samples


def manager(kind: str, name: str, root: Path, gateway: Gateway) -> KernosManager:
    if kind == "gateway":
        return KernosManager(name, gateway=gateway.url, token=gateway.token)
    return KernosManager(root / name)


async def one_client(kind: str, root: Path, gateway: Gateway, ops: int) -> list[float]:
    started = manager(kind, f"{kind}-one", root, gateway)
    await started.start()
    try:
        client = await started.client()
        await timed_ops(client, 5)  # warm up
        return await timed_ops(client, ops)
    finally:
        await started.shutdown()


async def many(kind: str, root: Path, gateway: Gateway, ops: int, count: int) -> float:
    """Committed ops/s of ``count`` workspaces driven at once (start-up not counted)."""
    managers = [manager(kind, f"{kind}-many-{index}", root, gateway) for index in range(count)]
    try:
        await asyncio.gather(*(each.start() for each in managers))
        clients = await asyncio.gather(*(each.client() for each in managers))
        began = time.perf_counter()
        await asyncio.gather(*(timed_ops(client, ops) for client in clients))
        elapsed = time.perf_counter() - began
        return count * (ops + 1) / elapsed
    finally:
        await asyncio.gather(*(each.shutdown() for each in managers))


async def main(ops: int, count: int) -> None:
    os.environ.setdefault("KERNEL_USERNAME", USERNAME)
    with tempfile.TemporaryDirectory(prefix="kernos-gateway-bench-") as temporary:
        base = Path(temporary)
        with running_gateway(base / "gateway", cull_idle=0) as gateway:
            local = await one_client("local", base, gateway, ops)
            through = await one_client("gateway", base, gateway, ops)
            local_ms, gateway_ms = (statistics.median(local) * 1000,
                                    statistics.median(through) * 1000)
            print(f"one client, {ops} trivial ops (median round trip):")
            print(f"  local kernel     {local_ms:7.2f} ms")
            print(f"  through gateway  {gateway_ms:7.2f} ms   overhead "
                  f"{gateway_ms - local_ms:+.2f} ms per op, {gateway_ms / local_ms:.2f}x")
            local_rate = await many("local", base, gateway, ops, count)
            gateway_rate = await many("gateway", base, gateway, ops, count)
            print(f"{count} workspaces at once, {ops} ops each (committed ops/s, total):")
            print(f"  local kernels    {local_rate:7.0f} ops/s")
            print(f"  through gateway  {gateway_rate:7.0f} ops/s   "
                  f"{gateway_rate / local_rate:.2f}x the local figure")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=200, help="ops per client (default 200)")
    parser.add_argument("--workspaces", type=int, default=8,
                        help="workspaces driven at once (default 8)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.ops, arguments.workspaces))
