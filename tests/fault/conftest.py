"""Fixtures of the fault-injection tests."""

import pytest


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """A data cache (tokenizer and pre-tokenized corpus) per test module."""
  return tmp_path_factory.mktemp('data')
