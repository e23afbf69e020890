"""Training steps of models written by others: Keras applications and keras_hub backbones.

Built from config only (no weights are downloaded), at tiny sizes for tests, coverage and
the zoo benchmark (`bench/keras_zoo.py`): the applications of `APPLICATIONS` at their
smallest input size or more, the keras_hub backbones of `BACKBONES` with 2 layers of
width `hidden` (their constructors' size arguments filled by name):

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

# Keras applications: our name -> (keras.applications class, smallest input size).
APPLICATIONS = {
    "resnet50": ("ResNet50", 32), "resnet50v2": ("ResNet50V2", 32),
    "vgg16": ("VGG16", 32), "mobilenet": ("MobileNet", 32),
    "mobilenetv2": ("MobileNetV2", 32), "mobilenetv3small": ("MobileNetV3Small", 32),
    "densenet121": ("DenseNet121", 32), "efficientnetb0": ("EfficientNetB0", 32),
    "efficientnetv2b0": ("EfficientNetV2B0", 32), "xception": ("Xception", 71),
    "inceptionv3": ("InceptionV3", 75), "nasnetmobile": ("NASNetMobile", 32),
    "convnexttiny": ("ConvNeXtTiny", 32), "mobilenetv3large": ("MobileNetV3Large", 32),
    "inceptionresnetv2": ("InceptionResNetV2", 75),
}
# keras_hub backbones, built from config at a tiny size (no preset, no download).
BACKBONES = {
    "gpt2": "GPT2Backbone", "bert": "BertBackbone", "distilbert": "DistilBertBackbone",
    "roberta": "RobertaBackbone", "albert": "AlbertBackbone", "electra": "ElectraBackbone",
    "opt": "OPTBackbone", "gpt_neox": "GPTNeoXBackbone", "bloom": "BloomBackbone",
    "llama": "LlamaBackbone", "mistral": "MistralBackbone", "gemma": "GemmaBackbone",
    "qwen": "QwenBackbone", "phi3": "Phi3Backbone", "falcon": "FalconBackbone",
    "deberta_v3": "DebertaV3Backbone", "llama3": "Llama3Backbone", "qwen2": "Qwen2Backbone",
    "qwen3": "Qwen3Backbone", "fnet": "FNetBackbone", "xlnet": "XLNetBackbone",
    "esm2": "ESM2Backbone", "xlm_roberta": "XLMRobertaBackbone",
    "roformer_v2": "RoformerV2Backbone", "gpt_oss": "GptOssBackbone",
    # encoder-decoder: both sides read the same ids (Whisper's encoder one-hot features)
    "t5": "T5Backbone", "bart": "BartBackbone", "whisper": "WhisperBackbone",
    "gemma3": "Gemma3Backbone",                    # text only (no vision encoder)
    "smollm3": "SmolLM3Backbone",                  # its second layer without RoPE
}
# Arguments a backbone requires besides the sizes `_backbone_config` fills by name.
_REQUIRED = {
    "SmolLM3Backbone": dict(attention_bias=False, attention_dropout=0.0,
                            rope_layer_enabled_list=[True, False],
                            layer_types=["attention", "attention"], mlp_bias=False,
                            layer_norm_epsilon=1e-5, rope_theta=10000.0,
                            partial_rotary_factor=1.0),
}
# keras_hub image backbones (tokens, a feature map, or a pyramid of them out: a mean over
# the deepest's positions and a softmax head on top), at a tiny size: our name -> (class,
# the constructor's arguments besides image_shape).
IMAGE_BACKBONES = {
    "vit": ("ViTBackbone", dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                mlp_dim=32)),
    "deit": ("DeiTBackbone", dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                  intermediate_dim=32)),
    "dinov2": ("DINOV2Backbone", dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                      intermediate_dim=32)),
    "swin": ("SwinTransformerBackbone", dict(embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                             patch_size=4, window_size=4)),
    "dinov3": ("DINOV3Backbone", dict(patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                      intermediate_dim=32)),
    "siglip": ("SigLIPVisionEncoder", dict(patch_size=8, hidden_dim=16, num_layers=2,
                                           num_heads=2, intermediate_dim=32)),
    "clip": ("CLIPVisionEncoder", dict(patch_size=8, hidden_dim=16, num_layers=2, num_heads=2,
                                       intermediate_dim=32)),
    # windowed attention with relative position embeddings, one global layer
    "vitdet": ("ViTDetBackbone", dict(hidden_size=16, num_layers=2, intermediate_dim=32,
                                      num_heads=2, global_attention_layer_indices=[1],
                                      patch_size=8, num_output_channels=8, use_bias=True,
                                      use_abs_pos=True, use_rel_pos=True, window_size=2,
                                      layer_norm_epsilon=1e-6)),
    # SegFormer's encoder: attention over spatially reduced keys (strided convolutions)
    "mit": ("MiTBackbone", dict(layerwise_depths=[1, 1], num_layers=2, hidden_dims=[8, 16],
                                layerwise_num_heads=[1, 2], layerwise_sr_ratios=[2, 1],
                                max_drop_path_rate=0.0, layerwise_patch_sizes=[7, 3],
                                layerwise_strides=[4, 2])),
    "cspdarknet": ("CSPNetBackbone", dict(stem_filters=16, stem_kernel_size=3, stem_strides=2,
                                          stackwise_depth=[1, 1], stackwise_strides=[1, 2],
                                          stackwise_num_filters=[16, 32],
                                          block_type="dark_block", stage_type="dark")),
    "hgnetv2": ("HGNetV2Backbone", dict(
        depths=[1, 1], embedding_size=8, hidden_sizes=[16, 16], stem_channels=[3, 8, 8],
        hidden_act="relu", use_learnable_affine_block=True,
        stackwise_stage_filters=[[8, 8, 16, 1, 2, 3], [16, 8, 16, 1, 2, 3]],
        apply_downsample=[False, True], use_lightweight_conv_block=[False, True])),
}
IMAGE_MODELS = tuple(APPLICATIONS) + tuple(IMAGE_BACKBONES)
TEXT_MODELS = tuple(BACKBONES)
KERAS_MODELS = IMAGE_MODELS + TEXT_MODELS
OPTIMIZERS = ("adam", "sgd_momentum")


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

    def batch(self, seed: int) -> tuple[np.ndarray, ...]:
        """Another synthetic batch of the same shapes and value ranges."""
        rng = np.random.default_rng(seed)
        x, y = self.inputs
        if np.issubdtype(x.dtype, np.integer):
            return (rng.integers(0, int(x.max()) + 1, x.shape).astype(x.dtype),
                    rng.integers(0, int(y.max()) + 1, y.shape).astype(y.dtype))
        classes = y.shape[-1]
        return (rng.standard_normal(x.shape).astype(x.dtype),
                np.eye(classes, dtype=y.dtype)[rng.integers(0, classes, y.shape[0])])


def smallest_image_size(name: str) -> int:
    return APPLICATIONS[name][1] if name in APPLICATIONS else 32


def _image_model(name: str, image_size: int, classes: int):
    import keras
    if name in APPLICATIONS:
        builder = getattr(keras.applications, APPLICATIONS[name][0])
        return builder(weights=None, input_shape=(image_size, image_size, 3), classes=classes)
    import keras_hub
    cls, sizes = IMAGE_BACKBONES[name]
    backbone = getattr(keras_hub.models, cls)(image_shape=(image_size, image_size, 3),
                                              **sizes)
    images = keras.Input((image_size, image_size, 3))
    features = backbone(images)
    if isinstance(features, dict):                   # a pyramid: its deepest level
        features = list(features.values())[-1]
    pooled = {2: lambda f: f, 3: keras.layers.GlobalAveragePooling1D(),
              4: keras.layers.GlobalAveragePooling2D()}[len(features.shape)](features)
    return keras.Model(images, keras.layers.Dense(classes, activation="softmax")(pooled))


def _backbone_config(cls, seq_len: int, hidden: int, vocab: int) -> dict:
    """The constructor's arguments at a tiny size, filled by name: every backbone takes
    the sizes under its own names."""
    import inspect
    sizes = {"vocabulary_size": vocab, "vocab_size": vocab, "num_layers": 2,
             "num_heads": 2, "num_query_heads": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "hidden_dim": hidden, "intermediate_dim": 2 * hidden,
             "embedding_dim": hidden, "head_dim": hidden // 2, "key_value_dim": hidden // 2,
             "max_sequence_length": seq_len, "num_groups": 1, "num_inner_repetitions": 1,
             "dropout": 0.0, "head_size": hidden // 2, "num_experts": 4, "top_k": 2,
             "num_experts_per_tok": 2, "image_size": 16, "max_position_embeddings": seq_len}
    parameters = inspect.signature(cls.__init__).parameters
    return {**{k: v for k, v in sizes.items() if k in parameters},
            **_REQUIRED.get(cls.__name__, {})}


def _text_model(name: str, seq_len: int, hidden: int, vocab: int):
    import keras
    import keras_hub
    cls = getattr(keras_hub.models, BACKBONES[name])
    backbone = cls(**_backbone_config(cls, seq_len, hidden, vocab))
    specs = backbone.input if isinstance(backbone.input, dict) else {"token_ids": None}

    def feature(ids, spec):
        """A float input (Whisper's audio features) from the ids: one-hot rows."""
        width = spec.shape[-1]
        return tf.one_hot(ids % width, width, dtype=spec.dtype)

    class LanguageModel(keras.Model):
        """Backbone + a dense head over the vocabulary (on the decoder's output where
        there is one)."""

        def __init__(self):
            super().__init__()
            self.backbone = backbone
            self.head = keras.layers.Dense(vocab)

        def call(self, ids):
            inputs = {}
            for name, spec in specs.items():
                if name.endswith("token_ids"):
                    inputs[name] = ids
                elif name.endswith("padding_mask"):
                    inputs[name] = tf.ones_like(ids)
                elif name == "segment_ids":
                    inputs[name] = tf.zeros_like(ids)
                else:
                    inputs[name] = feature(ids, spec)
            out = self.backbone(inputs)
            if isinstance(out, dict):
                out = out.get("decoder_sequence_output", out.get("sequence_output"))
            return self.head(out)

    model = LanguageModel()
    model(tf.zeros((1, seq_len), tf.int32))
    return model


def build_keras_step(name: str, *, batch_size: int = 2, image_size: int = 32,
                     classes: int = 10, seq_len: int = 8, hidden: int = 16, vocab: int = 64,
                     seed: int = 0, dtype: str = "float32", optimizer: str = "adam"
                     ) -> KerasStep:
    """A tf.function training step of a Keras application or keras_hub backbone.
    `dtype="float64"` builds the model under that Keras float type (equivalence tests);
    `optimizer`: "adam" (Adam(1e-3)) or "sgd_momentum" (SGD(0.05, momentum=0.9))."""
    import keras
    if name not in KERAS_MODELS:
        raise TofuError(f"unknown Keras model '{name}'; choose one of {', '.join(KERAS_MODELS)}.")
    if optimizer not in OPTIMIZERS:
        raise TofuError(f"unknown optimizer '{optimizer}'; choose one of {', '.join(OPTIMIZERS)}.")
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    with keras_float(dtype):
        return _build_keras_step(name, batch_size, image_size, classes, seq_len, hidden,
                                 vocab, rng, dtype, optimizer)


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
                      dtype, optimizer) -> KerasStep:
    import keras
    if name in IMAGE_MODELS:
        image_size = max(image_size, smallest_image_size(name))
        model = _image_model(name, image_size, classes)
        loss_fn = keras.losses.CategoricalCrossentropy()
        x = rng.standard_normal((batch_size, image_size, image_size, 3)).astype(dtype)
        y = np.eye(classes, dtype=dtype)[rng.integers(0, classes, batch_size)]
    else:
        model = _text_model(name, seq_len, hidden, vocab)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        x = rng.integers(0, vocab, (batch_size, seq_len)).astype(np.int32)
        y = rng.integers(0, vocab, (batch_size, seq_len)).astype(np.int32)
    optimizer = (keras.optimizers.Adam(1e-3) if optimizer == "adam"
                 else keras.optimizers.SGD(0.05, momentum=0.9))
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
