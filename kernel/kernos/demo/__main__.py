"""``python -m kernos.demo [--workspace DIR]``: the same as ``kernos demo``."""

from __future__ import annotations

import argparse

from kernos.demo import run_demo

parser = argparse.ArgumentParser(prog="python -m kernos.demo",
                                 description="run the headless demonstration on a real kernel")
parser.add_argument("--workspace", "-w", metavar="DIR",
                    help="workspace to use (default: a fresh one under snapshots/ or a "
                         "temporary directory)")
raise SystemExit(run_demo(parser.parse_args().workspace))
