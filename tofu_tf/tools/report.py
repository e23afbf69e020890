"""A plan as one self-contained HTML page, and what changed between two plans. No
TensorFlow, no scripts in the page (it opens anywhere, from a file).

Sections of the page: the summary; the estimated peak memory of every device against the
unpartitioned step's and the ideal share; bytes per level; the plan against each
baseline; the largest transfers with the op that causes each; every tensor group with
its stored state and its bytes per level.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Mapping

from tofu_tf.search.plan import Plan, human_bytes

SECTIONS = ("Summary", "Memory per device", "Bytes per level", "Against the baselines",
            "Largest transfers", "Tensor groups")
STEP_SECTION = "Step time per device"     # with a measured step (tofu_tf.runtime.profile)


def _bar(value: float, largest: float, label: str, colour: str = "#4a7bd0") -> str:
    width = 0.0 if largest <= 0 else 100.0 * value / largest
    return (f'<div class="bar"><span style="width:{width:.1f}%;background:{colour}">'
            f'</span><em>{html.escape(label)}</em></div>')


def _step_bars(profile) -> str:
    """A bar per device: busy time over the step's wall time, with its kernel time by kind."""
    wall = profile.wall_seconds or 1.0
    rows = [f"<p>One traced step: {1e3 * profile.wall_seconds:.2f} ms. Kernel time by kind: "
            "planner ops, the rewrite's plumbing (slices, concats, partial sums), sources "
            "and transfers.</p>"]
    for d in profile.devices:
        kinds = ", ".join(f"{kind} {1e3 * d.kernel_seconds.get(kind, 0.0):.2f}"
                          for kind in ("op", "rewrite", "source", "transfer"))
        rows.append(_bar(d.busy_seconds, wall, f"{d.device}: busy {1e3 * d.busy_seconds:.2f} "
                         f"ms, {d.nodes} nodes ({kinds} ms kernel)"))
    return "".join(rows)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_report(plan: Plan, *, title: str = "tofu_tf plan",
                baselines: Mapping[str, float] | None = None, transfers: int = 40,
                profile=None) -> str:
    """`profile`: a `tofu_tf.runtime.profile.StepProfile` of one step of the plan's emitted graph,
    shown as a bar per device (its busy time in the step) after the summary."""
    esc = html.escape
    parts = [f"<h1>{esc(title)}</h1>", f"<h2 id='summary'>{SECTIONS[0]}</h2>",
             f"<pre>{esc(str(plan))}</pre>"]
    if profile is not None:
        parts += [f"<h2 id='step'>{STEP_SECTION}</h2>", _step_bars(profile)]

    parts.append(f"<h2 id='memory'>{SECTIONS[1]}</h2>")
    single = plan.single_device_peak_bytes
    ideal = single / plan.num_devices if single else 0
    largest = max([single, *plan.per_device_peak_bytes]) or 1
    rows = [_bar(single, largest, f"one device, unpartitioned: {human_bytes(single)}", "#999")]
    rows += [_bar(peak, largest, f"device {d}: {human_bytes(peak)}"
                  + (f" ({peak / ideal:.2f}x the ideal share)" if ideal else ""))
             for d, peak in enumerate(plan.per_device_peak_bytes)]
    rows.append(_bar(ideal, largest, f"ideal share (one device / {plan.num_devices}): "
                     f"{human_bytes(ideal)}", "#6a6"))
    parts.append("".join(rows) or "<p>No memory estimate in this plan.</p>")

    parts.append(f"<h2 id='levels'>{SECTIONS[2]}</h2>")
    top = max(plan.bytes_per_level, default=0) or 1
    parts.append("".join(
        _bar(level.total_bytes, top, f"level {i + 1}: {level.ways}-way cut x "
             f"{level.groups} group(s): {human_bytes(level.total_bytes)}"
             + ("" if level.exact else " (DP fallback)")
             + (f"; the emitted step moves {human_bytes(plan.predicted_per_level[i])} "
                "over this level's links" if plan.predicted_per_level else ""))
        for i, level in enumerate(plan.levels)))

    parts.append(f"<h2 id='baselines'>{SECTIONS[3]}</h2>")
    if baselines:
        compared = {"tofu (this plan)": plan.total_bytes, **baselines}
        top = max(compared.values()) or 1
        parts.append("".join(
            _bar(value, top, f"{name}: {human_bytes(value)}"
                 + ("" if name.startswith("tofu") or not plan.total_bytes
                    else f" ({value / plan.total_bytes:.2f}x this plan)"),
                 "#d07b4a" if name.startswith("tofu") else "#4a7bd0")
            for name, value in sorted(compared.items(), key=lambda kv: kv[1])))
    else:
        parts.append("<p>Baselines were not evaluated (run with --baselines).</p>")

    parts.append(f"<h2 id='transfers'>{SECTIONS[4]}</h2>")
    moves = sorted(((t.bytes * level.groups, i, t) for i, level in enumerate(plan.levels)
                    for t in level.transfers), key=lambda m: -m[0])[:transfers]
    parts.append(_table(
        ["bytes (all groups)", "level", "op", "type", "strategy", "tensor", "state"],
        [[human_bytes(b), str(i + 1), esc(t.op), esc(plan.op_types.get(t.op, "?")),
          esc(plan.levels[i].choices.get(t.op, "?")), esc(t.tensor),
          esc(plan.state(i, t.tensor) if t.tensor in plan.groups else "?")]
         for b, i, t in moves]))

    parts.append(f"<h2 id='groups'>{SECTIONS[5]}</h2>")
    members: dict[int, list[str]] = defaultdict(list)
    for tensor, group in plan.groups.items():
        members[group].append(tensor)
    per_level: dict[int, list[float]] = defaultdict(lambda: [0.0] * len(plan.levels))
    for i, level in enumerate(plan.levels):
        for t in level.transfers:
            if t.tensor in plan.groups:
                per_level[plan.groups[t.tensor]][i] += t.bytes * level.groups
    ranked = sorted(members, key=lambda g: (-sum(per_level[g]), g))
    parts.append(_table(
        ["group", "tensors", "state per level", *[f"level {i + 1}" for i in
                                                   range(len(plan.levels))], "example"],
        [[str(g), str(len(members[g])),
          esc("/".join(level.group_states.get(g, "?") for level in plan.levels)),
          *[human_bytes(b) for b in per_level[g]], esc(sorted(members[g])[0])]
         for g in ranked]))
    style = ("body{font:14px sans-serif;margin:2em;max-width:1100px}"
             "table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
             ".bar{position:relative;height:18px;margin:2px 0;background:#eee}"
             ".bar span{position:absolute;left:0;top:0;bottom:0}"
             ".bar em{position:relative;padding-left:4px;font-style:normal;font-size:12px}"
             "pre{background:#f6f6f6;padding:8px;overflow-x:auto}")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(title)}</title><style>{style}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def plan_diff(a: Plan, b: Plan, limit: int = 20) -> str:
    """What changed from plan `a` to plan `b`: topology, totals, memory, tensor states
    and op strategies per level (tensors and ops the two plans share)."""
    lines = []
    if a.topology != b.topology:
        lines.append(f"topology: {_ways(a)} -> {_ways(b)}")
    lines.append(f"bytes moved: {human_bytes(a.total_bytes)} -> {human_bytes(b.total_bytes)} "
                 f"({_change(a.total_bytes, b.total_bytes)})")
    if a.peak_bytes or b.peak_bytes:
        lines.append(f"peak per device: {human_bytes(a.peak_bytes)} -> {human_bytes(b.peak_bytes)} "
                     f"({_change(a.peak_bytes, b.peak_bytes)})")
    if a.variable_storage != b.variable_storage:
        lines.append(f"variables: {a.variable_storage} -> {b.variable_storage}")
    if (a.early_updates, a.recompute) != (b.early_updates, b.recompute):
        lines.append(f"step rewrites: updates early {a.early_updates} -> {b.early_updates}, "
                     f"recomputed forward ops {len(a.recompute)} -> {len(b.recompute)}")
    shared_tensors = sorted(set(a.groups) & set(b.groups))
    shared_ops = sorted(set(a.op_types) & set(b.op_types))
    for i in range(min(len(a.levels), len(b.levels))):
        states = [(t, a.state(i, t), b.state(i, t)) for t in shared_tensors
                  if a.state(i, t) != b.state(i, t)]
        choices = [(op, a.levels[i].choices.get(op), b.levels[i].choices.get(op))
                   for op in shared_ops
                   if a.levels[i].choices.get(op) != b.levels[i].choices.get(op)]
        lines.append(f"level {i + 1}: {human_bytes(a.levels[i].total_bytes)} -> "
                     f"{human_bytes(b.levels[i].total_bytes)}; {len(states)} of "
                     f"{len(shared_tensors)} tensors change state, {len(choices)} of "
                     f"{len(shared_ops)} ops change strategy")
        lines += [f"    tensor {t}: {x} -> {y}" for t, x, y in states[:limit]]
        lines += [f"    op {op} ({a.op_types.get(op)}): {x} -> {y}"
                  for op, x, y in choices[:limit]]
        if len(states) > limit or len(choices) > limit:
            lines.append(f"    ... (first {limit} of each shown)")
    only = len(set(a.op_types) ^ set(b.op_types))
    if only:
        lines.append(f"{only} ops are in one plan only (different graphs)")
    if not any(line.startswith("    ") for line in lines) and a.total_bytes == b.total_bytes:
        lines.append("the plans store every shared tensor and run every shared op alike")
    return "\n".join(lines)


def _ways(plan: Plan) -> str:
    return "x".join(str(level.ways) for level in plan.levels)


def _change(old: float, new: float) -> str:
    return "same" if old == new else (f"{new / old - 1:+.1%}" if old else "new")
