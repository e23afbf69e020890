"""Differential fuzzing in CI: hypothesis draws random training steps (tofu_tf/tools/fuzz.py)
and device counts; partitioned must equal unpartitioned (200 steps, 120 rewritten: the
suite's share). The larger runs are `python bench/fuzz.py` (2000 steps by default,
bench/results/fuzz.md) and its `--pipeline_stages=2` run."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tofu_tf.options import Options, Recompute
from tofu_tf.tools.fuzz import HypothesisChooser, check, random_step

REWRITES = [Options(early_updates=True), Options(recompute=Recompute.CHEAP),
            Options(early_updates=True, recompute=Recompute.SEGMENTS)]


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data(), st.integers(2, 8), st.integers(0, 2**16))
def test_random_steps_partition_exactly(data, devices, seed):
    case = random_step(HypothesisChooser(data), seed=seed)
    problem = check(case, devices)
    assert problem is None, f"{case.describe()} on {devices} devices: {problem}"


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data(), st.integers(2, 8), st.integers(0, 2**16), st.sampled_from(REWRITES))
def test_random_steps_rewritten_partition_exactly(data, devices, seed, options):
    """The same, with the step rewritten to hold less (search/reorder.py, recompute.py)."""
    case = random_step(HypothesisChooser(data), seed=seed)
    problem = check(case, devices, options)
    assert problem is None, f"{case.describe()} on {devices} devices, {options}: {problem}"
