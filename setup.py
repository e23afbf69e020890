"""Install tofu_tf: `pip install -e ".[cpu,test]"` (CPU) or `pip install -e ".[gpu,test]"` (GPU).

TensorFlow is an extra, not a hard requirement, so that a CPU user and a GPU user each get
exactly one TensorFlow wheel: `tensorflow-cpu` and `tensorflow[and-cuda]` install the same
`tensorflow` package and overwrite each other. A user who already has a TensorFlow 2.x wheel
installs with no TensorFlow extra at all.

`build_py` also tries to prebuild the C++ cost op (tofu_tf/cc/build.py) into the package's
`tofu_tf/cc/_build/`. That only works where TensorFlow and g++ are present at install time
(e.g. `pip install --no-build-isolation`); otherwise it says why and moves on, and the
library is built on first use instead (or the NumPy path is used). It never fails the install.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_with_cost_op(build_py):
    """build_py, then a best-effort prebuild of the cost-op library."""

    def run(self):
        super().run()
        package_dir = HERE if getattr(self, "editable_mode", False) else Path(self.build_lib)
        try:
            path = _load_builder().library_path(dirs=[package_dir / "tofu_tf" / "cc" / "_build"])
            self.announce(f"tofu_tf: cost op library at {path}", level=2)
        except Exception as error:  # noqa: BLE001 - the install must not fail; the reason is shown
            print(f"tofu_tf: skipped prebuilding the C++ cost op ({error}); it will be "
                  "built on first use, or the NumPy path used.", file=sys.stderr)


def _load_builder():
    """tofu_tf/cc/build.py, imported from the source tree (tofu_tf may not be installed yet)."""
    sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location("tofu_tf_cc_build", HERE / "tofu_tf/cc/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


setup(
    name="tofu_tf",
    version="0.1.0",
    description="Partition every operator of a TensorFlow training graph across N devices.",
    packages=find_packages(include=["tofu_tf", "tofu_tf.*"]),
    cmdclass={"build_py": build_py_with_cost_op},
    package_data={"tofu_tf.cc": ["*.cc", "*.h", "BUILD"]},
    python_requires=">=3.10",
    install_requires=["numpy>=1.24", "absl-py>=1.4", "scipy>=1.11"],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.16,<3"],
        "gpu": ["tensorflow[and-cuda]>=2.16,<3"],
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6"],
        "plot": ["matplotlib>=3.7"],
    },
)
