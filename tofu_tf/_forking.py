"""One function run in a forked process beside the caller, its value sent back.

The search uses it to solve two independent problems on two cores: the child starts as a
copy of the caller (the catalog and coarse graph already built, nothing to send), runs
planner code only (never TensorFlow: a fork copies none of its threads, so a TensorFlow
op would wait for them forever; so the child computes overlaps with NumPy, the C++ cost
op's same answers) and sends its value back pickled. Where the platform cannot fork,
`available()` is False and callers run the function themselves.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable

from tofu_tf.cc import cost_op


def available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


class Forked:
    """`with Forked(fn) as child: ...; child.result(fallback)`: `fn()` runs in a forked
    process from the `with`; `result` waits for its value, re-raises its error, or, should
    the process die without an answer, returns `fallback()`. Leaving the block ends the
    process if it still runs."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn = fn
        self._answered = False

    def __enter__(self) -> "Forked":
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_serve, args=(self._fn, sender), daemon=True)
        self._process.start()
        sender.close()
        return self

    def result(self, fallback: Callable[[], Any]) -> Any:
        try:
            ok, value = self._receiver.recv()
        except EOFError:          # killed (out of memory, a signal): do the work here
            return fallback()
        self._answered = True
        if not ok:
            raise value
        return value

    def __exit__(self, *exc_info) -> None:
        """Stops a process that has not answered. Neither it nor one that answered (and
        is ending by itself) is waited for: tearing down a copy of a large process takes
        tens of milliseconds, and multiprocessing reaps ended processes on its own (at
        the next start, `active_children()`, and at exit)."""
        if not self._answered and self._process.is_alive():
            self._process.terminate()
        self._receiver.close()


def _serve(fn: Callable[[], Any], sender) -> None:
    cost_op.use_backend(cost_op.Backend.NUMPY)      # the C++ op runs in TensorFlow
    try:
        answer = (True, fn())
    except BaseException as error:  # noqa: BLE001 - every error goes back to the caller
        answer = (False, error)
    try:
        sender.send(answer)
    except Exception as error:  # noqa: BLE001 - an unpicklable value or error
        sender.send((False, RuntimeError(f"the forked process's answer cannot be sent "
                                         f"back: {error!r}")))
    sender.close()
