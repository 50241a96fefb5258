#!/bin/bash
# make run's command at two commits, alternating, with the process's RSS sampled every 0.2 s: the peak of the main
# experiment (before its run folder is printed) and of the article's pair (after), wall clock, the main table's
# target-only and speculative tokens/s and its peak_rss_mb column. Each side runs from its own checkout (its src/ on
# PYTHONPATH) with one Python.
#   git worktree add /tmp/before <commit>; bash docs/results/memory/ab.sh /tmp/before . 2 > out.txt
# usage: ab.sh BEFORE_DIR AFTER_DIR ROUNDS
set -u
before=$(realpath "$1"); after=$(realpath "$2"); rounds=$3
python=${PYTHON:-$PWD/.venv/bin/python}  # not resolved: the venv's link, not the interpreter it points to
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
done; done
rm -rf "$work"
