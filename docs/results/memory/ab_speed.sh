#!/bin/bash
# make run's main experiment (logger=none) at two checkouts, alternating, the main table's target-only and speculative tok/s
#   git worktree add /tmp/before <commit>; bash docs/results/memory/ab_speed.sh /tmp/before . 3
before=$(realpath "$1"); after=$(realpath "$2"); rounds=$3
python=${PYTHON:-$PWD/.venv/bin/python}
for r in $(seq 1 $rounds); do for side in before after; do
  dir=$before; [ "$side" = after ] && dir=$after
  out=$(cd "$dir" && PYTHONPATH=$dir/src "$python" -m experiments.run logger=none 2>&1)
  ar=$(echo "$out" | grep -m1 "^| autoregressive " | awk -F'|' '{gsub(/ /,"",$6); print $6}')
  sp=$(echo "$out" | grep -m1 "^| speculative " | awk -F'|' '{gsub(/ /,"",$6); print $6}')
  th=$(echo "$out" | grep -m1 "threads=auto:" | grep -o "[0-9] torch threads")
  echo "round $r $side: target-only $ar speculative $sp ($th, load $(cut -d' ' -f1 /proc/loadavg))"
done; done
