"""What ``pip install threadweaver[...]`` gives a user, without an index: the sdist built from
this checkout and the wheel built from that sdist, each with build isolation (as ``pip install``
and ``python -m build`` do), the wheel installed by pip (not editable) into a fresh venv, with
the running venv's packages on a plain path (the hosts, but none of its ``.pth`` files, so the
editable install stays out)."""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@functools.cache
def built() -> tuple[Path, Path]:
    """(the sdist, the wheel built from it): once per test process. Build isolation fetches
    setuptools from the package index, as a user's build does."""
    out = Path(tempfile.mkdtemp(prefix="threadweaver-dist-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [sdist] = out.glob("threadweaver-*.tar.gz")
    [wheel] = out.glob("threadweaver-*.whl")
    return sdist, wheel


def wheel_venv(tmp_path: Path) -> tuple[Path, Path]:
    """(the fresh venv's python, its site-packages)."""
    _, wheel = built()
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check", wheel]
    subprocess.run(install, check=True, capture_output=True)
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site
