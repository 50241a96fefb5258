#!/bin/bash
# Target-only against llama.cpp F32 on the 7 bundled prompts (`bench=llamacpp`, `bench.only=[ar,llamacpp_f32]`) at two
# commits, and the second with THP_MEM_ALLOC_ENABLE=0 (no huge pages), alternating; each side a fresh process from its
# own checkout (its src/ on PYTHONPATH), llama.cpp built once (`make llamacpp`).
#   git worktree add /tmp/before <commit>; bash docs/results/llamacpp-ab/ab.sh /tmp/before . 2 > out.txt
# usage: ab.sh BEFORE_DIR AFTER_DIR ROUNDS
set -u
before=$(realpath "$1"); after=$(realpath "$2"); rounds=$3
python=${PYTHON:-$PWD/.venv/bin/python}
work=$(mktemp -d)
for r in $(seq 1 "$rounds"); do for side in before after after_nothp; do
  dir=$after; env=""; [ "$side" = before ] && dir=$before; [ "$side" = after_nothp ] && env="THP_MEM_ALLOC_ENABLE=0"
  load=$(cut -d' ' -f1 /proc/loadavg)
  ( cd "$dir" && env $env PYTHONPATH="$dir/src" "$python" -m experiments.bench bench=llamacpp threads=2 \
      "bench.only=[ar,llamacpp_f32]" > "$work/$side-$r.log" 2>&1 )
  out=$(grep -m1 "writing to" "$work/$side-$r.log" | awk '{print $3}')
  rates=$(sed -n '/| contender | tok\/s median/,/^$/p' "$out/bench.md" | grep -E '^\| (ar|llamacpp_f32) ' |
          cut -d'|' -f2,3 | tr -s ' ' | tr '\n' ' ')
  echo "round $r $side (load $load): $(grep -m1 'Costs at' "$work/$side-$r.log" | cut -d'(' -f1) | tok/s:$rates"
done; done
rm -rf "$work"
