"""The lab's tests: opt-in (`pytest lab/tests`), marked `lab`, on the suite's tiny models."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAB / "scripts"))  # the scripts import their support modules (sides, policies)

_spec = importlib.util.spec_from_file_location("specdeploy_test_support", LAB.parent / "tests" / "conftest.py")
_support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_support)


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    return _support.export_tiny("llama", tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def features_bundle(tmp_path_factory) -> Path:
    """The tiny Llama exported with the features a feature head reads (`export --features`)."""
    return _support.export_tiny("llama", tmp_path_factory.mktemp("features"), head_features=True)
