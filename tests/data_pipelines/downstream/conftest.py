"""Fixtures shared by the tests of data_pipelines.downstream."""

import pytest

from data_pipelines import downstream


@pytest.fixture(scope='module')
def task():
  return downstream.embedded_task()
