"""Train a reference model partitioned across N devices, on synthetic data.

    python -m tofu_tf.train                     # a small WResNet on 8 logical CPUs, checked
    python -m tofu_tf.train --model=lstm --layers=2 --hidden=256 --num_devices=4 --steps=20
    python -m tofu_tf.train --model=transformer --topology=2x4 --memory_budget=300KiB \\
        --plan_out=plan.json --report=plan.html

The step is built as a graph, planned and rewritten (`tofu_tf.optimize`), its shards are
loaded from the model's initial values, and `--steps` steps run on synthetic batches in a
v1 Session over `--num_devices` logical CPU devices (or GPUs with --device_type=gpu),
logging the loss and time of each. With --check_equivalence (the default) the
unpartitioned step also runs on one device from the same values and batches, and the
losses and final variables must agree within --rtol / --atol, or the exit status is 1.
Bad input (a budget no plan meets, a device count that does not fit) exits with status 2
and the error's message.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags, logging

from tofu_tf import _cli
from tofu_tf._cli import FLAGS, model_sizes

flags.DEFINE_integer("steps", 5, "training steps to run")
flags.DEFINE_bool("check_equivalence", True,
                  "also run the unpartitioned step on one device and compare")
flags.DEFINE_enum("dtype", "float64", ["float32", "float64"],
                  "float dtype of the step; float64 (the default) lets the check compare "
                  "without float32 rounding noise, which training amplifies step by step")
flags.DEFINE_float("rtol", 1e-7, "relative tolerance of the equivalence check")
flags.DEFINE_float("atol", 1e-9, "absolute tolerance of the equivalence check")
flags.DEFINE_enum("device_type", "cpu", ["cpu", "gpu"], "devices to place the step on")
flags.DEFINE_integer("seed", 0, "seed of the initial values and the synthetic batches")


def _devices(n: int) -> list[str]:
    kind = FLAGS.device_type.upper()
    if kind == "GPU":
        import tensorflow as tf
        from tofu_tf.errors import PlanInfeasibleError
        visible = len(tf.config.list_physical_devices("GPU"))
        if visible < n:
            fewer = (f"pass --num_devices={visible} (or a topology of {visible} devices), "
                     "or " if visible >= 2 else "")
            raise PlanInfeasibleError(
                f"the plan needs {n} GPUs and {visible} are visible.",
                fix=f"{fewer}use --device_type=cpu for logical CPU devices.")
    return [f"/job:localhost/replica:0/task:0/device:{kind}:{d}" for d in range(n)]


def train() -> int:
    import numpy as np

    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.runtime import Runner, SingleDevice

    topology = _cli.topology()
    start = time.perf_counter()
    step = build(FLAGS.model, optimizer=FLAGS.optimizer, batch_size=FLAGS.batch_size,
                 graph_only=True, seed=FLAGS.seed, dtype=FLAGS.dtype, **model_sizes())
    logging.info("built %s: %d nodes (%.1f s)", step, len(step.graph_def.node),
                 time.perf_counter() - start)
    start = time.perf_counter()
    logging.info("planning and rewriting over %s ...", topology)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         topology=str(topology), options=_cli.options(),
                         devices=_devices(topology.num_devices))
    logging.info("partitioned in %.1f s\n%s", time.perf_counter() - start, optimized.plan)
    _cli.write_plan(optimized.plan, f"{FLAGS.model} on {topology}")

    batches = [dict(zip(step.feeds, step.sample_batch(FLAGS.seed + i)))
               for i in range(FLAGS.steps)]
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        initial = single.values()
        reference = None
        if FLAGS.check_equivalence:
            reference = [float(single.run(batch)[0]) for batch in batches]
            final_reference = single.values()
    losses = []
    with Runner(optimized, initial) as runner:
        for i, batch in enumerate(batches):
            start = time.perf_counter()
            loss = float(runner.run(batch)[0])
            losses.append(loss)
            logging.info("step %d: loss %.6f, %.3f s", i + 1, loss, time.perf_counter() - start)
        final = runner.values() if reference is not None else None
    if reference is None:
        return 0
    loss_error = max(abs(a - b) for a, b in zip(losses, reference))
    bad = {name: float(np.max(np.abs(final[name] - value)))
           for name, value in final_reference.items()
           if not np.allclose(final[name], value, rtol=FLAGS.rtol, atol=FLAGS.atol)}
    losses_match = np.allclose(losses, reference, rtol=FLAGS.rtol, atol=FLAGS.atol)
    if losses_match and not bad:
        logging.info("equivalent to the unpartitioned step: %d losses and %d variables "
                     "agree (largest loss difference %.2e; rtol %g, atol %g)", len(losses),
                     len(final_reference), loss_error, FLAGS.rtol, FLAGS.atol)
        print(f"MATCH: {FLAGS.steps} steps on {topology.num_devices} devices equal the "
              f"unpartitioned step (max loss difference {loss_error:.2e})")
        return 0
    print(f"MISMATCH: losses {losses} vs {reference}; variables differing (max abs "
          f"error): {dict(sorted(bad.items(), key=lambda kv: -kv[1])[:10])}", file=sys.stderr)
    return 1


def main(argv) -> int:
    del argv
    import tensorflow as tf
    from tofu_tf.errors import TofuError
    try:
        return train()
    except TofuError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except tf.errors.OpError as err:
        first = str(err.message).strip().splitlines()[0]
        print(f"error: TensorFlow could not run the step: {first} Fix: check the devices "
              f"(--device_type, --num_devices) and the model flags.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
