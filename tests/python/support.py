"""Helpers of the Python module's tests: the seed (printed, settable with OASIS_TEST_SEED) and the
programs that ctest passes in the environment (tests/python/CMakeLists.txt)."""

import os

import pytest


def seed():
    s = int(os.environ.get("OASIS_TEST_SEED", "20261129"))
    print(f"seed {s} (set OASIS_TEST_SEED to change it)")
    return s


def program(var, what):
    """The path in environment variable `var`, or skip the test saying why."""
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        pytest.skip(f"{var} is not set to the {what} (ctest sets it)")
    return path
