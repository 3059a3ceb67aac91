"""The ``kernos`` command.

``kernos install``            install the kernelspec (--user, --sys-prefix or --prefix DIR)
``kernos demo``               the headless demonstration, on a real kernel
``kernos log|show|diff``      browse a workspace's history; no kernel needed
``kernos checkout REF``       record a new snapshot equal to REF (the kernel must be stopped)

The workspace is ``--workspace DIR``, else ``$KERNOS_WORKSPACE``, else the
default (see ``kernos.store.workspace``).  Errors print one clear line and
exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kernos import history
from kernos.errors import KernosError
from kernos.store.workspace import Workspace, default_workspace

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernos",
        description="Kernos: a persistent, transactional Python image for Jupyter.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    install = commands.add_parser("install", help="install the 'kernos' kernelspec")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter directory")
    where.add_argument("--sys-prefix", action="store_true", help="into sys.prefix (this env)")
    where.add_argument("--prefix", metavar="DIR", help="into DIR/share/jupyter/kernels")

    demo = commands.add_parser("demo", help="run the headless demonstration on a real kernel")
    demo.add_argument("--workspace", "-w", metavar="DIR",
                      help="workspace to use (default: a fresh one under snapshots/ or a "
                           "temporary directory)")

    def with_workspace(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--workspace", "-w", metavar="DIR",
                         help="the workspace directory (default: $KERNOS_WORKSPACE)")
        return sub

    log = with_workspace("log", "list the snapshots, newest first")
    log.add_argument("-n", type=int, default=20, metavar="N", help="at most N (default 20)")
    show = with_workspace("show", "show one snapshot")
    show.add_argument("ref", nargs="?", default="HEAD")
    diff = with_workspace("diff", "names that differ between two snapshots")
    diff.add_argument("ref_a")
    diff.add_argument("ref_b", nargs="?", default="HEAD")
    checkout = with_workspace("checkout", "record a new snapshot equal to REF")
    checkout.add_argument("ref")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KernosError as error:
        print(f"kernos {args.command}: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "install":
        from kernos.kernel.install import install

        prefix = sys.prefix if args.sys_prefix else args.prefix
        print(f"Installed the kernos kernelspec in {install(user=args.user, prefix=prefix)}")
        return 0
    if args.command == "demo":
        from kernos.demo import run_demo

        return run_demo(args.workspace)
    path = args.workspace or default_workspace()
    if args.command == "checkout":
        with Workspace.open(path, create=False, purpose="kernos checkout") as workspace:
            commit = history.checkout_offline(workspace, args.ref)
        print(f"Checked out {args.ref} as a new snapshot {commit[:12]}. The next kernel on "
              f"this workspace restores it.")
        return 0
    with Workspace.open(path, writable=False) as workspace:
        if args.command == "log":
            print(history.format_log(history.log(workspace, limit=args.n)))
        elif args.command == "show":
            print(history.format_show(history.show(workspace, args.ref)))
        elif args.command == "diff":
            result = history.diff(workspace, args.ref_a, args.ref_b)
            print(history.format_diff(result, args.ref_a, args.ref_b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
