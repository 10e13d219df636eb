#!/usr/bin/env python3
"""ferry's benchmark figures, from the benchmarks' JSON (stdlib only, no GPU needed).

  perf_tables.py d2h-summary GBENCH_JSON OUT_JSON
      Derives the D2H summary (docs/perf/h200/d2h.json's keys: per-variant us, overheads vs no capture,
      publication above the copy-only baseline, per-hook us, variants, drain GB/s, entries checked) from
      ferry_bench_d2h's Google Benchmark JSON (--benchmark_out=... --benchmark_out_format=json).
      commit/date/command: FERRY_COMMIT / FERRY_DATE / FERRY_COMMAND from the environment, else from the
      benchmark's context.
  perf_tables.py headline D2H_JSON H2D_JSON [ANCHORS_MD]
      One screen: this run's figures, ferry beside the designs it replaces (copy only, per-entry release,
      event per hook; H2D: one copy per member, cudaMemcpyBatchAsync), all measured in that run, and the
      committed H200 run (docs/perf/h200/{d2h,h2d}.json) as the reference column. ANCHORS_MD (default
      $FERRY_ANCHORS; e.g. shared/anchors-h200.md), when it exists, adds an "anchor" column; it is optional.
  perf_tables.py tables [D2H_JSON] [H2D_JSON] [--write README]   (default: docs/perf/h200/{d2h,h2d}.json)
      The markdown tables of docs/perf/README.md; --write replaces them in README between its
      <!-- d2h-tables --> / <!-- h2d-tables --> and <!-- /tables --> markers.
  perf_tables.py variants [D2H_JSON]
      The D2H variant sweeps and diagnostics as text tables.
  perf_tables.py sinks [SINKS_RAW] [EAGER_B1] OUT_JSON
  perf_tables.py sinks-tables [SINKS_JSON] [--write README]
      The native sinks (issue 28): docs/perf/h200/sinks.json from ferry_bench_sinks' JSON and the eager B=1
      block, and its table in docs/perf/README.md (<!-- sinks-tables -->); sink_tables.py says how.
  perf_tables.py select [SELECT_RAW] [QWEN3_CB] OUT_JSON
  perf_tables.py select-tables [SELECT_JSON] [--write README]
      Selective capture (issue 27): docs/perf/h200/select.json from ferry_bench_select's JSON and
      bench/torch/qwen3_cb.py's, and its section of docs/perf/README.md (<!-- select-tables -->);
      select_tables.py says how.
The targets table of docs/perf/README.md is targets.py's, the torch section's torch_tables.py's.
"""
import json
import os
import re
import sys
import textwrap

SIZES = (4096, 16384, 65536, 1048576, 16777216, 67108864)
FWD_KEYS = ("no_capture", "copy_only", "old_volatile", "per_entry_release", "event_per_hook", "ferry", "ferry_pinned",
            "copy_only_plain", "ferry_plain", "ferry_inline", "ferry_gather", "ferry_gather_fused", "ferry_gather_k32")
HOOK_KEYS = ("copy_only", "old_volatile", "per_entry_release", "ferry_k1", "ferry_k4", "ferry_k16", "ferry_k64",
             "ferry_k16_pinned", "copy_only_plain", "ferry_k16_plain", "ferry_k16_inline", "ferry_k64_inline")
CHECK_KEYS = ("entries_checked", "entries_bad", "baseline_entries_checked", "baseline_entries_bad")


def r4(v):
    return None if v is None else round(v, 4)


def f(v, nd=2):
    return "n/a" if v is None else f"{v:.{nd}f}"


# ---- d2h-summary -----------------------------------------------------------------------------------
def d2h_summary(gbench_path, out_path):
    g = json.load(open(gbench_path))
    ctx = g.get("context", {})
    forward, per_hook, variants, fwd_variants, capture_cpu = {}, {}, {}, {}, {}
    drain = memcpy = None
    checks = dict.fromkeys(CHECK_KEYS, 0)
    for b in g.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        name = re.sub(r"(/iterations:\d+|/manual_time|/repeats:\d+)+$", "", b["name"])
        for k in CHECK_KEYS:
            checks[k] += int(b.get(k, 0))
        parts = name.split("/")
        if parts[0] == "forward" and len(parts) == 3 and parts[2] == "vllm_full_b1":  # forward/<key>/vllm_full_b1
            forward.setdefault("vllm_full_b1", {})[parts[1]] = b["us_per_forward"]
        elif parts[0] == "forward" and len(parts) == 3:  # forward/<key>/hooks:<H>
            forward.setdefault(int(parts[2].split(":")[1]), {})[parts[1]] = b["us_per_forward"]
        elif parts[0] == "per_hook_graph":  # per_hook_graph/<P>: one counter per contestant
            per_hook[int(parts[1])] = {k: v for k, v in b.items() if k in HOOK_KEYS}
        elif parts[0] == "variants" and parts[1] == "fwd341":
            fwd_variants["/".join(parts[2:])] = b["us_per_forward"]
        elif parts[0] == "variants" and parts[1] == "diag":
            for k, v in b.items():
                if isinstance(v, float) and k not in CHECK_KEYS and k not in ("real_time", "cpu_time"):
                    variants.setdefault("diag/" + k, {})[int(parts[2])] = v
        elif parts[0] == "variants":
            variants.setdefault("/".join(parts[1:-1]), {})[int(parts[-1])] = b["us_per_hook"]
        elif parts[0] == "capture_cpu":  # capture_cpu/<immediate|deferred>/vllm_full_b1: producer CPU us per call
            capture_cpu[parts[1]] = b["us_per_capture"]
        elif name == "drain/ferry_64MiB":
            drain = b["GBps"]
        elif name == "drain/memcpy_ceiling_64MiB":
            memcpy = b["GBps"]

    def env(k, default):
        return os.environ.get(k) or ctx.get(k) or default

    out = {"device": ctx.get("ferry_device", "?"), "commit": env("FERRY_COMMIT", "unknown"),
           "date": env("FERRY_DATE", ctx.get("date", "unknown")), "command": env("FERRY_COMMAND", "ferry_bench_d2h"),
           "backend": ctx.get("ferry_backend", "?"), "forward": {}}
    for H in (28, 341, "vllm_full_b1"):
        m = forward.get(H, {})
        row = {f"{k}_us": r4(m.get(k)) for k in FWD_KEYS}
        base = m.get("no_capture")
        for k in FWD_KEYS[1:]:
            x = m.get(k)
            row[f"{k}_overhead_pct"] = r4((x / base - 1) * 100) if base and x is not None else None

        def over(fer, cop):  # ferry's time above the copy-only baseline launched the same way, % of no capture
            x, c = m.get(fer), m.get(cop)
            return r4((x - c) / base * 100) if base and x is not None and c is not None else None

        row["ferry_publication_over_copy_pct"] = over("ferry", "copy_only")
        row["ferry_plain_publication_over_copy_plain_pct"] = over("ferry_plain", "copy_only_plain")
        row["ferry_inline_publication_over_copy_pct"] = over("ferry_inline", "copy_only")
        row["ferry_gather_over_copy_pct"] = over("ferry_gather", "copy_only")  # gather: one kernel per K hooks
        row["ferry_gather_fused_over_copy_pct"] = over("ferry_gather_fused", "copy_only")
        out["forward"][H if isinstance(H, str) else f"hooks{H}"] = row
    out["per_hook_graph_us"] = {str(P): {k: r4(per_hook[P].get(k)) for k in HOOK_KEYS} for P in SIZES if P in per_hook}
    out["variants"] = {
        "per_hook_graph_us": {n: {str(P): r4(m.get(P)) for P in (4096, 16384, 65536)} for n, m in sorted(variants.items())},
        "forward341_us": {n: r4(v) for n, v in sorted(fwd_variants.items())}}
    out["capture_cpu_us_vllm_full_b1"] = {k: r4(v) for k, v in sorted(capture_cpu.items())}
    out["drain_gbps_64MiB"] = r4(drain)
    out["memcpy_d2h_gbps_64MiB"] = r4(memcpy)
    out.update(checks)
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=2)
        fh.write("\n")
    print(f"wrote {out_path}: entries checked {checks['entries_checked']}, bad {checks['entries_bad']}")


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


# ---- tables (docs/perf/README.md) ------------------------------------------------------------------
def tables(d2h_path, h2d_path, readme=None):
    """Prints the D2H and H2D tables, or writes them into `readme` between its <!-- d2h-tables --> and
    <!-- h2d-tables --> markers (each block ends at <!-- /tables -->)."""
    import contextlib
    import io
    d2h_buf, h2d_buf = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(d2h_buf):
        d2h_tables(json.load(open(d2h_path)))
    with contextlib.redirect_stdout(h2d_buf):
        h2d_tables(json.load(open(h2d_path)))
    if readme is None:
        print(d2h_buf.getvalue() + "\n" + h2d_buf.getvalue(), end="")
        return
    for tag, body in (("d2h-tables", d2h_buf.getvalue()), ("h2d-tables", h2d_buf.getvalue())):
        write_block(readme, f"<!-- {tag} -->", "<!-- /tables -->", "\n" + body, "perf_tables")
    print(f"updated the tables of {readme}")


def generated_block(argv, name, merge, render, default_json, marker, who, what, doc):
    """The two commands of a generated README block (sink_tables.py, select_tables.py): `NAME INPUTS... OUT_JSON`
    merges the inputs into OUT_JSON; `NAME-tables [JSON] [--write README]` prints render(JSON's content, {} where
    it does not exist), or writes it into README between `marker` and <!-- /tables -->."""
    cmd, rest = (argv[1] if len(argv) > 1 else ""), argv[2:]
    if cmd == name and rest:
        merge(rest[:-1], rest[-1])
        return
    if cmd != name + "-tables":
        sys.exit(doc)
    readme = None
    if "--write" in rest:
        i = rest.index("--write")
        readme = rest[i + 1]
        rest = rest[:i] + rest[i + 2:]
    path = rest[0] if rest else default_json
    d = {}
    if os.path.exists(path):
        with open(path) as fh:
            d = json.load(fh)
    text = render(d)
    if readme is None:
        print(text, end="")
        return
    write_block(readme, marker, "<!-- /tables -->", "\n" + text, who)
    print(f"updated {what} of {readme}")


def write_block(path, start, end, body, who):
    """Replaces what stands between the one `start` marker of `path` and the first `end` after it by `body`
    (the generated blocks of docs/perf/README.md: perf_tables.py, torch_tables.py, targets.py)."""
    text = open(path).read()
    text, n = re.subn(re.escape(start) + ".*?" + re.escape(end), lambda m: start + body + end, text, flags=re.S)
    if n != 1:
        sys.exit(f"{who}: {path}: expected one {start} ... {end} block, found {n}")
    open(path, "w").write(text)


def d2h_tables(d2h):
    print(f"Measured at: commit {d2h['commit']}, {d2h['date']}, {d2h['device']} ({d2h.get('backend', '?')}). "
          f"Drain, 64 MiB entries: {f(d2h['drain_gbps_64MiB'], 1)} GB/s (plain pinned D2H memcpy in the same run: "
          f"{f(d2h.get('memcpy_d2h_gbps_64MiB'), 1)} GB/s). Entries checked: {d2h['entries_checked']}, bad: {d2h['entries_bad']}. "
          "Simulated forward (28 layers of ~60 us, 16 KiB per hook, CUDA graph replay, drain running, every word checked), "
          "overhead vs no capture. \"Copy only\": ferry's copy kernel without publication (the floor of any capture); "
          "\"old volatile\": the invalid `__threadfence` + volatile flag; \"per-entry release\": one `st.release.sys` per "
          "entry; ferry: one release per K = 16 hooks and at the forward's end; \"publication above copy\": ferry's time "
          "above copy only, as a share of no capture; anchor \"batched\": a release kernel every 16 hooks:\n")
    print("| hooks | no capture | copy only | old volatile (invalid) | per-entry release | ferry | ferry, pinned head "
          "| ferry publication above copy | ferry, inline releases | anchor: copy only / per-entry / batched |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    anchor = {"hooks28": "+3.08% / +4.16% / +3.31%", "hooks341": "+37.5% / +51.0% / +39.1%"}
    for h in ("hooks28", "hooks341"):
        r = d2h["forward"][h]
        print(f"| {h[5:]} | {f(r['no_capture_us'], 1)} us | +{f(r['copy_only_overhead_pct'])}% | +{f(r['old_volatile_overhead_pct'])}% "
              f"| +{f(r['per_entry_release_overhead_pct'])}% | **+{f(r['ferry_overhead_pct'])}%** | +{f(r['ferry_pinned_overhead_pct'])}% "
              f"| {f(r['ferry_publication_over_copy_pct'])}% | +{f(r.get('ferry_inline_overhead_pct'))}% | {anchor[h]} |")
    if any(d2h["forward"].get(h, {}).get("ferry_gather_us") is not None for h in ("hooks28", "hooks341", "vllm_full_b1")):
        print("\nDeferred capture (capture_deferred: one gather kernel per K = 16 hooks), same forward, overhead vs no "
              "capture (vllm_full_b1: 341 hooks of DMI's vllm-full sizes at B = 1; targets: <= +0.5% at 28 hooks, "
              "<= +3% at vllm_full_b1):\n")
        print("| forward | no capture | copy only | ferry (kernel per hook) | ferry gather (defaults: release on the "
              "branch) | gather, release fused in the gather | gather K = 32 |")
        print("|---|---|---|---|---|---|---|")
        for h in ("hooks28", "hooks341", "vllm_full_b1"):
            r = d2h["forward"].get(h, {})
            def cell(k, r=r):
                v = r.get(k)
                return "n/a" if v is None else f"{'+' if v >= 0 else ''}{f(v)}%"

            print(f"| {h} | {f(r.get('no_capture_us'), 1)} us | {cell('copy_only_overhead_pct')} "
                  f"| {cell('ferry_overhead_pct')} | **{cell('ferry_gather_overhead_pct')}** "
                  f"| {cell('ferry_gather_fused_overhead_pct')} | {cell('ferry_gather_k32_overhead_pct')} |")
    print("\nPer hook in a CUDA graph (us per hook, GPU time, round-robin medians):\n")
    cols = ["copy_only", "old_volatile", "per_entry_release", "ferry_k1", "ferry_k16", "ferry_k64", "ferry_k16_pinned",
            "ferry_k16_inline"]
    print("| payload | " + " | ".join(cols) + " | anchor: copy only / per-entry / release kernel every 16 |")
    print("|---|" + "---|" * len(cols) + "---|")
    anchors = {"4096": "0.934 / 1.909 / 1.022", "65536": "1.015 / 2.174 / 1.097", "1048576": "1.287 / 2.653 / 1.371",
               "16777216": "8.113 / 9.132 / 8.200", "67108864": "37.04 / 38.05 / 37.19"}
    for size, r in d2h["per_hook_graph_us"].items():
        label = f"{int(size) // 1024} KiB" if int(size) < 1 << 20 else f"{int(size) >> 20} MiB"
        print(f"| {label} | " + " | ".join(f(r.get(c), 3) for c in cols) + f" | {anchors.get(size, '')} |")


def h2d_tables(h2d):
    print(f"Measured at: commit {h2d['commit']}, {h2d['date']}, {h2d['device']} ({h2d.get('backend', '?')}). "
          "GPU span, us, from an event before the first upload to the end of the first-consumer kernel "
          f"(median of {h2d.get('iterations', '?')} round-robin iterations per cell, in a shuffled order). `auto`: ferry's "
          "calibrated choice; `direct`: one cudaMemcpyAsync per member, `batch`: cudaMemcpyBatchAsync, the two designs a "
          "user writes today; floor: the same span with no upload:\n")
    keys = ["floor_us", "floor_graph_us", "direct_us", "batch_us", "packed_us", "zerocopy_us", "auto_us", "direct_graph_us",
            "packed_graph_us", "zerocopy_graph_us", "auto_graph_us", "auto_cpu_us"]
    print("| case | " + " | ".join(k.replace("_us", "") for k in keys) + " | auto choice |")
    print("|---|" + "---|" * len(keys) + "---|")
    for c, r in h2d["cases"].items():
        print(f"| {c} | " + " | ".join(f(r.get(k), 1) for k in keys) + f" | {r.get('auto_choice', '')} |")
    print("\nAnchors (same definition): decode256 direct 48.4, batch 19.4, DMA+scatter graph 17.8, zero-copy graph 13.6, "
          "direct graph 56.0, floor 5.3 / 3.1; tiny4 batch 8.3, graph 6.3-6.9; small64 batch 37.9, zero-copy graph 8.3.")


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
    cmd = argv[1] if len(argv) > 1 else "tables"
    if cmd == "d2h-summary" and len(argv) == 4:
        d2h_summary(argv[2], argv[3])
    elif cmd == "headline" and len(argv) in (4, 5):
        headline(argv[2], argv[3], argv[4] if len(argv) == 5 else os.environ.get("FERRY_ANCHORS"))
    elif cmd in ("sinks", "sinks-tables", "select", "select-tables"):
        sys.dont_write_bytecode = True  # the sibling import leaves no __pycache__ in the tree
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        if cmd.startswith("sinks"):
            import sink_tables
            sink_tables.main(argv)
        else:
            import select_tables
            select_tables.main(argv)
    elif cmd == "variants":
        variant_tables(argv[2] if len(argv) > 2 else "docs/perf/h200/d2h.json")
    elif cmd == "tables" or cmd.endswith(".json"):
        rest = argv[2:] if cmd == "tables" else argv[1:]
        readme = None
        if "--write" in rest:
            i = rest.index("--write")
            readme = rest[i + 1]
            rest = rest[:i] + rest[i + 2:]
        tables(rest[0] if rest else "docs/perf/h200/d2h.json", rest[1] if len(rest) > 1 else "docs/perf/h200/h2d.json", readme)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
