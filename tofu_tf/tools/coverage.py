"""Which op types of a model's training graph are described, opaque or missing.

    python -m tofu_tf.tools.coverage --model=resnet50

Prints, per op type, the count and the status, then `described D, opaque O, missing M`
(counted over op types); the exit status is non-zero when M > 0. Every op instance is
also described and analysed, so a description that fails on a real shape shows here.
Models: the reference models (all optimizer variants: mlp, wresnet, lstm, transformer),
every Keras application and keras_hub backbone of `models/keras_models.py`, and the models
as users write them of `models/user_models.py` (a subclassed model with a custom layer, a
functional one with a shared layer and two outputs); 'all' takes the reference models,
KERAS (resnet50, vgg16, mobilenetv2, gpt2, bert) and USER (user_subclassed,
user_functional).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

from tofu_tf.graph import Graph
from tofu_tf.op_semantics.catalog import DESCRIBED, MISSING, OPAQUE, catalog

REFERENCE = ("mlp", "wresnet", "lstm", "transformer")
KERAS = ("resnet50", "vgg16", "mobilenetv2", "gpt2", "bert")
USER = ("user_subclassed", "user_functional")
COMPUTE_HEAVY = ("MatMul", "BatchMatMulV2", "Einsum", "Conv2D", "Conv2DBackpropInput",
                 "Conv2DBackpropFilter", "MaxPool", "MaxPoolGrad", "AvgPool", "AvgPoolGrad",
                 "Softmax", "SoftmaxCrossEntropyWithLogits",
                 "SparseSoftmaxCrossEntropyWithLogits")


def _type_status(op_type: str) -> str:
    from tofu_tf.op_semantics.registry import description
    desc = description(op_type)
    if desc is None:
        return MISSING
    return DESCRIBED if desc.build is not None else OPAQUE


@dataclass
class Coverage:
    """Per op type: how many instances, and the status (with a reason when not described)."""
    counts: Counter = field(default_factory=Counter)
    status: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    opaque_instances: Counter = field(default_factory=Counter)

    def add(self, graph: Graph) -> None:
        for entry in catalog(graph).values():
            t = entry.op.type
            self.counts[t] += 1
            self.status[t] = _type_status(t)
            if entry.status != DESCRIBED:
                self.reasons.setdefault(t, entry.reason)
                if self.status[t] == DESCRIBED:       # a described type, kept whole here
                    self.opaque_instances[t] += 1

    def totals(self) -> dict[str, int]:
        return {s: sum(1 for v in self.status.values() if v == s)
                for s in (DESCRIBED, OPAQUE, MISSING)}

    def table(self) -> str:
        lines = [f"{'op type':36s} {'count':>6s}  status"]
        for t in sorted(self.counts):
            status = self.status[t]
            note = ""
            if status != DESCRIBED:
                note = f": {self.reasons.get(t, '')}"
            elif self.opaque_instances[t]:
                note = (f" ({self.opaque_instances[t]} instance(s) kept whole: "
                        f"{self.reasons[t]})")
            lines.append(f"{t:36s} {self.counts[t]:6d}  {status}{note}")
        totals = self.totals()
        lines.append(f"described {totals[DESCRIBED]}, opaque {totals[OPAQUE]}, "
                     f"missing {totals[MISSING]}")
        return "\n".join(lines)


def model_graphs(name: str, batch_size: int = 2):
    """Imported planner graphs of a model's training step (every optimizer variant)."""
    from tofu_tf.importer.graphdef_io import import_concrete_function
    if name in REFERENCE:
        from tofu_tf.models import OPTIMIZERS, build
        for optimizer in OPTIMIZERS:
            step = build(name, optimizer=optimizer, batch_size=batch_size)
            yield import_concrete_function(step.concrete_function).graph
    elif name in _keras_models():
        from tofu_tf.models.keras_models import build_keras_step
        step = build_keras_step(name, batch_size=batch_size)
        yield import_concrete_function(step.concrete_function()).graph
    elif name in USER:
        from tofu_tf.models.user_models import build_user_step
        step = build_user_step(name)           # holds the model while its step imports
        yield import_concrete_function(step.concrete_function()).graph
    else:
        from tofu_tf.errors import TofuError
        raise TofuError(f"unknown model '{name}'; choose one of "
                        f"{', '.join(REFERENCE + _keras_models() + USER)} or all.")


def _keras_models() -> tuple[str, ...]:
    from tofu_tf.models.keras_models import KERAS_MODELS
    return KERAS_MODELS


def coverage(names) -> Coverage:
    result = Coverage()
    for name in names:
        for graph in model_graphs(name):
            result.add(graph)
    return result


def main(argv) -> int:
    from absl import flags
    names = (REFERENCE + KERAS + USER if flags.FLAGS.model == "all"
             else flags.FLAGS.model.split(","))
    result = coverage(names)
    print(result.table())
    return 1 if result.totals()[MISSING] else 0


if __name__ == "__main__":
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from absl import app, flags
    flags.DEFINE_string("model", "all", "model name(s), comma-separated, or 'all'")
    app.run(lambda argv: sys.exit(main(argv)))
