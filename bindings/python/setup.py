"""`pip install` for the strata Python package, offline, with Debian's build dependencies.

    /usr/bin/python3 -m venv --system-site-packages ~/strata-venv   # Debian 12: PEP 668
    ~/strata-venv/bin/pip install --no-build-isolation -v ./bindings/python

(--no-build-isolation: pip then uses the installed setuptools instead of downloading one;
-v: pip shows the CMake build's progress, which takes minutes, instead of a spinner.)
The extension is built by CMake from the repository root (the same build as
scripts/build.sh, target strata_python) in $STRATA_PY_BUILD_DIR (default
<repo>/build-python); the package is assembled from bindings/python/strata/ (with its
subpackage strata/torch/) plus the built strata/_strata*.so. Without pip: build with CMake
and use PYTHONPATH=<build>/python.
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class CMakeBuild(build_py):
    """Builds strata._strata with CMake, then copies it next to the Python sources."""

    def run(self):
        super().run()
        build_dir = os.environ.get("STRATA_PY_BUILD_DIR", os.path.join(REPO, "build-python"))
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", REPO, "-B", build_dir, *gen,
                                   "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                                   "-DSTRATA_BUILD_TESTS=OFF", "-DSTRATA_BUILD_BENCH=OFF",
                                   f"-DPython3_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "strata_python",
                               "-j", str(os.cpu_count() or 2)])
        built = glob.glob(os.path.join(build_dir, "python", "strata", "_strata*.so"))
        if not built:
            raise RuntimeError(f"the CMake build in {build_dir} produced no _strata module")
        dest = os.path.join(self.build_lib, "strata")
        os.makedirs(dest, exist_ok=True)
        for so in built:
            shutil.copy2(so, dest)


setup(
    name="strata",
    version="0.1.0",
    description="Tiered tensor store (GPU HBM / pinned DRAM / NVMe) and offloaded optimizer",
    packages=["strata", "strata.torch", "strata.torch.optim", "strata.torch.offload"],
    package_dir={"strata": "strata"},
    package_data={"strata": ["*.pyi", "py.typed"]},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    cmdclass={"build_py": CMakeBuild},
    zip_safe=False,
)
