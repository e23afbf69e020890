"""Test setup: TensorFlow sees 8 logical CPU devices, and runtime graph rewrites are off."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's own CPU kernels unless TF_ENABLE_ONEDNN_OPTS says otherwise: one kernel
# library for the suite's float32 tolerances. tests/robustness/test_onednn.py and
# tests/binaries/test_readme.py run steps with oneDNN on, in processes of their own.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def pytest_configure(config):
    try:
        import tensorflow as tf
    except ImportError:  # planner-only tests still run
        return
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 8)
    except RuntimeError:
        pass  # already initialised by another plugin; the device count is checked in tests
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
