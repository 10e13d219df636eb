#!/usr/bin/env python3
"""ferry's performance targets against the committed run files (stdlib only, no GPU needed).

  targets.py [H200_DIR] [--write README]   (default: docs/perf/h200)
      One row per target: target | value | anchor | met. Every value is computed from the JSON files of
      H200_DIR (d2h.json, gpu_stress.json, h2d.json, torch_qwen3.json, capture_cost.json); the rows of an
      absent file are left out, a figure absent from its file reads n/a. --write replaces the text between README's <!-- targets --> and <!-- /targets -->.

The thresholds are the project's targets; the anchors are the reference designs' figures of
shared/anchors-h200.md (measured outside this project, beside the repository), typed here as the other
tables of docs/perf/README.md type them, except where the run measured its own reference (the memcpy
ceiling, the torch copies).
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # the sibling import below leaves no __pycache__ in the tree
from perf_tables import write_block  # noqa: E402

# Sources: (key, file, what it measured)
SOURCES = [("d2h", "d2h.json", "D2H"), ("stress", "gpu_stress.json", "GPU stress"), ("h2d", "h2d.json", "H2D"),
           ("torch", "torch_qwen3.json", "torch"), ("py", "capture_cost.json", "Python")]

ANCHOR_NOTE = ("Anchors: shared/anchors-h200.md (\"batched\": a release kernel every 16 hooks; \"naive\": a copy "
               "kernel node with a join per hook; \"bare gather\": its gather probe at K = 16; torch-native: "
               "`pinned.copy_(t, non_blocking=True)` per hook), except \"same run\".")


def pct(v):
    return "n/a" if v is None else f"{v:+.2f}%"


def num(v, nd=1, unit=""):
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"


def met(ok):
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def at_most(limit, *vals):
    return None if any(v is None for v in vals) else all(v <= limit for v in vals)


def get(d, *path):
    for k in path:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return d


def d2h_rows(d, stress):
    fw = lambda h, k: get(d, "forward", h, k)
    rows = []
    drain, memcpy = d.get("drain_gbps_64MiB"), d.get("memcpy_d2h_gbps_64MiB")
    rows.append(("D2H drain bandwidth >= 50 GB/s", num(drain, 1, " GB/s"), f"pinned memcpy {num(memcpy)} (same run)",
                 None if drain is None else drain >= 50))
    checked, bad = d.get("entries_checked"), d.get("entries_bad")
    value = "n/a" if checked is None else f"bench: {'0' if bad == 0 else f'**{bad}**'} bad of {checked:,}"
    ok = None if checked is None else bad == 0 and checked > 0
    if stress:
        deferred = sum(v for k, v in (stress.get("deferred") or {}).items() if k != "percent")
        value += (f"; GPU stress: {stress['forbidden']} forbidden of {stress['entries_checked']:,} "
                  f"({deferred:,} of them deferred)")
        ok = ok and stress["forbidden"] == 0 and stress["entries_checked"] > 0
    rows.append(("D2H no lost, torn or stale entry", value, "-", ok))
    for h, limit, anchor in (("hooks28", 2.5, "batched +3.31%"), ("hooks341", 25, "batched +39.1%")):
        v = fw(h, "ferry_overhead_pct")
        rows.append((f"D2H whole overhead <= {limit}% at {h[5:]} hooks",
                     f"**{pct(v)}** (copy only {pct(fw(h, 'copy_only_overhead_pct'))})", anchor, at_most(limit, v)))
    v28 = fw("hooks28", "ferry_gather_overhead_pct")
    rows.append(("D2H gather (deferred, K=16) <= +0.5% at 28 hooks", f"**{pct(v28)}**", "-", at_most(0.5, v28)))
    vv, v341 = fw("vllm_full_b1", "ferry_gather_overhead_pct"), fw("hooks341", "ferry_gather_overhead_pct")
    rows.append(("D2H gather (deferred, K=16) <= +3% at vllm_full_b1 and 341 hooks",
                 f"**{pct(vv)}** vllm_full_b1, **{pct(v341)}** 341 x 16 KiB", "bare gather +2.3%", at_most(3, vv, v341)))
    cpu = d.get("capture_cpu_us_vllm_full_b1") or {}
    rows.append(("D2H eager CPU cost per deferred capture <= 1.0 us (C++)",
                 f"**{num(cpu.get('deferred'), 2, ' us')}** (immediate capture {num(cpu.get('immediate'), 2, ' us')}), "
                 "vllm_full_b1 sizes", "-", at_most(1.0, cpu.get("deferred"))))
    for h, limit, anchor in (("hooks28", 0.15, "batched +0.23% (3.31 - 3.08)"), ("hooks341", 0.5, "batched +1.2%")):
        v = fw(h, "ferry_publication_over_copy_pct")
        rows.append((f"D2H publication above copies <= {limit}% at {h[5:]} hooks", f"**{pct(v)}**", anchor,
                     at_most(limit, v)))
    ph = get(d, "per_hook_graph_us", "16384") or {}
    rows.append(("D2H capture copy <= 1.0 us per 16 KiB hook in a graph",
                 f"K=16 **{num(ph.get('ferry_k16'), 3, ' us')}** (copy only {num(ph.get('copy_only'), 3)})", "naive 1.87",
                 at_most(1.0, ph.get("ferry_k16"))))
    return rows


def torch_rows(t):
    def over(mode, preset, who):
        m = get(t, "decode", mode) or {}
        v, base = get(m, preset, who), m.get("no_capture_ms")
        return None if v is None or not base else (v / base - 1) * 100

    rows = []
    for preset, name, limit, glimit, anchor in (("hidden_states", "hidden-states", 1.0, 0.3, "torch-native +8.0%"),
                                                ("vllm_full", "vllm-full", 10, 2, "torch-native +59.9%")):
        ferry, gather, copies = (over("b1_graph", preset, k) for k in ("ferry_ms", "gather_ms", "torch_copy_ms"))
        quarter = None if copies is None else copies / 4
        quarter_rule = preset == "vllm_full"  # and at most a quarter of the torch copies' overhead
        ok = at_most(limit, ferry) and at_most(glimit, gather)
        if quarter_rule:
            ok = ok and (None if quarter is None else at_most(quarter, ferry))
        rows.append((f"torch b1_graph {name}: ferry <= +{limit}%"
                     + (" and <= 1/4 of the torch copies' overhead" if quarter_rule else "")
                     + f"; ferry gather <= +{glimit}%",
                     f"immediate capture **{pct(ferry)}**, gather **{pct(gather)}**; torch copies {pct(copies)}"
                     + (f" (a quarter: {pct(quarter)})" if quarter_rule else ""),
                     anchor, ok))
    checked, bad = t.get("entries_checked"), t.get("entries_bad")
    rows.append(("torch entries_bad = 0 with entries_checked > 0",
                 "n/a" if checked is None else f"**{bad} bad** of {checked:,}" if bad else f"0 bad of {checked:,}", "-",
                 None if checked is None else bad == 0 and checked > 0))
    cells, ratios = [], []
    for mode in ("eager", "graph"):
        c = get(t, "h2d_step", mode) or {}
        if c.get("torch_copies_us") and c.get("ferry_us") is not None:
            r = c["ferry_us"] / c["torch_copies_us"]
            ratios.append(r)
            cells.append(f"{mode} {c['ferry_us']:.1f} vs {c['torch_copies_us']:.1f} us (**{r:.2f}x**)")
    rows.append(("torch h2d_step: ferry <= 0.5x the per-tensor copies", ", ".join(cells) or "n/a",
                 "-", at_most(0.5, *ratios) if ratios else None))
    return rows


def python_rows(p):
    above, paths = p.get("above_cpp_us") or {}, p.get("paths_us") or {}
    names = (("hooks_auto", "`ferry.hooks.capture_fn`"), ("channel_default", "`Channel.capture`"),
             ("op_default", "torch op `.default`"))
    cells = [f"{label} {num(paths.get(k), 2)} us ({'+' + num(above.get(k), 2) if above.get(k) is not None else 'n/a'})"
             for k, label in names]
    return [("Python eager capture <= 3 us of CPU per hook above the C++ call",
             ", ".join(cells) + f" vs C++ {num(p.get('cpp_capture_us'), 2)} us", "-",
             at_most(3, *(above.get(k) for k, _ in names)))]


def h2d_rows(h):
    c = lambda case, k: get(h, "cases", case, k)
    d = "decode256"
    rows = [("H2D decode256 in a graph <= 10 us, auto and packed",
             f"auto {num(c(d, 'auto_graph_us'))} (floor {num(c(d, 'floor_graph_us'))}), packed {num(c(d, 'packed_graph_us'))}",
             "zero-copy graph 13.6", at_most(10, c(d, "auto_graph_us"), c(d, "packed_graph_us")))]
    for case, limit, anchor in (("small64", 7, "zero-copy graph 8.3"), ("tiny4", 5, "graph 6.3")):
        rows.append((f"H2D {case} in a graph <= {limit} us", f"auto {num(c(case, 'auto_graph_us'))} "
                     f"(floor {num(c(case, 'floor_graph_us'))})", anchor, at_most(limit, c(case, "auto_graph_us"))))
    rows.append(("H2D eager decode256 <= 12 us (auto)", f"{num(c(d, 'auto_us'))} (floor {num(c(d, 'floor_us'))})",
                 "DMA + scatter 17.1", at_most(12, c(d, "auto_us"))))
    rows.append(("H2D CPU pack + enqueue <= 6 us", f"auto {num(c(d, 'auto_cpu_us'), 1, ' us')} (decode256)",
                 "packed 15-17", at_most(6, c(d, "auto_cpu_us"))))
    worst = None  # (excess %, case, mode, best backend)
    for case, r in (h.get("cases") or {}).items():
        for mode, sfx, fixed in (("eager", "_us", ("direct", "batch", "packed", "zerocopy")),
                                 ("graph", "_graph_us", ("direct", "packed", "zerocopy"))):
            best = min(((r[k + sfx], k) for k in fixed if r.get(k + sfx) is not None), default=None)
            if best and r.get("auto" + sfx) is not None:
                excess = (r["auto" + sfx] / best[0] - 1) * 100
                if worst is None or excess > worst[0]:
                    worst = (excess, case, mode, best[1])
    rows.append(("H2D auto within 5% of the best fixed backend",
                 "n/a" if worst is None else f"farthest cell: {worst[1]} {worst[2]}, auto {pct(worst[0])} vs {worst[3]}", "-",
                 None if worst is None else worst[0] <= 5))
    return rows


def load(folder, name):
    try:
        return json.load(open(os.path.join(folder, name)))
    except (OSError, ValueError):
        return None


def sources_line(files):
    cells = []
    for key, name, what in SOURCES:
        d = files[key]
        if d is None:
            cells.append(f"{what} `{name}`: absent")
            continue
        stamp = ", ".join(x for x in (d.get("commit") and f"commit {d['commit']}", d.get("date")) if x)
        cells.append(f"{what} [{name}](h200/{name}) ({stamp or 'no commit or date recorded in the file'})")
    devices = sorted({(d.get("device") or "").removeprefix("cuda: ") for d in files.values() if d} - {""})
    return f"Computed from the run files in h200/, on {', '.join(devices) or '?'}: " + "; ".join(cells) + "."


def table(folder):
    files = {key: load(folder, name) for key, name, _ in SOURCES}
    rows = []
    if files["d2h"]:
        rows += d2h_rows(files["d2h"], files["stress"])
    if files["torch"]:
        rows += torch_rows(files["torch"])
    if files["py"]:
        rows += python_rows(files["py"])
    if files["h2d"]:
        rows += h2d_rows(files["h2d"])
    out = [sources_line(files) + " " + ANCHOR_NOTE, "", "| target | value | anchor | met |", "|---|---|---|---|"]
    out += [f"| {t} | {v} | {a} | {met(ok)} |" for t, v, a, ok in rows]
    return "\n".join(out) + "\n"


def main(argv):
    rest = list(argv)
    readme = None
    if "--write" in rest:
        i = rest.index("--write")
        readme = rest[i + 1]
        del rest[i:i + 2]
    text = table(rest[0] if rest else "docs/perf/h200")
    if readme is None:
        print(text, end="")
    else:
        write_block(readme, "<!-- targets -->", "<!-- /targets -->", "\n" + text, "targets")
        print(f"updated the targets of {readme}")


if __name__ == "__main__":
    main(sys.argv[1:])
