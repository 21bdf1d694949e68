"""Shared fixtures: paths of the real data copied into tests/data (each with its NOTICE).

JAX sees 8 CPU devices in the tests (set before JAX is imported), so sharded training runs here
without accelerators. XLA compiles for the CPU without LLVM's optimizations
(``--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true``, XLA's own HLO
passes unchanged) and with its older fusion code generator (``--xla_cpu_use_fusion_emitters=false``):
the suite compiles thousands of small programs and runs each briefly, so compiling dominates.
Measured on 2 cores from an empty cache: the same four files (tests/central/test_dpsgd.py,
tests/models/test_ner_model.py, tests/tasks/test_nwp.py, tests/runner/test_fl_ner.py, run side by
side) took 337 s of CPU without LLVM's optimizations against 447 s with the defaults; on top of
that, the 365 programs of tests/strategies/test_federated_core.py and
tests/clients/test_federated_client_dp.py took 19-25 s of XLA compiling without the fusion emitters
(three runs) against 48-52 s with them (two runs; JAX's backend_compile_duration events), every test
passing every way. Every process of a test (subprocesses, Ray actors, Flower's
processes) inherits the flags, so the bitwise comparisons between them hold; what users run is
compiled with XLA's defaults. Compiled programs go to JAX's persistent compilation cache (a directory
under the system temp dir, or $FEDPRIV_TEST_JAX_CACHE), so the many short runs that compile the
same programs (resume tests, engine comparisons, both xdist workers) compile each once. Every
program is cached, not only those that took 1 s or more to compile (JAX's default): most of the
suite's compiles are eager ops and small programs of 40-70 ms each here, which every subprocess,
Ray actor and the other worker would compile again. Measured on 2 cores against a 0.2 s threshold:
tests/central and tests/strategies with the cache warm compiled 1,038 of their 1,262 programs
again (53 s of compiling) and now read all of them back (12 s); test_federated_engines.py and
test_kill_resume.py from an empty cache took 345 s instead of 389 s (one run each, in sequence). A test
that runs Flower simulations takes ``flower_on_shared_ray`` (or ``shared_ray``, the address): they
connect to one Ray cluster per test module instead of starting and stopping one each
(tests/ray_cluster.py).

Scheduling under ``make test`` (``pytest -n 2 --dist loadfile --no-loadscope-reorder``): a test
file runs whole on one worker, so a module-scoped fixture (a trained store, a prepared corpus) is
built once; files are handed out in the order set here, the ones with the most slow tests first,
so the run does not end with one worker on a long file while the other idles. (pytest-xdist
3.8's ``loadgroup`` does not group under pytest 9: it rewrites ``item._nodeid``, which pytest 9
no longer reads.)
"""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ.get("FEDPRIV_TEST_JAX_CACHE", os.path.join(tempfile.gettempdir(), "fedpriv-test-jax-cache")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Hypothesis draws the same examples on every run (a CI run does not fail on a case that an
# earlier run of the same code passed). FEDPRIV_HYPOTHESIS_PROFILE=explore draws new ones each
# run (or pass --hypothesis-seed=N): how new malformed inputs are found; a case found that way
# is kept as an explicit test (docs/reliability.md).
settings.register_profile("derandomized", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("FEDPRIV_HYPOTHESIS_PROFILE", "derandomized"))
from ray_cluster import flower_on_shared_ray, shared_ray  # noqa: E402, F401  (fixtures: in-process Flower runs on one Ray cluster per module)

DATA = Path(__file__).parent / "data"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Files with more slow tests first (longest first is what balancing two workers needs); each
    file's tests stay together and in their order. Deterministic: every xdist worker must collect
    the same order."""
    first: dict[str, int] = {}
    slow: dict[str, int] = {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::")[0]
        first.setdefault(path, i)
        slow[path] = slow.get(path, 0) + (item.get_closest_marker("slow") is not None)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-slow[item.nodeid.split("::")[0]], first[item.nodeid.split("::")[0]], order[id(item)]))


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
