"""``python -m threadweaver.lmeval_tasks install|remove|status|path|lm_eval``: see :mod:`.discovery`."""

from __future__ import annotations

import os
import sys

from threadweaver.lmeval_tasks import discovery
from threadweaver.lmeval_tasks.pth import PTH_LINE


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m threadweaver.lmeval_tasks",
        description="Make the plain lm_eval CLI find the threadweaver model and tasks.",
    )
    parser.add_argument(
        "action",
        choices=("install", "remove", "status", "path", "lm_eval"),
        help="install/remove the .pth start-up hook, show its status, print the tasks directory "
        "(for --include_path), or run the lm_eval CLI with the model and tasks found, hook or not",
    )
    parser.add_argument(
        "lm_eval_args", nargs=argparse.REMAINDER, metavar="...", help="(lm_eval) the lm_eval CLI's arguments"
    )
    args = parser.parse_args(argv)
    if args.lm_eval_args and args.action != "lm_eval":
        parser.error(f"{args.action} takes no arguments: {' '.join(args.lm_eval_args)}")
    target = discovery.pth_path()
    if args.action == "lm_eval":
        return lm_eval(args.lm_eval_args)
    if args.action == "path":
        print(discovery.TASKS_DIR)
    elif args.action == "install":
        if not target.exists() or target.read_text() != PTH_LINE:
            target.write_text(PTH_LINE)
        print(f"installed {target}")
    elif args.action == "remove":
        if target.exists():
            target.unlink()
            print(f"removed {target}")
        else:
            print(f"{target}: not installed, nothing to remove")
    else:
        state = "installed" if target.exists() and target.read_text() == PTH_LINE else "not installed"
        switched_off = os.environ.get("THREADWEAVER_LMEVAL_AUTOLOAD", "1") == "0"
        print(f"{target}: {state}" + (" (switched off by THREADWEAVER_LMEVAL_AUTOLOAD=0)" if switched_off else ""))
        return 0 if state == "installed" else 1
    return 0


def lm_eval(arguments: list[str]) -> int:
    """lm-eval's own CLI with the hook's work done in this process (``THREADWEAVER_LMEVAL_AUTOLOAD=0`` or not)."""
    from lm_eval.__main__ import cli_evaluate

    from threadweaver.lmeval_tasks import autoload, cli_errors

    autoload.install()
    cli_errors.install()
    sys.argv = ["lm_eval", *arguments]
    cli_evaluate()
    return 0


sys.exit(main())
