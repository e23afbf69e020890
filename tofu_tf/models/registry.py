"""The model registry, `build`, and the paper-size settings of each model."""

from __future__ import annotations

from tofu_tf.errors import TofuError
from tofu_tf.models import lstm, mlp, transformer, wresnet
from tofu_tf.models.builder import ModelDef
from tofu_tf.models.common import DEFAULT_DTYPE, ModelStep

MODELS: dict[str, ModelDef] = {m.MODEL.name: m.MODEL for m in (mlp, wresnet, lstm, transformer)}

# Keyword arguments of `build` for the sizes of the Tofu paper (largest evaluated settings)
# and GPT-2 medium.
PAPER_SIZES: dict[str, dict] = {
    "wresnet": {"depth": 152, "widen": 10, "base_width": 64, "image_size": 224,
                "num_classes": 1000, "batch_size": 8},
    "lstm": {"layers": 10, "hidden": 8192, "steps": 20, "embedding": 512, "vocab": 512,
             "num_classes": 512, "batch_size": 8},
    "transformer": {"layers": 24, "d_model": 1024, "heads": 16, "seq_len": 1024,
                    "vocab": 50257, "batch_size": 8},
}


def build(name: str, *, optimizer: str = "sgd", batch_size: int, graph_only: bool = False,
          seed: int = 0, learning_rate: float | None = None, dtype: str = DEFAULT_DTYPE,
          initializers: bool = True, micro_batches: int = 1, **sizes) -> ModelStep:
    """Builds model `name`'s training step; see `MODELS[name].defaults` for its sizes.

    Eager (default): tiny-size friendly, real variables from a NumPy RNG seeded by `seed`.
    graph_only=True: a GraphDef in a fresh tf.Graph, no weight memory; any size. With
    `initializers=False` it has no variable initializers (and no `init` op): a step that
    is only planned, whose initializers the importer would drop anyway.
    `learning_rate` defaults per optimizer (optimizers.DEFAULT_LEARNING_RATE).
    `dtype` ("float32" default, or "float64") is the float dtype of the whole step:
    variables, optimizer slots and constants, float inputs, masks, batch-norm statistics,
    losses and `sample_batch` arrays; integer inputs (token ids) stay int32. float64 steps
    let equivalence tests compare a partitioned step with the unpartitioned one without
    float32 rounding noise. Any other value raises `TofuError`. `micro_batches`: the step
    accumulates gradients over that many equal slices of the batch (a pipeline's
    micro-batches; builder.train_step).
    """
    if name not in MODELS:
        raise TofuError(f"unknown model '{name}'; valid choices: {', '.join(MODELS)}.")
    return MODELS[name](optimizer=optimizer, batch_size=batch_size, graph_only=graph_only,
                        seed=seed, learning_rate=learning_rate, dtype=dtype,
                        initializers=initializers, micro_batches=micro_batches, **sizes)
