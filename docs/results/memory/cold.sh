#!/bin/bash
# make run's command (then=[article_pair]) cold at two checkouts, alternating: each time empty model, kernel, inductor,
# pip and matplotlib caches and the page cache dropped (as root); wall clock and each run's main table
#   git worktree add /tmp/before <commit>; sudo bash docs/results/memory/cold.sh /tmp/before . 2
before=$(realpath "$1"); after=$(realpath "$2"); rounds=$3
python=${PYTHON:-$PWD/.venv/bin/python}
for r in $(seq 1 $rounds); do for side in before after; do
  dir=$before; [ "$side" = after ] && dir=$after
  cold=$(mktemp -d); sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N)
  out=$(cd "$dir" && SPECDEC_CACHE=$cold/specdec PIP_CACHE_DIR=$cold/pip MPLCONFIGDIR=$cold/mpl PYTHONPATH=$dir/src \
        "$python" -m experiments.run 'then=[article_pair]' 2>&1)
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  ar=$(echo "$out" | grep -m1 "^| autoregressive " | awk -F'|' '{gsub(/ /,"",$6); print $6}')
  sp=$(echo "$out" | grep -m1 "^| speculative " | awk -F'|' '{gsub(/ /,"",$6); print $6}')
  th=$(echo "$out" | grep -m1 "threads=auto:" | grep -o "[0-9] torch threads")
  echo "round $r $side: ${wall%.*} s; main table target-only $ar speculative $sp tok/s ($th)"
  rm -rf "$cold"
done; done
