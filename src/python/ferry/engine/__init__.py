# SPDX-License-Identifier: Apache-2.0
"""ferry inside an engine: per-request capture while a continuously batching engine serves, written as a dataset
of per-request samples (docs/api/engine.md).

- ``Spec(tokens=..., taps=None)``: what one request captures (``"prompt"``, ``"generated"``, ``"all"``,
  ``"last_prompt"`` or an ``(a, b)`` window of absolute positions).
- ``resolve_taps(model, taps)``: the run's taps (presets ``"eagle3"``, ``"all-layers"``, ``"sae[:i]"``, layer
  indices, ``"final"``, ``Tap``, ``ferry.hooks.Rule``).
- ``Capture(model, taps, out, format=...)``: Hugging Face transformers' continuous batching
  (``ferry.engine.transformers``; imported on first use, it needs torch and transformers).
- ``cb_config(**kw)``: a ``ContinuousBatchingConfig`` for capture (block sharing off; ``page_size`` named as the
  installed transformers names it).
- ``open_samples(directory)``: reads the samples back; ``stream_rows(reader)``: a ``ferry.ShmReader``'s entries
  of a ``Capture(..., out=ferry.sinks.shm_stream(name))``, per request, in another process.
"""

from __future__ import annotations

from typing import Any

from .samples import FORMAT, Sample, SampleWriter, decode, open_samples, write_safetensors
from .spec import TAP_PRESETS, TOKEN_FORMS, Spec, Tap, resolve_taps
from .stream import open_reader, stream_rows

__all__ = ["FORMAT", "TAP_PRESETS", "TOKEN_FORMS", "Capture", "Sample", "SampleWriter", "Spec", "Tap", "cb_config",
           "decode", "open_reader", "open_samples", "resolve_taps", "stream_rows", "write_safetensors"]


def __getattr__(name: str) -> Any:
    if name == "Capture":
        from .transformers import Capture
        return Capture
    if name == "cb_config":
        from .transformers_run import cb_config
        return cb_config
    raise AttributeError(f"module 'ferry.engine' has no attribute {name!r}")
