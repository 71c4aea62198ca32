"""Test-wide settings: a private label cache so tests never touch the user's."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    if "LEANGNN_CACHE" not in os.environ:
        os.environ["LEANGNN_CACHE"] = str(tmp_path_factory.mktemp("leangnn-cache"))
    yield
