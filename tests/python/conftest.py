"""Fixtures of the Python module's tests."""

import numpy as np
import pytest

import support


@pytest.fixture
def rng():
    return np.random.default_rng(support.seed())


@pytest.fixture
def verify_exe():
    return support.program("OASIS_VERIFY", "oasis-verify program")
