"""The Flower tests' temporary files (a node's working folder without a state-dir) go to the test's folder."""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture(scope="module", autouse=True)
def temporary_files_in_the_test_folder(tmp_path_factory):
    before = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("tmp"))
    yield
    tempfile.tempdir = before
