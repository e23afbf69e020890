"""Keras models trained side by side: `tofu_tf.function` against `tf.function`.

    result = train_side_by_side("mobilenetv2", num_devices=8, dtype="float32", steps=3)
    result.outcome         # "equal", "rounding" or "DIFFERS"; or a typed error's summary

Two copies of the model are built from the same seed; each trains `steps` steps on the
same batches, one through `tf.function`, one through `tofu_tf.function(num_devices=N)`, and
the losses and every variable (weights and optimizer slots, written back) are compared:
`loss_error` is the largest relative difference of a step's loss, `variable_error` the
largest difference of a variable relative to its scale: its largest magnitude, but at
least sqrt(eps) of the largest magnitude of any variable of the model. Below that floor a
variable is mostly rounding: an attention key bias, whose gradient vanishes exactly
(softmax does not see a shift common to a row), holds the rounding of its updates alone,
in any two implementations.

Equal means both within the tolerances (LOSS_TOLERANCE, VARIABLE_TOLERANCE). In float32 a
training step is not a continuous function of its rounding (a ReLU6 mask flips at its
edge, batch norm divides by small spreads), so the partitioned step, whose sums run in
another order, can drift further over a few steps. `yardstick` measures how far the
model drifts from its own rounding: the unpartitioned step trained from weights perturbed
by one unit in the last place. A float32 run beyond the tolerances is `rounding` when
its drift is within YARDSTICK_FACTOR times the yardstick's (and `DIFFERS` otherwise);
`tofu_tf.tools.debug` then judges one step op by op. In float64 the yardstick runs only
where the drift is past the tolerances: Adam divides each gradient by its own root mean
square, so the rounding of a gradient that vanishes exactly (a convolution's bias before
batch norm) becomes updates of about the learning rate in float64 too (Keras ResNet50 at
7 devices, batch 6, 40x40, Adam: conv1_conv/bias 4.0e-4 apart after two steps, and
3.3e-4 from its own weights one unit in the last place off).

TensorFlow's runtime graph optimizer is off for both (the partitioned step's session
always runs without it): it rewrites the unpartitioned step's arithmetic, and where a
model computes in float32 inside a float64 step (keras_hub's norms do), that alone moves
a float64 loss by 1e-10.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from tofu_tf.errors import TofuError

LOSS_TOLERANCE = 1e-5          # relative difference of a step's loss
VARIABLE_TOLERANCE = 1e-4      # a variable's largest difference over its scale
YARDSTICK_FACTOR = 10.0


@dataclass(frozen=True)
class Drift:
    """How far two trainings ended apart."""
    loss_error: float                 # largest relative loss difference over the steps
    variable_error: float             # largest variable difference over its scale
    worst_variable: str = ""
    losses: tuple[float, ...] = ()    # the compared training's losses

    @property
    def within_tolerance(self) -> bool:
        return self.loss_error <= LOSS_TOLERANCE and self.variable_error <= VARIABLE_TOLERANCE


@dataclass(frozen=True)
class SideBySide:
    model: str
    num_devices: int
    dtype: str
    steps: int
    partitioned: Drift | None = None          # None: a typed error
    yardstick: Drift | None = None            # float32, or past the tolerances
    reference_losses: tuple[float, ...] = ()
    error: str = ""                           # the TofuError, when one was raised
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        if self.partitioned is None:
            return f"error: {self.error}"
        return verdict(self.partitioned, self.yardstick)

    def to_dict(self) -> dict:
        return {**asdict(self), "outcome": self.outcome}


def verdict(partitioned: Drift, yardstick: Drift | None) -> str:
    """"equal", "rounding" or "DIFFERS" (the module docstring)."""
    if partitioned.within_tolerance:
        return "equal"
    if yardstick is not None and (
            partitioned.loss_error <= YARDSTICK_FACTOR * max(
                yardstick.loss_error, LOSS_TOLERANCE) and
            partitioned.variable_error <= YARDSTICK_FACTOR * max(
                yardstick.variable_error, VARIABLE_TOLERANCE)):
        return "rounding"
    return "DIFFERS"


def one_ulp_off(value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A float array with each element moved by -1, 0 or 1 unit in the last place (the
    yardstick's start); other arrays as they are."""
    if not np.issubdtype(value.dtype, np.floating):
        return value
    return value + rng.choice([-1, 0, 1], value.shape) * np.spacing(value)


def train_side_by_side(model: str, *, num_devices: int = 8, dtype: str = "float32",
                       steps: int = 3, batch_size: int = 8, image_size: int = 32,
                       optimizer: str = "sgd_momentum", seed: int = 0,
                       yardstick: bool | None = None, options=None) -> SideBySide:
    """See the module docstring; `yardstick` defaults to on in float32 and wherever the
    drift is past the tolerances; `options`: the partitioned step's tofu_tf.Options."""
    import tensorflow as tf
    previous = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        return _train_side_by_side(model, num_devices, dtype, steps, batch_size, image_size,
                                   optimizer, seed, yardstick, options)
    finally:
        tf.config.optimizer.set_experimental_options(
            {"disable_meta_optimizer": previous.get("disable_meta_optimizer", False)})


def _train_side_by_side(model, num_devices, dtype, steps, batch_size, image_size, optimizer,
                        seed, yardstick, options) -> SideBySide:
    import tofu_tf
    from tofu_tf.models.keras_models import build_keras_step
    start = time.perf_counter()

    def build():
        return build_keras_step(model, batch_size=batch_size, image_size=image_size,
                                dtype=dtype, optimizer=optimizer, seed=seed)
    reference, mine = build(), build()
    batches = [reference.batch(seed + s) for s in range(steps)]
    want = [float(reference.step(*b)) for b in batches]
    common = dict(model=model, num_devices=num_devices, dtype=dtype, steps=steps,
                  reference_losses=tuple(want))
    try:
        partitioned = tofu_tf.function(mine.step, num_devices=num_devices,
                                       options=options or tofu_tf.Options())
        got = [float(np.asarray(partitioned(*b))) for b in batches]
        partitioned.write_back()
    except TofuError as err:
        return SideBySide(**common, error=f"{type(err).__name__}: {err}"[:500],
                          seconds=time.perf_counter() - start)
    drift = drift_between(want, got, _variables(reference), _variables(mine))
    nodes = len(partitioned.optimized.graph_def.node)
    if yardstick is None:
        yardstick = dtype == "float32" or not drift.within_tolerance
    ruler = _yardstick(build, batches, want, _variables(reference)) if yardstick else None
    return SideBySide(**common, partitioned=drift, yardstick=ruler,
                      seconds=time.perf_counter() - start,
                      details={"planner_ops": len(partitioned.optimized.graph),
                               "partitioned_nodes": nodes,
                               "recomputed_ops": len(partitioned.plan.recompute)})


def _variables(step) -> list[tuple[str, np.ndarray]]:
    """(path, value) of every weight and optimizer variable, in creation order (equal for
    two builds of the same code; the paths of a second build may carry a suffix)."""
    return [(v.path, v.numpy()) for v in step.model.weights + step.optimizer.variables]


def _yardstick(build, batches, want, final) -> Drift:
    """The unpartitioned training from weights one unit in the last place off."""
    perturbed = build()
    rng = np.random.default_rng(1)
    for v in perturbed.model.trainable_variables:
        v.assign(one_ulp_off(v.numpy(), rng))
    got = [float(perturbed.step(*b)) for b in batches]
    return drift_between(want, got, final, _variables(perturbed))


def drift_between(want, got, want_vars, got_vars) -> Drift:
    loss = max((abs(g - w) / max(abs(w), 1e-30) for w, g in zip(want, got)), default=0.0)
    worst, name = 0.0, ""
    if [v.shape for _, v in want_vars] != [v.shape for _, v in got_vars]:
        raise TofuError("the two builds of the model have different variables.",
                        fix="build both copies from the same code and seed.")
    floats = [(key, value, other) for (key, value), (_, other) in zip(want_vars, got_vars)
              if value.size and np.issubdtype(value.dtype, np.floating)]
    floor = max((float(np.sqrt(np.finfo(value.dtype).eps) * np.max(np.abs(value)))
                 for _, value, _ in floats), default=0.0)
    for key, value, other in floats:
        scale = max(float(np.max(np.abs(value))), floor)
        error = float(np.max(np.abs(other.astype(np.float64) - value)))
        relative = error / scale if scale else error
        if relative > worst:
            worst, name = relative, key
    return Drift(float(loss), worst, name, tuple(got))
