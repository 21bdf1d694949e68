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
# run: installs the wheels into $WORK/site (WORK: default /tmp), then experiments/parallel_grid.sh on JOBS
#   (default: the runs the committed report lacks) for GRID seconds in $WORK/grid, stopping after the
#   public runs unless their hashes are the committed report's (PUBLIC_SHA256= , empty, runs the rows
#   anyway), and writes to $OUT (default ./device-out) gridout.tar.gz (logs, report) and store.tar.gz
#   (every run folder without its .msgpack files: enough for `fedpriv report`; plus grid/public.sha256,
#   the public models' SHA-256 in public_params.sha256's format), prints those hashes and whether they
#   are those of the committed report (docs/examples/arxiv-dp/public_params.sha256): only then do its
#   runs merge with that report's store (docs/examples/arxiv-dp/store.tar.gz). Exits with the grid's
#   status (5: public models differ, 4: a public run failed, 124: out of time), outputs written anyway.
# merge: extracts BASE (default: that committed store) and DEVICE into DEST (default
#   runs/arxiv-dp-merged) and refuses (exit 5, DEST removed) unless DEVICE's grid/public.sha256 is
#   byte-equal to PUBLIC_SHA256 (default: the committed hashes) and every run it would add is one of
#   BASE's experiment.json runs with the same config (as in the call's experiment.json); then adds each
#   finished run of the call (grid/RUN/RUN) that the store lacks or holds unfinished (no summary.json;
#   replaced), keeps public runs and finished runs as committed, writes DEST/store/report and DEST/store.tar.gz.
# SRC, DEST, DEVICE, BASE, OUT, PUBLIC_SHA256 and WORK, when given, are relative to the caller's directory;
#   the defaults, to the repository.
set -uo pipefail
for v in SRC DEST DEVICE BASE OUT PUBLIC_SHA256 WORK; do   # the caller's relative paths, before the cd
  case ${!v:-/} in /*) ;; *) printf -v "$v" %s "$PWD/${!v}" ;; esac
done
cd "$(dirname "$0")/.."
strip_corpus() {  # SRC -> DEST: first_author and abstract only, line by line, gzip -9
  local src=${SRC:-../shared/data/arxiv-csai/abstracts.jsonl.gz} dest=${DEST:-.devdata/arxiv.jsonl.gz}
  local py; py=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
  mkdir -p "$(dirname "$dest")"
  # into $dest.tmp, moved over $dest only when the whole source was read: never a partial copy
  gzip -dc "$src" | "$py" -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    sys.stdout.write(json.dumps({"first_author": d["first_author"], "abstract": d["abstract"]}) + "\n")
' | gzip -9 > "$dest.tmp" && mv "$dest.tmp" "$dest" || { rm -f "$dest.tmp"; echo "corpus: could not read $src; $dest left as it was" >&2; return 1; }
}
case "${1:-}" in
corpus) strip_corpus ;;
prepare)
  strip_corpus || exit 1
  bash benchmarks/gpu_wheels.sh >/dev/null || { echo "prepare: benchmarks/gpu_wheels.sh failed" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d .whl "$(grep -i -E '^jax-privacy==' constraints.txt)" || { echo "prepare: pip download jax-privacy failed" >&2; exit 1; }
  du -sh .devdata .whl
  ;;
run)
  T0=$(date +%s); WORK=${WORK:-/tmp}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl || exit 3
  export PYTHONPATH=$WORK/site:$PWD PYTHONUNBUFFERED=1
  OUT=${OUT:-device-out}; mkdir -p "$OUT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  ( while sleep 20; do echo "$(( $(date +%s) - T0 )) s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader) load $(cut -d' ' -f1 /proc/loadavg)"; done ) > "$WORK/smi.log" 2>&1 &
  SMI=$!
  # default: the runs the committed report lacks, the federated ones first (a call fits about six of these)
  JOBS=${JOBS:-"dp-fedavg-s0 dp-fedavg-s1 bmf-dp-fedavg-s0 bmf-dp-fedavg-s1 bmf-dp-sgd-user-s0 bmf-dp-sgd-user-s1 blt-dp-fedavg-s0 blt-dp-fedavg-s1 blt-dp-sgd-user-s0 blt-dp-sgd-user-s1"}
  GRID=${GRID:-545}
  SUMS=${PUBLIC_SHA256:-docs/examples/arxiv-dp/public_params.sha256}
  rm -rf "$WORK/grid" "$WORK/gridout"
  PUBLIC_SHA256=${PUBLIC_SHA256-docs/examples/arxiv-dp/public_params.sha256} \
  EXP=experiments/arxiv-dp.toml SEEDS="0 1" JOBS="$JOBS" BUDGET=$GRID OUT="$WORK/gridout" W="$WORK/grid" PY=python3 \
    SETS="--set data.source=.devdata/arxiv.jsonl.gz" timeout $(( GRID + 5 )) bash experiments/parallel_grid.sh
  rc=$?   # the call's status: 5 public models differ, 4 a public run failed, 124 out of time
  echo "grid exit $rc after $(( $(date +%s) - T0 )) s"
  # the public models' hashes travel in store.tar.gz (grid/public.sha256): merge checks them
  (cd "$WORK/grid" && for s in 0 1; do sha256sum public-s$s/public-s$s/params.msgpack | sed "s| public-s$s/| |"; done) > "$WORK/public.sha256"
  cp "$WORK/public.sha256" "$WORK/grid/public.sha256" 2>/dev/null
  cat "$WORK/public.sha256"
  if cmp -s "$WORK/public.sha256" "$SUMS"; then
    echo "public models: the committed report's ($SUMS): these rows merge with its store"
  else
    echo "public models: NOT the committed report's: these rows do not merge with it (see docs/private_comparison.md)"
  fi
  kill $SMI 2>/dev/null; cp "$WORK/smi.log" "$WORK/gridout/" 2>/dev/null
  tar czf "$OUT/gridout.tar.gz" -C "$WORK" gridout
  tar czf "$OUT/store.tar.gz" --exclude='*.msgpack' --exclude='.fedpriv.lock' -C "$WORK" grid
  echo "total $(( $(date +%s) - T0 )) s"
  exit $rc
  ;;
merge)  # here: the committed store (BASE) plus a call's finished runs (DEVICE: its store.tar.gz), reported
  BASE=${BASE:-docs/examples/arxiv-dp/store.tar.gz}
  SUMS=${PUBLIC_SHA256:-docs/examples/arxiv-dp/public_params.sha256}
  [ -f "${DEVICE:-}" ] || { echo "merge: set DEVICE to a call's store.tar.gz" >&2; exit 2; }
  DEST=${DEST:-runs/arxiv-dp-merged}; [ -e "$DEST" ] && { echo "merge: $DEST exists" >&2; exit 2; }
  refuse() { echo "merge: refused, nothing merged: $*" >&2; rm -rf "$DEST"; exit 5; }
  mkdir -p "$DEST/call" && tar xzf "$BASE" -C "$DEST" && tar xzf "$DEVICE" -C "$DEST/call" || { rm -rf "$DEST"; exit 1; }
  # the call's public models must be the committed ones: run wrote their hashes to grid/public.sha256
  [ -f "$DEST/call/grid/public.sha256" ] || refuse "$DEVICE has no grid/public.sha256 (the call's public-model hashes)"
  cmp -s "$DEST/call/grid/public.sha256" "$SUMS" || refuse "the call's public models (grid/public.sha256) are not those of $SUMS"
  add=()   # the call's finished grid/RUN/RUN (not grid/store/RUN, the grid's own copy) that BASE lacks or left unfinished
  for run in "$DEST"/call/grid/*/*/summary.json; do
    d=$(dirname "$run"); name=$(basename "$d")
    [ "$(basename "$(dirname "$d")")" = "$name" ] || continue
    case $name in public-s*) continue ;; esac
    if [ -f "$DEST/store/$name/summary.json" ]; then echo "merge: $name is in the committed store already; kept the committed one"; continue; fi
    add+=("$d")
  done
  # each must be a run of BASE's experiment.json (the report reads only those) with BASE's config
  why=$(python3 -c '
import json, os, sys
def runs(path):
    try:
        return {r["name"]: r.get("config") for r in json.load(open(path))["runs"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"cannot read {path}: {e!r}")
base = runs(sys.argv[1])
for d in sys.argv[3:]:
    name = os.path.basename(d)
    if name not in base:
        sys.exit(f"{name} is not a run of BASE'"'"'s experiment.json (the report would ignore it)")
    for exp in (os.path.join(os.path.dirname(d), "experiment.json"), os.path.join(sys.argv[2], "store", "experiment.json")):
        if os.path.exists(exp):
            if runs(exp).get(name) != base[name]:
                sys.exit(f"{name}: its config in the call ({os.path.relpath(exp, sys.argv[2])}) differs from BASE'"'"'s")
            break
    else:  # no record of what the call trained: its config cannot be checked
        sys.exit(f"{name}: the call holds no experiment.json (grid/{name}/ or grid/store/), so its config cannot be checked")
' "$DEST/store/experiment.json" "$DEST/call/grid" ${add[@]+"${add[@]}"} 2>&1) || refuse "$why"
  for d in ${add[@]+"${add[@]}"}; do
    name=$(basename "$d")
    if [ -e "$DEST/store/$name" ]; then
      rm -rf "$DEST/store/$name" && cp -a "$d" "$DEST/store/" && echo "merge: replaced $name (unfinished in the committed store: no summary.json) with the call's finished run"
    else
      cp -a "$d" "$DEST/store/" && echo "merge: added $name"
    fi
  done
  find "$DEST/store" -name .fedpriv.lock -delete
  PY=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )
  "$PY" -m fedpriv.cli report "$DEST/store" > "$DEST/report.log" 2>&1 || { tail -5 "$DEST/report.log"; exit 1; }
  tar --sort=name --mtime='2026-11-28 00:00Z' --owner=0 --group=0 --numeric-owner -C "$DEST" -cf - --exclude=store/report store | gzip -9n > "$DEST/store.tar.gz"
  echo "merged: $DEST/store/report (copy it and $DEST/store.tar.gz to docs/examples/arxiv-dp/)"
  ;;
*)
  echo "usage: bash experiments/arxiv_device_call.sh prepare|corpus|run|merge" >&2; exit 2 ;;
esac
