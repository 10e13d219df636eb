# SPDX-License-Identifier: Apache-2.0
"""Helpers of the engine tests: a tiny Qwen3 model, a witness of every forward's tapped tensors, and the checks of
the samples against it and against a plain forward."""

from __future__ import annotations

import copy

import numpy as np

torch = __import__("pytest").importorskip("torch")
transformers = __import__("pytest").importorskip("transformers")

from transformers import GenerationConfig  # noqa: E402

import ferry.engine as fe  # noqa: E402

LAYERS = 4


def tiny_model(dtype=torch.float32, device="cpu", layers=LAYERS):
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                   tie_word_embeddings=True, max_position_embeddings=1024)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).to(dtype=dtype, device=device).eval()


def prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(1, 256, n)] for n in lengths]


def gen_config(max_new):
    return GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=-1, pad_token_id=0)


def cb_config(**kw):
    base = dict(num_blocks=64, max_batch_tokens=32, max_requests_per_batch=8, page_size=16)
    base.update(kw)
    return fe.cb_config(**base)


class Witness:
    """A torch tap in the same forwards, captured into the engine's CUDA graphs like ferry's: each tapped module's
    output is copied into a static buffer of its own; after every step (``ModelRunner.compute_batch``, wrapped
    outside ferry's dispatch) the step's real rows are read back with the engine's own ``position_ids`` and the
    batch's requests (recorded at prepare time, in batch order). ``rows(rid, tap)`` gives ``{position: row}`` of one
    request, independently of ferry's selection and attribution."""

    MAX_ROWS = 4096

    def __init__(self, model, taps):
        from transformers.generation.continuous_batching import input_outputs as io
        from transformers.generation.continuous_batching import model_runner as mr

        self.model, self.taps, self.forwards, self._batch = model, taps, [], None
        self._bufs, self._handles = {}, []
        mods = dict(model.named_modules())
        for i, t in enumerate(taps):
            self._handles.append(mods[t.module].register_forward_hook(self._hook(i)))
        self._io_cls, self._mr_cls = io.ContinuousBatchingIOs, mr.ModelRunner
        self._orig_prepare = self._io_cls.prepare_batch_tensors
        self._orig_compute = self._mr_cls.compute_batch
        w = self

        def prepare(io_self, requests_in_batch, *a, **k):
            w._batch = [(fs.state.request_id, int(fs.query_length)) for fs in requests_in_batch]
            return w._orig_prepare(io_self, requests_in_batch, *a, **k)

        def compute_batch(runner, m, batch_data):
            out = w._orig_compute(runner, m, batch_data)
            if m is w.model and w._batch is not None and w._bufs:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                n = sum(q for _, q in w._batch)
                pos = batch_data["position_ids"].reshape(-1)[:n].cpu().clone()
                w.forwards.append({"positions": pos, "batch": w._batch,
                                   "taps": {i: b[:n].cpu().clone() for i, b in w._bufs.items()}})
            return out

        self._io_cls.prepare_batch_tensors = prepare
        self._mr_cls.compute_batch = compute_batch

    def _hook(self, i):
        def hook(mod, args, out):
            o = out[0] if isinstance(out, tuple) else out
            o = o.reshape(-1, o.shape[-1])
            b = self._bufs.get(i)
            if b is None:
                b = self._bufs[i] = torch.zeros(self.MAX_ROWS, o.shape[-1], dtype=o.dtype, device=o.device)
            b[:o.shape[0]].copy_(o)
        return hook

    def rows(self, rid, tap):
        out = {}
        for f in self.forwards:
            row = 0
            for r, q in f["batch"]:
                if r == rid:
                    for j in range(q):
                        out[int(f["positions"][row + j])] = f["taps"][tap][row + j]
                row += q
        return out

    def remove(self):
        for h in self._handles:
            h.remove()
        self._io_cls.prepare_batch_tensors = self._orig_prepare
        self._mr_cls.compute_batch = self._orig_compute


def as_tensor(hidden, dtype):
    """A sample's hidden_states bits as a torch tensor of the model's dtype."""
    t = torch.from_numpy(np.array(hidden))  # a writable copy
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t.view(dtype)


def reference_model(model):
    """A copy of ``model`` with eager attention, for the plain forwards."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    return ref


def plain_reference(ref, seq, taps):
    """The plain (non-batched) forward of ``seq`` with output_hidden_states: per tap name, [len(seq), hidden]."""
    with torch.no_grad():
        hs = ref(torch.tensor([seq], device=next(ref.parameters()).device), output_hidden_states=True).hidden_states
    n = len(hs) - 1
    out = {}
    for t in taps:
        if t.name == "embeddings":
            out[t.name] = hs[0][0]
        elif t.name == "final":
            out[t.name] = hs[n][0]
        else:
            i = int(t.name.split(".")[1])
            out[t.name] = hs[i + 1][0] if i < n - 1 else None
    return out
