"""Reference training-step models (MLP, Wide ResNet, LSTM, GPT-style transformer).

Each is a full training step (forward, loss, gradients, optimizer update) in plain TF ops,
built eagerly at tiny sizes or graph-only at paper sizes from the same code.
"""

from tofu_tf.models.builder import ModelDef
from tofu_tf.models.common import DTYPES, ModelStep, VariableStore
from tofu_tf.models.optimizers import DEFAULT_LEARNING_RATE, OPTIMIZERS, OptimizerConfig
from tofu_tf.models.registry import MODELS, PAPER_SIZES, build

__all__ = ["DEFAULT_LEARNING_RATE", "DTYPES", "MODELS", "ModelDef", "ModelStep", "OPTIMIZERS",
           "OptimizerConfig", "PAPER_SIZES", "VariableStore", "build"]
