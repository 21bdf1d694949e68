#!/usr/bin/env bash
# One device check: the vectorized engine at cohort 1,000 of 342,477 Stack-Overflow-shaped users
# (FedAvg and DP-FedAvg; Flower beside it when flwr is importable; not with --cpu) and the DP-SGD
# step benchmark, and (not with --cpu) whether two runs of one seed give the same parameters with
# and without fedpriv's deterministic GPU flag, within 10 minutes, written as one JSON to
# ${OUT:-.}/gpu_check.json.
#
#   bash benchmarks/gpu_check.sh           # on a machine with an accelerator (JAX's default backend)
#   bash benchmarks/gpu_check.sh --cpu     # CI-sized, on the CPU (2 forced host devices: the sharded path)
#   PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh --cpu    # with the project's environment
#
# Needs python3 with jax, flax, optax, numpy, msgpack, typer, rich, psutil; the rest comes from
# .whl/ (benchmarks/gpu_wheels.sh downloads it where PyPI is reachable), installed into
# /tmp/site without touching the machine's Python. Each part has its own time limit; a part that
# fails or runs out of time is recorded with its exit status and the tail of its log, and the
# others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=device
[ "${1:-}" = "--cpu" ] && MODE=cpu
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
LOGS=$(mktemp -d)
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD
if ! "$PY" -c "import pydantic, dp_accounting" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check: pydantic or dp-accounting missing and no .whl/ (run benchmarks/gpu_wheels.sh where PyPI is reachable)" >&2; exit 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
if [ "$MODE" = cpu ]; then
  export JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=2"
  SCALE=(--populations 1000 --cohorts 10,32 --rounds 1 --model tiny --max-examples 8 --chunk-size 16 --devices 2)
  SCALE_DP=(--populations 1000 --cohorts 32 --rounds 1 --model tiny --max-examples 8 --chunk-size 16 --strategy dp-fedavg)
  DPSGD=(--model nwp --nwp-model tiny --batch 8 --repeats 2)
  LIMIT=300
else
  SCALE=(--populations stackoverflow --cohorts 1000 --rounds 3 --model stackoverflow --chunk-size auto)
  SCALE_DP=(--populations stackoverflow --cohorts 1000 --rounds 3 --model stackoverflow --chunk-size auto --strategy dp-fedavg)
  DPSGD=(--model all --repeats 10)
  FLOWER=(--corpus synthetic --clients 1000 --rounds 3 --model stackoverflow --users-per-message 100:sum)
  LIMIT=150  # three parts: 7.5 minutes at most
  "$PY" -c "import flwr" 2>/dev/null && LIMIT=110  # four parts
fi
part() {  # name, seconds, command...: stdout (one JSON document) to $LOGS/name.json, exit status to $LOGS/name.rc
  local name=$1 secs=$2; shift 2
  echo "gpu_check: $name (at most ${secs}s)" >&2
  timeout "$secs" "$@" >"$LOGS/$name.json" 2>"$LOGS/$name.log"
  echo $? >"$LOGS/$name.rc"
}
part scale_fedavg "$LIMIT" "$PY" benchmarks/federated_scale.py "${SCALE[@]}" --json
part scale_dpfedavg "$LIMIT" "$PY" benchmarks/federated_scale.py "${SCALE_DP[@]}" --json
part dpsgd_step "$LIMIT" "$PY" benchmarks/dpsgd_step.py "${DPSGD[@]}" --json
[ "$MODE" = device ] && part determinism 120 "$PY" benchmarks/determinism.py --json  # docs/architecture.md, "Determinism on a GPU"
if [ "$MODE" = device ] && "$PY" -c "import flwr" 2>/dev/null; then
  part flower "$LIMIT" "$PY" benchmarks/federated_engines.py "${FLOWER[@]}" --json
fi
"$PY" - "$LOGS" "$OUT_DIR/gpu_check.json" "$MODE" <<'PY'
import json, os, platform, sys
from pathlib import Path

logs, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
doc = {"mode": mode, "machine": platform.node(), "python": platform.python_version(), "parts": {}}
try:
    import jax
    doc.update(jax=jax.__version__, backend=jax.default_backend(), devices=[str(d) for d in jax.devices()])
except Exception as e:  # noqa: BLE001 - recorded, not raised: the JSON is written whatever happened
    doc["jax_error"] = repr(e)
for rc in sorted(logs.glob("*.rc")):
    name = rc.stem
    part = {"exit": int(rc.read_text().strip() or -1)}
    text = (logs / f"{name}.json").read_text()
    try:
        part["result"] = json.loads(text)
    except json.JSONDecodeError:
        part["stdout_tail"] = text[-2000:]
    if part["exit"] != 0:
        part["log_tail"] = (logs / f"{name}.log").read_text()[-3000:]
    doc["parts"][name] = part
doc["flower"] = "run" if "flower" in doc["parts"] else ("skipped: --cpu" if mode == "cpu" else "skipped: flwr is not importable")
doc["ok"] = all(p["exit"] == 0 for p in doc["parts"].values())
out.write_text(json.dumps(doc, indent=1))
print(f"gpu_check: wrote {out} ({'all parts passed' if doc['ok'] else 'some parts failed: see their log_tail'})")
PY
