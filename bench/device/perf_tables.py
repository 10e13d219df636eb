#!/usr/bin/env python3
"""Prints the markdown tables of docs/perf/README.md from docs/perf/h200/{d2h,h2d}.json (no GPU needed).
Usage: python3 bench/device/perf_tables.py [d2h.json] [h2d.json]"""
import json
import sys

d2h_path = sys.argv[1] if len(sys.argv) > 1 else "docs/perf/h200/d2h.json"
h2d_path = sys.argv[2] if len(sys.argv) > 2 else "docs/perf/h200/h2d.json"
d2h = json.load(open(d2h_path))
h2d = json.load(open(h2d_path))


def f(v, nd=2):
    return "n/a" if v is None else f"{v:.{nd}f}"


print(f"### D2H — {d2h['device']}, commit {d2h['commit']}, {d2h['date']}\n")
print(f"Command: `{d2h['command']}`\n")
print("Simulated forward (28 layers of ~60 us, 16 KiB per hook, CUDA graph replay, drain running, every word checked):\n")
print("| hooks/forward | no capture | copy only | old volatile (invalid) | per-entry release | ferry (managed head) | ferry (pinned head) | ferry publication above copy | ferry, inline releases (publication above copy) | copy only, plain launch | ferry, plain launch | anchor: naive batched / copy only |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
anchor = {"hooks28": "+3.31% / +3.08%", "hooks341": "+39.1% / +37.5%"}
for h in ("hooks28", "hooks341"):
    r = d2h["forward"][h]
    print(f"| {h[5:]} | {f(r['no_capture_us'],1)} us | +{f(r['copy_only_overhead_pct'])}% | +{f(r['old_volatile_overhead_pct'])}% "
          f"| +{f(r['per_entry_release_overhead_pct'])}% | +{f(r['ferry_overhead_pct'])}% | +{f(r['ferry_pinned_overhead_pct'])}% "
          f"| {f(r['ferry_publication_over_copy_pct'])}% "
          f"| +{f(r.get('ferry_inline_overhead_pct'))}% ({f(r.get('ferry_inline_publication_over_copy_pct'))}%) "
          f"| +{f(r.get('copy_only_plain_overhead_pct'))}% "
          f"| +{f(r.get('ferry_plain_overhead_pct'))}% | {anchor[h]} |")
print("\nPer hook in a CUDA graph (us per hook, GPU time):\n")
cols = ["copy_only", "old_volatile", "per_entry_release", "ferry_k1", "ferry_k4", "ferry_k16", "ferry_k64", "ferry_k16_pinned",
        "ferry_k16_inline", "ferry_k64_inline", "copy_only_plain", "ferry_k16_plain"]
print("| payload | " + " | ".join(cols) + " | anchor copy only / per-entry release / release kernel every 16 |")
print("|---|" + "---|" * len(cols) + "---|")
anchors = {"4096": "0.934 / 1.909 / 1.022", "65536": "1.015 / 2.174 / 1.097", "1048576": "1.287 / 2.653 / 1.371",
           "16777216": "8.113 / 9.132 / 8.200", "67108864": "37.04 / 38.05 / 37.19"}
for size, r in d2h["per_hook_graph_us"].items():
    print(f"| {int(size) // 1024} KiB | " + " | ".join(f(r.get(c), 3) for c in cols) + f" | {anchors.get(size, '')} |")
print(f"\nDrain bandwidth, 64 MiB entries: {f(d2h['drain_gbps_64MiB'], 1)} GB/s (plain pinned D2H memcpy in the same run: "
      f"{f(d2h.get('memcpy_d2h_gbps_64MiB'), 1)} GB/s). Entries checked: {d2h['entries_checked']}, bad: {d2h['entries_bad']}"
      f" (the two per-entry baselines' own drain, old volatile and per-entry release: {d2h.get('baseline_entries_checked')} checked, {d2h.get('baseline_entries_bad')} bad).\n")

print(f"### H2D — {h2d['device']}, commit {h2d['commit']}, {h2d['date']}\n")
print(f"Command: `{h2d['command']}` (median of {h2d.get('iterations', '?')} iterations per cell)\n")
print("GPU span, us, from an event before the first upload operation to the end of the first-consumer kernel:\n")
keys = ["floor_us", "floor_graph_us", "direct_us", "batch_us", "packed_us", "zerocopy_us", "auto_us", "direct_graph_us",
        "packed_graph_us", "zerocopy_graph_us", "auto_graph_us", "packed_cpu_us", "auto_cpu_us"]
print("| case | " + " | ".join(k.replace("_us", "") for k in keys) + " | auto choice |")
print("|---|" + "---|" * len(keys) + "---|")
for c, r in h2d["cases"].items():
    print(f"| {c} | " + " | ".join(f(r.get(k), 1) for k in keys) + f" | {r.get('auto_choice', '')} |")
print("\nAnchors (reference implementations, same definition): decode256 direct 48-50, batch 19.4, DMA+scatter graph 17.8, "
      "zero-copy graph 13.6, direct graph 56, floor 5.3 / 3.1; tiny4 graph 6.3-6.7; small64 zero-copy graph 8.3; "
      "CPU pack+enqueue 15-17 (packed, memcpy into the arena included).")
