# SPDX-License-Identifier: Apache-2.0
"""``ferry capture``: generates a dataset of per-request samples with transformers' continuous batching and
ferry as its capture layer (``python -m ferry capture``; docs/api/engine.md).

With no arguments it needs no download: a small Qwen3-shaped model built from a config with seeded random weights
(``--size``), a built-in prompt set of seeded random token ids, CUDA graphs on a GPU, the host backend on CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

SIZES = {  # hidden, layers, heads, kv heads, head_dim, intermediate, vocab
    "tiny": (64, 4, 4, 2, 16, 128, 256),
    "small": (256, 8, 8, 4, 32, 768, 4096),
    "0.6b": (1024, 28, 16, 8, 128, 3072, 151936),  # Qwen3-0.6B's config (its head_dim is 128, not 1024 / 16)
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferry", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="generate a dataset of per-request samples (hidden states per token)")
    c.add_argument("--model", help="a local Hugging Face checkpoint directory (default: the embedded model)")
    c.add_argument("--size", choices=sorted(SIZES), help="the embedded model's size (default: small on a GPU, "
                   "tiny on CPU)")
    c.add_argument("--prompts", help="a JSONL file: one {\"input_ids\": [...]} or {\"prompt\": \"...\"} per line "
                   "(default: the built-in prompt set)")
    c.add_argument("--requests", type=int, default=None, help="built-in prompts: how many (default 64 GPU, 8 CPU)")
    c.add_argument("--preset", default="eagle3", help="taps: eagle3, all-layers, sae or sae:<layer> "
                   "(default eagle3)")
    c.add_argument("--tokens", default="all", help="prompt, generated, all, last_prompt or A:B (a window of "
                   "absolute positions; default all)")
    c.add_argument("--max-new-tokens", type=int, default=None, help="default 64 GPU, 8 CPU")
    c.add_argument("--out", default="ferry-samples", help="output directory (default ./ferry-samples)")
    c.add_argument("--format", choices=("per-request", "shards", "arrow"), default="per-request",
                   help="per-request safetensors files (default), shards + index.json, or arrow (a Hugging Face "
                   "dataset: datasets.load_from_disk(OUT); needs pyarrow)")
    c.add_argument("--reduce", default=None, help="every tap's rows reduced on the device, one record per token: "
                   "fp8_e4m3 (half the bytes of bf16) or topk(K) (ferry.engine.decode reads them)")
    c.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    c.add_argument("--no-graphs", action="store_true", help="run the engine eagerly on a GPU (no CUDA graphs)")
    c.add_argument("--overwrite", action="store_true", help="replace the samples of an earlier run in --out")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _tokens(s: str) -> Any:
    if ":" in s:
        a, b = s.split(":", 1)
        return int(a), int(b)
    return s


def embedded_model(size: str, device: str, seed: int = 0) -> Any:
    """The embedded default: a Qwen3-shaped model of ``size`` with seeded random weights (bf16 on a GPU)."""
    import torch
    import transformers

    h, n, heads, kv, head_dim, inter, vocab = SIZES[size]
    cfg = transformers.Qwen3Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=n,
                                   num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                                   vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return transformers.Qwen3ForCausalLM(cfg).to(dtype=dtype, device=device).eval()


def builtin_prompts(n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of seeded random token ids, lengths uniform in ``[lo, hi]``."""
    import random
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _load_prompts(path: str, model_dir: str | None) -> list[list[int]]:
    out, tok = [], None
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if "input_ids" in rec:
                out.append([int(x) for x in rec["input_ids"]])
            elif "prompt" in rec:
                if tok is None:
                    if model_dir is None:
                        raise SystemExit(f"ferry capture: {path}:{i}: a text prompt needs --model (its tokenizer)")
                    from transformers import AutoTokenizer
                    tok = AutoTokenizer.from_pretrained(model_dir)
                out.append(tok(rec["prompt"])["input_ids"])
            else:
                raise SystemExit(f"ferry capture: {path}:{i}: expected \"input_ids\" or \"prompt\", got {sorted(rec)}")
    return out


class _Progress:
    """The progress bar: requests done, tokens/s, and the sample writer's bytes per second (``written()``: its
    counter, no directory scan)."""

    def __init__(self, total: int, written: Any, quiet: bool) -> None:
        self.total, self.done, self.tokens, self.written, self.quiet = total, 0, 0, written, quiet
        self.t0 = time.perf_counter()

    def __call__(self, output: Any) -> None:
        self.done += 1
        self.tokens += len(output.prompt_ids) + len(output.generated_tokens)
        if self.quiet:
            return
        dt = max(time.perf_counter() - self.t0, 1e-9)
        written = self.written()
        bar = "#" * (30 * self.done // max(self.total, 1))
        sys.stderr.write(f"\rferry capture [{bar:<30}] {self.done}/{self.total} requests  "
                         f"{self.tokens / dt:,.0f} tokens/s  {written / dt / 1e9:.3f} GB/s written")
        sys.stderr.flush()


class _NoPsutilNoise:
    """transformers' continuous batching logs an error and a warning on CPU machines without psutil (an optional
    memory probe); they say nothing about the capture."""

    @staticmethod
    def filter(record: Any) -> bool:
        return "psutil" not in record.getMessage()


def capture(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("ContinuousBatchingLogger").addFilter(_NoPsutilNoise())
    import torch
    import transformers
    from transformers import GenerationConfig

    import ferry
    from ferry.engine import Capture, Spec, cb_config

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and "cuda" in ferry.available_backends() else "cpu"
    gpu = device == "cuda"
    if args.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.bfloat16 if gpu else torch.float32).to(device).eval()
        what = args.model
    else:
        size = args.size or ("small" if gpu else "tiny")
        model = embedded_model(size, device, args.seed)
        what = f"embedded Qwen3-shaped '{size}' model (seeded random weights)"
    vocab = model.config.vocab_size
    if args.prompts:
        prompts = _load_prompts(args.prompts, args.model)
    else:
        n = args.requests or (64 if gpu else 8)
        prompts = builtin_prompts(n, vocab, 16 if not gpu else 64, 48 if not gpu else 512, args.seed)
    max_new = args.max_new_tokens or (64 if gpu else 8)
    gc = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cbc = cb_config(use_cuda_graph=gpu and not args.no_graphs,
                    **(dict(max_memory_percent=0.5) if gpu else dict(num_blocks=64, max_batch_tokens=64, page_size=16)))
    cap = Capture(model, taps=args.preset, out=args.out, format=args.format, overwrite=args.overwrite,
                  reduce=args.reduce)
    prog = _Progress(len(prompts), lambda: cap.writer.bytes_written, args.quiet)
    print(f"ferry capture: {what} on {device}, {len(prompts)} requests, taps {cap.names}, tokens {args.tokens!r}, "
          f"-> {args.out} ({args.format})", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        outs = cap.generate_batch(prompts, generation_config=gc, capture=Spec(tokens=_tokens(args.tokens)),
                                  continuous_batching_config=cbc, progress=prog)
    finally:
        rep = cap.close()
    dt = time.perf_counter() - t0
    if not args.quiet:
        sys.stderr.write("\n")
    toks = sum(len(o.prompt_ids) + len(o.generated_tokens) for o in outs.values())
    print(f"ferry capture: {len(outs)} requests, {toks} tokens in {dt:.1f} s ({toks / dt:,.0f} tokens/s); "
          f"{rep['samples']} samples ({rep['complete']} complete, {len(rep['incomplete'])} incomplete, "
          f"{len(rep['dropped'])} dropped, {len(rep['lost'])} lost), {rep.get('bytes_written', 0) / 1e6:.1f} MB "
          f"written to {args.out}")
    if rep.get("disabled"):
        print(f"ferry capture: capture was disabled: {rep['disabled']}")
    print("open it with: python3 -c \"import ferry.engine as e; "
          f"[print(m['request_id'], t['hidden_states'].shape) for m, t in e.open_samples('{args.out}')]\"  "
          + (f"(or datasets.load_from_disk('{args.out}'))" if args.format == "arrow" else
             "(or safetensors.safe_open on each .safetensors file)"))
    bad = len(rep["lost"]) + len(rep["dropped"]) + (rep["samples"] != len(outs)) + bool(rep.get("error"))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "capture":
        return capture(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
