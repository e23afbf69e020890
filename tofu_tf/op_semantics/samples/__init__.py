"""Sample instances of every described op, for the strategy validator.

A sample builds one real TensorFlow op from arguments (placeholders fed with seeded random
values, constants, or resource variables). `samples/<family>.py` mirror
`ops/<family>.py`:

    sample("Conv2D", "stride 2 SAME", lambda x, w: tf.nn.conv2d(x, w, 2, "SAME"),
           arg((2, 9, 9, 3)), arg((3, 3, 3, 4)))
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Arg:
    """One argument of a sample: a fed input, a constant, or a resource variable."""
    shape: tuple[int, ...]
    dtype: str = "float32"
    kind: str = "input"             # "input" | "const" | "variable"
    low: float | None = None        # value range of random data
    high: float | None = None
    value: Any = None               # explicit value (constants, index tensors)

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.value is not None:
            return np.asarray(self.value, dtype=self.dtype).reshape(self.shape)
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith(("int", "uint")):
            low = 0 if self.low is None else int(self.low)
            high = 5 if self.high is None else int(self.high)
            return rng.integers(low, high, self.shape).astype(self.dtype)
        low = -2.0 if self.low is None else self.low
        high = 2.0 if self.high is None else self.high
        values = rng.uniform(low, high, self.shape)
        if self.dtype.startswith("complex"):
            values = values + 1j * rng.uniform(low, high, self.shape)
        return values.astype(self.dtype)


def arg(shape, dtype: str = "float32", *, low=None, high=None, value=None) -> Arg:
    return Arg(tuple(shape), dtype, "input", low, high, value)


def const(value, dtype: str | None = None) -> Arg:
    array = np.asarray(value, dtype=dtype)
    return Arg(array.shape, array.dtype.name, "const", value=array)


def variable(shape, dtype: str = "float32", *, low=None, high=None) -> Arg:
    return Arg(tuple(shape), dtype, "variable", low, high)


@dataclass(frozen=True)
class Sample:
    op_type: str
    label: str
    build: Callable[..., Any]
    args: tuple[Arg, ...]

    @property
    def id(self) -> str:
        return f"{self.op_type}[{self.label}]"


_SAMPLES: list[Sample] = []
_LOADED = False


def sample(op_type: str, label: str, build: Callable[..., Any], *args: Arg) -> Sample:
    s = Sample(op_type, label, build, tuple(args))
    if any(existing.id == s.id for existing in _SAMPLES):
        raise ValueError(f"sample {s.id} is defined twice")
    _SAMPLES.append(s)
    return s


def all_samples() -> list[Sample]:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")
    return list(_SAMPLES)
