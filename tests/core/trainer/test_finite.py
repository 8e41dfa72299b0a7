"""#47: a step's loss and gradient norm, checked on the host values every step
already has; the first non-finite one is named with its step and where to resume."""

import math

import pytest

from rlctl.core.errors import NonFiniteError
from rlctl.core.trainer.algorithm.finite import check_update, first_non_finite


def test_finite_values_pass():
    check_update(3, [0.1, -0.2], [1.0, 2.0], "r", 2)
    assert first_non_finite([0.0, 1e38]) is None


@pytest.mark.parametrize(
    ("losses", "norms", "words"),
    [
        ([0.1, math.nan], [1.0], "step 4: the loss is nan"),
        ([0.1], [math.inf], "step 4: the gradient norm is inf"),
        ([-math.inf], [math.nan], "step 4: the loss is -inf"),  # the loss is named first
    ],
)
def test_the_first_non_finite_value_is_named_with_its_source(losses, norms, words):
    with pytest.raises(NonFiniteError) as e:
        check_update(4, losses, norms, "my-run", 3)
    assert e.value.message.startswith(words)
    assert "the last finite checkpoint, 3, is kept" in e.value.message
    assert "'rlctl resume my-run' continues from checkpoint 3" in e.value.hint
    assert e.value.exit_code != 0


def test_before_any_checkpoint_the_hint_says_step_0():
    with pytest.raises(NonFiniteError) as e:
        check_update(1, [math.nan], [1.0], "r", None)
    assert "no checkpoint was saved yet" in e.value.message
    assert "from step 0" in e.value.hint
