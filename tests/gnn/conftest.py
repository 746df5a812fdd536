"""Fixtures of the per-kernel GNN's tests: one compiled H100 module (vgg19 small, XLA's default
compile) from tests/data, as JSON and as a :class:`gnn.kernel_data.Record`."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.support.paths import H100_RECORD as RECORD



@pytest.fixture(scope="module")
def record_json() -> dict:
    with gzip.open(RECORD, "rt") as f:
        return json.loads(f.readline())


@pytest.fixture(scope="module")
def record(record_json: dict):
    from gnn import kernel_data as KD

    return KD.record_from_json(record_json)
