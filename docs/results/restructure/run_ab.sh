#!/bin/bash
# alternate before/after processes on one machine; each line of ab.jsonl is one process
cd "$(dirname "$0")"
: > ab.jsonl
for rep in 1 2 3; do
  for tree in before main; do
    PYTHONPATH=${CHECKOUTS:?set CHECKOUTS to the folder holding the before and main checkouts}/$tree/src ${PYTHON:-python} ab_bench.py prompts.jsonl 64 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); d['tree']='$tree'; d['rep']=$rep; d['load']=open('/proc/loadavg').read().split()[:3]; print(json.dumps(d))" >> ab.jsonl
  done
done

