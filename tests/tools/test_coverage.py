"""Every op type in the training graphs of the reference models (all optimizers), Keras
applications, keras_hub backbones and models as users write them is described or opaque
with a reason."""

import pytest

from tofu_tf.op_semantics.catalog import DESCRIBED
from tofu_tf.tools.coverage import COMPUTE_HEAVY, KERAS, REFERENCE, USER, coverage


@pytest.mark.parametrize("model", REFERENCE + KERAS + USER)
def test_no_op_type_is_missing(model):
    result = coverage([model])
    totals = result.totals()
    assert totals["missing"] == 0, result.table()
    for op_type in COMPUTE_HEAVY:
        if op_type in result.status:
            assert result.status[op_type] == DESCRIBED and not result.opaque_instances[op_type], \
                f"{op_type} is kept whole in {model}: {result.reasons.get(op_type)}"
    assert result.table().splitlines()[-1].startswith(f"described {totals['described']}")


def test_unknown_model_is_a_typed_error():
    from tofu_tf.errors import TofuError
    with pytest.raises(TofuError, match="unknown model"):
        coverage(["alexnet"])
