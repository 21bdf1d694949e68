#!/usr/bin/env bash
# Download, into .whl/, the wheels that benchmarks/gpu_check.sh needs beyond what a GPU machine's
# Python 3.12 already has (jax with CUDA, flax, optax, numpy, msgpack, typer, rich, psutil; scipy,
# absl-py and chex come with them). Run it here, where PyPI is reachable; copy the repository,
# .whl/ included, to the GPU machine. Versions are the ones pinned in constraints.txt.
#
#   fedpriv.config      -> pydantic, pydantic-core (binary), annotated-types, typing-inspection,
#                          typing_extensions (pydantic-core needs >= 4.16)
#   fedpriv.privacy.accounting (imported by the engine) -> dp-accounting, dm-tree (binary),
#                          attrs, mpmath, wrapt (binary)
#
# Not needed: jax-privacy (imported lazily, by the empirical audit only), flwr (the Flower row
# is skipped when it is not importable), datasets, sentencepiece.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
pin() { grep -i -E "^$1==" constraints.txt | head -1; }
BINARY=(pydantic_core dm-tree wrapt)
PURE=(pydantic annotated-types typing-inspection typing_extensions dp-accounting attrs mpmath)
for name in "${BINARY[@]}"; do
  spec=$(pin "$name"); [ -n "$spec" ] || { echo "gpu_wheels: $name is not pinned in constraints.txt" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$spec"
done
for name in "${PURE[@]}"; do
  spec=$(pin "$name"); [ -n "$spec" ] || { echo "gpu_wheels: $name is not pinned in constraints.txt" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any -d .whl "$spec"
done
ls -la .whl
du -sh .whl
