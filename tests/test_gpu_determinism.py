"""fedpriv asks XLA:GPU for deterministic algorithms when it is imported (fedpriv/__init__.py): the
flag is added to XLA_FLAGS, a choice already there is kept, and FEDPRIV_GPU_NONDETERMINISTIC=1
leaves XLA's default. That the flag makes two GPU runs equal is checked on a GPU
(benchmarks/gpu_check.sh); here, that it is set, and that a CPU run accepts it."""

import os
import subprocess
import sys

import pytest

import fedpriv


def test_the_flag_is_added_to_the_users_xla_flags(monkeypatch):
    monkeypatch.delenv(fedpriv.NONDETERMINISTIC_ENV, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    fedpriv._deterministic_gpu_ops()
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_gpu_deterministic_ops=true"
    monkeypatch.delenv("XLA_FLAGS")
    fedpriv._deterministic_gpu_ops()
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true"


@pytest.mark.parametrize("env, flags", [({"XLA_FLAGS": "--xla_gpu_deterministic_ops=false"}, "--xla_gpu_deterministic_ops=false"),
                                        ({fedpriv.NONDETERMINISTIC_ENV: "1", "XLA_FLAGS": "--a=1"}, "--a=1")])
def test_a_users_choice_is_kept(monkeypatch, env, flags):
    monkeypatch.delenv(fedpriv.NONDETERMINISTIC_ENV, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    fedpriv._deterministic_gpu_ops()
    assert os.environ["XLA_FLAGS"] == flags


def test_an_import_sets_it_before_jax_starts_and_a_cpu_run_accepts_it():
    """A fresh process: importing fedpriv alone sets the flag (a child process, a Ray actor or a
    Flower ClientApp inherits it), and JAX then starts and computes with it on the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", fedpriv.NONDETERMINISTIC_ENV)}
    code = "import os, fedpriv, jax.numpy as jnp; print(os.environ['XLA_FLAGS']); print(float(jnp.arange(4.0).sum()))"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["--xla_gpu_deterministic_ops=true", "6.0"]
