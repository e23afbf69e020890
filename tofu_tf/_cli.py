"""Flags and helpers the binaries share (`tofu_tf.plan`, `tofu_tf.train`)."""

from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "wresnet", ["mlp", "wresnet", "lstm", "transformer"], "model")
flags.DEFINE_integer("batch_size", 8, "batch size")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "momentum", "adam"], "optimizer")
flags.DEFINE_integer("num_devices", 8, "number of devices (ignored with --topology)")
flags.DEFINE_string("topology", None, "levels outermost first, e.g. '2x4' or '2@12e9x4@300e9'")
flags.DEFINE_string("memory_budget", None,
                    "largest estimated peak per device, e.g. 12GiB: the least-communication "
                    "plan that fits, or an error naming the smallest peak reachable")
flags.DEFINE_bool("recompute", False,
                  "recompute forward ops in the backward pass (tofu_tf/search/recompute.py): with "
                  "--memory_budget the search picks the mix that fits (updates early, CHEAP or "
                  "SEGMENTS recomputation), without one CHEAP and early updates")
flags.DEFINE_enum("recompute_policy", None, ["none", "cheap", "segments", "auto"],
                  "a recomputation policy by name instead of --recompute's choice")
flags.DEFINE_string("step_profile", "this_cpu", "device profile (search/simulate.py) on which "
                    "--recompute with a budget predicts each mix's step time to keep the "
                    "fastest, and whose exchange rate prices repeated work")
flags.DEFINE_float("flop_bytes", None, "bytes moved one flop of repeated computation is worth "
                   "in the search (default: --step_profile's rate; 0: not priced)")
flags.DEFINE_float("transfer_bytes", 0.0, "bytes moved one transfer's latency is worth in the "
                   "search (0: transfers only break ties; this_cpu's link latency x "
                   "bandwidth is 2.56e6)")
flags.DEFINE_bool("lookahead", False, "at three or more levels, also fix each level by the "
                  "joint optimum of it and the level below (Options.lookahead)")
flags.DEFINE_bool("shared_reads", False, "price a tensor several ops read from other devices "
                  "once, as the emitter moves it (Options.shared_reads)")
flags.DEFINE_bool("early_updates", False, "run each update as soon as its gradient is "
                  "complete, gradient sums as running sums (tofu_tf/search/reorder.py)")
flags.DEFINE_integer("pipeline_stages", 1, "cut the devices into this many pipeline stages "
                     "(tofu_tf/search/pipeline.py): each op runs on one stage's devices")
flags.DEFINE_bool("pipeline", False, "search the pipeline stage count too (1 included): the "
                  "plan predicted fastest on --step_profile within the budget")
flags.DEFINE_integer("micro_batches", None, "the step accumulates gradients over this many "
                     "slices of the batch (default: the stage count, 2 with --pipeline, "
                     "else 1)")
flags.DEFINE_string("plan_out", None, "write the full plan (Plan.to_json) here")
flags.DEFINE_string("report", None, "write the plan as an HTML report here")
# model sizes: only the flags given are passed on; the rest keep the model's defaults
SIZE_FLAGS = {
    "depth": int, "widen": int, "base_width": int, "image_size": int, "num_classes": int,
    "layers": int, "hidden": int, "steps_per_sequence": int, "embedding": int, "vocab": int,
    "d_model": int, "heads": int, "seq_len": int, "input_dim": int,
}
for _name in SIZE_FLAGS:
    flags.DEFINE_integer(_name, None, f"model size: {_name}")


def model_sizes() -> dict:
    """The size flags given, as `models.build` keywords."""
    sizes = {name: getattr(FLAGS, name) for name in SIZE_FLAGS
             if getattr(FLAGS, name) is not None}
    if "steps_per_sequence" in sizes:                  # the LSTM's unrolled time steps
        sizes["steps"] = sizes.pop("steps_per_sequence")
    if "hidden" in sizes and FLAGS.model == "mlp":
        sizes["hidden"] = (sizes["hidden"],) * 2
    return sizes


def micro_batches() -> int:
    """The step's micro-batches: --micro_batches, else as its help says."""
    if FLAGS.micro_batches is not None:
        return FLAGS.micro_batches
    return 2 if FLAGS.pipeline else FLAGS.pipeline_stages


def topology():
    from tofu_tf.search.topology import Topology
    return (Topology.parse(FLAGS.topology) if FLAGS.topology
            else Topology.default(FLAGS.num_devices))


def options(**overrides):
    """Options from the flags (the memory budget, the step rewrites), with `overrides`."""
    from tofu_tf.options import Options, Recompute, parse_bytes
    budget = parse_bytes(FLAGS.memory_budget) if FLAGS.memory_budget else None
    policy, early = Recompute.NONE, FLAGS.early_updates
    if FLAGS.recompute:
        policy, early = (Recompute.AUTO, early) if budget else (Recompute.CHEAP, True)
    if FLAGS.recompute_policy:
        policy = Recompute(FLAGS.recompute_policy)
    return Options(memory_budget_bytes=budget, recompute=policy, early_updates=early,
                   step_profile=FLAGS.step_profile, flop_bytes=FLAGS.flop_bytes,
                   transfer_bytes=FLAGS.transfer_bytes, shared_reads=FLAGS.shared_reads,
                   lookahead=FLAGS.lookahead,
                   pipeline_stages=0 if FLAGS.pipeline else FLAGS.pipeline_stages, **overrides)


def write_plan(plan, title: str = "", baselines=None, profile=None) -> None:
    """The plan to --plan_out (JSON) and --report (HTML, with a measured step's
    `profile` when given), when given."""
    if FLAGS.plan_out:
        with open(FLAGS.plan_out, "w") as f:
            f.write(plan.to_json())
    if FLAGS.report:
        from tofu_tf.tools.report import html_report
        with open(FLAGS.report, "w") as f:
            f.write(html_report(plan, title=title or f"{FLAGS.model} plan",
                                baselines=baselines, profile=profile))
