#!/usr/bin/env python3
"""ferry's headline screens, from the benchmarks' JSON (stdlib only, no GPU needed).

  headline.py D2H_JSON H2D_JSON [ANCHORS_MD]
      One screen: this run's figures, ferry beside the designs it replaces (copy only, per-entry release,
      event per hook; H2D: one copy per member, cudaMemcpyBatchAsync), all measured in that run, and the
      committed H200 run (docs/perf/h200/{d2h,h2d}.json) as the reference column. ANCHORS_MD (default
      $FERRY_ANCHORS; e.g. shared/anchors-h200.md), when it exists, adds an "anchor" column; it is optional.
  headline.py variants [D2H_JSON]
      The D2H variant sweeps and diagnostics as text tables.
The page docs/perf/README.md is perf_page.py's; the run files it reads are run_files.py's.
"""
import json
import os
import re
import sys
import textwrap


def f(v, nd=2):
    return "n/a" if v is None else f"{v:.{nd}f}"


# ---- headline --------------------------------------------------------------------------------------
def num(cell):
    m = re.search(r"-?\d[\d,]*\.?\d*", cell or "")
    return float(m.group(0).replace(",", "")) if m else None


def md_tables(text):
    """Every markdown table of `text` as (header cells, rows of cells)."""
    tables, cur = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cur is None:
                cur = (cells, [])
                tables.append(cur)
            elif not all(set(c) <= set("-: ") for c in cells):
                cur[1].append(cells)
        else:
            cur = None
    return tables


def read_anchors(path):
    """{'fwd': {28: {...}, 341: {...}}, 'h2d': {case: {...}}, 'd2h_gbps': x}; empty where absent."""
    a = {"fwd": {}, "h2d": {}, "d2h_gbps": None}
    try:
        text = open(path).read()
    except OSError:
        return a
    m = re.search(r"D2H ([\d.]+) GB/s at 512 MiB", text)
    a["d2h_gbps"] = float(m.group(1)) if m else None
    for head, rows in md_tables(text):
        h = [c.lower() for c in head]
        col = lambda *keys: next((i for i, c in enumerate(h) if all(k in c for k in keys)), None)
        if h and "hooks / forward" in h[0]:
            cols = {"no_capture": col("no capture"), "copy_only": col("copy only"),
                    "per_entry_release": col("st.release.sys"), "batched": col("release every 16")}
            for r in rows:
                a["fwd"][int(num(r[0]))] = {k: (num(r[i]) if i is not None and i < len(r) else None) for k, i in cols.items()}
        elif h and h[0] == "case" and col("cudamemcpybatchasync") is not None:
            cols = {"direct": col("one cudamemcpyasync"), "batch": col("cudamemcpybatchasync"),
                    "floor": col("floor")}
            eager = [col("one-block-per-member scatter")]
            graph = [i for i, c in enumerate(h) if "graph" in c and "floor" not in c]
            for r in rows:
                members = int(num(r[1]))
                case = r[0].split()
                key = "decode" + case[-1] if case[0] == "decode" else case[0] + str(members)
                low = lambda i: min(float(x) for x in re.findall(r"\d+\.?\d*", r[i])) if i is not None and i < len(r) else None
                e = {k: low(i) for k, i in cols.items()}
                floors = [float(x) for x in re.findall(r"\d+\.?\d*", r[cols["floor"]])] if cols["floor"] is not None else []
                e["floor"] = floors[0] if floors else None
                e["floor_graph"] = floors[1] if len(floors) > 1 else None
                vals = [low(i) for i in [cols["direct"], cols["batch"]] + eager if i is not None]
                e["best_eager"] = min(vals) if vals else None
                gv = [low(i) for i in graph]
                e["best_graph"] = min(gv) if gv else None
                a["h2d"][key] = e
    return a


def para(text, width=106, indent=""):
    print(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent))


REFERENCE_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs",
                                              "perf", "h200"))


def headline(d2h_path, h2d_path, anchors_path=None, ref_dir=REFERENCE_DIR):
    """One screen: this run's figures of ferry and of the designs it replaces (measured in the same run, beside
    each other), and the committed H200 run (ref_dir: docs/perf/h200/{d2h,h2d}.json) as the reference column.
    `anchors_path` (shared/anchors-h200.md), when it exists, adds its figures as an extra column."""
    def load(p):
        try:
            return json.load(open(p))
        except (OSError, ValueError):
            return {}

    d2h, h2d = load(d2h_path), load(h2d_path)
    rd2h, rh2d = load(os.path.join(ref_dir, "d2h.json")), load(os.path.join(ref_dir, "h2d.json"))
    a = read_anchors(anchors_path) if anchors_path else {"fwd": {}, "h2d": {}, "d2h_gbps": None}
    has_anchors = bool(a["fwd"] or a["h2d"] or a["d2h_gbps"])
    host = "host" in (d2h.get("backend", ""), h2d.get("backend", "")) or "host" in d2h.get("device", "").lower()
    dev = d2h.get("device") or h2d.get("device") or "?"
    backend = d2h.get("backend") or h2d.get("backend") or "?"
    missing = "- (not in that run)"  # a figure the reference run did not measure (a contestant added later)
    absent = "- (not run: see log)"  # a figure this run did not produce (its benchmark failed)

    def ref_label(j, what):
        if not j:
            return f"{what}: {ref_dir} not found"
        short = j.get("device", "?").replace("NVIDIA ", "")
        return f"{short}, {j.get('commit', '?')} {str(j.get('date', '?'))[:10]}"

    def num_or(v, nd, none, fmt=None):
        return none if v is None else (fmt(v) if fmt else f"{v:.{nd}f}")

    pct = lambda v: f"{v:+.2f}%"
    print("=" * 108)
    print(f"ferry headline: {dev} ({backend}), commit {d2h.get('commit') or h2d.get('commit') or '?'}, "
          f"{d2h.get('date') or h2d.get('date') or '?'}")
    where = "the host-emulated device (CPU threads)" if host else dev
    para(f"\"this run\": ferry and the designs it replaces, each measured in this run on {where}, every delivered "
         "byte checked." + (" Host timings are of the emulation, not of a GPU: compare the rows of a column, not this "
                            "run with the H200." if host else "")
         + f" \"{ref_label(rd2h, 'D2H reference')}\" (D2H) and \"{ref_label(rh2d, 'H2D reference')}\" (H2D): the "
         "committed H200 runs, docs/perf/h200/*.json.")
    print("More (method, every table, the targets): docs/perf/README.md")
    if has_anchors:
        print(f"\"anchor\": {anchors_path}")
    elif anchors_path:
        print(f"(anchors file {anchors_path}: not found or without figures; it is optional, no column added)")

    # ---- D2H: the simulated forward
    ref = ref_label(rd2h, "D2H reference")
    print()
    para("D2H simulated forward, overhead vs no capture (28 layers of ~60 us, 16 KiB per hook, graph replay, drain "
         "running)")
    w = 45
    print(f"  {'':<{w}}{'this run':>21}   {ref:>23}" + (f"{'anchor':>13}" if has_anchors else ""))
    print(f"  {'design':<{w}}{'28 hooks':>10}{'341 hooks':>11}   {'28 hooks':>11}{'341 hooks':>12}"
          + (f"{'28':>7}{'341':>7}" if has_anchors else ""))
    fw, rfw = d2h.get("forward", {}), rd2h.get("forward", {})
    rows = [("no capture (us per forward)", "no_capture", "no_capture"),
            ("copy only (the copy kernel, no publication)", "copy_only", "copy_only"),
            ("per-entry release (st.release.sys per entry)", "per_entry_release", "per_entry_release"),
            ("event per hook (CPU polls an event per hook)", "event_per_hook", None),
            ("ferry (K=16: one release per 16 hooks)", "ferry", "batched"),
            ("ferry gather (capture_deferred, K=16)", "ferry_gather", None)]

    def pair(vals, fmt, widths, none):  # two cells, or one message across both when neither was measured
        if all(v is None for v in vals):
            return f"{none:>{sum(widths)}}"
        return "".join(f"{num_or(v, 2, '-', fmt):>{wd}}" for v, wd in zip(vals, widths))

    for label, k, ak in rows:
        key = "no_capture_us" if k == "no_capture" else f"{k}_overhead_pct"
        fmt = (lambda v: f"{v:.1f}") if k == "no_capture" else pct
        mine = [fw.get(f"hooks{H}", {}).get(key) for H in (28, 341)]
        theirs = [rfw.get(f"hooks{H}", {}).get(key) for H in (28, 341)]
        line = f"  {label:<{w}}{pair(mine, fmt, (10, 11), absent)}   {pair(theirs, fmt, (11, 12), missing)}"
        if has_anchors:
            av = [a["fwd"].get(H, {}).get(ak) if ak else None for H in (28, 341)]
            af = (lambda v: f"{v:.0f}") if k == "no_capture" else (lambda v: f"+{v:.1f}%")
            line += "".join(f"{num_or(v, 2, '-', af):>7}" for v in av)
        print(line.rstrip())
    para("event per hook: the copy-only kernel plus an event recorded after each hook; a CPU thread polls the events "
         "and copies each completed entry D2H. The replaced designs' drains check every word, as ferry's.", indent="  ")
    print(f"\nD2H drain, 64 MiB entries: this run {num_or(d2h.get('drain_gbps_64MiB'), 1, '-')} GB/s (plain pinned "
          f"D2H memcpy {num_or(d2h.get('memcpy_d2h_gbps_64MiB'), 1, '-')} GB/s);")
    print(f"  {ref}: {num_or(rd2h.get('drain_gbps_64MiB'), 1, missing)} GB/s (memcpy "
          f"{num_or(rd2h.get('memcpy_d2h_gbps_64MiB'), 1, missing)} GB/s)"
          + (f"; anchor: memcpy {num_or(a['d2h_gbps'], 1, '-')} GB/s at 512 MiB" if has_anchors else ""))
    if d2h:
        print(f"D2H entries checked: ferry {d2h.get('entries_checked', '-')}, bad {d2h.get('entries_bad', '-')}; "
              f"the replaced designs' drains {d2h.get('baseline_entries_checked', '-')}, bad "
              f"{d2h.get('baseline_entries_bad', '-')}")
        print("  (bad entries of the old volatile flag, an invalid publication, are not failures)")
    else:
        print(f"D2H: no summary from this run ({d2h_path} is missing or unreadable: see the D2H benchmark's log)")

    # ---- H2D
    span = "span on the host-emulated device" if host else "GPU span"
    rref = ref_label(rh2d, "H2D reference")
    print()
    para(f"H2D {span}, us (event before the first upload -> end of the first-consumer kernel)"
         + (f", median of {h2d['iterations']} per cell" if h2d.get("iterations") else "")
         + (f"; reference rows: {rref}" if rh2d else ""))
    if not h2d:
        print(f"  no summary from this run ({h2d_path} is missing or unreadable: see the H2D benchmark's log)")
    print(f"  {'case':<10}{'run':<14}{'floor eager/graph':>18}{'direct':>9}{'batch API':>11}{'ferry eager (auto)':>21}"
          f"{'ferry graph (auto)':>21}")

    def h2d_row(r, none):
        g = lambda k: num_or(r.get(k), 1, none.split()[0])
        fl = f"{g('floor_us')}/{g('floor_graph_us')}"
        fe = f"{g('auto_us')} {(r.get('auto_choice') or '?')[:8]}"
        fg = f"{g('auto_graph_us')} {(r.get('auto_graph_choice') or '?')[:8]}"
        return f"{fl:>18}{g('direct_us'):>9}{g('batch_us'):>11}{fe:>21}{fg:>21}"

    cases = list(h2d.get("cases", {}))
    cases += [c for c in rh2d.get("cases", {}) if c not in cases]
    rname = f"{rh2d.get('device', '?').replace('NVIDIA ', '')} {rh2d.get('commit', '?')}"[:13]
    for c in cases:
        r, rr = h2d.get("cases", {}).get(c), rh2d.get("cases", {}).get(c)
        print(f"  {c:<10}{'this run':<14}" + (h2d_row(r, absent) if r else f"{absent:>18}"))
        print(f"  {'':<10}{rname:<14}" + (h2d_row(rr, missing) if rr else f"{missing:>18}"))
        e = a["h2d"].get(c)
        if has_anchors and e:
            fl = f"{num_or(e.get('floor'), 1, '-')}/{num_or(e.get('floor_graph'), 1, '-')}"
            print(f"  {'':<10}{'anchor':<14}{fl:>18}{num_or(e.get('direct'), 1, '-'):>9}{num_or(e.get('batch'), 1, '-'):>11}"
                  f"{num_or(e.get('best_eager'), 1, '-') + ' best':>21}{num_or(e.get('best_graph'), 1, '-') + ' best':>21}")
    para("direct: one cudaMemcpyAsync per member; batch API: cudaMemcpyBatchAsync"
         + (" (the host backend has no batched copy: one copy per member there, as direct)" if host else "")
         + "; ferry: the upload its calibration chose." + (" Anchor rows: the lower of 2 runs; in the ferry columns, "
                                                          "the best reference design of that mode." if has_anchors else ""),
         indent="  ")
    print("=" * 108)


def variant_tables(d2h_path):
    d2h = json.load(open(d2h_path))
    v = d2h.get("variants", {})
    print(f"variants: us/hook in a graph (K = 16 for ferry)\n{'variant':<36}{'4K':>9}{'16K':>9}{'64K':>9}")
    for n, m in v.get("per_hook_graph_us", {}).items():
        print(f"{n:<36}" + "".join(f"{f(m.get(P), 3):>9}" for P in ("4096", "16384", "65536")))
    fw = v.get("forward341_us", {})
    base, copy = fw.get("no_capture"), fw.get("copy_only/default")
    print("variants: forward, 341 hooks x 16 KiB (us; % vs no_capture; us/hook over copy_only/default)")
    for n, us in fw.items():
        extra = f"  {(us / base - 1) * 100:+6.2f}%" if base and us is not None else ""
        extra += f"  {(us - copy) / 341:+6.3f} us/hook" if copy and us is not None else ""
        print(f"{n:<36}{f(us, 1):>10} us{extra}")


def main(argv):
    if len(argv) >= 2 and argv[1] == "variants":
        variant_tables(argv[2] if len(argv) > 2 else "docs/perf/h200/d2h.json")
    elif len(argv) in (3, 4):
        headline(argv[1], argv[2], argv[3] if len(argv) == 4 else os.environ.get("FERRY_ANCHORS"))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
