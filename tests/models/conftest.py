"""Fixtures shared by the model tests."""

import pytest

from tofu_tf.models import common


@pytest.fixture
def share_from_two_calls(monkeypatch):
    """Block keys share one function from two calls: the tests' small models have keys of
    2-5 calls, fewer than `MIN_SHARED_CALLS`, which are built op by op by default."""
    monkeypatch.setattr(common, "MIN_SHARED_CALLS", 2)
