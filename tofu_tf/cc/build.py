"""Build `cost_op.cc` into a TensorFlow op library, once per source and TensorFlow version.

    key     = sha256(source bytes, TF version, compiler command and flags)[:16]
    library = <cache dir>/tofu_cost_op-tf<TF version>-<key>.so

A library whose key matches is loaded as is; any change to the source, the TensorFlow
version or the flags gives a new key, so a stale library is never loaded (and the older
libraries of the same TF version are removed after a build). The cache dir is
`_build/` next to the source when that is writable (an editable install), else
`~/.cache/tofu_tf/`. The compile (~4 s, ~630 MB) writes a temporary file and renames it
into place, so concurrent processes never load a half-written library. Every failure
(no TensorFlow, no compiler, compile error) is a `CustomOpBuildError` that says why.

This module never imports TensorFlow at import time; `setup.py` loads it by path to
prebuild the library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tofu_tf.errors import TofuError

COMPILER = "g++"                                  # looked up on PATH; tests point it elsewhere
SOURCE = Path(__file__).with_name("cost_op.cc")
LIBRARY_PREFIX = "tofu_cost_op-"
COMPILE_TIMEOUT_S = 600
BASE_FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O3")
QUIET_FLAGS = ("-Wno-deprecated-declarations", "-Wno-interference-size")
STDERR_TAIL_LINES = 25


class CustomOpBuildError(TofuError):
    """The C++ cost op cannot be compiled or loaded; the NumPy path is used instead."""


def cache_dirs() -> list[Path]:
    """Where libraries are looked for, in order; the first writable one receives new ones."""
    return [SOURCE.parent / "_build", Path.home() / ".cache" / "tofu_tf"]


def library_path(compiler: str | None = None, dirs: list[Path] | None = None) -> Path:
    """The library for the current source and TensorFlow: found in a cache dir, or built."""
    compiler = compiler or COMPILER
    dirs = cache_dirs() if dirs is None else dirs
    name = library_name(compiler)
    for directory in dirs:
        if (directory / name).is_file():
            return directory / name
    target = _writable_dir(dirs) / name
    compile_library(compiler, target)
    _remove_stale(target, _tf_prefix(_import_tensorflow().__version__))
    return target


def library_name(compiler: str) -> str:
    """`tofu_cost_op-tf<version>-<hash of source, TF version and compile command>.so`."""
    tf = _import_tensorflow()
    command = compile_command(compiler, Path("SOURCE"), Path("OUTPUT"))
    try:
        digest = hashlib.sha256(SOURCE.read_bytes())
    except OSError as error:
        raise CustomOpBuildError(f"cannot read the op source {SOURCE}: {error}.",
                                 fix="reinstall tofu_tf; the package ships cost_op.cc.") from error
    digest.update(tf.__version__.encode())
    digest.update("\0".join(command).encode())
    return f"{_tf_prefix(tf.__version__)}{digest.hexdigest()[:16]}.so"


def _tf_prefix(tf_version: str) -> str:
    return f"{LIBRARY_PREFIX}tf{tf_version}-"


def compile_command(compiler: str, source: Path, output: Path) -> list[str]:
    """`g++ -std=c++17 -shared -fPIC -O3 <TF compile flags> src -o out <TF link flags>`."""
    tf = _import_tensorflow()
    return [compiler, *BASE_FLAGS, *tf.sysconfig.get_compile_flags(), str(source),
            "-o", str(output), *tf.sysconfig.get_link_flags(), *QUIET_FLAGS]


def compile_library(compiler: str, target: Path) -> None:
    """Compile SOURCE into `target` atomically; raise CustomOpBuildError with the reason."""
    if shutil.which(compiler) is None:
        raise CustomOpBuildError(
            f"C++ compiler '{compiler}' not found, so the cost op cannot be built.",
            fix="install g++ (C++17) to use the C++ path; the NumPy path gives the same answers.")
    fd, partial = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
    os.close(fd)
    try:
        _run_compiler(compile_command(compiler, SOURCE, Path(partial)))
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _run_compiler(command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CustomOpBuildError(f"running the C++ compiler failed: {error}.",
                                 fix="check the compiler; the NumPy path is used meanwhile.") from error
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        raise CustomOpBuildError(
            f"compiling {SOURCE.name} failed (exit {done.returncode}). Command: "
            f"{' '.join(command)}\nLast lines of the compiler's output:\n{tail}\n",
            fix="check that g++ supports C++17 and matches TensorFlow's headers "
                "(-D_GLIBCXX_USE_CXX11_ABI); the NumPy path is used meanwhile.")


def _import_tensorflow():
    try:
        import tensorflow as tf
    except ImportError as error:
        raise CustomOpBuildError(f"TensorFlow is not importable ({error}), so the cost op "
                                 "cannot be built.", fix="pip install tensorflow-cpu.") from error
    return tf


def _writable_dir(dirs: list[Path]) -> Path:
    for directory in dirs:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise CustomOpBuildError(f"no writable cache directory for the cost op among "
                             f"{[str(d) for d in dirs]}.", fix="make ~/.cache writable.")


def _remove_stale(current: Path, prefix: str) -> None:
    """Best effort: drop the libraries of older sources (same TF version) next to `current`.
    Libraries of other TF versions may belong to another environment, so they stay."""
    for old in current.parent.glob(prefix + "*.so"):
        if old != current:
            try:
                old.unlink()
            except OSError:
                pass
