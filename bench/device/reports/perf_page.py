#!/usr/bin/env python3
"""docs/perf/README.md's generated blocks, from the run files of docs/perf/h200 (stdlib only, no GPU needed).

  perf_page.py --write README [--dir DIR]   rewrites every <!-- perf:NAME --> ... <!-- /perf --> block of README and
                                            redraws the plots beside it (perf_plots.py)
  perf_page.py --check README [--dir DIR]   exits 1, naming each stale block, where README is not what --write gives
  perf_page.py show NAME [JSON]             prints one section's block (NAME: SECTIONS) from JSON (default: its file
                                            in DIR; an absent file reads as {}: "not measured yet")

Each section is one run file; its targets are that file's "targets" block (bounds {"max": x} or {"min": x}, with
the reference design's figure as "anchor" where shared/anchors-h200.md has one) and decide() is the one verdict
rule. A target the file does not carry shows "-".
"""
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # the sibling import leaves no __pycache__ in the tree
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = "docs/perf/h200"
NOT_YET = "not measured yet"
UNDECIDED_TEXT = "**undecided** (the median meets it, its ci95 does not)"


# ---- the verdict ----------------------------------------------------------------------------------------------
def decide(median, ci95, target):
    """"met", "missed" or "undecided" for one figure against a target {"max": x} (or {"min": x}): met only where the
    95% interval of the median lies within the bound (noise cannot decide it), missed where the median is beyond
    it, undecided in between; the median alone where the run gave no interval. None: no figure or no target."""
    if median is None or not target:
        return None
    if "max" in target:
        beyond, inside = median > target["max"], ci95 is None or ci95[1] <= target["max"]
    elif "min" in target:
        beyond, inside = median < target["min"], ci95 is None or ci95[0] >= target["min"]
    else:
        raise ValueError(f"decide: expected a target {{'max': x}} or {{'min': x}}, got {target!r}")
    return "missed" if beyond else ("met" if inside else "undecided")


def combine(*verdicts):
    """One verdict of several figures: None if any is None, missed if any is missed, then undecided, else met."""
    if any(v is None for v in verdicts):
        return None
    return next((v for v in ("missed", "undecided") if v in verdicts), "met")


def met_cell(verdict, target=True):
    if not target:
        return "-"
    return {None: NOT_YET, "met": "yes", "missed": "**no**", "undecided": UNDECIDED_TEXT}[verdict]


def bound(t, unit="", sign=""):
    """A target's bound as the tables write it: "<= +2.5%", ">= 50 GB/s"; "-" where the file has none."""
    if not t:
        return "-"
    op, x = ("<=", t["max"]) if "max" in t else (">=", t["min"])
    if (op, x, unit) == ("<=", 0, " bad"):
        return "0 bad"
    return f"{op} {sign}{x:g}{unit}" if isinstance(x, float) and sign else f"{op} {sign}{x}{unit}"


# ---- formatting -----------------------------------------------------------------------------------------------
def get(d, *path):
    for k in path:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return d


def pct(v, nd=2):
    return "n/a" if v is None else f"{v:+.{nd}f}%"


def num(v, nd=1, unit=""):
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"


def over(x, base):
    return None if x is None or not base else (x / base - 1) * 100


def bad_count(checked, bad):
    """A count that must be 0, as a figure: nothing checked fails (inf)."""
    return None if checked is None else (bad if checked > 0 else float("inf"))


def stamp(d, name):
    when = ", ".join(x for x in (d.get("commit") and f"commit {d['commit']}", d.get("date")) if x)
    return f"{d.get('device', '?')}, {when or 'no commit or date recorded in the file'} ([{name}](h200/{name}))"


def target_table(rows):
    """rows: (what, target text, value, anchor, verdict, has target)."""
    out = ["| target | bound | value | anchor | met |", "|---|---|---|---|---|"]
    return out + [f"| {w} | {b} | {v} | {a} | {met_cell(ok, t)} |" for w, b, v, a, ok, t in rows]


def row(targets, what, value, parts, anchor=None):
    """A target row: parts [(target key, [figures], unit, label)], each figure decided against its key's bound."""
    ts = [(targets.get(k), figs, unit, label) for k, figs, unit, label in parts]
    text = "; ".join(f"{label}{bound(t, unit)}" for t, _, unit, label in ts)
    ok = combine(*(decide(v, None, t) for t, figs, _, _ in ts for v in figs)) if all(t for t, *_ in ts) else None
    anchor = anchor or next((t["anchor"] for t, *_ in ts if t and t.get("anchor")), "-")
    return what, text, value, anchor, ok, all(t for t, *_ in ts)


# ---- D2H ------------------------------------------------------------------------------------------------------
def d2h_section(d, stress=None):
    if not d:
        return f"D2H: {NOT_YET} (no d2h.json).\n"
    t, fw = d.get("targets") or {}, lambda h, k: get(d, "forward", h, k)
    stress = stress or {}
    out = [f"{stamp(d, 'd2h.json')}; GPU stress: [gpu_stress.json](h200/gpu_stress.json). Simulated forward: 28 "
           "layers of ~60 us, 16 KiB per hook (vllm_full_b1: DMI's vllm-full sizes at B = 1), CUDA graph replay, "
           "drain running, every word checked; overhead vs no capture. \"Gather\": `capture_deferred`, one gather "
           "per K = 16 hooks; \"publication\": ferry's time above copy only, % of no capture.", ""]
    drain, memcpy = d.get("drain_gbps_64MiB"), d.get("memcpy_d2h_gbps_64MiB")
    checked, bad = d.get("entries_checked"), d.get("entries_bad")
    value = "n/a" if checked is None else f"bench: {'0' if bad == 0 else f'**{bad}**'} bad of {checked:,}"
    figs = [bad_count(checked, bad)]
    if stress:
        deferred = sum(v for k, v in (stress.get("deferred") or {}).items() if k != "percent")
        value += (f"; GPU stress: {stress['forbidden']} forbidden of {stress['entries_checked']:,} "
                  f"({deferred:,} of them deferred)")
        figs.append(bad_count(stress["entries_checked"], stress["forbidden"]))
    cpu, ph = d.get("capture_cpu_us_vllm_full_b1") or {}, get(d, "per_hook_graph_us", "16384") or {}
    g = lambda h: fw(h, "ferry_gather_overhead_pct")
    rows = [row(t, "drain bandwidth, 64 MiB entries", num(drain, 1, " GB/s"), [("drain_gbps", [drain], " GB/s", "")],
                f"pinned memcpy {num(memcpy)} (same run)"),
            row(t, "no lost, torn or stale entry", value, [("entries_bad", figs, " bad", "")])]
    for h in ("hooks28", "hooks341"):
        rows.append(row(t, f"whole overhead, {h[5:]} hooks", f"**{pct(fw(h, 'ferry_overhead_pct'))}** (copy only "
                        f"{pct(fw(h, 'copy_only_overhead_pct'))})", [(f"overhead_pct_{h}", [fw(h, 'ferry_overhead_pct')], "%", "")]))
    rows.append(row(t, "gather, 28 hooks", f"**{pct(g('hooks28'))}**", [("gather_pct_hooks28", [g("hooks28")], "%", "")]))
    rows.append(row(t, "gather, vllm_full_b1 and 341 hooks", f"**{pct(g('vllm_full_b1'))}** vllm_full_b1, "
                    f"**{pct(g('hooks341'))}** 341 x 16 KiB",
                    [("gather_pct_vllm_full_b1_hooks341", [g("vllm_full_b1"), g("hooks341")], "%", "")]))
    rows.append(row(t, "eager CPU per deferred capture (C++, vllm_full_b1 sizes)",
                    f"**{num(cpu.get('deferred'), 2, ' us')}** (immediate capture {num(cpu.get('immediate'), 2, ' us')})",
                    [("deferred_capture_cpu_us", [cpu.get("deferred")], " us", "")]))
    for h in ("hooks28", "hooks341"):
        v = fw(h, "ferry_publication_over_copy_pct")
        rows.append(row(t, f"publication above copies, {h[5:]} hooks", f"**{pct(v)}**",
                        [(f"publication_pct_{h}", [v], "%", "")]))
    rows.append(row(t, "capture copy per 16 KiB hook in a graph", f"K=16 **{num(ph.get('ferry_k16'), 3, ' us')}** "
                    f"(copy only {num(ph.get('copy_only'), 3)})", [("per_hook_us_16KiB", [ph.get("ferry_k16")], " us", "")]))
    out += target_table(rows)
    anchors = d.get("anchors") or {}
    keys = ("copy_only", "old_volatile", "per_entry_release", "ferry", "ferry_pinned", "ferry_inline", "ferry_gather",
            "ferry_gather_fused", "ferry_gather_k32")
    out += ["", "| forward | no capture | copy only | old volatile (invalid) | per-entry release | ferry (K = 16) | "
                "pinned head | inline releases | gather | gather, release fused | gather K = 32 | publication | "
                "anchor: copy only / per-entry / batched |", "|---" * 13 + "|"]
    for h in ("hooks28", "hooks341", "vllm_full_b1"):
        r = get(d, "forward", h) or {}
        cells = [pct(r.get(k + "_overhead_pct")) for k in keys]
        cells[3], cells[6] = f"**{cells[3]}**", f"**{cells[6]}**"
        pub = r.get("ferry_publication_over_copy_pct")
        out.append(f"| {h} | {num(r.get('no_capture_us'), 1)} us | " + " | ".join(cells)
                   + f" | {num(pub, 2)}% | {get(anchors, 'forward', h) or '-'} |")
    return "\n".join(out) + "\n"


# ---- H2D ------------------------------------------------------------------------------------------------------
def h2d_section(h):
    if not h:
        return f"H2D: {NOT_YET} (no h2d.json).\n"
    t, c, dc = h.get("targets") or {}, lambda case, k: get(h, "cases", case, k), "decode256"
    out = [f"{stamp(h, 'h2d.json')}. GPU span, us, from an event before the first upload to the end of the "
           f"first-consumer kernel (median of {h.get('iterations', '?')} round-robin iterations per cell, shuffled). "
           "`auto`: ferry's calibrated choice; `direct`: one cudaMemcpyAsync per member, `batch`: "
           "cudaMemcpyBatchAsync, the two designs a user writes today; floor: the same span with no upload."
           + (f" Anchors (same definition): {h['anchors']['cases']}." if get(h, "anchors", "cases") else ""), ""]
    rows = [row(t, "decode256 in a graph, auto and packed", f"auto {num(c(dc, 'auto_graph_us'))} (floor "
                f"{num(c(dc, 'floor_graph_us'))}), packed {num(c(dc, 'packed_graph_us'))}",
                [("decode256_graph_us", [c(dc, "auto_graph_us"), c(dc, "packed_graph_us")], " us", "")])]
    for case in ("small64", "tiny4"):
        rows.append(row(t, f"{case} in a graph", f"auto {num(c(case, 'auto_graph_us'))} (floor "
                        f"{num(c(case, 'floor_graph_us'))})", [(f"{case}_graph_us", [c(case, "auto_graph_us")], " us", "")]))
    rows.append(row(t, "eager decode256 (auto)", f"{num(c(dc, 'auto_us'))} (floor {num(c(dc, 'floor_us'))})",
                    [("decode256_eager_us", [c(dc, "auto_us")], " us", "")]))
    rows.append(row(t, "CPU pack + enqueue (decode256)", f"auto {num(c(dc, 'auto_cpu_us'), 1, ' us')}",
                    [("cpu_us", [c(dc, "auto_cpu_us")], " us", "")]))
    worst = None  # (excess %, case, mode, best backend)
    for case, r in (h.get("cases") or {}).items():
        for mode, sfx, fixed in (("eager", "_us", ("direct", "batch", "packed", "zerocopy")),
                                 ("graph", "_graph_us", ("direct", "packed", "zerocopy"))):
            best = min(((r[k + sfx], k) for k in fixed if r.get(k + sfx) is not None), default=None)
            if best and r.get("auto" + sfx) is not None:
                excess = (r["auto" + sfx] / best[0] - 1) * 100
                if worst is None or excess > worst[0]:
                    worst = (excess, case, mode, best[1])
    rows.append(row(t, "auto beside the best fixed backend", "n/a" if worst is None else
                    f"farthest cell: {worst[1]} {worst[2]}, auto {pct(worst[0])} vs {worst[3]}",
                    [("auto_over_best_pct", [worst and worst[0]], "%", "")]))
    out += target_table(rows)
    keys = ("floor_us", "floor_graph_us", "direct_us", "batch_us", "packed_us", "zerocopy_us", "auto_us",
            "direct_graph_us", "packed_graph_us", "zerocopy_graph_us", "auto_graph_us", "auto_cpu_us")
    out += ["", "| case | " + " | ".join(k.replace("_us", "") for k in keys) + " | auto choice |",
            "|---" * (len(keys) + 2) + "|"]
    out += [f"| {case} | " + " | ".join(num(r.get(k), 1) for k in keys) + f" | {r.get('auto_choice', '')} |"
            for case, r in (h.get("cases") or {}).items()]
    return "\n".join(out) + "\n"


# ---- torch (and the Python capture cost) ------------------------------------------------------------------------
MODES = (("b1_eager", "B=1 eager"), ("b1_graph", "B=1 graph"), ("b16_graph", "B=16 graph"))
PRESETS = (("hidden_states", "hidden-states (28)"), ("vllm_full", "vllm-full (341)"))
CONTESTANTS = (("ferry_ms", "ferry"), ("gather_ms", "ferry gather"), ("torch_copy_ms", "torch copies"))


def torch_section(d, py=None):
    if not d:
        return f"torch: {NOT_YET} (no torch_qwen3.json).\n"
    t, c, nz = d.get("targets") or {}, d.get("check") or {}, d.get("noise") or {}
    out = [f"{stamp(d, 'torch_qwen3.json')}: `{d.get('command', '?')}`. transformers `Qwen3ForCausalLM` "
           "(Qwen3-0.6B's config, random bf16 weights, static KV cache), the whole 128-token greedy generation "
           "(median). ferry: immediate capture; ferry gather: deferred, a gather per 128 hooks; torch copies: the "
           "torch-native copy per hook. One release per forward, one memory pool for all graphs "
           "([step_probe.json](h200/step_probe.json)). Entries checked bit-exact against witness copies (a synchronous copy of each hooked tensor "
           f"beside its capture): {d.get('entries_checked', 0)}, bad: {d.get('entries_bad', '?')}."
           + (f" The uncaptured replay is no reference: two whole uncaptured generations differ in "
              f"{c.get('reference_vs_reference_bad', '?')} captures." if c else "")
           + (" Noise floor of the graph rows (the no-capture step captured twice): "
              + ", ".join(f"{name} {nz[k]['spread_pct']:+.2f}%" for k, name in MODES if k in nz) + "." if nz else ""),
           ""]

    def ov(preset, who):
        m = get(d, "decode", "b1_graph") or {}
        return over(get(m, preset, who), m.get("no_capture_ms"))

    rows = []
    for preset, name in (("hidden_states", "hidden-states"), ("vllm_full", "vllm-full")):
        ferry, gather, copies = (ov(preset, k) for k in ("ferry_ms", "gather_ms", "torch_copy_ms"))
        share = None if ferry is None or not copies else ferry / copies
        parts = [(f"b1_graph_{preset}_ferry_pct", [ferry], "%", "ferry ")]
        if f"b1_graph_{preset}_ferry_share_of_copies" in t:
            parts.append((f"b1_graph_{preset}_ferry_share_of_copies", [share], "x the copies' overhead", "ferry "))
        parts.append((f"b1_graph_{preset}_gather_pct", [gather], "%", "gather "))
        rows.append(row(t, f"b1_graph {name}", f"immediate capture **{pct(ferry)}**, gather **{pct(gather)}**; torch "
                        f"copies {pct(copies)}", parts))
    checked, bad = d.get("entries_checked"), d.get("entries_bad")
    rows.append(row(t, "entries bad, entries checked > 0", "n/a" if checked is None else f"{bad} bad of {checked:,}",
                    [("entries_bad", [bad_count(checked, bad)], " bad", "")]))
    cells, ratios = [], []
    for mode in ("eager", "graph"):
        s = get(d, "h2d_step", mode) or {}
        if s.get("torch_copies_us") and s.get("ferry_us") is not None:
            ratios.append(s["ferry_us"] / s["torch_copies_us"])
            cells.append(f"{mode} {s['ferry_us']:.1f} vs {s['torch_copies_us']:.1f} us (**{ratios[-1]:.2f}x**)")
    rows.append(row(t, "H2D decode step B=64, ferry / per-tensor copies", ", ".join(cells) or "n/a",
                    [("h2d_step_ratio", ratios or [None], "x", "")]))
    if py:
        above, paths = py.get("above_cpp_us") or {}, py.get("paths_us") or {}
        names = (("hooks_auto", "`ferry.hooks.capture_fn`"), ("channel_default", "`Channel.capture`"),
                 ("op_default", "torch op `.default`"))
        cells = [f"{label} {num(paths.get(k), 2)} us (+{num(above.get(k), 2)})" for k, label in names]
        rows.append(row(py.get("targets") or {}, "Python eager capture, CPU per hook above the C++ call "
                        "([capture_cost.json](h200/capture_cost.json))",
                        ", ".join(cells) + f" vs C++ {num(py.get('cpp_capture_us'), 2)} us",
                        [("above_cpp_us", [above.get(k) for k, _ in names], " us", "")]))
    out += target_table(rows)
    out += ["", "| decode | no capture | preset | " + " | ".join(n for _, n in CONTESTANTS) + " |",
            "|---|---|---|" + "---|" * len(CONTESTANTS)]
    for key, name in MODES:
        m = get(d, "decode", key)
        if not m or not m.get("no_capture_ms"):
            continue  # a mode not run here (graphs on the host backend)
        base = m["no_capture_ms"]
        for pk, pname in PRESETS:
            p = m.get(pk) or {}
            cells = [f"{p[k]:.1f} ms ({pct(over(p[k], base))})" if p.get(k) is not None else "-" for k, _ in CONTESTANTS]
            out.append(f"| {name} | {base:.1f} ms | {pname} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


# ---- selective capture (issue 27) ------------------------------------------------------------------------------
SELECT_BLOCKS = ("d2h_t256_select16", "d2h_t16_full", "prefill_last_token")
K = 128  # ferry_bench_select's publish_every: the table's first column


def select_section(d):
    t = d.get("targets") or {}
    t256, t16, pre = (d.get(k) or {} for k in SELECT_BLOCKS)
    q, k1 = d.get("qwen3_cb") or {}, d.get("k1024") or {}
    o256, o16, opre = (b.get("overhead_pct") or {} for b in (t256, t16, pre))
    k256, kpre = k1.get("d2h_t256_select16_overhead_pct") or {}, k1.get("prefill_last_token_overhead_pct") or {}
    device = re.sub(r"^NVIDIA |\s*\(.*$", "", d.get("device") or "?")
    commit = d.get("commit") or "?"
    ms = lambda b: "?" if b.get("no_capture_us") is None else f"{b['no_capture_us'] / 1000:.1f}"
    checked = sum(b.get("entries_checked", 0) for b in (t256, t16, pre))
    bad = sum(b.get("entries_bad", 0) for b in (t256, t16, pre))
    lines = [f"## Selective capture (issue 27), {device}, commit {commit}, {(d.get('date') or '?')[:10]}",
             (f"`FERRY_COMMIT={commit} bash bench/device/drivers/h200.sh select qwen3cb` "
                  "([select.json](h200/select.json)): a simulated 28-layer forward in a CUDA graph, the no-capture "
                  f"step about a Qwen3-0.6B step's time ({ms(t256)} ms at 256 tokens, {ms(t16)} ms at 16, {ms(pre)} "
                  "ms at 8192), each step's selection published by `h2d::publisher`; medians of 15 interleaved rounds; "
                  f"every delivered row checked ({bad:,} bad of {checked:,} entries). " + qwen3_prose(q))]
    k1c = k1.get("commit")
    lines += ["", f"| scenario | target | K = {K} | {f'K = 1024 ({k1c})' if k1c else 'K = 1024'} | met |",
              "|---|---|---|---|---|"]

    def sel_row(what, key, value, k1024_value, figs, text=None):
        tk = t.get(key) if key else None
        tx = text or (bound(tk, "%", "+") if key else "-")
        ok = combine(*(decide(v, None, tk) for v in figs)) if tk else None
        lines.append(f"| {what} | {tx} | {value} | {k1024_value if k1 else '-'} | {met_cell(ok, bool(key) and tk)} |")

    sp = lambda v, nd=2, b=False: NOT_YET if v is None else (f"**{v:+.{nd}f}%**" if b else f"{v:+.{nd}f}%")
    sel_row("256 tokens, a random 1/16 of the rows (16), vllm-full, `capture_rows_deferred` (one gather per batch)",
            "t256_gather", sp(o256.get("ferry_gather"), b=True), sp(k256.get("ferry_gather")), [o256.get("ferry_gather")])
    sel_row("same, `capture_rows` (a select kernel per hook)", None, sp(o256.get("ferry"), 1), sp(k256.get("ferry"), 1), [])
    sel_row("same, every row captured (full capture, gather; the PCIe limit)", None, sp(o256.get("full_capture"), 0),
            sp(k256.get("full_capture"), 0), [], "(today +184%)")
    sel_row("16 tokens, every row captured (gather)", "t16_full", sp(o16.get("ferry_gather"), b=True),
            sp(k1.get("d2h_t16_full_overhead_pct")), [o16.get("ferry_gather")])
    for p, what in (("hidden_states", "prefill 16 x 512 tokens, last token of each request, hidden-states"),
                    ("vllm_full", "same, vllm-full")):
        sel_row(what, "prefill", sp(opre.get(p), b=True), sp(kpre.get(p)), [opre.get(p)])
    none = q.get("no_capture_ms")
    qo = [None if x is None else round(x, 2) for x in (over(q.get(p + "_ms"), none) for p, _ in PRESETS)]
    qt = [t.get("qwen3_" + p) for p, _ in PRESETS]
    ok = combine(*(decide(v, None, x) for v, x in zip(qo, qt))) if all(qt) else None
    lines.append("| Qwen3 continuous batching, B = 64 decode in a graph, 4-16 requests selected per step, hidden-states "
                 f"/ vllm-full (`qwen3_cb`) | {bound(qt[0], '%', '+')} / {bound(qt[1], '%', '+')} | "
                 f"{NOT_YET if None in qo else '**' + sp(qo[0]) + ' / ' + sp(qo[1]) + '**'} | - | {met_cell(ok, all(qt))} |")
    return "\n".join(lines) + "\n"


def qwen3_prose(q):
    if not q:
        return f"`qwen3_cb`: {NOT_YET} (`bash bench/device/drivers/h200.sh qwen3cb`)."
    none, pp = q.get("no_capture_ms"), q.get("per_preset") or {}
    f2 = lambda v: "?" if v is None else f"{v:.2f}"
    per = lambda key: " / ".join(f2((pp.get(p) or {}).get(key)) for p, _ in PRESETS)
    torch_over = [over((pp.get(p) or {}).get("torch_select_ms"), none) for p, _ in PRESETS]
    tp = lambda v, nd: "?" if v is None else f"{round(v, 2):+.{nd}f}%"
    return ("`qwen3_cb` ([qwen3_cb.json](h200/qwen3_cb.json)): Qwen3-0.6B-shaped, B = 64 decoding 64 tokens in a "
            f"`torch.cuda.graph`, medians of 10 generations: no capture {f2(none)} ms; `ferry.hooks.rows_capture` "
            f"{f2(q.get('hidden_states_ms'))} / {f2(q.get('vllm_full_ms'))} ms (hidden-states / vllm-full); every row "
            f"captured, selected on the CPU {per('cpu_select_ms')} ms; torch's `index_select` + pinned copy "
            f"{per('torch_select_ms')} ms ({tp(torch_over[0], 2)} / {tp(torch_over[1], 1)}); "
            f"{q.get('rows_checked', 0):,} rows checked, {q.get('rows_bad', '?')} bad, {q.get('misattributed', '?')} "
            "misattributed.")


# ---- native sinks (issue 28) ------------------------------------------------------------------------------------
# The eager contestants in the order the rows list them, with their names there; ferry's modes for the best-mode
# target (immediate, per-hook deferred, the Collector's hand-over).
EAGER_KINDS = (("ferry", "ferry"), ("deferred", "deferred"), ("collect", "Collector"), ("bounce", "bounce"),
               ("torch", "torch copies"), ("hooks", "no-op hooks"))
BEST_MODES = ("ferry", "deferred", "collect")
PAIRS = ("deferred_minus_ferry_pp", "collect_minus_ferry_pp", "ferry_minus_torch_pp")


def _sink_row(what, value, target, ok, has_target=True):
    met = NOT_YET if not value else ("-" if target == "-" else met_cell(ok, has_target))
    return f"| {what} | {value if value else NOT_YET} | {target} | {met} |"


def eager_verdict(t, preset, modes, pair):
    """(target, verdict) of an eager row: hidden-states, ferry's best mode (`modes`: {kind: (overhead %, ci95)}, None
    where not timed) within its bound; vllm-full, ferry - torch copies (pp); both, deferred - immediate where
    measured (`pair`: {difference: (median pp, ci95)}); each decided by decide on its ci95."""
    if preset == "hidden_states":
        timed = {k: m for k, m in modes.items() if m[0] is not None}
        best = min(timed, key=lambda k: timed[k][0]) if timed else None
        tb = t.get("eager_best_mode_pct")
        target = f"ferry {bound(tb, '%', '+')}" + (f" (best mode: {best})" if best else "")
        ok = None if best is None else decide(*timed[best], tb)
    else:
        tb = t.get("eager_ferry_minus_torch_pp")
        target = "ferry <= the torch copies" if tb == {"max": 0} else f"ferry - torch copies {bound(tb, ' pp')}"
        ok = decide(*pair.get("ferry_minus_torch_pp", (None, None)), tb)
    td = t.get("eager_deferred_minus_ferry_pp")
    deferred = decide(*pair.get("deferred_minus_ferry_pp", (None, None)), td)
    if ok is not None and deferred is not None:
        ok = combine(ok, deferred)
    return target + ("; deferred <= immediate" if td == {"max": 0} else f"; deferred - immediate {bound(td, ' pp')}"), ok


def sinks_section(d):
    t = d.get("targets") or {}
    st, shm, eg = d.get("safetensors") or {}, d.get("shm") or {}, d.get("eager_b1") or {}
    fw = d.get("forward") or {}
    lines = [(f"{stamp(d, 'sinks.json')}: `{d.get('command', '?')}`." if d.get("commit") else
              f"{NOT_YET.capitalize()}: no [sinks.json](h200/sinks.json) (`bash bench/device/drivers/h200.sh sinks`).")
             + f" The forward: {fw.get('layers', 28)} layers of a spin kernel, {fw.get('hooks', 341)} hooks of DMI's "
             f"vllm-full sizes at {fw.get('tokens', 16)} tokens per step"
             + (f" ({fw['step_bytes'] / 1e6:.1f} MB per step)" if fw.get("step_bytes") else "")
             + ", `capture_deferred`, CUDA graph replay; overheads vs the forward alone, medians of interleaved "
               "rounds; every captured byte checked. safetensors: against the disk's O_DIRECT rate in the same run; "
               "shm: the stream read by another process. Eager rows: `bench/torch/qwen3_eager.py`, every contestant "
               "interleaved per step; the pooled rows: every kept run's rounds (`bench/torch/eager_pool.py`).",
             "", "| benchmark | figure | target | met |", "|---|---|---|---|"]

    def trow(what, value, key, figs, text, unit=""):
        tk = t.get(key)
        ok = combine(*(decide(v, None, tk) for v in figs)) if tk else None
        lines.append(_sink_row(what, value, text(tk) if tk else "-", ok, bool(tk)))

    disk, sink = st.get("disk_write_gbps"), st.get("sink_write_gbps")
    ratio = sink / disk * 100 if disk and sink is not None else None
    trow("safetensors sink, policy block, fsync on: sustained write while the forward runs",
         sink is not None and f"**{sink:.3f} GB/s** vs the disk's {num(disk, 3)} GB/s (O_DIRECT, same filesystem and "
                              f"size, same run): {num(ratio, 1)}%", "sink_pct_of_disk", [ratio],
         lambda tk: bound(tk, "% of the disk"))
    fo, no, drop = st.get("forward_overhead_pct"), st.get("null_consumer_overhead_pct"), st.get("drop") or {}
    lines.append(_sink_row("safetensors sink, policy drop: the forward's cost",
                           fo is not None and f"{pct(fo)} (null in-process consumer {pct(no)}); "
                                              f"{drop.get('dropped_forwards', '?')} of {drop.get('forwards_captured', '?')} "
                                              "forwards dropped whole", "-", None))
    blk, chk = st.get("block") or {}, st.get("entries_checked")
    torn = (blk.get("forwards_torn") or 0) + (drop.get("forwards_torn") or 0)
    trow("safetensors: shards read back",
         chk is not None and f"{chk:,} entries checked, {st.get('entries_bad')} bad; block: "
                             f"{blk.get('forwards_missing', '?')} forwards missing, {blk.get('stalls', '?')} stalls; "
                             f"torn forwards: {torn}", "entries_bad",
         [None if chk is None else bad_count(chk, st.get("entries_bad") + (blk.get("forwards_missing") or 0) + torn)],
         lambda tk: "0 bad, none missing or torn" if tk == {"max": 0} else bound(tk, " bad"))
    thr, rg = shm.get("throughput") or {}, shm.get("reader_gbps")
    trow(f"shm stream: a reader process receives {(thr.get('entry_bytes') or 64 << 20) >> 20} MiB entries",
         rg is not None and f"**{rg:.2f} GB/s** (pinned D2H memcpy {num(thr.get('memcpy_d2h_gbps'), 2)} GB/s in the "
                            "same run)", "reader_gbps", [rg], lambda tk: bound(tk, " GB/s"))
    so, si = shm.get("forward_overhead_pct"), shm.get("in_process_overhead_pct")
    gap = so - si if so is not None and si is not None else None
    trow("shm stream: the forward's cost with the reader process attached",
         so is not None and f"**{pct(so)}** vs {pct(si)} with an in-process null consumer (gap {num(gap, 2)} pp)",
         "gap_pp", [gap], lambda tk: f"within {tk['max']} pp")
    sc = shm.get("entries_checked")
    trow("shm stream: entries checked in the reader process",
         sc is not None and f"{sc:,} checked, {shm.get('entries_bad')} bad ({shm.get('check', '')})", "entries_bad",
         [None if sc is None else bad_count(sc, shm.get("entries_bad"))],
         lambda tk: "0 bad" if tk == {"max": 0} else bound(tk, " bad"))
    lines += eager_rows(t, eg) + pooled_rows(t, d.get("eager_pooled") or {})
    return "\n".join(lines) + "\n"


def eager_rows(t, eg):
    """The published eager B=1 run's rows (qwen3_eager.py's block): every contestant's median and intervals."""
    rows, base, src = [], eg.get("no_capture_ms"), eg.get("source") or {}
    for preset, label in (("hidden_states", "hidden-states (28 hooks)"), ("vllm_full", "vllm-full (341 hooks)")):
        p = eg.get(preset) or {}
        paired, spread, ci95 = p.get("overhead_pct") or {}, p.get("spread_pct") or {}, p.get("ci95_pct") or {}

        def ov(kind, x):  # the bench's paired median where it gives one, else the ratio of the medians
            return paired[kind] if kind in paired else over(x, base)

        def cell(kind, name, x):
            sp, ci = spread.get(kind), ci95.get(kind)
            tail = f" [p10..p90 {pct(sp[0])}..{pct(sp[1])}]" if sp else ""
            tail += f" [ci95 {pct(ci[0])}..{pct(ci[1])}]" if ci else ""
            return f"{name} {num(x, 3)} ms ({pct(ov(kind, x))}{tail})"

        ms = lambda k: p.get({"torch": "torch_copy_ms", "hooks": "hooks_only_ms"}.get(k, k + "_ms"))
        shown = [(k, n) for k, n in EAGER_KINDS if k in paired or k not in ("bounce", "hooks", "collect")
                 or (k == "collect" and p.get("collect_ms") is not None)]
        value = p.get("ferry_ms") is not None and base and (
            ", ".join(cell(k, n, ms(k)) for k, n in shown)
            + f"; no capture {num(base, 3)} ms; {eg.get('rounds', '?')} rounds of {eg.get('tokens_per_round', '?')}"
              f" steps, main-thread CPU per step{'; commit ' + src['commit'] if src.get('commit') else ''}")
        comp = p.get("comparisons_pp") or {}

        def diff(name, a, b):  # the bench's paired difference (median, ci95) where it gives one
            c = comp.get(name) or {}
            return (c["median"], c.get("ci95")) if "median" in c else ((None if a is None or b is None else a - b), None)

        fo, do, to = ov("ferry", p.get("ferry_ms")), ov("deferred", p.get("deferred_ms")), ov("torch", ms("torch"))
        modes = {k: (ov(k, p.get(k + "_ms")), ci95.get(k)) for k in BEST_MODES}
        pair = {"ferry_minus_torch_pp": diff("ferry_minus_torch_pp", fo, to),
                "deferred_minus_ferry_pp": diff("deferred_minus_ferry_pp", do, fo) if do is not None else (None, None)}
        target, ok = eager_verdict(t, preset, modes, pair)
        rows.append(_sink_row(f"eager B=1, Qwen3-0.6B-shaped, a sink running: {label}", value, target, ok))
    return rows


def pooled_rows(t, pb):
    """The eager rows of every kept run pooled ("eager_pooled": eager_pool.py's figures), decided as the published
    run's are (decide on the pooled median and ci95)."""
    rows = []
    for preset, label in (("hidden_states", "hidden-states (28 hooks)"), ("vllm_full", "vllm-full (341 hooks)")):
        f = pb.get(preset)
        if not f:
            continue
        most = max(((x.get("runs", 0), x.get("rounds", 0)) for x in f.values()), default=(0, 0))

        def cell(name, x, unit):
            tail = f" [ci95 {x['ci95'][0]:+.2f}..{x['ci95'][1]:+.2f}]" if x.get("ci95") else ""
            fewer = (x.get("runs", 0), x.get("rounds", 0)) != most  # a contestant only some runs timed
            return f"{name} {x['median']:+.2f}{unit}{tail}" + (f" ({x.get('rounds')} rounds of {x.get('runs')} runs)"
                                                                 if fewer else "")

        parts = [cell(n, f[k], "%") for k, n in EAGER_KINDS if k in f]
        parts += [cell(k.replace("_minus_", " - ").replace("_pp", ""), f[k], " pp") for k in PAIRS if k in f]
        mc = lambda k: (f[k]["median"], f[k].get("ci95")) if k in f else (None, None)
        rows.append(_sink_row(f"eager B=1, {label}: every kept run pooled ({most[0]} runs, {most[1]} rounds, "
                              "[eager_rounds.json](h200/eager_rounds.json))", "; ".join(parts),
                              *eager_verdict(t, preset, {k: mc(k) for k in BEST_MODES}, {k: mc(k) for k in PAIRS})))
    return rows


# ---- engine (issue 40) -------------------------------------------------------------------------------------------
def engine_section(d):
    if not d:
        return f"Engine: {NOT_YET} (no engine.json).\n"
    t = d.get("targets") or {}
    e, s, a, n = (d.get(k) or {} for k in ("eagle3", "sae_shm", "all_layers_disk", "naive"))
    runs = d.get("runs") or [d]
    ratio = lambda b: None if b.get("ratio") is None else b["ratio"] * 100
    out = [f"{stamp(d, 'engine.json')}: transformers {d.get('transformers', '?')} continuous batching, CUDA graphs, a "
           f"Qwen3-0.6B-shaped model (random bf16), {d.get('requests', '?')} requests (prompts 64..1024, 128 new "
           "tokens, greedy), the contestants interleaved per round; tokens/s to the last result, medians; each row "
           "beside the no-capture contestant of its own run (" + "; ".join(
               f"run {i}: {r.get('commit')} {r.get('date')}, {r.get('rounds')} round{'s' * (r.get('rounds') != 1)}"
               for i, r in enumerate(runs))
           + ").", ""]

    def share(b, label, key, extra=""):
        v = ratio(b)
        late = "" if "ferry_tok_s_written" in b else ", timed until the last sample was written"
        value = "n/a" if v is None else (f"**{v:.1f}%** ({b['ferry_tok_s']:,.0f} vs {b['no_capture_tok_s']:,.0f} "
                                         f"tokens/s, run {b.get('run', 0)}{late}){extra}")
        return row(t, label, value, [(key, [v], "%", "")])
    bad = sum(b.get("samples_bad", 0) for b in (e, s, a)) + (d.get("misattributed") or 0)
    checked = sum(b.get("samples", 0) for b in (e, s, a))
    tail = "" if a.get("write_tail_s") is None else f"; every sample written {a['write_tail_s']:.2f} s after the last result"
    disk = a.get("disk_write_gbps")
    rows = [share(e, "EAGLE-3 preset (4 taps, prompt + generated), per-request files", "eagle3_pct",
                  f"; naive hooks {n.get('naive_tok_s', 0):,.0f} tokens/s ({(n.get('ratio') or 0) * 100:.1f}%)" if n else ""),
            share(s, "SAE preset (one layer, every token), shm stream + a reader process", "sae_pct"),
            share(a, "every layer's residual (29 taps), every token, per-request files on the disk", "all_layers_pct",
                  f"; the sink wrote {num(a.get('sink_write_gbps'), 2)} GB/s, the disk {num(disk, 2)} GB/s{tail}"),
            row(t, "samples bad, rows misattributed (every sample checked against the plain forward)",
                f"{bad} of {checked:,} samples", [("bad", [bad_count(checked, bad)], " bad", "")])]
    out += target_table(rows)
    return "\n".join(out) + "\n"


# ---- reducers and writers (issue 41) -----------------------------------------------------------------------------
def reduce_section(d):
    if not d:
        return f"Reducers: {NOT_YET} (no reduce.json).\n"
    t = d.get("targets") or {}
    cmd = str(d.get("command", "")).split()

    def arg(name, default):  # reduce_bench's option as the recorded command gave it, else its default
        return cmd[cmd.index(name) + 1] if name in cmd[:-1] else default
    out = [f"{stamp(d, 'reduce.json')}: `bench/torch/reduce_bench.py`, DMI vllm-full shapes at 256 tokens a step (graph "
           f"replay, {arg('--reps', '20')} rounds of {arg('--steps', '20')} back-to-back steps, medians) and a "
           "16-request 512-token prefill; every reduced entry "
           "checked against torch. Writers: rate against the medium measured in the same run (" + "; ".join(
               f"{k}: {d[k].get('commit')}" for k in ("arrow", "safetensors_tmpfs", "safetensors_disk")
               if isinstance(d.get(k), dict)) + ")." + (f" Note: {d['note']}" if d.get("note") else ""), ""]

    def ovr(key, label, tkey):
        b = d.get(key) or {}
        v = b.get("overhead_pct")
        text = "n/a" if v is None else (f"**+{v:.1f}%** ({b['ferry_us']:,.0f} vs {b['no_capture_us']:,.0f} us; "
                                         f"{b.get('entries_checked', 0)} entries, {b.get('entries_bad', 0)} bad)")
        return row(t, label, text, [(tkey, [v], "%", "")])

    def share(key, label, tkey, rate="sink_write_gbps", medium="medium_gbps"):
        b = d.get(key) or {}
        m = b.get(medium, b.get("disk_write_gbps"))
        v = None if not m or b.get(rate) is None else 100 * b[rate] / m
        text = "n/a" if v is None else f"**{v:.1f}%** ({b[rate]:.3f} of {m:.3f} GB/s)"
        if v is not None and b.get("setting"):  # measured with options other than the default: say which
            text += f"; {b['setting'].split(':')[0]}"
        return row(t, label, text, [(tkey, [v], "%", "")])
    bad = sum((d.get(k) or {}).get("entries_bad", 0) for k in ("t256_topk64", "t256_fp8_topk64", "prefill_mean"))
    bad += (d.get("arrow") or {}).get("rows_bad", 0)
    rows = [ovr("t256_topk64", "t256: logits as top-64, every other tap whole", "topk64_pct"),
            ovr("t256_fp8_topk64", "t256: every bf16 tap fp8, logits top-64", "fp8_topk64_pct"),
            ovr("prefill_mean", "per-request mean, 16 x 512-token prefill, every layer", "prefill_mean_pct"),
            share("arrow", "Arrow sink vs the disk (buffered or O_DIRECT, the higher)", "arrow_share_pct"),
            share("safetensors_tmpfs", "safetensors sink vs tmpfs (dd on as many files as the sink writes)",
                  "safetensors_tmpfs_pct"),
            share("safetensors_disk", "safetensors sink vs the disk (O_DIRECT dd)", "safetensors_disk_pct"),
            row(t, "reduced entries and Arrow rows bad", f"{bad} bad", [("bad", [bad], " bad", "")])]
    out += target_table(rows)
    return "\n".join(out) + "\n"


# ---- the page -------------------------------------------------------------------------------------------------
SECTIONS = {  # name: (run files, renderer)
    "d2h": (("d2h.json", "gpu_stress.json"), d2h_section),
    "h2d": (("h2d.json",), h2d_section),
    "torch": (("torch_qwen3.json", "capture_cost.json"), torch_section),
    "select": (("select.json",), select_section),
    "sinks": (("sinks.json",), sinks_section),
    "engine": (("engine.json",), engine_section),
    "reduce": (("reduce.json",), reduce_section),
}
BLOCK = re.compile(r"(<!-- perf:(\w+) -->\n)(.*?)(<!-- /perf -->)", re.S)


def load(path):
    """A run file's content; {} where it does not exist."""
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        try:
            return json.load(fh)
        except ValueError as e:
            sys.exit(f"perf_page: {path}: expected a JSON run file, got unreadable JSON ({e})")


def render(name, folder=DEFAULT_DIR, path=None):
    if name not in SECTIONS:
        sys.exit(f"perf_page: expected a section among {', '.join(SECTIONS)}, got {name!r}")
    files, fn = SECTIONS[name]
    data = [load(path if path and i == 0 else os.path.join(folder, f)) for i, f in enumerate(files)]
    return fn(*data)


def page(text, folder=DEFAULT_DIR, readme="README"):
    """`text` with every perf block rendered; exits naming the problem where a block is unknown or missing."""
    found = [m.group(2) for m in BLOCK.finditer(text)]
    missing, unknown = [n for n in SECTIONS if n not in found], [n for n in found if n not in SECTIONS]
    if missing or unknown or len(found) != len(set(found)):
        sys.exit(f"perf_page: {readme}: expected one <!-- perf:NAME --> ... <!-- /perf --> block per section "
                 f"({', '.join(SECTIONS)}), got {', '.join(found) or 'none'}")
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), folder) + m.group(4), text)


def main(argv):
    folder = DEFAULT_DIR
    if "--dir" in argv:
        i = argv.index("--dir")
        folder = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if len(argv) == 2 and argv[0] in ("--write", "--check"):
        readme = argv[1]
        with open(readme) as fh:
            old = fh.read()
        new = page(old, folder, readme)
        if argv[0] == "--check":
            stale = [a.group(2) for a, b in zip(BLOCK.finditer(old), BLOCK.finditer(new)) if a.group(0) != b.group(0)]
            if stale:
                sys.exit(f"perf_page: {readme}: stale blocks {', '.join(stale)} (expected what the run files of "
                         f"{folder} give): run python3 bench/device/reports/perf_page.py --write {readme}")
            print(f"perf_page: {readme} is what {folder} gives")
            return
        with open(readme, "w") as fh:
            fh.write(new)
        sys.path.insert(0, HERE)
        import perf_plots
        perf_plots.draw(folder, os.path.dirname(readme) or ".")
        print(f"perf_page: rewrote the blocks of {readme} from {folder}")
    elif argv and argv[0] == "show" and len(argv) in (2, 3):
        print(render(argv[1], folder, argv[2] if len(argv) == 3 else None), end="")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
