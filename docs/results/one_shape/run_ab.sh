#!/bin/bash
# Alternate before/after processes on one machine; each line of ab.jsonl is one process (one checkout, one repetition).
#   BEFORE=<checkout of a51de4e> AFTER=<checkout of the restructuring> PYTHON=<venv python> bash run_ab.sh
cd "$(dirname "$0")"
: > ab.jsonl
for rep in 1 2; do
  for tree in before after; do
    src=$([ "$tree" = before ] && echo "${BEFORE:?}" || echo "${AFTER:?}")/src
    PYTHONPATH=$src ${PYTHON:-python} ab_bench.py prompts.jsonl 64 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); d['tree']='$tree'; d['rep']=$rep; d['load']=open('/proc/loadavg').read().split()[:3]; print(json.dumps(d))" >> ab.jsonl
  done
done
