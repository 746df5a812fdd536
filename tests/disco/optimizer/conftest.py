"""Fixtures shared by the optimizer's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def target():
    """mlp at preset tiny on 2 devices (sgd), prepared for the optimizer (one per test module)."""
    import trax_models
    from disco import optimizer as opt

    step, args = trax_models.make_train_step("mlp", "tiny", devices=2, optimizer="sgd")
    return opt.prepare(step, args)
