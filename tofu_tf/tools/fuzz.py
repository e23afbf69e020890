"""Random training steps for differential testing: partitioned against unpartitioned.

    case = random_step(RandomChooser(seed))       # or a hypothesis-driven Chooser
    mismatch = check(case, num_devices=5)          # None when the numbers agree

A step is a random DAG of described ops on float64 placeholders and variables (element-wise
unary and binary ops, broadcasting, MatMul with transposes, BatchMatMulV2, Conv2D with random
strides and padding, dilated and grouped (XLA-compiled) convolutions, pooling, bilinear
and nearest resizing, reductions, Reshape, Transpose, Softmax, ConcatV2, Slice, Pad, Roll,
Tile, DepthToSpace, SpaceToDepth, MatrixBandPart, TopKV2, BiasAdd), a scalar loss over
every leaf, TensorFlow's gradients for every variable and an SGD update: the partitioned
graph must give the same loss and the same updated variables over `STEPS` steps. Shapes are static
and chosen so every op is valid; every choice goes through the `Chooser`, so a hypothesis
strategy can shrink a failing case.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

BATCH = 8                      # the leading dim of every placeholder: always >= the devices
STEPS = 2                      # training steps compared
LEARNING_RATE = 0.05
RTOL, ATOL = 1e-7, 1e-9        # float64: only the order of summation differs


class Chooser(Protocol):
    def choice(self, options: Sequence): ...
    def integer(self, low: int, high: int) -> int: ...      # inclusive bounds


class RandomChooser:
    """Choices from a seeded `random.Random` (benchmarks, reproducible by seed)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def choice(self, options: Sequence):
        return options[self.rng.randrange(len(options))]

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)


class HypothesisChooser:
    """Every choice drawn from a hypothesis `st.data()` (tests: failures shrink)."""

    def __init__(self, data):
        self.data = data

    def choice(self, options: Sequence):
        from hypothesis import strategies as st
        return self.data.draw(st.sampled_from(list(options)))

    def integer(self, low: int, high: int) -> int:
        from hypothesis import strategies as st
        return self.data.draw(st.integers(low, high))


@dataclass
class Case:
    graph_def: object
    fetches: list[str]                   # [loss tensor, train op]
    feeds: dict[str, np.ndarray]         # placeholder tensor name -> value
    init_op: str
    ops: list[str] = field(default_factory=list)    # the random ops, for messages

    def describe(self) -> str:
        return " -> ".join(self.ops)


def random_step(chooser: Chooser, max_ops: int = 7, seed: int = 0) -> Case:
    """A random training step (see the module docstring); `seed` fills the values."""
    import tensorflow as tf
    graph = tf.Graph()
    rng = np.random.default_rng(seed)
    with graph.as_default():
        builder = _Builder(chooser, rng)
        for _ in range(chooser.integer(2, max_ops)):
            builder.grow()
        loss = tf.add_n([tf.reduce_sum(tf.square(t)) / float(np.prod(t.shape))
                         for t in builder.leaves()], name="loss")
        variables = builder.variables
        grads = tf.gradients(loss, variables)
        updates = [v.assign_sub(LEARNING_RATE * g) for v, g in zip(variables, grads)
                   if g is not None]
        train = tf.group(*updates, name="train")
        init = tf.group(*[v.initializer for v in variables], name="init")
    return Case(graph.as_graph_def(), [loss.name, train.name], builder.feeds, init.name,
                builder.log)


def check(case: Case, num_devices: int, options=None) -> str | None:
    """None when `STEPS` partitioned steps equal the unpartitioned ones, else what differs
    (`options`: the partitioned step's tofu_tf.Options, such as its step rewrites)."""
    from tofu_tf.options import Options
    from tofu_tf.api import optimize
    from tofu_tf.runtime.session import Runner, SingleDevice
    with SingleDevice(case.graph_def, case.init_op, case.fetches) as single:
        initial = single.values()
        want = [single.run(case.feeds)[0] for _ in range(STEPS)]
        want_values = single.values()
    optimized = optimize(case.graph_def, case.fetches, feeds=list(case.feeds),
                         num_devices=num_devices, options=options or Options())
    with Runner(optimized, initial) as runner:
        got = [runner.run(case.feeds)[0] for _ in range(STEPS)]
        got_values = runner.values()
    if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
        return f"losses {got} != {want}"
    for name, value in want_values.items():
        # a variable the fetches do not reach is pruned from the partitioned graph: the
        # unpartitioned step must then leave it as it was
        have = got_values[name] if name in got_values else initial[name]
        if not np.allclose(have, value, rtol=RTOL, atol=ATOL):
            error = float(np.max(np.abs(have - value)))
            return f"variable {name} differs by up to {error:.3g}"
    return None


class _Builder:
    """Grows a DAG one random op at a time from a pool of (tensor, static shape)."""

    def __init__(self, chooser: Chooser, rng: np.random.Generator):
        self.chooser, self.rng = chooser, rng
        self.pool: list = []
        self.used: set[int] = set()
        self.variables: list = []
        self.feeds: dict[str, np.ndarray] = {}
        self.log: list[str] = []
        for _ in range(chooser.integer(1, 2)):
            self._placeholder()

    # -- sources ---------------------------------------------------------------------------
    def _placeholder(self):
        import tensorflow as tf
        c = self.chooser
        shape = (BATCH, c.integer(3, 10), c.integer(3, 10), c.integer(1, 4)) \
            if c.choice([True, False]) else (BATCH, c.integer(2, 12))
        x = tf.compat.v1.placeholder(tf.float64, shape, name=f"x{len(self.feeds)}")
        self.feeds[x.name] = self.rng.standard_normal(shape)
        self.pool.append(x)
        return x

    def _variable(self, shape):
        import tensorflow as tf
        value = self.rng.standard_normal(shape) * (1.0 / np.sqrt(max(shape[0], 1)))
        v = tf.Variable(value, name=f"w{len(self.variables)}")
        self.variables.append(v)
        return v

    # -- growth ----------------------------------------------------------------------------
    def leaves(self) -> list:
        return [t for i, t in enumerate(self.pool) if i not in self.used] or self.pool[-1:]

    def _pick(self, rank: int | None = None):
        options = [i for i, t in enumerate(self.pool)
                   if rank is None or len(t.shape) == rank]
        if not options:
            return None
        index = self.chooser.choice(options)
        self.used.add(index)
        return self.pool[index]

    def grow(self) -> None:
        kinds: dict[str, Callable] = {
            "unary": self._unary, "binary": self._binary, "matmul": self._matmul,
            "batch_matmul": self._batch_matmul, "conv": self._conv, "pool": self._pool,
            "reduce": self._reduce, "reshape": self._reshape, "transpose": self._transpose,
            "softmax": self._softmax, "concat": self._concat, "slice": self._slice,
            "pad": self._pad, "bias": self._bias, "dilated": self._dilated,
            "resize": self._resize, "roll": self._roll, "tile": self._tile,
            "blocks": self._blocks, "band": self._band, "grouped": self._grouped,
            "top_k": self._top_k,
        }
        kind = self.chooser.choice(sorted(kinds))
        out = kinds[kind]()
        if out is not None:
            self.pool.append(out)
            self.log.append(out.op.type)

    def _unary(self):
        import tensorflow as tf
        fn = self.chooser.choice([tf.nn.relu, tf.tanh, tf.sigmoid, tf.square, tf.negative,
                                  tf.nn.softplus])
        return fn(self._pick())

    def _binary(self):
        import tensorflow as tf
        a = self._pick()
        same = [t for t in self.pool if t.shape == a.shape]
        b = self.chooser.choice(same) if len(same) > 1 and self.chooser.choice(
            [True, False]) else self._variable(tuple(a.shape[1:]))     # broadcast over batch
        fn = self.chooser.choice([tf.add, tf.subtract, tf.multiply, tf.maximum])
        return fn(a, b)

    def _matmul(self):
        import tensorflow as tf
        a = self._pick(rank=2)
        if a is None:
            return None
        n = self.chooser.integer(2, 12)
        if self.chooser.choice([True, False]):
            w = self._variable((n, a.shape[1]))
            return tf.matmul(a, w, transpose_b=True)
        return tf.matmul(a, self._variable((a.shape[1], n)))

    def _batch_matmul(self):
        import tensorflow as tf
        a = self._pick(rank=2)
        if a is None:
            return None
        m = a.shape[1]
        splits = [k for k in (2, 3, 4) if m % k == 0]
        if not splits:
            return None
        k = self.chooser.choice(splits)
        x = tf.reshape(a, (BATCH, k, m // k))
        y = tf.matmul(x, x, transpose_b=True)            # [B, k, k]: BatchMatMulV2
        return tf.reshape(y, (BATCH, k * k))

    def _conv(self):
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None:
            return None
        c = self.chooser
        kh, kw = c.integer(1, 3), c.integer(1, 3)
        stride = c.choice([1, 1, 2])
        padding = c.choice(["SAME", "VALID"])
        if padding == "VALID" and (x.shape[1] < kh or x.shape[2] < kw):
            padding = "SAME"
        f = self._variable((kh, kw, x.shape[3], c.integer(1, 4)))
        # no dilations: TensorFlow's CPU filter gradient has no kernel for them
        return tf.nn.conv2d(x, f, strides=stride, padding=padding)

    def _top_k(self):
        """The k largest of each row (TopKV2): values times their positions."""
        import tensorflow as tf
        x = self._pick(rank=2)
        if x is None:
            return None
        values, indices = tf.math.top_k(x, k=self.chooser.integer(1, x.shape[1]))
        return values * tf.cast(indices + 1, values.dtype)

    def _grouped(self):
        """A grouped Conv2D (filter of C / G input channels), compiled with XLA as Keras
        compiles Conv2D(groups=G): TensorFlow's CPU kernels have no grouped gradients."""
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None or x.shape[3] < 2:
            return None
        c = self.chooser
        groups = c.choice([g for g in range(2, x.shape[3] + 1) if x.shape[3] % g == 0])
        stride = c.choice([1, 2])
        padding = c.choice(["SAME", "VALID"]) if min(x.shape[1], x.shape[2]) >= 3 else "SAME"
        f = self._variable((3, 3, x.shape[3] // groups, groups * c.integer(1, 2)))

        @tf.function(jit_compile=True, autograph=False)
        def grouped(x, f):
            return tf.nn.conv2d(x, f, strides=stride, padding=padding)
        return grouped(x, f)

    def _dilated(self):
        """tf.nn.convolution with dilation 2: SpaceToBatchND, Conv2D, BatchToSpaceND."""
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None:
            return None
        c = self.chooser
        k = c.integer(2, 3)
        padding = c.choice(["SAME", "VALID"])
        if padding == "VALID" and min(x.shape[1], x.shape[2]) < 2 * k - 1:
            padding = "SAME"
        f = self._variable((k, k, x.shape[3], c.integer(1, 3)))
        return tf.nn.convolution(x, f, padding=padding, dilations=2)

    def _resize(self):
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None:
            return None
        c = self.chooser
        size = (c.integer(2, 12), c.integer(2, 12))
        # bilinear resizing computes in float32 whatever its input: cast back
        return tf.cast(tf.image.resize(x, size, method=c.choice(["bilinear", "nearest"])),
                       x.dtype)

    def _roll(self):
        import tensorflow as tf
        x = self._pick()
        axes = sorted({self.chooser.integer(1, len(x.shape) - 1)
                       for _ in range(self.chooser.integer(1, len(x.shape) - 1))})
        shifts = [self.chooser.integer(-x.shape[a], x.shape[a]) for a in axes]
        return tf.roll(x, shifts, axes)

    def _blocks(self):
        """DepthToSpace where the channels allow, else SpaceToDepth where the plane does."""
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None:
            return None
        if x.shape[3] % 4 == 0:
            return tf.nn.depth_to_space(x, 2)
        if x.shape[1] % 2 == 0 and x.shape[2] % 2 == 0:
            return tf.nn.space_to_depth(x, 2)
        return None

    def _band(self):
        import tensorflow as tf
        x = self._pick()
        rows, cols = x.shape[-2], x.shape[-1]          # the kernel takes bands within them
        return tf.linalg.band_part(x, self.chooser.integer(-1, min(2, rows)),
                                   self.chooser.integer(-1, min(2, cols)))

    def _tile(self):
        import tensorflow as tf
        x = self._pick()
        multiples = [1] + [self.chooser.integer(1, 3) if d <= 4 else 1 for d in x.shape[1:]]
        return tf.tile(x, multiples)

    def _pool(self):
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None:
            return None
        c = self.chooser
        size, stride = c.integer(2, 3), c.integer(1, 2)
        padding = c.choice(["SAME", "VALID"])
        if padding == "VALID" and min(x.shape[1], x.shape[2]) < size:
            padding = "SAME"
        fn = c.choice([tf.nn.max_pool2d, tf.nn.avg_pool2d])
        return fn(x, size, stride, padding)

    def _reduce(self):
        import tensorflow as tf
        x = self._pick()
        rank = len(x.shape)
        axes = sorted({self.chooser.integer(1, rank - 1)
                       for _ in range(self.chooser.integer(1, rank - 1))})
        fn = self.chooser.choice([tf.reduce_sum, tf.reduce_mean, tf.reduce_max])
        out = fn(x, axis=axes, keepdims=True)
        return tf.reshape(out, (BATCH, -1)) if len(out.shape) > 2 else out

    def _reshape(self):
        import tensorflow as tf
        x = self._pick()
        return tf.reshape(x, (BATCH, -1))

    def _transpose(self):
        import tensorflow as tf
        x = self._pick(rank=4)
        if x is None:
            return None
        rest = [1, 2, 3]
        order = [0] + [rest.pop(self.chooser.integer(0, len(rest) - 1)) for _ in range(3)]
        return tf.transpose(x, order)

    def _softmax(self):
        import tensorflow as tf
        x = self._pick(rank=2)
        return None if x is None else tf.nn.softmax(x)

    def _concat(self):
        import tensorflow as tf
        a = self._pick()
        axis = self.chooser.integer(1, len(a.shape) - 1)
        partners = [t for t in self.pool if len(t.shape) == len(a.shape) and all(
            t.shape[d] == a.shape[d] for d in range(len(a.shape)) if d != axis)]
        b = self.chooser.choice(partners)
        return tf.concat([a, b], axis=axis)

    def _slice(self):
        import tensorflow as tf
        x = self._pick()
        begin, size = [0], [BATCH]
        for d in x.shape[1:]:
            start = self.chooser.integer(0, d - 1)
            begin.append(start)
            size.append(self.chooser.integer(1, d - start))
        return tf.slice(x, begin, size)

    def _pad(self):
        import tensorflow as tf
        x = self._pick()
        pads = [[0, 0]] + [[self.chooser.integer(0, 2), self.chooser.integer(0, 2)]
                           for _ in x.shape[1:]]
        return tf.pad(x, pads)

    def _bias(self):
        import tensorflow as tf
        x = self._pick()
        return tf.nn.bias_add(x, self._variable((x.shape[-1],)))
