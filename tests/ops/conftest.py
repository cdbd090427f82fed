"""Fixtures for op tests (helpers live in ophelp.py, imported by name)."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
