"""TensorFlow imported first with oneDNN on: the kernel bug behind the guard, and the guard.

Each case runs in a fresh process, since oneDNN is chosen when TensorFlow is imported."""

from __future__ import annotations

import os
import subprocess
import sys

# The minimal reproduction cited in tofu_tf/__init__.py: float32 against the float64
# kernel (which oneDNN does not serve) on the same values.
REPRODUCTION = """
import numpy as np, tensorflow as tf
from tensorflow.python.util import _pywrap_util_port
assert _pywrap_util_port.IsMklEnabled()
rng = np.random.default_rng(0)
worst = 0.0
for c in range(1, 8):
    x = rng.standard_normal((2, 8, 8, c))
    dy = rng.standard_normal((2, 4, 4, 8))
    def grad(dtype):
        return tf.raw_ops.Conv2DBackpropFilter(
            input=tf.constant(x, dtype), filter_sizes=[1, 1, c, 8],
            out_backprop=tf.constant(dy, dtype), strides=[1, 2, 2, 1],
            padding="VALID").numpy().astype(np.float64)
    want = grad(tf.float64)
    worst = max(worst, float(np.abs(grad(tf.float32) - want).max() / np.abs(want).max()))
print("worst", worst)
"""

GUARD = """
import numpy as np
import tensorflow as tf
import tofu_tf
w = tf.Variable(np.ones((4, 4), np.float32))
def step(x):
    w.assign_sub(0.1 * tf.matmul(x, w))
    return tf.reduce_sum(w)
try:
    tofu_tf.function(step, num_devices=2)
except tofu_tf.KernelConfigError as err:
    print("raised:", err)
allowed = tofu_tf.function(step, num_devices=2,
                           options=tofu_tf.Options(allow_onednn=True))
print("allowed:", float(allowed(np.ones((4, 4), np.float32))))
"""


def _run(script: str, onednn: str, **env_vars: str) -> str:
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2",
           **env_vars}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_onednn_avx2_filter_gradient_is_wrong_on_small_channel_counts():
    """oneDNN's AVX2 kernels (what CPUs without AVX-512 run). If this fails, they are right
    now: check_kernels may be relaxed."""
    worst = float(_run(REPRODUCTION, "1", ONEDNN_MAX_CPU_ISA="AVX2").split("worst")[-1])
    assert worst > 1e-2, f"oneDNN's 1x1 stride-2 filter gradient is right now ({worst:.1e})"


def test_tensorflow_kernels_give_the_same_filter_gradient():
    """The same reproduction with oneDNN off: TensorFlow's own float32 kernel is right."""
    script = REPRODUCTION.replace("assert _pywrap_util_port.IsMklEnabled()",
                                  "assert not _pywrap_util_port.IsMklEnabled()")
    worst = float(_run(script, "0").split("worst")[-1])
    assert worst < 1e-5, worst


def test_tensorflow_first_with_onednn_is_a_typed_error_naming_the_fix():
    out = _run(GUARD, "1")
    assert "raised:" in out and "TF_ENABLE_ONEDNN_OPTS=0" in out, out
    assert "allowed: " in out


def test_without_onednn_nothing_is_raised():
    out = _run(GUARD, "0")
    assert "raised:" not in out and "allowed: " in out, out
