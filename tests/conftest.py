"""Shared fixtures: paths of the real data copied into tests/data (each with its NOTICE).

JAX sees 8 CPU devices in the tests (set before JAX is imported), so sharded training runs here
without accelerators. Compiled programs go to JAX's persistent compilation cache (a directory
under the system temp dir, or $FEDPRIV_TEST_JAX_CACHE), so the many short runs that compile the
same programs (resume tests, engine comparisons, both xdist workers) compile each once.
"""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ.get("FEDPRIV_TEST_JAX_CACHE", os.path.join(tempfile.gettempdir(), "fedpriv-test-jax-cache")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

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


@pytest.fixture
def run_toml(tmp_path):
    """Run an experiment given as TOML text into ``tmp_path/store``: (store, summaries), every run finished."""

    def run(text: str, name: str = "experiment.toml"):
        from fedpriv.runner.store import run_experiment

        exp = tmp_path / name
        exp.write_text(text)
        store, summaries, complete = run_experiment(exp, tmp_path / "store")
        assert complete
        return store, summaries

    return run
