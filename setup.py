"""Builds openneuron._C with CMake + Ninja (+ ccache) against the installed torch.

Use `pip install --no-build-isolation -e .` (the Makefile does): the build must see the
installed, pinned torch rather than fetch its own.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = Path(os.environ.get("OPENNEURON_BUILD_DIR", ROOT / "build"))
        build_dir.mkdir(parents=True, exist_ok=True)
        if not (build_dir / "build.ninja").exists():
            subprocess.check_call([
                "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                f"-DPython3_EXECUTABLE={sys.executable}",
            ])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C"])
        built = next((ROOT / "openneuron").glob("_C*.so"))
        dest = Path(self.get_ext_fullpath(ext.name))
        if dest.resolve() != built.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, dest)


setup(ext_modules=[CMakeExtension("openneuron._C")], cmdclass={"build_ext": CMakeBuild})
