#!/bin/bash
# Alternate before/after processes on one machine; each line of ab.jsonl is one process (one checkout, one
# repetition), then ab_batch4.jsonl: the batch of 4 again, three calls per process (the fastest kept).
#   BEFORE=<checkout of a51de4e> AFTER=<checkout of the restructuring> PYTHON=<venv python> bash run_ab.sh
cd "$(dirname "$0")"
run() {  # run <tree> <rep> <output> [batch4]
  local src
  src=$([ "$1" = before ] && echo "${BEFORE:?}" || echo "${AFTER:?}")/src
  PYTHONPATH=$src ${PYTHON:-python} ab_bench.py prompts.jsonl 64 $4 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); d['tree']='$1'; d['rep']=$2; d['load']=open('/proc/loadavg').read().split()[:3]; print(json.dumps(d))" >> "$3"
}
: > ab.jsonl
for rep in 1 2; do for tree in before after; do run $tree $rep ab.jsonl; done; done
: > ab_batch4.jsonl
for rep in 1 2; do for tree in before after; do run $tree $rep ab_batch4.jsonl batch4; done; done
