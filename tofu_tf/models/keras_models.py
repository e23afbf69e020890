"""Training steps of models written by others: Keras applications and keras_hub backbones.

Built from config only (no weights are downloaded), at tiny sizes for tests and coverage:

    step = build_keras_step("resnet50", batch_size=2, image_size=64)
    loss = step.step(*step.inputs)

The step is a `tf.function` over a Keras model and a Keras optimizer (built before tracing),
as a user would write it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from tofu_tf.errors import TofuError

IMAGE_MODELS = ("resnet50", "vgg16", "mobilenetv2")
TEXT_MODELS = ("gpt2", "bert")
KERAS_MODELS = IMAGE_MODELS + TEXT_MODELS


@dataclass(frozen=True, eq=False)
class KerasStep:
    name: str
    step: Callable                     # tf.function(x, y) -> loss
    inputs: tuple[np.ndarray, ...]     # one synthetic batch (x, y)
    model: Any
    optimizer: Any

    def concrete_function(self):
        specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in self.inputs]
        return self.step.get_concrete_function(*specs)


def _image_model(name: str, image_size: int, classes: int):
    import keras
    builders = {"resnet50": keras.applications.ResNet50, "vgg16": keras.applications.VGG16,
                "mobilenetv2": keras.applications.MobileNetV2}
    return builders[name](weights=None, input_shape=(image_size, image_size, 3),
                          classes=classes)


def _text_model(name: str, seq_len: int, hidden: int, vocab: int):
    import keras
    import keras_hub
    common = dict(vocabulary_size=vocab, num_layers=2, num_heads=2, hidden_dim=hidden,
                  intermediate_dim=2 * hidden, max_sequence_length=seq_len)
    backbone = (keras_hub.models.GPT2Backbone(**common) if name == "gpt2"
                else keras_hub.models.BertBackbone(**common))

    class LanguageModel(keras.Model):
        """Backbone + a dense head over the vocabulary."""

        def __init__(self):
            super().__init__()
            self.backbone = backbone
            self.head = keras.layers.Dense(vocab)

        def call(self, ids):
            inputs = {"token_ids": ids, "padding_mask": tf.ones_like(ids)}
            if name == "bert":
                inputs["segment_ids"] = tf.zeros_like(ids)
            out = self.backbone(inputs)
            return self.head(out["sequence_output"] if isinstance(out, dict) else out)

    model = LanguageModel()
    model(tf.zeros((1, seq_len), tf.int32))
    return model


def build_keras_step(name: str, *, batch_size: int = 2, image_size: int = 32,
                     classes: int = 10, seq_len: int = 8, hidden: int = 16, vocab: int = 64,
                     seed: int = 0, dtype: str = "float32") -> KerasStep:
    """A tf.function training step (Adam) of a Keras application or keras_hub backbone.
    `dtype="float64"` builds the model under that Keras float type (equivalence tests)."""
    import keras
    if name not in KERAS_MODELS:
        raise TofuError(f"unknown Keras model '{name}'; choose one of {', '.join(KERAS_MODELS)}.")
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    with keras_float(dtype):
        return _build_keras_step(name, batch_size, image_size, classes, seq_len, hidden,
                                 vocab, rng, dtype)


@contextlib.contextmanager
def keras_float(dtype: str) -> Iterator[None]:
    """Keras builds layers, losses and optimizers in `dtype` inside the block. Layers take
    the global dtype policy, which Keras fixes from floatx on first use (maybe earlier in
    the process): set both, and put both back."""
    import keras
    previous, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(previous)
        keras.config.set_dtype_policy(policy)


def _build_keras_step(name, batch_size, image_size, classes, seq_len, hidden, vocab, rng,
                      dtype) -> KerasStep:
    import keras
    if name in IMAGE_MODELS:
        model = _image_model(name, image_size, classes)
        loss_fn = keras.losses.CategoricalCrossentropy()
        x = rng.standard_normal((batch_size, image_size, image_size, 3)).astype(dtype)
        y = np.eye(classes, dtype=dtype)[rng.integers(0, classes, batch_size)]
    else:
        model = _text_model(name, seq_len, hidden, vocab)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        x = rng.integers(0, vocab, (batch_size, seq_len)).astype(np.int32)
        y = rng.integers(0, vocab, (batch_size, seq_len)).astype(np.int32)
    optimizer = keras.optimizers.Adam(1e-3)
    return KerasStep(name, training_step(model, optimizer, loss_fn), (x, y), model, optimizer)


def training_step(model, optimizer, loss_fn) -> Callable:
    """The usual Keras training step as a tf.function(x, y) -> loss (optimizer built first,
    so its slots exist before tracing)."""
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step
