"""Partitioned steps on TensorFlow's distributed runtime: one `tf.distribute.Server` per
worker process, a client that runs the step through a v1 Session on the grpc target.

A worker process (one per host; the cluster from `--cluster` or from TF_CONFIG):

    python -m tofu_tf.runtime.cluster --cluster=10.0.0.1:2222,10.0.0.2:2222 --task=1 --num_cpus=4
    TF_CONFIG='{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 1}}' \\
        python -m tofu_tf.runtime.cluster --num_cpus=4

The client (any process that reaches worker 0):

    topology = Topology.hosts(2, 4)
    optimized = tofu_tf.optimize(gd, fetches, topology=topology,
                                 devices=topology.device_names("CPU"))
    runner = Runner(optimized, values, target="grpc://10.0.0.1:2222",
                    config=session_config(step_timeout_s=60))

`LocalCluster` starts the workers on 127.0.0.1 as child processes, for tests and for
`python -m tofu_tf.train --local_cluster`. A worker started by it reads its stdin and exits
when that closes, so it ends with its parent even when the parent is killed. Every process
agrees on `/job:worker/replica:0/task:0` as the collective group leader (without it,
collectives across tasks wait forever).

Faults: a step is bounded by `step_timeout_s` (the session's operation timeout), and a failed
step's TensorFlow error becomes a `WorkerError` that names the workers no longer running
(`LocalCluster.guard`). State lives in the workers' variables, so what survives a failure is
what the client saved last (see `tofu_tf.runtime.checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Sequence

from tofu_tf.errors import WorkerError, tf_error_cause

JOB = "worker"
LEADER = f"/job:{JOB}/replica:0/task:0"
# Errors TensorFlow raises when a peer is gone or a step ran past its deadline.
_PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError",
                "CancelledError", "InternalError", "UnknownError")


def session_config(num_cpus: int | None = None, *, step_timeout_s: float | None = None):
    """The ConfigProto of servers and clients: the collective group leader, TensorFlow's
    runtime graph optimizer off (it would re-optimise each partition and change low bits),
    `num_cpus` logical CPU devices per server, and a per-step deadline."""
    from tensorflow.core.protobuf import config_pb2
    config = config_pb2.ConfigProto()
    if num_cpus is not None:
        config.device_count["CPU"] = num_cpus
    config.experimental.collective_group_leader = LEADER
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    if step_timeout_s is not None:
        config.operation_timeout_in_ms = int(step_timeout_s * 1000)
    return config


def cluster_from_tf_config(text: str | None = None) -> tuple[list[str], int]:
    """(worker addresses, this task's index) from TF_CONFIG (`text`, or the environment)."""
    text = os.environ.get("TF_CONFIG") if text is None else text
    fix = ('set TF_CONFIG to {"cluster": {"worker": ["host:port", ...]}, '
           '"task": {"type": "worker", "index": i}}, or pass --cluster and --task.')
    if not text:
        raise WorkerError("TF_CONFIG is not set and no cluster was given.", fix=fix)
    try:
        config = json.loads(text)
        workers = list(config["cluster"][JOB])
        task = config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as err:
        raise WorkerError(f"cannot read TF_CONFIG ({err!r}): {text[:200]}", fix=fix) from None
    if task.get("type", JOB) != JOB or not 0 <= index < len(workers):
        raise WorkerError(f"TF_CONFIG's task {task} is not one of the {len(workers)} "
                          f"'{JOB}' tasks.", fix=fix)
    return workers, index


def start_server(workers: Sequence[str], task: int, num_cpus: int):
    """This process's `tf.distribute.Server` for task `task` of job `worker`."""
    import tensorflow as tf
    cluster = tf.train.ClusterSpec({JOB: list(workers)})
    return tf.distribute.Server(cluster, job_name=JOB, task_index=task,
                                config=session_config(num_cpus), start=True)


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class LocalCluster:
    """`num_workers` worker processes on 127.0.0.1 with `cpus_per_worker` logical CPUs each.

        with LocalCluster(2, 4) as cluster:
            runner = Runner(optimized, values, target=cluster.target,
                            config=cluster.config)
            with cluster.guard(runner):
                runner.run(batch)

    Startup waits at most `start_timeout_s` for every worker's server; `close` (also on
    leaving the `with`) ends them, killing any that has not exited `stop_timeout_s` later.
    """

    def __init__(self, num_workers: int, cpus_per_worker: int, *,
                 step_timeout_s: float = 120.0, start_timeout_s: float = 120.0,
                 stop_timeout_s: float = 10.0, python: str = sys.executable):
        if num_workers < 1 or cpus_per_worker < 1:
            raise WorkerError(f"a cluster of {num_workers} workers x {cpus_per_worker} CPUs.",
                              fix="pass at least one worker with at least one CPU.")
        self.addresses = [f"127.0.0.1:{port}" for port in free_ports(num_workers)]
        self.config = session_config(step_timeout_s=step_timeout_s)
        self.stop_timeout_s = stop_timeout_s
        self.processes: list[subprocess.Popen] = []
        # Each worker's stderr goes to a file: a pipe nobody drains would block a chatty
        # worker once its buffer fills.
        self._logs = [tempfile.TemporaryFile() for _ in range(num_workers)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        env.pop("TF_CONFIG", None)
        try:
            for task in range(num_workers):
                self.processes.append(subprocess.Popen(
                    [python, "-m", "tofu_tf.runtime.cluster",
                     f"--cluster={','.join(self.addresses)}", f"--task={task}", f"--num_cpus={cpus_per_worker}"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._logs[task],
                    env=env))
            self._wait_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def target(self) -> str:
        return f"grpc://{self.addresses[0]}"

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for task, process in enumerate(self.processes):
            while True:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([process.stdout], [], [], max(left, 0))
                line = process.stdout.readline() if ready else b""
                if line.startswith(b"ready"):
                    break
                if ready and line:
                    continue
                if ready:                              # stdout closed: it is exiting
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=self.stop_timeout_s)
                reason = (f"exited with status {process.poll()}: {self._stderr(task)}"
                          if process.poll() is not None
                          else f"did not start within {timeout_s:.0f} s")
                raise WorkerError(f"worker task {task} at {self.addresses[task]} {reason}",
                                  fix="check that TensorFlow imports in a fresh process and "
                                      "that loopback ports can be bound.")

    def _stderr(self, task: int) -> str:
        """The last lines worker `task` wrote to stderr."""
        log = self._logs[task]
        log.seek(0)
        return " | ".join(log.read().decode(errors="replace").strip().splitlines()[-3:])

    def dead(self) -> list[int]:
        """The tasks whose process is no longer running."""
        return [task for task, p in enumerate(self.processes) if p.poll() is not None]

    def kill(self, task: int) -> None:
        """End worker `task` at once (SIGKILL), as a crashed host would."""
        self.processes[task].send_signal(signal.SIGKILL)
        self.processes[task].wait()

    def guard(self, *runners):
        """`guard` for this cluster: names the workers whose process has ended."""
        return guard(self.addresses, *runners, dead=self.dead)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None and process.stdin:
                with contextlib.suppress(OSError):
                    process.stdin.close()
        deadline = time.monotonic() + self.stop_timeout_s
        for process in self.processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout:
                process.stdout.close()
        for log in self._logs:
            log.close()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def guard(addresses: Sequence[str], *runners,
          dead: Callable[[], list[int]] | None = None) -> Iterator[None]:
    """Turns a TensorFlow error of a step on the cluster of `addresses` into a `WorkerError`
    naming the workers `dead()` reports, and abandons the sessions of `runners` (closing
    one on a broken cluster would wait the whole step timeout)."""
    try:
        yield
    except Exception as err:                           # noqa: BLE001 -- filtered below
        if type(err).__name__ not in _PEER_ERRORS:
            raise
        for runner in runners:
            runner.abandon()
        raise worker_error(err, dead() if dead else [], addresses) from None


def worker_error(err: Exception, dead: Sequence[int], addresses: Sequence[str]) -> WorkerError:
    """A `WorkerError` for TensorFlow error `err` of a step, naming the `dead` tasks."""
    cause, node = tf_error_cause(str(getattr(err, "message", err)))
    if dead:
        who = ", ".join(f"task {t} ({addresses[t]})" for t in dead)
        what = f"worker {who} stopped during the step"
    else:
        what = f"the step failed on the cluster {','.join(addresses)}"
    return WorkerError(f"{what}: {type(err).__name__}: {cause}", node=node,
                       fix="restart the workers and resume from the last checkpoint "
                           "(tofu_tf.runtime.checkpoint.restore, or --resume); raise the step "
                           "timeout if the step is only slow.")


def _serve(argv) -> None:
    del argv
    from absl import flags
    flags_ = flags.FLAGS
    if flags_.cluster:
        workers, task = flags_.cluster.split(","), flags_.task
    else:
        workers, task = cluster_from_tf_config()
    server = start_server(workers, task, flags_.num_cpus)
    print(f"ready task {task} {server.target}", flush=True)
    if sys.stdin.isatty():
        server.join()
    # Started by a parent: serve until it closes our stdin (or dies).
    while sys.stdin.buffer.read(1 << 16):
        pass
    sys.stdout.flush()
    os._exit(0)                   # a started Server cannot be stopped; do not wait for it


def main() -> None:
    from absl import app, flags
    flags.DEFINE_string("cluster", None, "worker addresses host:port, comma separated "
                                         "(default: from TF_CONFIG)")
    flags.DEFINE_integer("task", 0, "this worker's index in --cluster")
    flags.DEFINE_integer("num_cpus", 1, "logical CPU devices of this worker")
    app.run(_serve)


if __name__ == "__main__":
    main()
