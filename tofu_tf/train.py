"""Train a reference model partitioned across N devices, on synthetic data.

    python -m tofu_tf.train                     # a small WResNet on 8 logical CPUs, checked
    python -m tofu_tf.train --model=lstm --layers=2 --hidden=256 --num_devices=4 --steps=20
    python -m tofu_tf.train --model=transformer --topology=2x4 --memory_budget=300KiB \\
        --plan_out=plan.json --report=plan.html
    python -m tofu_tf.train --topology=2x4 --local_cluster --checkpoint_dir=/tmp/ckpt
    python -m tofu_tf.train --topology=2x4 --cluster=host0:2222,host1:2222   # running workers

The step is built as a graph, planned and rewritten (`tofu_tf.optimize`), its shards are
loaded from the model's initial values, and `--steps` steps run on synthetic batches in a
v1 Session over `--num_devices` logical CPU devices (or GPUs with --device_type=gpu),
logging the loss and time of each. With --check_equivalence (the default) the
unpartitioned step also runs on one device from the same values and batches, and the
losses and final variables must agree within --rtol / --atol, or the exit status is 1.
Bad input (a budget no plan meets, a device count that does not fit) exits with status 2
and the error's message.

Across processes (TensorFlow's distributed runtime): the topology's first level is the
hosts, one worker process each (`python -m tofu_tf.runtime.cluster`). `--local_cluster` starts them
on 127.0.0.1 and stops them at the end; `--cluster` names workers already running. The step
runs from this process through a Session on worker 0. A worker that fails ends the run within
--step_timeout seconds with status 2; `--checkpoint_dir` keeps the variables of the last
`--checkpoint_every`-th step, and `--resume` continues from them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable, Iterator

from absl import app, flags, logging

from tofu_tf import _cli
from tofu_tf._cli import FLAGS, model_sizes
from tofu_tf.runtime.cluster import LocalCluster, guard, session_config
from tofu_tf.errors import PlanInfeasibleError, TofuError, WorkerError, tf_error_cause

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
flags.DEFINE_bool("local_cluster", False,
                  "start one worker process per host (the topology's first level) on "
                  "127.0.0.1, train through TensorFlow's distributed runtime, stop them")
flags.DEFINE_list("cluster", None, "host:port of running workers (python -m tofu_tf.runtime.cluster), "
                                   "one per host of the topology's first level")
flags.DEFINE_float("step_timeout", 300.0, "seconds a step on a cluster may take")
flags.DEFINE_string("checkpoint_dir", None, "save the variables here (tf.train.Checkpoint)")
flags.DEFINE_integer("checkpoint_every", 1, "save every this many steps")
flags.DEFINE_bool("resume", False, "start from the latest checkpoint in --checkpoint_dir")
flags.DEFINE_string("profile_dir", None, "write a TensorBoard profile here: the last step "
                    "under TensorFlow's profiler (plugins/profile/<run>/<host>.xplane.pb) and "
                    "the step before it from its step stats, a trace row per device "
                    "(<host>.trace.json.gz beside it); --report shows that step per device")


def _devices(topology) -> list[str]:
    kind = FLAGS.device_type.upper()
    if topology.host_levels:
        return list(topology.device_names(kind))
    n = topology.num_devices
    if kind == "GPU":
        import tensorflow as tf
        visible = len(tf.config.list_physical_devices("GPU"))
        if visible < n:
            fewer = (f"pass --num_devices={visible} (or a topology of {visible} devices), "
                     "or " if visible >= 2 else "")
            raise PlanInfeasibleError(
                f"the plan needs {n} GPUs and {visible} are visible.",
                fix=f"{fewer}use --device_type=cpu for logical CPU devices.")
    return [f"/job:localhost/replica:0/task:0/device:{kind}:{d}" for d in range(n)]


def _topology():
    """The flags' topology; on a cluster its first level is the hosts."""
    topology = _cli.topology()
    if not (FLAGS.local_cluster or FLAGS.cluster):
        return topology
    if FLAGS.local_cluster and FLAGS.cluster:
        raise WorkerError("--local_cluster and --cluster both given.",
                          fix="pass --local_cluster to start workers here, or --cluster to "
                              "use running ones.")
    if FLAGS.local_cluster and FLAGS.device_type == "gpu":
        raise WorkerError("--local_cluster starts logical-CPU workers only.",
                          fix="start `python -m tofu_tf.runtime.cluster` on each GPU host and pass "
                              "--cluster, or use --device_type=cpu.")
    topology = topology.with_hosts(1)
    if FLAGS.cluster and len(FLAGS.cluster) != topology.num_hosts:
        raise WorkerError(f"--cluster names {len(FLAGS.cluster)} workers and the topology "
                          f"{topology} has {topology.num_hosts} hosts (its first level).",
                          fix=f"pass --topology={len(FLAGS.cluster)}xD for D devices per "
                              "worker, or one address per host.")
    return topology


@contextlib.contextmanager
def _cluster(topology) -> Iterator[tuple[str, object, Callable]]:
    """(session target, session config, guard(runner) context) of the run: local devices,
    workers started here, or running workers."""
    if FLAGS.local_cluster:
        per_host = topology.num_devices // topology.num_hosts
        logging.info("starting %d worker processes with %d CPUs each on 127.0.0.1 ...",
                     topology.num_hosts, per_host)
        with LocalCluster(topology.num_hosts, per_host,
                          step_timeout_s=FLAGS.step_timeout) as local:
            logging.info("workers up at %s", ", ".join(local.addresses))
            yield local.target, local.config, local.guard
    elif FLAGS.cluster:
        yield (f"grpc://{FLAGS.cluster[0]}", session_config(step_timeout_s=FLAGS.step_timeout),
               lambda *runners: guard(FLAGS.cluster, *runners))
    else:
        yield "", None, lambda *runners: contextlib.nullcontext()


def train() -> int:
    import numpy as np

    from tofu_tf.runtime import checkpoint
    from tofu_tf.api import optimize
    from tofu_tf.models import build
    from tofu_tf.runtime.session import Runner, SingleDevice

    topology = _topology()
    start = time.perf_counter()
    step = build(FLAGS.model, optimizer=FLAGS.optimizer, batch_size=FLAGS.batch_size,
                 graph_only=True, seed=FLAGS.seed, dtype=FLAGS.dtype,
                 micro_batches=_cli.micro_batches(), **model_sizes())
    logging.info("built %s: %d nodes (%.1f s)", step, len(step.graph_def.node),
                 time.perf_counter() - start)
    start = time.perf_counter()
    logging.info("planning and rewriting over %s ...", topology)
    optimized = optimize(step.graph_def, step.fetches, feeds=list(step.feeds),
                         topology=topology, options=_cli.options(),
                         devices=_devices(topology))
    logging.info("partitioned in %.1f s\n%s", time.perf_counter() - start, optimized.plan)
    _cli.write_plan(optimized.plan, f"{FLAGS.model} on {topology}")

    first = 0
    resumed = None
    if FLAGS.resume:
        if not FLAGS.checkpoint_dir:
            raise TofuError("--resume needs --checkpoint_dir.",
                            fix="pass the directory a previous run saved to.")
        resumed, first = checkpoint.restore(FLAGS.checkpoint_dir)
        logging.info("resuming after step %d from %s", first, FLAGS.checkpoint_dir)
    numbers = range(first, first + FLAGS.steps)
    batches = [dict(zip(step.feeds, step.sample_batch(FLAGS.seed + i))) for i in numbers]
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        if resumed is not None:
            single.load(resumed)
        initial = single.values()
        reference = None
        if FLAGS.check_equivalence:
            reference = [float(single.run(batch)[0]) for batch in batches]
            final_reference = single.values()
    losses = []
    with _cluster(topology) as (target, config, guard_of), \
            Runner(optimized, initial, target=target, config=config) as runner:
        profiled = numbers[-1] if FLAGS.profile_dir else None
        traced = (numbers[-2] if profiled is not None and len(numbers) > 1 else numbers[-1]) \
            if FLAGS.profile_dir or FLAGS.report else None
        stats = None
        for i, batch in zip(numbers, batches):
            start = time.perf_counter()
            with guard_of(runner):
                if i == traced:
                    loss, stats = _traced_step(runner, batch, optimized, topology)
                elif i == profiled:
                    loss = _profiled_step(runner, batch, stats)
                else:
                    loss = float(runner.run(batch)[0])
            losses.append(loss)
            logging.info("step %d: loss %.6f, %.3f s", i + 1, loss, time.perf_counter() - start)
            if FLAGS.checkpoint_dir and (i + 1) % FLAGS.checkpoint_every == 0:
                with guard_of(runner):
                    values = runner.values()
                logging.info("saved %s", checkpoint.save(FLAGS.checkpoint_dir, values, i + 1))
        if reference is not None:
            with guard_of(runner):
                final = runner.values()
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
        where = (f" in {topology.num_hosts} worker processes" if topology.host_levels else "")
        print(f"MATCH: {FLAGS.steps} steps on {topology.num_devices} devices{where} equal "
              f"the unpartitioned step (max loss difference {loss_error:.2e})")
        return 0
    if FLAGS.dtype != "float64":
        verdict = _within_rounding(step, initial, batches, reference, final_reference,
                                   losses, final)
        if verdict is not None:
            print(f"MATCH within {FLAGS.dtype} rounding: {FLAGS.steps} steps on "
                  f"{topology.num_devices} devices; {verdict}")
            return 0
    print(f"MISMATCH: losses {losses} vs {reference}; variables differing (max abs "
          f"error): {dict(sorted(bad.items(), key=lambda kv: -kv[1])[:10])}", file=sys.stderr)
    return 1


def _within_rounding(step, initial, batches, reference, final_reference, losses, final):
    """In float32 a few training steps drift apart from their own rounding (a ReLU mask
    flips, batch norm divides by a small spread), so the partitioned training, whose sums
    run in another order, is judged against a yardstick (`tools.zoo`): the unpartitioned
    training from values one unit in the last place off. A sentence saying how far each
    drifted when the partitioned drift is within `zoo.YARDSTICK_FACTOR` of it; else None."""
    import numpy as np

    from tofu_tf.runtime.session import SingleDevice
    from tofu_tf.tools.zoo import drift_between, one_ulp_off, verdict
    rng = np.random.default_rng(1)
    perturbed = {name: one_ulp_off(value, rng) for name, value in initial.items()}
    with SingleDevice(step.graph_def, step.init_op, step.fetches) as single:
        single.load(perturbed)
        ruled = [float(single.run(batch)[0]) for batch in batches]
        ruled_final = single.values()
    names = sorted(final_reference)
    want = [(name, final_reference[name]) for name in names]
    drift = drift_between(reference, losses, want, [(n, final[n]) for n in names])
    ruler = drift_between(reference, ruled, want, [(n, ruled_final[n]) for n in names])
    if verdict(drift, ruler) not in ("equal", "rounding"):
        return None
    return (f"loss {drift.loss_error:.1e}, variables {drift.variable_error:.1e} "
            f"({drift.worst_variable}) from the unpartitioned training; its own from values "
            f"one unit in the last place off: loss {ruler.loss_error:.1e}, variables "
            f"{ruler.variable_error:.1e}")


def _traced_step(runner, batch, optimized, topology):
    """The step with TensorFlow's step stats: logged per device, and in the --report page.
    Returns (the loss, the stats)."""
    from tofu_tf.runtime.profile import StepProfile, traced
    run_args = traced()
    loss = float(runner.run(batch, **run_args)[0])
    stats = run_args["run_metadata"].step_stats
    profile = StepProfile.of(stats, optimized.op_nodes)
    logging.info("%s\n%s", profile, "\n".join(profile.bars()))
    if FLAGS.report:
        _cli.write_plan(optimized.plan, f"{FLAGS.model} on {topology}", profile=profile)
    return loss, stats


def _profiled_step(runner, batch, stats) -> float:
    """The step under TensorFlow's profiler, written to --profile_dir with `stats` (the
    traced step's) beside it as a trace with a row per device. Returns the loss."""
    from tofu_tf.runtime.profile import write_profile
    path, loss = write_profile(FLAGS.profile_dir, lambda: runner.run(batch)[0], stats)
    logging.info("wrote the profile to %s (tensorboard --logdir=%s)", path.parent,
                 FLAGS.profile_dir)
    return float(loss)


def main(argv) -> int:
    del argv
    import tensorflow as tf
    try:
        return train()
    except TofuError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except tf.errors.OpError as err:
        cause, node = tf_error_cause(str(err.message))
        where = f" (node '{node}')" if node else ""
        print(f"error: TensorFlow could not run the step{where}: {cause} Fix: check the devices "
              f"(--device_type, --num_devices) and the model flags.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(lambda argv: sys.exit(main(argv)))
