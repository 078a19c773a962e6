"""The start-up hook's ``.pth`` line, built from the standard library alone: ``setup.py`` loads
this file by its path while the wheel is built, where threadweaver is not importable."""

from pathlib import Path

PTH_NAME = "threadweaver-lmeval.pth"


def pth_line(autoload_source: str) -> str:
    """The ``.pth`` line: run the start-up hook's source in a namespace of its own."""
    return f"import sys; exec({autoload_source!r}, {{'__name__': 'threadweaver_lmeval_startup'}})\n"


PTH_LINE = pth_line((Path(__file__).resolve().parent / "autoload.py").read_text())
