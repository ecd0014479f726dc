"""Fixtures of the topology tests: the ArangoDB to write to.

By default an in-process STAND-IN (tests/topology/arango_standin.py, not ArangoDB) on a free
port. With SEGSCOPE_ARANGO_URL (+ SEGSCOPE_ARANGO_USER, SEGSCOPE_ARANGO_PASSWORD) the same tests
run against that real ArangoDB; each test uses its own database `segscope_test_<random>`,
dropped afterwards.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pytest

from arango_standin import ArangoStandin


@dataclass
class ArangoTarget:
    url: str
    user: str
    password: str
    db_name: str
    standin: ArangoStandin | None     # None: a real ArangoDB


@pytest.fixture
def arango():
    db_name = f"segscope_test_{uuid.uuid4().hex[:10]}"
    url = os.environ.get("SEGSCOPE_ARANGO_URL")
    if url:
        user = os.environ.get("SEGSCOPE_ARANGO_USER", "root")
        password = os.environ.get("SEGSCOPE_ARANGO_PASSWORD", "")
        yield ArangoTarget(url, user, password, db_name, None)
        from arango import ArangoClient
        sys_db = ArangoClient(hosts=url).db("_system", username=user, password=password)
        if sys_db.has_database(db_name):
            sys_db.delete_database(db_name)
        return
    with ArangoStandin() as standin:
        yield ArangoTarget(standin.url, standin.user, standin.password, db_name, standin)
