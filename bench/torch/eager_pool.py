#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The eager B=1 runs of qwen3_eager.py side by side and pooled: each run's per-round overheads (every contestant's,
against the two no-capture turns beside it) kept in one small JSON, and the comparisons the targets ask for per run
and over all the kept runs together (the rounds of every run, none left out: a comparison one run leaves undecided
may be decided by the rounds of several).

  eager_pool.py add RUN_JSON... --to ROUNDS_JSON
      Adds each run (qwen3_eager.py's --out) to ROUNDS_JSON (created if absent): its source (device, commit, date,
      command), rounds, no-capture ms and, per preset and contestant, the per-round overheads (%, 3 decimals). A
      run already there (same commit and date) is replaced, not added twice.
  eager_pool.py report ROUNDS_JSON [--json OUT]
      Per preset: each run's and the pooled medians [ci95] of every contestant's overhead and of the paired
      differences (pp) the targets use; ``decided`` where the interval excludes 0. A pooled figure takes the rounds
      of the runs that timed its contestant (a difference: both of them, paired within each run) and says how many
      (``rounds``, ``runs``): a run of only some contestants (qwen3_eager.py --kinds) adds to theirs alone. --json
      writes them too.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3bench.paired import PAIRS, pair_differences, summary  # noqa: E402  (the bench's own statistics and pairs)


def extract(run):
    """One run's entry: its source and, per preset, {contestant kind: per-round overheads}."""
    presets = {}
    for key, c in (run.get("contestants") or {}).items():
        kind, _, preset = key.partition(":")
        if preset and "round_overhead_pct" in c:
            presets.setdefault(preset, {})[kind] = [round(x, 3) for x in c["round_overhead_pct"]]
    if not presets:
        raise SystemExit("eager_pool: expected a qwen3_eager.py JSON with per-round overheads "
                         "(contestants.<kind>:<preset>.round_overhead_pct), got none")
    e = run.get("eager_b1") or {}
    return {"device": run.get("device"), "commit": run.get("commit"), "date": run.get("date"),
            "command": run.get("command"), "rounds": e.get("rounds"), "no_capture_ms": e.get("no_capture_ms"),
            "presets": presets}


def add(paths, to):
    data = {"runs": []}
    if os.path.exists(to):
        with open(to) as f:
            data = json.load(f)
    for p in paths:
        with open(p) as f:
            r = extract(json.load(f))
        data["runs"] = [x for x in data["runs"] if (x["commit"], x["date"]) != (r["commit"], r["date"])] + [r]
        print(f"eager_pool: {p}: commit {r['commit']}, {r['date']}, {r['rounds']} rounds, presets "
              f"{', '.join(r['presets'])}")
    with open(to, "w") as f:
        json.dump(data, f, indent=None, separators=(",", ":"))
        f.write("\n")


def compare(kinds):
    """{name: summary} of every contestant's overhead (%) and of the targets' paired differences (pp) given
    per-round lists."""
    return {**{k: summary(v) for k, v in kinds.items() if k != "none"}, **pair_differences(kinds)}


def report(path):
    with open(path) as f:
        runs = json.load(f)["runs"]
    result = {}
    for preset in sorted({p for r in runs for p in r["presets"]}):
        had = [r for r in runs if preset in r["presets"]]
        per_run = [{"commit": r["commit"], "date": r["date"], "no_capture_ms": r["no_capture_ms"],
                    "rounds": len(next(iter(r["presets"][preset].values()))), "figures": compare(r["presets"][preset])}
                   for r in had]
        pooled = {"rounds": sum(x["rounds"] for x in per_run),
                  "figures": pooled_figures([r["presets"][preset] for r in had])}
        result[preset] = {"rounds_json": path, "runs": per_run, "pooled": pooled}
    return result


def pooled_figures(runs):
    """compare()'s figures over the runs' rounds together, each over the runs that timed every contestant it names
    (rounds stay paired within their run), with its ``rounds`` and ``runs``."""
    kinds = list(dict.fromkeys(k for r in runs for k in r if k != "none"))
    out = {}
    for need, name in [((k,), k) for k in kinds] + [((a, b), f"{a}_minus_{b}_pp") for a, b in PAIRS]:
        had = [r for r in runs if all(k in r for k in need)]
        if had:
            rounds = {k: [x for r in had for x in r[k]] for k in need}
            fig = summary(rounds[name]) if len(need) == 1 else pair_differences(rounds)[name]
            out[name] = {**fig, "rounds": len(rounds[need[0]]), "runs": len(had)}
    return out


def show(result):
    def cell(s):
        ci = s.get("ci95")
        tail = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
        n = f"  ({s['rounds']} rounds, {s['runs']} runs)" if "runs" in s else ""
        return f"{s['median']:+.2f}{tail}{' decided' if s.get('decided') else ''}{n}"

    for preset, r in result.items():
        print(f"{preset}:")
        rows = [(f"{x['commit']} {x['date']} ({x['rounds']} rounds, no capture {x['no_capture_ms']:.2f} ms)",
                 x["figures"]) for x in r["runs"]]
        rows.append((f"pooled ({r['pooled']['rounds']} rounds)", r["pooled"]["figures"]))
        for label, fig in rows:
            print(f"  {label}")
            for k, s in fig.items():
                print(f"    {k:<26}{cell(s)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("runs", nargs="+")
    a.add_argument("--to", required=True)
    r = sub.add_parser("report")
    r.add_argument("rounds")
    r.add_argument("--json")
    args = ap.parse_args(argv)
    if args.cmd == "add":
        add(args.runs, args.to)
        return
    result = report(args.rounds)
    show(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
