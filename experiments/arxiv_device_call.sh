#!/usr/bin/env bash
# The arXiv grid (experiments/arxiv-dp.toml) on a GPU machine that has Python 3.12 with JAX (CUDA),
# flax and optax but no network, one call at a time:
#
#   bash experiments/arxiv_device_call.sh prepare    # here, where PyPI is reachable: fills .devdata/ and .whl/
#   bash experiments/arxiv_device_call.sh run        # there, in a copy of the repository with .devdata/ and .whl/
#   SRC=in.jsonl.gz DEST=out.jsonl.gz bash experiments/arxiv_device_call.sh corpus   # prepare's first half alone
#   DEVICE=path/to/store.tar.gz bash experiments/arxiv_device_call.sh merge            # here: add a call's runs to the committed store
#
# prepare (= corpus, then the wheels): .devdata/arxiv.jsonl.gz is the corpus with only the two fields the loader reads
#   (first_author, abstract), in the same order: the same 56,229 users and 642,799 sentences as
#   ../shared/data/arxiv-csai/abstracts.jsonl.gz (`fedpriv data inspect` gives identical counts),
#   38 MB instead of 47, so that the repository, the wheels and the corpus travel under 64 MiB.
#   .whl/ holds benchmarks/gpu_wheels.sh's wheels and jax-privacy (the BLT rows and the audits).
# run: installs the wheels into /tmp/site, then experiments/parallel_grid.sh on JOBS (default: the
#   runs the committed report lacks) for GRID seconds, stopping after the public runs unless their
#   hashes are the committed report's (PUBLIC_SHA256= , empty, runs the rows anyway), and writes to $OUT (default
#   ./device-out) gridout.tar.gz (logs, report) and store.tar.gz (every run folder without its
#   .msgpack files: enough for `fedpriv report`), and prints the public models' SHA-256 and whether
#   they are those of the committed report (docs/examples/arxiv-dp/public_params.sha256): only then
#   do its runs merge with that report's store (docs/examples/arxiv-dp/store.tar.gz).
# merge: extracts BASE (default: that committed store) and DEVICE into DEST (default
#   runs/arxiv-dp-merged), adds each finished run of the call that the store lacks (public runs and
#   runs already there are kept as committed), writes DEST/store/report and DEST/store.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
strip_corpus() {  # SRC -> DEST: first_author and abstract only, line by line, gzip -9
  local src=${SRC:-../shared/data/arxiv-csai/abstracts.jsonl.gz} dest=${DEST:-.devdata/arxiv.jsonl.gz}
  local py; py=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
  mkdir -p "$(dirname "$dest")"
  gzip -dc "$src" | "$py" -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    sys.stdout.write(json.dumps({"first_author": d["first_author"], "abstract": d["abstract"]}) + "\n")
' | gzip -9 > "$dest"
}
case "${1:-}" in
corpus) strip_corpus ;;
prepare)
  strip_corpus || exit 1
  bash benchmarks/gpu_wheels.sh >/dev/null
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d .whl "$(grep -i -E '^jax-privacy==' constraints.txt)"
  du -sh .devdata .whl
  ;;
run)
  T0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  OUT=${OUT:-device-out}; mkdir -p "$OUT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  ( while sleep 20; do echo "$(( $(date +%s) - T0 )) s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader) load $(cut -d' ' -f1 /proc/loadavg)"; done ) > /tmp/smi.log 2>&1 &
  SMI=$!
  # default: the runs the committed report lacks, the federated ones first (a call fits about six of these)
  JOBS=${JOBS:-"dp-fedavg-s0 dp-fedavg-s1 bmf-dp-fedavg-s0 bmf-dp-fedavg-s1 bmf-dp-sgd-user-s0 bmf-dp-sgd-user-s1 blt-dp-fedavg-s0 blt-dp-fedavg-s1 blt-dp-sgd-user-s0 blt-dp-sgd-user-s1"}
  GRID=${GRID:-545}
  rm -rf /tmp/grid /tmp/gridout
  PUBLIC_SHA256=${PUBLIC_SHA256-docs/examples/arxiv-dp/public_params.sha256} \
  EXP=experiments/arxiv-dp.toml SEEDS="0 1" JOBS="$JOBS" BUDGET=$GRID OUT=/tmp/gridout W=/tmp/grid PY=python3 \
    SETS="--set data.source=.devdata/arxiv.jsonl.gz" timeout $(( GRID + 5 )) bash experiments/parallel_grid.sh
  echo "grid exit $? after $(( $(date +%s) - T0 )) s"
  (cd /tmp/grid && for s in 0 1; do sha256sum public-s$s/public-s$s/params.msgpack | sed "s| public-s$s/| |"; done) > /tmp/public.sha256
  cat /tmp/public.sha256
  if cmp -s /tmp/public.sha256 docs/examples/arxiv-dp/public_params.sha256; then
    echo "public models: the committed report's (docs/examples/arxiv-dp/public_params.sha256): these rows merge with its store"
  else
    echo "public models: NOT the committed report's: these rows do not merge with it (see docs/private_comparison.md)"
  fi
  kill $SMI 2>/dev/null; cp /tmp/smi.log /tmp/gridout/ 2>/dev/null
  tar czf "$OUT/gridout.tar.gz" -C /tmp gridout
  tar czf "$OUT/store.tar.gz" --exclude='*.msgpack' --exclude='.fedpriv.lock' -C /tmp grid
  echo "total $(( $(date +%s) - T0 )) s"
  ;;
merge)  # here: the committed store (BASE) plus a call's finished runs (DEVICE: its store.tar.gz), reported
  BASE=${BASE:-docs/examples/arxiv-dp/store.tar.gz}
  [ -f "${DEVICE:-}" ] || { echo "merge: set DEVICE to a call's store.tar.gz" >&2; exit 2; }
  DEST=${DEST:-runs/arxiv-dp-merged}; [ -e "$DEST" ] && { echo "merge: $DEST exists" >&2; exit 2; }
  mkdir -p "$DEST/call" && tar xzf "$BASE" -C "$DEST" && tar xzf "$DEVICE" -C "$DEST/call" || exit 1
  for run in "$DEST"/call/grid/*/*/summary.json; do
    d=$(dirname "$run"); name=$(basename "$d")
    case $name in public-s*) continue ;; esac
    if [ -e "$DEST/store/$name" ]; then echo "merge: $name is in the committed store already; kept the committed one"; continue; fi
    cp -a "$d" "$DEST/store/" && echo "merge: added $name"
  done
  find "$DEST/store" -name .fedpriv.lock -delete
  PY=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
  "$PY" -m fedpriv.cli report "$DEST/store" > "$DEST/report.log" 2>&1 || { tail -5 "$DEST/report.log"; exit 1; }
  tar --sort=name --mtime='2026-11-28 00:00Z' --owner=0 --group=0 --numeric-owner -C "$DEST" -cf - --exclude=store/report store | gzip -9n > "$DEST/store.tar.gz"
  echo "merged: $DEST/store/report (copy it and $DEST/store.tar.gz to docs/examples/arxiv-dp/ once its public models matched)"
  ;;
*)
  echo "usage: bash experiments/arxiv_device_call.sh prepare|corpus|run|merge" >&2; exit 2 ;;
esac
