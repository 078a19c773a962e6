"""``python -m threadweaver.lmeval_tasks install|remove|status|path``: see :mod:`.discovery`."""

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
        choices=("install", "remove", "status", "path"),
        help="install/remove the .pth start-up hook, show its status, or print the tasks directory "
        "(for --include_path)",
    )
    args = parser.parse_args(argv)
    target = discovery.pth_path()
    if args.action == "path":
        print(discovery.TASKS_DIR)
    elif args.action == "install":
        if not target.exists() or target.read_text() != PTH_LINE:
            target.write_text(PTH_LINE)
        print(f"installed {target}")
    elif args.action == "remove":
        target.unlink(missing_ok=True)
        print(f"removed {target}")
    else:
        state = "installed" if target.exists() and target.read_text() == PTH_LINE else "not installed"
        switched_off = os.environ.get("THREADWEAVER_LMEVAL_AUTOLOAD", "1") == "0"
        print(f"{target}: {state}" + (" (switched off by THREADWEAVER_LMEVAL_AUTOLOAD=0)" if switched_off else ""))
        return 0 if state == "installed" else 1
    return 0


sys.exit(main())
