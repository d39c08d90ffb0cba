"""Shared fixtures: one Context per Vulkan device present, reused across tests."""
from __future__ import annotations

import os

import pytest

from vkdflash import plugins
from vkdflash.runtime.context import Context
from vkdflash.runtime.device import list_devices

DEVICES = list_devices()
_contexts: dict[int, Context] = {}


def context_for(index: int) -> Context:
    if index not in _contexts:
        _contexts[index] = Context(index)
    return _contexts[index]


@pytest.fixture(autouse=True, scope="session")
def private_verify_curves(tmp_path_factory):
    """Curves timed while tests load the machine stay out of the user's cache, where they would
    price the user's own runs (the default model's download is shared on purpose)."""
    os.environ["VKDFLASH_CURVES"] = str(tmp_path_factory.mktemp("curves") / "verify-curves.json")


@pytest.fixture(params=[d.index for d in DEVICES], ids=[f"dev{d.index}" for d in DEVICES])
def ctx(request) -> Context:
    """Parametrizes a test over every Vulkan device present."""
    return context_for(request.param)


@pytest.fixture
def ctx0() -> Context:
    """The default device, for tests about the runtime rather than about a kernel."""
    return context_for(DEVICES[0].index)


@pytest.fixture
def fresh_plugins():
    """A plugin manager loaded afresh for the test and forgotten after it (tests register their own)."""
    plugins.reset()
    yield
    plugins.reset()
