"""What ``pip install threadweaver[...]`` gives a user, without an index: this repo's wheel
unpacked into a fresh venv's site-packages (what pip does with a pure wheel), and the
running venv's packages on a plain path (the hosts, but none of its ``.pth`` files, so
the editable install stays out)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wheel_venv(tmp_path: Path) -> tuple[Path, Path]:
    """(the fresh venv's python, its site-packages)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(REPO),
            "-w",
            str(tmp_path / "wheel"),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = (tmp_path / "wheel").glob("threadweaver-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    zipfile.ZipFile(wheel).extractall(site)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site
