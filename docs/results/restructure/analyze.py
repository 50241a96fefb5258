import json, statistics, sys
rows = [json.loads(l) for l in open("ab.jsonl")]
methods = list(rows[0]["methods"])
def tps(d, m):
    p = d["methods"][m]; return sum(len(v["tokens"]) for v in p.values()) / sum(v["seconds"] for v in p.values())
print("process | tree | load | " + " | ".join(methods))
for d in rows:
    print(d["rep"], d["tree"], d["load"][0], " | ".join(f"{tps(d, m):.2f}" for m in methods))
print()
print("| method | before: tok/s (median of 3) | after | before: / target-only | after: / target-only | after / before (ratio of ratios) |")
print("|---|---|---|---|---|---|")
for m in methods:
    b = [d for d in rows if d["tree"] == "before"]; a = [d for d in rows if d["tree"] == "main"]
    tb = statistics.median(tps(d, m) for d in b); ta = statistics.median(tps(d, m) for d in a)
    rb = statistics.median(tps(d, m) / tps(d, "autoregressive") for d in b)
    ra = statistics.median(tps(d, m) / tps(d, "autoregressive") for d in a)
    print(f"| {m} | {tb:.2f} | {ta:.2f} | {rb:.3f} | {ra:.3f} | {ra / rb:.3f} |")
ident = all(d["methods"][m][p]["tokens"] == rows[0]["methods"][m][p]["tokens"] for d in rows for m in methods for p in d["methods"][m])
print("\nidentical outputs across all processes (before and after), every method and prompt:", ident)
same_as_ar = {m: all(rows[0]["methods"][m][p]["tokens"] == rows[0]["methods"]["autoregressive"][p]["tokens"] for p in rows[0]["methods"][m]) for m in methods}
print("equal to target-only:", same_as_ar)
