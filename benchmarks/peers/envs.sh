#!/usr/bin/env bash
# Create each peer's own virtual environment under .bench-envs/ (git-ignored), never in .venv.
#
#   bash benchmarks/peers/envs.sh [opacus|tf|tff|pfl|all]
#
# Idempotent: an env whose stamp file exists is skipped. A failed install leaves
# .bench-envs/<name>.error holding pip's output (the benchmark page reports it) and no stamp.
# Pins:
#   opacus : torch==2.13.0 (the CPU wheel on this machine's disk) + opacus==1.6.0
#   tf     : tensorflow==2.14.1 + tensorflow-privacy==0.9.0 (the TF Privacy release TFF 0.87 pins
#            with TF 2.14), on Python 3.11
#   tff    : tensorflow-federated==0.87.0 (pins tensorflow~=2.14.0, tensorflow-privacy==0.9.0,
#            jax/jaxlib==0.4.14). Kept apart from tf so that a failure of TFF leaves TF Privacy.
#            PyPI has no jaxlib 0.4.14 wheel for Python 3.11 on x86_64 (0.4.13, then 0.4.18), so a
#            plain `pip install tensorflow-federated==0.87.0` fails. Installed in two steps instead:
#            TFF itself with --no-deps, then every other Requires-Dist of its METADATA exactly as
#            pinned there, except jax/jaxlib 0.4.13 for 0.4.14 (TFF's JAX backend is not used here:
#            the benchmark runs TFF's TensorFlow simulation). `pip check` then reports that one
#            mismatch (kept in .bench-envs/tff/pip-check.txt).
#   pfl    : pfl==0.6.0 (pfl-research) with its PyTorch backend on torch==2.13.0 (the CPU wheel, as
#            opacus); pfl's own pins bring dp-accounting 0.5.1 and prv-accountant 0.2.0. Its `pytorch`
#            extra only names torch, so torch is given explicitly (no CUDA wheels pulled in).
# Flower's built-in DP strategies need no env of their own: flwr==1.41.0 is part of the
# project's stack (.venv) and is measured from there.
set -u
cd "$(dirname "$0")/../.."
ROOT=.bench-envs
PYTHON=${PYTHON:-python3}
mkdir -p "$ROOT"

make_env() {  # name, pip args...
  local name=$1; shift
  local env=$ROOT/$name stamp=$ROOT/$name/.installed err=$ROOT/$name.error
  if [ -f "$stamp" ]; then echo "[envs] $name: present ($env)"; return 0; fi
  if [ -f "$err" ] && [ "${RETRY:-0}" != 1 ]; then echo "[envs] $name: failed before (see $err; RETRY=1 to try again)"; return 1; fi
  echo "[envs] $name: creating $env"
  local t0=$(date +%s)
  test -x "$env/bin/python" || "$PYTHON" -m venv "$env"
  "$env/bin/python" -m pip install --quiet --upgrade "pip>=24" >/dev/null 2>&1
  if { [ -z "${NODEPS:-}" ] || "$env/bin/python" -m pip install --quiet --progress-bar off --no-deps $NODEPS >"$ROOT/$name.log" 2>&1; } &&
     "$env/bin/python" -m pip install --quiet --progress-bar off "$@" >>"$ROOT/$name.log" 2>&1; then
    "$env/bin/python" -m pip freeze > "$env/freeze.txt"
    "$env/bin/python" -m pip check > "$env/pip-check.txt" 2>&1
    rm -f "$err"; touch "$stamp"
    echo "[envs] $name: installed in $(( $(date +%s) - t0 )) s"
  else
    cp "$ROOT/$name.log" "$err"
    echo "[envs] $name: install FAILED (see $err)"; tail -5 "$err"
    return 1
  fi
}

what=${1:-all}
rc=0
if [ "$what" = opacus ] || [ "$what" = all ]; then
  make_env opacus "torch==2.13.0" "opacus==1.6.0" "numpy<3" || rc=1
fi
if [ "$what" = tf ] || [ "$what" = all ]; then
  make_env tf "tensorflow==2.14.1" "tensorflow-privacy==0.9.0" || rc=1
fi
if [ "$what" = tff ] || [ "$what" = all ]; then
  # TFF 0.87.0's Requires-Dist, jax/jaxlib 0.4.14 -> 0.4.13 (see the header).
  NODEPS="tensorflow-federated==0.87.0" make_env tff "tensorflow==2.14.1" "tensorflow-privacy==0.9.0" \
    "jax==0.4.13" "jaxlib==0.4.13" "absl-py==1.*,>=1.0" "attrs~=23.1" "cachetools~=5.3" "dm-tree==0.1.8" \
    "dp-accounting==0.4.3" "google-vizier==0.1.11" "grpcio~=1.46" "ml-dtypes==0.2.*,>=0.2.0" "numpy~=1.25" \
    "portpicker~=1.6" "scipy~=1.9.3" "tensorflow-model-optimization==0.7.5" "tqdm~=4.64" \
    "typing-extensions==4.5.*,>=4.5.0" "googleapis-common-protos==1.61.0" || rc=1
fi
if [ "$what" = pfl ] || [ "$what" = all ]; then
  make_env pfl "torch==2.13.0" "pfl==0.6.0" "numpy<3" || rc=1
fi
exit $rc
