# SPDX-License-Identifier: Apache-2.0
"""The pieces of the bench/torch programs (qwen3_capture.py, qwen3_cb.py, step_probe.py, capture_cost.py), one
concern each:

  model         the Qwen3-0.6B-shaped transformers model, its static KV cache and the decode step (and the step
                captured into a CUDA graph)
  drain         the consumer thread that polls the channel and releases (and digests) its entries
  check         the witness check of a generation's entries and its determinism diagnostics
  rig           qwen3_capture's channel, consumer, entry count and clocks (the harness the contestants run on)
  contestants   qwen3_capture's contestants, each ferry one with its witness
  probe         step_probe's contestants
  trace         step_probe's --profile: the kernels of one replay, summarized
  h2d           qwen3_capture's H2D decode-metadata comparison
  timing        the round-robin timing loop and its clock
  meta          run metadata (device, commit, date, command), the JSON writing and the log
  cb            qwen3_cb's harness: the steps' selections, their ferry.Publisher upload, the channel and its
                consumer thread
  cb_contestants  qwen3_cb's contestants (none, ferry rows, cpu_select, torch_select), each ferry one with its
                witness
  cb_check      qwen3_cb's check: every delivered row against its witness, and its attribution

The scripts put their own directory on sys.path (python runs them that way), so ``import qwen3bench`` works.
"""
