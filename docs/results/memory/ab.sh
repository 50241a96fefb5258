#!/bin/bash
# make run's command at two commits, alternating, the process's RSS sampled every 0.2 s: the peak of the main experiment
set -u
before=$(realpath "$1"); after=$(realpath "$2"); rounds=$3
python=${PYTHON:-/work/main/.venv/bin/python}
work=$(mktemp -d)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
     "before $(git -C "$before" rev-parse --short HEAD), after $(git -C "$after" rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do for side in before after; do
  dir=$before; [ "$side" = after ] && dir=$after
  out=$work/$side-$r; load=$(cut -d' ' -f1 /proc/loadavg)
  ( cd "$dir" && PYTHONPATH=$dir/src /usr/bin/time -v "$python" -m experiments.run 'then=[article_pair]' 2> "$out.time" |
    while IFS= read -r line; do echo "$(date +%s.%N) $line"; done > "$out.log" ) &
  sleep 0.5
  while pgrep -f "python -m experiments.run" > /dev/null; do
    pid=$(pgrep -f "python -m experiments.run" | tail -1)
    echo "$(date +%s.%N) $(awk '/VmRSS/{print $2}' /proc/"$pid"/status 2>/dev/null)"; sleep 0.2
  done > "$out.rss"
  wait
  split=$(grep -m1 "Run folder:" "$out.log" | cut -d' ' -f1)
  main=$(awk -v s="$split" '$1<s && $2>m{m=$2} END{printf "%.0f", m/1024}' "$out.rss")
  pair=$(awk -v s="$split" '$1>=s && $2>m{m=$2} END{printf "%.0f", m/1024}' "$out.rss")
  wall=$(grep Elapsed "$out.time" | awk '{print $NF}')
  rate() { grep -m1 "^[0-9.]* | $1 " "$out.log" | awk -F'|' '{gsub(/ /, "", $6); print $6}'; }
  peak() { grep -m1 "^[0-9.]* | $1 " "$out.log" | awk -F'|' '{gsub(/ /, "", $(NF-1)); print $(NF-1)}'; }
  echo "round $r $side: wall $wall, peak RSS main experiment $main MB, article pair $pair MB," \
       "tok/s target-only $(rate autoregressive) speculative $(rate speculative), table peak_rss_mb $(peak autoregressive)/$(peak speculative)/$(peak naive), load average at start $load"
  cp "$out.log" /tmp/ab-$side-$r.log
done; done
rm -rf "$work"
