"""Shared fixtures: paths of the real data copied into tests/data (each with its NOTICE)."""

from pathlib import Path

import pytest

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
