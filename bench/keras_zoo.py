"""Keras models nobody here wrote, trained partitioned and unpartitioned side by side.

    python bench/keras_zoo.py                          # every model, float64 and float32, 8 devices
    python bench/keras_zoo.py --models=mobilenetv2,llama --dtypes=float32 --fresh

Every Keras application and keras_hub backbone of `tofu_tf.models.keras_models` (tiny
sizes; by default batch 8 and SGD(0.05, momentum=0.9): `--batch_size`, `--optimizer`)
trains `--steps` steps through `tofu_tf.function(num_devices=N)` and through `tf.function`
from the same weights and batches (`tofu_tf.tools.zoo.train_side_by_side`), each row in a
fresh process. Outcomes: `equal` (loss within 1e-5 relative, every variable within 1e-4
of its scale), `rounding` (beyond that, but no further than the unpartitioned model
drifts from weights one unit in the last place off, the yardstick: in float32, and in
float64 past the tolerances), `DIFFERS`, or the typed error raised. A float32 row that is
not equal is also judged one step op by op (`tofu_tf.tools.debug`): "rounding only", or
the op to blame. MobileNetV2 also runs at 64x64, the size it was first reported wrong at.
Results go to bench/results/keras_zoo.{json,md}; rows already there are kept unless
`--fresh` (or named again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from absl import app, flags

from tofu_tf.models.keras_models import OPTIMIZERS

FLAGS = flags.FLAGS
flags.DEFINE_string("models", "", "comma-separated models (default: all), name@size for an "
                                  "image size")
flags.DEFINE_string("dtypes", "float64,float32", "comma-separated float dtypes")
flags.DEFINE_integer("devices", 8, "logical CPU devices")
flags.DEFINE_integer("steps", 3, "training steps")
flags.DEFINE_integer("batch_size", 8, "examples per batch")
flags.DEFINE_enum("optimizer", "sgd_momentum", list(OPTIMIZERS),
                  "SGD(0.05, momentum=0.9) or Adam(1e-3)")
flags.DEFINE_bool("fresh", False, "drop the stored rows first")
flags.DEFINE_enum("onednn", "off", ["off", "on", "avx2"], "TensorFlow's oneDNN CPU kernels: "
                  "off, on (this CPU's best ISA), or on with AVX2 kernels (what CPUs without "
                  "AVX-512 run)")
flags.DEFINE_bool("validate", False, "instead of training, validate every distinct op of "
                                     "each model's graph on its real inputs (float64)")
flags.DEFINE_string("child", None, "internal: run one row (model@size:dtype) and print it")
flags.DEFINE_integer("timeout", 1800, "seconds one row may take")

sys.path.insert(0, str(Path(__file__).parent))
from common import markdown_table, read_results, write_results  # noqa: E402

EXTRA_ROWS = ("mobilenetv2@64",)


def _rows() -> list[str]:
    from tofu_tf.models.keras_models import KERAS_MODELS
    names = [m for m in FLAGS.models.split(",") if m] or list(KERAS_MODELS) + list(EXTRA_ROWS)
    if FLAGS.validate:
        return [f"{name}:validate" for name in names]
    return [f"{name}:{dtype}" for name in names for dtype in FLAGS.dtypes.split(",")]


def _key(row: str) -> str:
    """The row's key in the results: the defaults (batch 8, SGD with momentum, oneDNN
    off) add nothing, so older rows keep theirs."""
    return (f"{row}:{FLAGS.devices}" +
            (f":b{FLAGS.batch_size}" if FLAGS.batch_size != 8 else "") +
            (f":{FLAGS.optimizer}" if FLAGS.optimizer != "sgd_momentum" else "") +
            {"off": "", "on": ":onednn", "avx2": ":onednn-avx2"}[FLAGS.onednn])


def run_child(row: str) -> dict:
    """One row in this process: the side-by-side training, and the one-step judgement
    of a float32 row that is not equal."""
    from tofu_tf.tools.zoo import train_side_by_side
    name_size, dtype = row.split(":")
    name, _, size = name_size.partition("@")
    size = int(size) if size else 32
    if dtype == "validate":
        return validate_child(name, size)
    result = train_side_by_side(name, num_devices=FLAGS.devices, dtype=dtype,
                                steps=FLAGS.steps, image_size=size,
                                batch_size=FLAGS.batch_size,
                                optimizer=FLAGS.optimizer).to_dict()
    result.update(image_size=size, batch_size=FLAGS.batch_size, optimizer=FLAGS.optimizer)
    if dtype == "float32" and result["outcome"] not in ("equal",) and \
            not result["outcome"].startswith("error"):
        from tofu_tf.tools.debug import compare_step, model_case
        case = model_case(name, steps=1, dtype=dtype, image_size=size)
        report = compare_step(case.imported, FLAGS.devices, case.batches, case.values)
        result["one_step"] = ("equal" if report.equal else "rounding only"
                              if report.culprit is None else
                              f"blames {report.culprit.diff.op} ({report.culprit.diff.op_type})")
        result["one_step_report"] = str(report)[:3000]
    return result


def validate_child(name: str, size: int) -> dict:
    """The validator over the model's graph (`validate_graph`), float64."""
    from tofu_tf.tools.debug import model_case
    from tofu_tf.tools.validate import validate_graph
    start = time.perf_counter()
    try:
        case = model_case(name, steps=1, dtype="float64", image_size=size)
    except Exception as err:  # noqa: BLE001 -- recorded as the row's outcome
        return {"model": name, "image_size": size, "dtype": "validate",
                "outcome": f"error: {type(err).__name__}: {err}"[:300]}
    report = validate_graph(case.imported, case.batches[0], case.values)
    kinds = {}
    for finding in report.failures:
        kinds[finding.kind] = kinds.get(finding.kind, 0) + 1
    return {"model": name, "image_size": size, "dtype": "validate",
            "outcome": "valid" if not report.failures else "INVALID: " + ", ".join(
                f"{v} {k}" for k, v in sorted(kinds.items())),
            "instances": report.samples, "strategies": report.strategies,
            "checks": report.checks, "failures": [str(f) for f in report.failures[:20]],
            "seconds": time.perf_counter() - start}


def run_row(row: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_ENABLE_ONEDNN_OPTS": "0" if FLAGS.onednn == "off" else "1",
           **({"ONEDNN_MAX_CPU_ISA": "AVX2"} if FLAGS.onednn == "avx2" else {})}
    command = [sys.executable, __file__, f"--child={row}", f"--devices={FLAGS.devices}",
               f"--steps={FLAGS.steps}", f"--batch_size={FLAGS.batch_size}",
               f"--optimizer={FLAGS.optimizer}"]
    start = time.perf_counter()
    try:
        run = subprocess.run(command, capture_output=True, text=True, env=env,
                             timeout=FLAGS.timeout)
    except subprocess.TimeoutExpired:
        return {"row": row, "outcome": f"timeout after {FLAGS.timeout} s"}
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return {"row": row, "outcome": f"CRASH (exit {run.returncode}): " + " | ".join(tail),
                "seconds": time.perf_counter() - start}
    return {"row": row, **json.loads(lines[-1])}


def _e(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def table(stored: dict) -> str:
    rows, checked = [], []
    for key in sorted(stored.get("rows", {})):
        r = stored["rows"][key]
        if r.get("dtype") == "validate" or key.split(":")[1] == "validate":
            checked.append([r.get("model", r["row"]), r.get("image_size", "-"),
                            r["outcome"][:160], r.get("instances", "-"),
                            r.get("strategies", "-"), r.get("checks", "-"),
                            f"{r.get('seconds', 0):.0f}"])
            continue
        part, ruler = r.get("partitioned") or {}, r.get("yardstick") or {}
        rows.append([r.get("model", r["row"]), r.get("image_size", "-"),
                     r.get("batch_size", 8), r.get("optimizer", "sgd_momentum"),
                     r.get("num_devices", "-"), r.get("dtype", "-"),
                     {"onednn": "on", "onednn-avx2": "AVX2"}.get(key.split(":")[-1], "off"),
                     r["outcome"][:160].replace("|", "/"),
                     _e(part.get("loss_error")), _e(part.get("variable_error")),
                     _e(ruler.get("loss_error")), _e(ruler.get("variable_error")),
                     r.get("one_step", "-"), f"{r.get('seconds', 0):.0f}"])
    counts = {}
    for r in stored.get("rows", {}).values():
        if r.get("dtype") == "validate":
            continue
        outcome = r["outcome"].split(":")[0]
        counts[outcome] = counts.get(outcome, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return "\n".join([
        "# Keras zoo: partitioned against unpartitioned training",
        "",
        f"`python bench/keras_zoo.py` on {stored.get('machine', {}).get('cpu', '?')} "
        f"({stored.get('machine', {}).get('nproc', '?')} cores; the last run: "
        f"`{stored.get('command', '')}`). Each row: "
        f"{FLAGS.steps} steps of SGD(0.05, momentum=0.9) or Adam(1e-3), through "
        "`tofu_tf.function` and `tf.function` from the same weights and batches. Errors: "
        "the largest relative loss difference over the steps, the largest variable "
        "difference over its scale (weights and momenta). Yardstick: the unpartitioned "
        "training from weights one unit in the last place off (float32, and float64 past "
        "the tolerances). One step: "
        "`tofu_tf.tools.debug` judging one step op by op (float32 rows not equal).",
        "",
        f"Outcomes: {summary}.",
        "",
        markdown_table(["model", "input", "batch", "optimizer", "devices", "dtype", "oneDNN",
                        "outcome", "loss err", "variable err", "yardstick loss",
                        "yardstick var", "one step", "s"], rows),
        "",
        "## The validator on each model's own ops",
        "",
        "`python bench/keras_zoo.py --validate`: every distinct described op of the "
        "model's training graph (float64), each strategy at k = 2, 3, 4 on the values "
        "its inputs had in one step, against the whole op, and every two-level "
        "composition (2 x 2 and 2 x 3 parts) as the emitter composes it "
        "(`tofu_tf.tools.validate.validate_graph`; rows from before the composition "
        "check have fewer checks).",
        "",
        markdown_table(["model", "input", "outcome", "op instances", "strategies",
                        "checks", "s"], checked)])


def main(argv) -> int:
    if FLAGS.child:
        print(json.dumps(run_child(FLAGS.child), default=str))
        return 0
    stored = read_results("keras_zoo", FLAGS.fresh)
    stored.setdefault("rows", {})
    for row in _rows():
        result = run_row(row)
        stored["rows"][_key(row)] = result
        print(f"{row}: {result['outcome'][:200]} ({result.get('seconds', 0):.0f} s)",
              flush=True)
        write_results("keras_zoo", stored, table)
    print(table(stored))
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
