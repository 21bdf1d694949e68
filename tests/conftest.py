"""Shared fixtures: paths of the real data copied into tests/data (each with its NOTICE).

JAX sees 8 CPU devices in the tests (set before JAX is imported), so sharded training runs here
without accelerators.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def coffee_posts() -> Path:
    return DATA / "stackexchange-coffee" / "Posts.xml"


@pytest.fixture(scope="session")
def wnut_train() -> Path:
    return DATA / "wnut17" / "wnut17train.conll"


@pytest.fixture(scope="session")
def ncbi_train() -> Path:
    return DATA / "ncbi-disease" / "train.tsv"
