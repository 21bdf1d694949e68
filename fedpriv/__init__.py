"""fedpriv: measure and reduce what language models memorize about the people in their training data."""

import os as _os

__version__ = "0.1.0"

GPU_DETERMINISM_FLAG = "--xla_gpu_deterministic_ops=true"
NONDETERMINISTIC_ENV = "FEDPRIV_GPU_NONDETERMINISTIC"


def _deterministic_gpu_ops() -> None:
    """Ask XLA:GPU for deterministic algorithms, so that one config and seed give the same numbers
    run after run on a GPU. Without it XLA sums with atomics (an embedding's gradient is a
    scatter-add), and the last bits then differ between two runs and drift: two runs of the arXiv
    grid's public model on an H100 ended at 21.91% and 21.68% validation accuracy
    (docs/architecture.md, "Determinism on a GPU"). XLA reads XLA_FLAGS when JAX starts a
    backend, so this is set when fedpriv is imported, before any backend starts (child processes,
    Ray actors and Flower ClientApps inherit it); it changes nothing on a CPU. A flag the user already
    put in XLA_FLAGS is kept, and ``FEDPRIV_GPU_NONDETERMINISTIC=1`` leaves XLA's default."""
    if _os.environ.get(NONDETERMINISTIC_ENV) == "1":
        return
    flags = _os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        _os.environ["XLA_FLAGS"] = f"{flags} {GPU_DETERMINISM_FLAG}".strip()


_deterministic_gpu_ops()
