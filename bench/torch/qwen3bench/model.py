# SPDX-License-Identifier: Apache-2.0
"""The model: a transformers Qwen3ForCausalLM built from Qwen3-0.6B's config (random bf16 weights, nothing
downloaded), a static KV cache and a greedy decode step made of device ops only (so that one step can be
captured into a CUDA graph)."""

from __future__ import annotations

import inspect

import torch


class StaticKV:
    """A static KV cache the decode graph can own: per layer [B, kv_heads, max_len, head_dim], written at the
    device position ``pos`` (index_copy_, no host sync). Duck-typed Cache for Qwen3Attention's update()."""

    is_compileable = True

    def __init__(self, layers, batch, kv_heads, max_len, head_dim, dtype, device, pos):
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.pos = pos

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.pos, key_states)
        self.values[layer_idx].index_copy_(2, self.pos, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx=0):
        return 0

    def __len__(self):
        return len(self.keys)


class Decoder:
    """Greedy decode of one token per sequence per step; every op is a device op on static tensors, so one
    step can be captured into a CUDA graph and replayed (tok, pos, mask and the cache advance on the device)."""

    def __init__(self, model, cfg, batch, max_len, device, seed):
        self.model, self.batch = model, batch
        dtype = model.dtype
        g = torch.Generator().manual_seed(seed)
        self.start = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g).to(device)
        self.tok = self.start.clone()
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.pos_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.ar = torch.arange(max_len, device=device)
        self.mask = torch.zeros(batch, 1, 1, max_len, dtype=dtype, device=device)
        self.neg = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
        self.zero = torch.zeros((), dtype=dtype, device=device)
        # transformers >= 5.2x names the argument `cache` (`past_key_values` is deprecated there)
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.kv = StaticKV(cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim, dtype,
                           device, self.pos)

    def reset(self):
        """The start state of a generation: the start tokens, position 0 and a zeroed KV cache (the positions
        past ``pos`` are masked, but a cache left by the previous generation would make two generations start
        from different states)."""
        self.tok.copy_(self.start)
        self.pos.zero_()
        for t in self.kv.keys + self.kv.values:
            t.zero_()

    def step(self):
        self.pos_ids.copy_(self.pos.expand(self.batch, 1))
        self.mask.copy_(torch.where(self.ar <= self.pos, self.zero, self.neg).expand_as(self.mask))
        out = self.model(input_ids=self.tok, position_ids=self.pos_ids, attention_mask={"full_attention": self.mask},
                         use_cache=True, **{self.cache_kw: self.kv})
        self.tok.copy_(out.logits[:, -1, :].argmax(-1, keepdim=True))
        self.pos.add_(1)

    def capture_graph(self, body, pool, sync, warm=None, warmed=None):
        """torch.cuda.graph capture of one decode step ``body()`` (the engine's graph) into memory pool ``pool``,
        after two eager warm-up steps (``warm()``, else ``body()``) from the start state on a side stream;
        ``sync()`` waits for the device after the warm-up and after the capture, ``warmed()`` (the entry
        accounting: the warm-up's entries drained) runs between the warm-up's sync and the capture."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.reset()
                (warm or body)()
        torch.cuda.current_stream().wait_stream(side)
        sync()
        if warmed is not None:
            warmed()
        self.reset()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
            body()
        sync()
        return g


def build_model(args, device):
    """(config, model): Qwen3-0.6B's dimensions (``args.tiny``: hidden 64, vocab 512) with ``args.layers``
    layers, transformers attention ``args.attn``, weights from ``args.seed``, bf16 on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if args.tiny:
        dims = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    vocab_size=512)
    else:  # Qwen3-0.6B
        dims = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                    head_dim=128, vocab_size=151936)
    cfg = Qwen3Config(num_hidden_layers=args.layers, max_position_embeddings=40960, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, **dims)
    cfg._attn_implementation = args.attn
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    return cfg, model
