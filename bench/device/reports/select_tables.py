#!/usr/bin/env python3
"""ferry's selective-capture figures (issue 27): docs/perf/h200/select.json and its README section (stdlib only,
no GPU needed). perf_tables.py's `select` and `select-tables` commands run these:

  perf_tables.py select [SELECT_RAW] [QWEN3_CB] OUT_JSON
      Merges into OUT_JSON (kept where it exists: each input replaces only its own blocks) the
      d2h_t256_select16, d2h_t16_full and prefill_last_token blocks derived from ferry_bench_select's JSON
      (SELECT_RAW: its stdout, select_raw.json; medians in us, overheads vs no capture) and the qwen3_cb block of
      bench/torch/qwen3_cb.py's JSON (QWEN3_CB; its own commit/date/command go into the block's "source").
      With SELECT_RAW, device/commit/date/command come from FERRY_DEVICE / FERRY_COMMIT / FERRY_DATE /
      FERRY_COMMAND (else OUT_JSON's), and the blocks it replaces move, with the old commit and date, to
      "previous_run" (unless the commit is the same: a re-merge of one run). Other keys (method, k1024) stay.
      Each input is recognised by its keys; a path that does not exist or "-" is skipped (say so).
  perf_tables.py select-tables [SELECT_JSON] [--write README]   (default: docs/perf/h200/select.json)
      docs/perf/README.md's selective-capture section (heading, method, the table with its "met" column, the
      qwen3_cb paragraph); --write replaces it between README's <!-- select-tables --> and <!-- /tables -->.
"""
import json
import os
import re
import sys
import textwrap

sys.dont_write_bytecode = True

STAMP = ("device", "commit", "date", "command")
D2H_BLOCKS = ("d2h_t256_select16", "d2h_t16_full", "prefill_last_token")
ORDER = STAMP + ("method",) + D2H_BLOCKS + ("qwen3_cb", "k1024", "previous_run")
QWEN3_KEYS = ("no_capture_ms", "hidden_states_ms", "vllm_full_ms", "cpu_select_ms", "torch_select_ms", "rows_checked",
              "rows_bad", "misattributed", "per_preset")
PRESETS = ("hidden_states", "vllm_full")
# issue 27's targets: the overhead vs no capture, %
TARGETS = {"t256_gather": 2.5, "t16_full": 2.0, "prefill": 1.0, "qwen3_hidden_states": 1.0, "qwen3_vllm_full": 3.0}
K = 128  # ferry_bench_select's publish_every: the table's first column
DEFAULT_JSON = "docs/perf/h200/select.json"
NOT_YET = "not measured yet"


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def over(x, none):
    return None if x is None or not none else round((x / none - 1) * 100, 2)


def _checks(*blocks):
    return {"entries_checked": sum(b.get("entries_checked", 0) for b in blocks),
            "entries_bad": sum(b.get("entries_bad", 0) for b in blocks)}


def from_raw(raw):
    """select.json's d2h blocks from ferry_bench_select's JSON (those it has)."""
    out = {}
    t = raw.get("d2h_t256_select16")
    if t:
        none = t.get("none_us")
        out["d2h_t256_select16"] = {
            "no_capture_us": none, "ferry_us": t.get("select_us"), "ferry_gather_us": t.get("select_gather_us"),
            "full_capture_us": t.get("full_gather_us"), **_checks(t),
            "overhead_pct": {"ferry": over(t.get("select_us"), none),
                             "ferry_gather": over(t.get("select_gather_us"), none),
                             "full_capture": over(t.get("full_gather_us"), none)}}
    t = raw.get("d2h_t16_full")
    if t:
        out["d2h_t16_full"] = {"no_capture_us": t.get("none_us"), "ferry_gather_us": t.get("full_gather_us"),
                               **_checks(t),
                               "overhead_pct": {"ferry_gather": over(t.get("full_gather_us"), t.get("none_us"))}}
    pre = {p: raw["prefill_last_token_" + p] for p in PRESETS if raw.get("prefill_last_token_" + p)}
    if pre:
        nones = {p: b.get("none_us") for p, b in pre.items()}
        block = {"no_capture_us": round(sum(nones.values()) / len(nones), 2)}
        block.update({f"{p}_us": b.get("select_gather_us") for p, b in pre.items()})
        block.update(_checks(*pre.values()))
        block["no_capture_us_per_preset"] = nones
        block["overhead_pct"] = {p: over(b.get("select_gather_us"), b.get("none_us")) for p, b in pre.items()}
        out["prefill_last_token"] = block
    return out


def merge(inputs, out_path):
    """Writes out_path: its current content, with the blocks of each input replaced (see the module's doc)."""
    out = _load(out_path) if os.path.exists(out_path) else {}
    for path in inputs:
        if path == "-" or not os.path.exists(path):
            print(f"select: {path}: skipped (absent)")
            continue
        d = _load(path)
        if any(k.startswith("prefill_last_token_") for k in d) or "none_us" in (d.get("d2h_t256_select16") or {}) \
                or "none_us" in (d.get("d2h_t16_full") or {}):
            new = from_raw(d)
            stamp = {k: os.environ.get("FERRY_" + k.upper()) or out.get(k) or "unknown" for k in STAMP}
            if not os.environ.get("FERRY_COMMIT"):
                print(f"select: {path}: WARNING: FERRY_COMMIT is not set: the run keeps the commit {stamp['commit']}")
            old = {k: out[k] for k in D2H_BLOCKS if k in out}
            if old and out.get("commit") != stamp["commit"]:
                out["previous_run"] = {"commit": out.get("commit"), "date": out.get("date"), **old}
            out.update(stamp)
            out.update(new)
            if d.get("host_backend"):
                print(f"select: {path}: WARNING: measured on the host backend (host timings say nothing about a GPU)")
            if d.get("publish_every", K) != K:
                print(f"select: {path}: WARNING: publish_every {d['publish_every']}, the table's column says K = {K}")
            print(f"select: {', '.join(new)} from {path}")
        elif ("qwen3_cb" in d or {"no_capture_ms", "per_preset"} <= set(d)) and not any(k in d for k in D2H_BLOCKS):
            src = d.get("qwen3_cb", d)
            block = {k: src[k] for k in QWEN3_KEYS if k in src}
            block["source"] = {"file": os.path.basename(path), **{k: d[k] for k in STAMP[1:] if k in d}}
            out["qwen3_cb"] = block
            for k in STAMP:  # a file of qwen3_cb alone still names where it was measured
                if k not in out and k in d:
                    out[k] = d[k]
            miss = [k for k in QWEN3_KEYS if k not in block]
            print(f"select: qwen3_cb from {path}" + (f", missing {', '.join(miss)}" if miss else ""))
        else:
            sys.exit(f"select: {path}: neither ferry_bench_select's JSON nor bench/torch/qwen3_cb.py's")
    ordered = {k: out[k] for k in ORDER if k in out}
    ordered.update({k: v for k, v in out.items() if k not in ordered})
    with open(out_path, "w") as fh:
        json.dump(ordered, fh, indent=1)
        fh.write("\n")
    print(f"wrote {out_path}")


# ---- the section --------------------------------------------------------------------------------------------
def _pct(v, nd=2, bold=False):
    if v is None:
        return NOT_YET
    s = f"{v:+.{nd}f}%"
    return f"**{s}**" if bold else s


def _met(values, targets):
    if any(v is None for v in values):
        return NOT_YET
    return "yes" if all(v <= t for v, t in zip(values, targets)) else "**no**"


def _wrap(text):  # the width of README's prose; a `code span` stays on one line
    text = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    return textwrap.fill(text, 119, break_on_hyphens=False, break_long_words=False).replace("\0", " ")


def section(d):
    """The markdown of the selective-capture section for select.json's content `d`."""
    t256, t16, pre = (d.get(k) or {} for k in D2H_BLOCKS)
    q, k1 = d.get("qwen3_cb") or {}, d.get("k1024") or {}
    o256, o16, opre = (b.get("overhead_pct") or {} for b in (t256, t16, pre))
    k256, kpre = k1.get("d2h_t256_select16_overhead_pct") or {}, k1.get("prefill_last_token_overhead_pct") or {}
    device = re.sub(r"^NVIDIA |\s*\(.*$", "", d.get("device") or "?")
    commit, date = d.get("commit") or "?", (d.get("date") or "?")[:10]
    lines = [f"## Selective capture (issue 27), {device}, commit {commit}, {date}", ""]
    k1c = k1.get("commit")
    k1024 = "" if not k1 else (f"; K = 1024{', an earlier commit (' + k1c + ')' if k1c and k1c != commit else ''}: "
                                "[bench_select_k1024.log](h200/bench_select_k1024.log)")
    ms = lambda b: "?" if b.get("no_capture_us") is None else f"{b['no_capture_us'] / 1000:.1f}"
    checks = _checks(t256, t16, pre)
    lines.append(_wrap(
        f"`FERRY_COMMIT={commit} bash bench/device/drivers/h200.sh select qwen3cb` ([select.json](h200/select.json), "
        f"[bench_select.log](h200/bench_select.log){k1024}). A simulated 28-layer forward in a CUDA graph (a spin "
        "kernel per layer, set so the no-capture step takes about what a Qwen3-0.6B-shaped step of that many tokens "
        f"takes: {ms(t256)} ms at 256 tokens, {ms(t16)} ms at 16, {ms(pre)} ms at 8192), DMI's vllm-full hook sizes "
        "per token (341 hooks; hidden-states: 28 x 2 KiB); each step publishes its selection with ferry's own "
        "`h2d::publisher`, then replays; each replay's plan reserves the exact selected row count "
        "(`plan(..., selected=n)`). Step time: 20 back-to-back steps until the compute stream finished (the drain's "
        "copies run beside it; backpressure would be inside), median of 15 interleaved rounds (min..max in the logs: "
        "within 0.2% for every selective row). Every delivered row was compared with its source row "
        f"({checks['entries_bad']:,} bad of {checks['entries_checked']:,} entries), found through the entry's "
        "forward tag."))
    k1col = f"K = 1024 ({k1c})" if k1c else "K = 1024"
    lines += ["", f"| scenario | target | K = {K} | {k1col} | met |", "|---|---|---|---|---|"]
    tg = TARGETS

    def row(what, target, value, k1024_value, met):
        lines.append(f"| {what} | {target} | {value} | {k1024_value if k1 else '-'} | {met} |")

    row("256 tokens, a random 1/16 of the rows (16), vllm-full, `capture_rows_deferred` (one gather per batch)",
        f"<= +{tg['t256_gather']:g}%", _pct(o256.get("ferry_gather"), bold=True), _pct(k256.get("ferry_gather")),
        _met([o256.get("ferry_gather")], [tg["t256_gather"]]))
    row("same, `capture_rows` (a select kernel per hook)", "-", _pct(o256.get("ferry"), 1), _pct(k256.get("ferry"), 1),
        "-")
    row("same, every row captured (full capture, gather; the PCIe limit)", "(today +184%)",
        _pct(o256.get("full_capture"), 0), _pct(k256.get("full_capture"), 0), "-")
    row("16 tokens, every row captured (gather)", f"<= +{tg['t16_full']:g}%", _pct(o16.get("ferry_gather"), bold=True),
        _pct(k1.get("d2h_t16_full_overhead_pct")), _met([o16.get("ferry_gather")], [tg["t16_full"]]))
    for p, what in (("hidden_states", "prefill 16 x 512 tokens, last token of each request, hidden-states"),
                    ("vllm_full", "same, vllm-full")):
        row(what, f"<= +{tg['prefill']:g}%", _pct(opre.get(p), bold=True), _pct(kpre.get(p)),
            _met([opre.get(p)], [tg["prefill"]]))
    none = q.get("no_capture_ms")
    qo = [over(q.get(p + "_ms"), none) for p in PRESETS]
    qt = [tg["qwen3_" + p] for p in PRESETS]
    lines.append(f"| Qwen3 continuous batching, B = 64 decode in a graph, 4-16 requests selected per step, "
                 f"hidden-states / vllm-full (`qwen3_cb`) | <= +{qt[0]:g}% / <= +{qt[1]:g}% | "
                 f"{NOT_YET if None in qo else '**' + _pct(qo[0]) + ' / ' + _pct(qo[1]) + '**'} | - | {_met(qo, qt)} |")
    lines.append("")
    if q:
        pp = q.get("per_preset") or {}
        f2 = lambda v: "?" if v is None else f"{v:.2f}"
        per = lambda key: " / ".join(f2((pp.get(p) or {}).get(key)) for p in PRESETS)
        torch_over = [over((pp.get(p) or {}).get("torch_select_ms"), none) for p in PRESETS]
        lines.append(_wrap(
            "`qwen3_cb` ([qwen3_cb.json](h200/qwen3_cb.json), [bench_qwen3_cb.log](h200/bench_qwen3_cb.log); "
            "`bash bench/device/drivers/h200.sh qwen3cb`): the transformers Qwen3-0.6B-shaped model (random bf16 "
            "weights), B = 64 requests decoding 64 tokens, the step in a `torch.cuda.graph`, each step's selection "
            "uploaded by `ferry.Publisher`, medians of 10 interleaved whole generations: no capture "
            f"{f2(none)} ms; ferry rows (`ferry.hooks.rows_capture`, deferred) {f2(q.get('hidden_states_ms'))} ms "
            f"hidden-states, {f2(q.get('vllm_full_ms'))} ms vllm-full; every row captured and selected on the CPU "
            f"{per('cpu_select_ms')} ms; torch's per-hook `index_select` + pinned copy {per('torch_select_ms')} ms "
            f"({_pct(torch_over[0])} / {_pct(torch_over[1], 1)}). {q.get('rows_checked', 0):,} rows checked against "
            f"witnesses, {q.get('rows_bad', '?')} bad, {q.get('misattributed', '?')} misattributed (`rows_of(request)` "
            "per step's tag). At B = 64 and one token per request the whole capture is small (about 64 rows per "
            "hook), so capturing every row then selecting on the CPU costs about the same here."))
    else:
        lines.append(f"`qwen3_cb`: {NOT_YET} (`bash bench/device/drivers/h200.sh qwen3cb`).")
    return "\n".join(lines) + "\n"


def main(argv):
    from perf_tables import generated_block
    generated_block(argv, "select", merge, section, DEFAULT_JSON, "<!-- select-tables -->", "select_tables", "the selective-capture section", __doc__)


if __name__ == "__main__":
    main(sys.argv)
