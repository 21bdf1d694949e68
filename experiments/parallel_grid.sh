#!/usr/bin/env bash
# Every run of an experiment in its own process (and its own store, since one process owns a store), for
# a machine with an accelerator: the public runs first, then the others at once; then the run folders are
# merged into one store and reported. Each process sizes its cohort chunks for the whole device, so with
# many federated runs at once give a small chunk (SETS="--set federated.chunk_size=64"): the committed
# arxiv-dp report (docs/private_comparison.md) lost five runs to GPU memory with chunks of 256 in 20 processes.
#   EXP=experiments/arxiv-dp.toml SEEDS="0 1" BUDGET=3600 OUT=runs/arxiv-dp-logs W=/tmp/grid bash experiments/parallel_grid.sh
# BUDGET: seconds for the whole grid; a run still training then is killed (its store W/RUN keeps its last
# checkpoint: `fedpriv run EXP --out W/RUN --only RUN` resumes it, on the same machine). W must not exist yet.
# PUBLIC_SHA256: a file of "HASH  public-sS/params.msgpack" lines (docs/examples/arxiv-dp/public_params.sha256):
#   after the public runs, stop (exit 5) unless they have these hashes, before any GPU time goes to rows that could
#   not join that store.
# JOBS: run-seed names to run instead of every RUNS x SEEDS (the committed H100 report ran
#   JOBS="dp-sgd-user-s0 dp-sgd-user-s1 dp-fedavg-poisson-s0 dp-fedavg-poisson-s1 dp-fedavg-s0").
set -u
EXP=${EXP:-experiments/arxiv-dp.toml}
SEEDS=${SEEDS:-"0 1"}
RUNS=${RUNS:-"sgd fedavg fedavg-clip dp-sgd-user dp-fedavg dp-fedavg-poisson dp-sgd-example blt-dp-sgd-user blt-dp-fedavg dp-fedavg-cold"}
# Several processes share one GPU: JAX must not take 75% of its memory in the first one.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
SETS=${SETS:-}   # e.g. "--set federated.chunk_size=256": given to every run alike
OUT=${OUT:-/tmp/gridout}; mkdir -p $OUT
W=${W:-/tmp/grid}
[ -e "$W" ] && { echo "W=$W exists: remove it or choose another folder" >&2; exit 2; }
mkdir -p $W
T0=$(date +%s); BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
fp() { $PY -m fedpriv.cli "$@"; }
for s in $SEEDS; do
  fp run $EXP --out $W/public-s$s --only public-s$s --no-report $SETS > $OUT/public-s$s.log 2>&1 &
done
wait
echo "public runs done after $(( $(date +%s) - T0 )) s"
for s in $SEEDS; do [ -f $W/public-s$s/public-s$s/summary.json ] || { echo "public-s$s failed:"; tail -5 $OUT/public-s$s.log; exit 4; }; done
if [ -n "${PUBLIC_SHA256:-}" ]; then   # rows meant to join a committed store: stop unless its public models came out again
  have=$(cd $W && for s in $SEEDS; do sha256sum public-s$s/public-s$s/params.msgpack | sed "s| public-s$s/| |"; done)
  if [ "$have" != "$(grep -E "public-s($(echo $SEEDS | tr ' ' '|'))/" "$PUBLIC_SHA256")" ]; then
    echo "public models differ from $PUBLIC_SHA256: these rows would not merge; stopping"; echo "$have"; exit 5
  fi
  echo "public models match $PUBLIC_SHA256"
fi
JOBS=${JOBS:-$(for s in $SEEDS; do for r in $RUNS; do echo -n "$r-s$s "; done; done)}   # or name run-seed jobs: JOBS="dp-sgd-user-s0 dp-fedavg-s1"
for j in $JOBS; do
  s=${j##*-s}; st=$W/$j; cp -a $W/public-s$s $st; rm -f $st/.fedpriv.lock
  timeout $(( $(left) - 60 )) $PY -m fedpriv.cli run $EXP --out $st --only $j --no-report $SETS > $OUT/$j.log 2>&1 &
done
wait
echo "runs ended after $(( $(date +%s) - T0 )) s"
S=$W/store; cp -a $W/public-s${SEEDS%% *} $S; rm -f $S/.fedpriv.lock
for s in $SEEDS; do [ -d $S/public-s$s ] || cp -a $W/public-s$s/public-s$s $S/; done
for j in $JOBS; do cp -a $W/$j/$j $S/ 2>/dev/null; done
find $S -name .fedpriv.lock -delete
fp report $S > $OUT/report.log 2>&1; echo "report rc=$?"
cp -a $S/report $OUT/report 2>/dev/null; cp $S/experiment.json $OUT/ 2>/dev/null
ls -la $OUT | head -40
grep -hE "reached|missed|failed|error|Error|stopped|Traceback" $OUT/*.log | cut -c1-220 | tail -40
echo "total $(( $(date +%s) - T0 )) s"
