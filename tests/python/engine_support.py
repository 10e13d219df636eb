# SPDX-License-Identifier: Apache-2.0
"""Helpers of the engine tests: a tiny Qwen3 model, a witness of every forward's tapped tensors, and the checks of
the samples against it and against a plain forward."""

from __future__ import annotations

import copy

import numpy as np

torch = __import__("pytest").importorskip("torch")
transformers = __import__("pytest").importorskip("transformers")

from transformers import ContinuousBatchingConfig, GenerationConfig  # noqa: E402

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
    base = dict(num_blocks=64, max_batch_tokens=32, max_requests_per_batch=8, allow_block_sharing=False,
                page_size=16)
    base.update(kw)
    return ContinuousBatchingConfig(**base)


class Witness:
    """A torch tap in the same forwards: per forward, the tapped modules' whole outputs, the forward's positions
    and the requests of the batch (recorded at prepare time, in batch order); ``rows(rid, tap)`` then gives
    ``{position: row}`` of one request, from the engine's own inputs, independently of ferry."""

    def __init__(self, model, taps):
        from transformers.generation.continuous_batching import input_outputs as io

        self.model, self.taps, self.forwards, self._batches = model, taps, [], []
        self._handles = []
        mods = dict(model.named_modules())
        for i, t in enumerate(taps):
            self._handles.append(mods[t.module].register_forward_hook(self._hook(i)))
        self._handles.append(model.register_forward_pre_hook(self._pre, with_kwargs=True))
        self._io_cls = io.ContinuousBatchingIOs
        self._orig = self._io_cls.prepare_batch_tensors
        witness = self

        def prepare(io_self, requests_in_batch, *a, **k):
            witness._batches.append([(fs.state.request_id, int(fs.query_length)) for fs in requests_in_batch])
            return witness._orig(io_self, requests_in_batch, *a, **k)

        self._io_cls.prepare_batch_tensors = prepare

    def _pre(self, mod, args, kwargs):
        pos = kwargs.get("position_ids")
        if pos is not None and self._batches:
            self.forwards.append({"positions": pos.reshape(-1).cpu().clone(), "batch": self._batches[-1], "taps": {}})

    def _hook(self, i):
        def hook(mod, args, out):
            if self.forwards and i not in self.forwards[-1]["taps"]:
                o = out[0] if isinstance(out, tuple) else out
                self.forwards[-1]["taps"][i] = o.reshape(-1, o.shape[-1]).detach().cpu().clone()
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
        self._io_cls.prepare_batch_tensors = self._orig


def as_tensor(hidden, dtype):
    """A sample's hidden_states bits as a torch tensor of the model's dtype."""
    t = torch.from_numpy(np.ascontiguousarray(hidden))
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
