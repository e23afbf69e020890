"""Checkpoints of a partitioned step's variables, stored whole (unpartitioned), by name.

    path = checkpoint.save("ckpt/", runner.values(), step=3)
    values, step = checkpoint.restore("ckpt/")          # the latest one
    runner.load(values)                                   # any plan, any device count

The files are TensorFlow's own (`tf.train.Checkpoint`, written through a
`CheckpointManager`): the index file names a checkpoint only after its data is written, so a
failure during a save leaves the one before it the latest. A variable `name` is stored as
`values/<name>`; `tf.train.load_checkpoint` reads them without tofu_tf.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from tofu_tf.errors import TofuError

_PREFIX = "values/"
_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _unescape(key: str) -> str:
    """The name of a dict entry from its object-graph key ('/' is stored as '.S', '.' as
    '..')."""
    out, i = [], 0
    while i < len(key):
        if key[i] == "." and i + 1 < len(key):
            out.append({"S": "/", ".": "."}.get(key[i + 1], "." + key[i + 1]))
            i += 2
        else:
            out.append(key[i])
            i += 1
    return "".join(out)


def save(directory: str, values: Mapping[str, np.ndarray], step: int, *,
         max_to_keep: int = 3) -> str:
    """Writes `values` (variable name -> array) as checkpoint `step` in `directory`; returns
    its path."""
    import tensorflow as tf
    with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        variables = {name: tf.Variable(np.asarray(value), trainable=False)
                     for name, value in values.items()}
        counter = tf.Variable(step, dtype=tf.int64, trainable=False)
    ckpt = tf.train.Checkpoint(step=counter, values=variables)
    manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=max_to_keep)
    return manager.save(checkpoint_number=step)


def restore(path: str) -> tuple[dict[str, np.ndarray], int]:
    """(variable name -> array, step) from a checkpoint path, or the latest in a directory."""
    import tensorflow as tf
    found = tf.train.latest_checkpoint(path) or path
    try:
        reader = tf.train.load_checkpoint(found)
    except (ValueError, tf.errors.OpError) as err:
        raise TofuError(f"no readable checkpoint at '{path}' ({type(err).__name__}).",
                        fix="pass a directory written by tofu_tf.runtime.checkpoint.save, or "
                            "the path of one checkpoint in it.") from None
    values = {}
    for key in reader.get_variable_to_shape_map():
        if key.startswith(_PREFIX) and key.endswith(_SUFFIX):
            values[_unescape(key[len(_PREFIX):-len(_SUFFIX)])] = reader.get_tensor(key)
    step = int(reader.get_tensor("step" + _SUFFIX))
    return values, step
