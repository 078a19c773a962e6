"""Everything is in pyproject.toml; this only ships lm-eval's start-up hook.

A ``.pth`` file must sit at the top of site-packages, which package data cannot reach:
``build_py`` writes ``threadweaver-lmeval.pth`` (``pth.PTH_LINE``, loaded from its file,
which imports only the standard library: an isolated build cannot import threadweaver or
its dependencies) to the root of the wheel. Editable
installs do not carry it; ``python -m threadweaver.lmeval_tasks install``
writes it (``scripts/setup.sh`` does).
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py


def pth_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins", "lmeval_tasks", "pth.py")
    spec = importlib.util.spec_from_file_location("threadweaver_lmeval_pth", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        pth = pth_module()
        with open(os.path.join(self.build_lib, pth.PTH_NAME), "w", encoding="utf-8") as f:
            f.write(pth.PTH_LINE)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, pth_module().PTH_NAME)]


setup(cmdclass={"build_py": BuildPyWithPth})
