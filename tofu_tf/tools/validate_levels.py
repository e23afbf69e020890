"""Levels composed: every strategy of an op, then every strategy of its part's local op, ...

A plan over a topology of several levels splits an op at level 1, re-describes part p1's
local op and splits that at level 2, and so on (rewrite/partition.py, `device_op`). The
single-level checks of validate.py prove each description right on the whole op; they
cannot see a description that is right for the whole op but wrong for a local op (Split
once took its output offsets from its outputs' sizes, which equal the kernel's pieces
only at level 1: the second level read the wrong columns). So this check runs the
emitter's own composition:

    for s1 in strategies(op), valid for k1:
        for s2 in strategies(local op of part 0 under s1), valid for k2:   (and so on)
            for every device (p1, p2): device_ops(op, (s1, s2), (k1, k2)), piece (p1, p2):
                cut the real inputs to the device's input pieces, run the kernel with
                the device's attrs, crop each output to its piece (or, for a piece that
                reads nothing of a reduction, take its reducer's identity);
            an output split at every level equals its share of the whole op's output;
            a partial one, combined over the devices that differ only at its partial
            levels, equals its share.

The kernel's result shapes, which a local op that crops its result needs to be
described, come from running the kernel on zeros of the local shapes.
"""

from __future__ import annotations

import itertools

import numpy as np

from tofu_tf.tools.kernels import (Finding, OpInstance, attr_changes, combine, compare,
                                   cut_input)


def check_levels(inst: OpInstance, strategies, expected, sample_id: str, ways=(2, 2)
                 ) -> tuple[int, list[Finding]]:
    """(checks run, findings) of every composition of `inst`'s strategies over `ways`."""
    from tofu_tf.op_semantics.memo import SemanticsMemo
    memo, dtypes = SemanticsMemo(), _dtypes(inst)
    shapes = _result_shapes(inst)
    checks, findings = 0, []
    for labels in _label_paths(inst.sem, strategies, ways, memo, dtypes, shapes):
        checks += 1
        findings += check_composition(inst, strategies, labels, ways, expected, sample_id,
                                      memo, dtypes, shapes)
    return checks, findings


def _label_paths(sem, strategies, ways, memo, dtypes, shapes):
    """Every sequence of one strategy label per level: a strategy of the op valid for
    ways[0], then the labels of its part-0 local op (re-described) over the rest."""
    from tofu_tf.op_semantics.localize import localize
    from tofu_tf.rewrite.partition import _next_level
    for strategy in strategies:
        if not strategy.valid_for(ways[0]):
            continue
        if len(ways) == 1:
            yield (strategy.label,)
            continue
        described = _next_level(sem, localize(sem, strategy, ways[0], 0), memo, dtypes,
                                shapes)
        if described is not None:
            for rest in _label_paths(*described, ways[1:], memo, dtypes, shapes):
                yield (strategy.label, *rest)


def check_composition(inst: OpInstance, strategies, labels, ways, expected, sample_id: str,
                      memo, dtypes, result_shapes) -> list[Finding]:
    """Every device's piece of the op under `labels` (one per level) against the whole."""
    from tofu_tf.errors import TofuError
    from tofu_tf.rewrite.partition import device_ops, nonempty
    where = dict(op_type=inst.op_type, sample=sample_id,
                 strategy=" then ".join(labels), k=int(np.prod(ways)))
    combined: dict[tuple, tuple] = {}            # (output, group) -> (box, reducer, value)
    findings = []
    coordinates = list(itertools.product(*(range(k) for k in ways)))
    try:
        pieces = device_ops(inst.sem, strategies, labels, ways, coordinates, memo, dtypes,
                            result_shapes)
    except TofuError as err:                     # refused with a typed error: no number
        return [Finding("refused", message=f"{type(err).__name__}: {err}"[:300], **where)]
    for device, (coords, piece) in enumerate(zip(coordinates, pieces)):
        if piece.outputs and not any(nonempty(out.box) for out in piece.outputs):
            continue                                      # an empty part computes nothing
        try:
            results = _held(inst, piece)
        except Exception as err:  # a failing kernel is a finding, not a crash
            return [Finding("error", part=device, message=f"{type(err).__name__}: "
                            f"{str(err).splitlines()[0][:300]}", **where)]
        for o, (out, result) in enumerate(zip(piece.outputs, results)):
            if expected[o] is None or not nonempty(out.box):
                continue
            if out.partial_levels:
                group = tuple(c for level, c in enumerate(coords)
                              if level not in out.partial_levels)
                box, _, acc = combined.get((o, group), (out.box, out.reducer, None))
                if box != out.box:
                    findings.append(Finding("wrong", part=device, message=(
                        f"output {o}: partial pieces of one group hold different boxes "
                        f"{box} and {out.box}"), **where))
                    continue
                combined[(o, group)] = (box, out.reducer, combine(out.reducer, acc, result))
                continue
            problem = compare(np.asarray(result), expected[o][_slices(out.box)])
            if problem:
                findings.append(Finding("wrong", part=device,
                                        message=f"output {o} {out.box}: {problem}", **where))
    for (o, group), (box, _, value) in combined.items():
        problem = compare(np.asarray(value, dtype=expected[o].dtype), expected[o][_slices(box)])
        if problem:
            findings.append(Finding("wrong", message=f"output {o} {box} combined over the "
                                    f"partial levels of group {group}: {problem}", **where))
    return findings


def _held(inst: OpInstance, piece) -> list[np.ndarray]:
    """What the device holds of each output, as the emitter makes it: the kernel's result
    cropped and scaled, or the reducers' identities where the piece reads nothing."""
    from tofu_tf.rewrite.partition import reducer_identity
    if piece.identity:
        return [np.full([b - a for a, b in out.box],
                        reducer_identity(out.reducer, np.dtype(dtype)) if out.reducer else 0)
                for out, dtype in zip(piece.outputs, inst.output_dtypes)]
    results = _run_piece(inst, piece)
    return [result[_slices(out.crop)] * out.scale if out.scale != 1.0
            else result[_slices(out.crop)] for out, result in zip(piece.outputs, results)]


def _run_piece(inst: OpInstance, piece) -> list[np.ndarray]:
    values = [inst.values[i] if p is None else cut_input(inst.values[i], p.data, p.pads, p.fill)
              for i, p in enumerate(piece.inputs)]
    for i, value in piece.const_inputs.items():
        values[i] = np.asarray(value, dtype=np.asarray(inst.values[i]).dtype)
    return inst.run(values, attr_changes(inst.sem, piece.attrs))


def _dtypes(inst: OpInstance) -> tuple[list[str], list[str]]:
    return ([np.asarray(v).dtype.name for v in inst.values], list(inst.output_dtypes))


def _result_shapes(inst: OpInstance):
    """The caller's shape inference of partition.device_op: the kernel run on zeros."""
    from tofu_tf.rewrite.partition import nonempty

    def shapes(op_name, local, in_shapes):
        del op_name
        if any(share is not None and not nonempty(share) for share in local.output_slices):
            return None          # an empty part runs no kernel, here as in the emitter
            #                      (oneDNN's pooling dies on a window past its input: SIGFPE)
        try:                     # an empty part's input may have a negative extent
            values = [np.zeros(shape, dtype=np.asarray(v).dtype)
                      for shape, v in zip(in_shapes, inst.values)]
            # constant inputs as the op has them (an fft_length of zeros aborts the
            # process), unless a level set them
            for i, value in {**inst.sem.constants, **local.const_inputs}.items():
                values[i] = np.asarray(value, dtype=values[i].dtype)
            results = inst.run(values, attr_changes(inst.sem, local.attrs))
        except Exception:  # noqa: BLE001 -- unknown shapes end the descent, as in the emitter
            return None
        return [r.shape for r in results[:inst.num_outputs]]
    return shapes


def _slices(box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)
