// SPDX-License-Identifier: Apache-2.0
// variants/...: copy layouts x publication placement, and diagnostics of where ferry's time over copy-only
// goes (FERRY_D2H_VARIANTS=0 leaves them out). Filed by run_files.py d2h-summary under "variants" in the summary.
//   variants/<layout>/<contestant>/<bytes>: per hook in a graph, one configuration at a time (not
//     round-robin): <layout>/copy_only, <layout>/ferry_k16 (the layout's releases: on the branch by
//     default), <layout>/ferry_k16_sep (inline releases, never fused: every entry multi-block and a
//     1-thread release kernel every 16 on the compute stream); "single_xV" layouts copy every entry
//     <= 32 KiB with one block.
//   variants/diag/<bytes>: round-robin (per_hook_table) diagnostics, one counter per contestant.
//   variants/fwd341/<name>: the 341-hook forward: which part of ferry's cost over copy-only comes from the
//     layout, the drain running during the forward (drain_paused) or the releases (k_inf: only the
//     forward-end release).
#include "common.hpp"

namespace ferry::bench {

namespace {

std::vector<shape_opts> variant_shapes()
{
  std::vector<shape_opts> v;
  v.push_back(legacy_shape());
  v.push_back(plain_shape());
  for (std::uint32_t vpt : {2U, 4U}) { v.push_back({"single_x" + std::to_string(vpt), 256, vpt, 32 * KiB, 32 * KiB}); }
  for (auto [t, vpt] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{
         {64, 1}, {128, 1}, {256, 1}, {64, 2}, {128, 2}, {256, 2}, {128, 4}, {256, 4}, {128, 8}}) {
    v.push_back({"s" + std::to_string(t) + "x" + std::to_string(vpt), t, vpt, 0, 32 * KiB});
  }
  return v;
}

void register_layouts()
{
  for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB}) {
    for (const shape_opts& sh : variant_shapes()) {
      const std::string at = "/" + std::to_string(P);
      register_us("variants/" + sh.label + "/copy_only" + at, "us_per_hook",
                  [sh, P] { return per_hook_us(variant::copy_only, P, sh); });
      register_us("variants/" + sh.label + "/ferry_k16" + at, "us_per_hook",
                  [sh, P] { return per_hook_us(variant::ferry, P, sh, 16); });
      if (sh.single_max == 0) {
        shape_opts sep = sh;  // inline releases, never fused: a 1-thread release kernel every 16
        sep.fused_max = 0;
        sep.branch = false;
        register_us("variants/" + sh.label + "/ferry_k16_sep" + at, "us_per_hook",
                    [sep, P] { return per_hook_us(variant::ferry, P, sep, 16); });
      }
    }
  }
}

/// Where ferry's per-entry time over copy-only goes, replayed round-robin: copy-only with a cursor read /
/// the kernel-to-kernel cursor chain / ferry's two-slot cursor (with and without its placement) / the word
/// in other places or read other ways, ferry's own copy kernel without a channel (with and without the
/// chain), and the channel with K = 16, K = 16 inline and only the forward-end release (k_inf), drain
/// running or polled between replays.
void register_diag()
{
  for (std::uint64_t P : {4 * KiB, 16 * KiB, 64 * KiB}) {
    register_measurement("variants/diag/" + std::to_string(P), [P] {
      const shape_opts def{}, plain = plain_shape();
      shape_opts paused;
      paused.drain_paused = true;
      const auto managed = fd::head_memory::managed;
      std::vector<contestant_maker> base{copy_maker("copy_only", variant::copy_only, def, 0),
                                         copy_maker("copy_only_cursor_read", variant::copy_only, def, 1),
                                         copy_maker("copy_only_cursor_chain", variant::copy_only, def, 2)};
      const char* modes[] = {"two_slot", "two_slot_placed", "two_slot_two_lines", "two_slot_8b", "word_in_src",
                             "word_in_ring", "word_block_bcast", "word_ldg"};
      for (std::uint32_t m = 3; m <= 10; ++m) {
        base.push_back(copy_maker(std::string{"copy_only_"} + modes[m - 3], variant::copy_only, def, m));
      }
      base.push_back(copy_maker("ferry_kernel", variant::ferry_kernel, def, 0));
      base.push_back(copy_maker("ferry_kernel_no_chain", variant::ferry_kernel, def, 1));
      base.push_back(copy_maker("copy_only_plain", variant::copy_only, plain, 0));
      base.push_back(copy_maker("ferry_kernel_plain", variant::ferry_kernel, plain, 0));
      figures out = per_hook_table(P,
                                   {ferry_maker("ferry_k16", 16, managed, def),
                                    ferry_maker("ferry_k16_inline", 16, managed, inline_shape()),
                                    ferry_maker("ferry_k_inf", 1U << 30, managed, def),
                                    ferry_maker("ferry_k_inf_drain_paused", 1U << 30, managed, paused)},
                                   base);
      return measured{out["ferry_k16"] / 1e6, out};
    });
  }
}

void register_fwd341()
{
  auto add = [](const std::string& n, variant v, fwd_opts o) {
    register_us("variants/fwd341/" + n, "us_per_forward",
                [v, o] { return forward_us(v, 341, fd::head_memory::managed, o); });
  };
  const shape_opts def{};
  shape_opts def_sep = def;  // inline releases, never fused
  def_sep.fused_max = 0;
  def_sep.branch = false;
  add("no_capture", variant::no_capture, {});
  add("copy_only/default", variant::copy_only, {def});
  add("copy_only/legacy", variant::copy_only, {legacy_shape()});
  add("ferry/legacy", variant::ferry, {legacy_shape()});
  add("ferry/legacy_drain_paused", variant::ferry, {legacy_shape(), 16, true});
  add("ferry/default", variant::ferry, {def});
  add("ferry/default_sep", variant::ferry, {def_sep});
  add("ferry/default_drain_paused", variant::ferry, {def, 16, true});
  add("ferry/default_k_inf", variant::ferry, {def, 1U << 30, false});
  add("ferry/default_k_inf_drain_paused", variant::ferry, {def, 1U << 30, true});
  add("copy_only/plain", variant::copy_only, {plain_shape()});
  add("ferry/plain", variant::ferry, {plain_shape()});
  add("ferry/default_k64", variant::ferry, {def, 64, false});
  add("ferry_kernel/default", variant::ferry_kernel, {def});
  add("ferry/inline", variant::ferry, {inline_shape()});
  add("ferry/inline_k64", variant::ferry, {inline_shape(), 64, false});
  for (const shape_opts& sh : variant_shapes()) {
    if (sh.label == "s64x1" || sh.label == "s128x1" || sh.label == "s256x2" || sh.label == "s128x4") {
      add("copy_only/" + sh.label, variant::copy_only, {sh});
      add("ferry/" + sh.label, variant::ferry, {sh});
    }
  }
}

}  // namespace

void register_variants()
{
  register_layouts();
  register_diag();
  register_fwd341();
}

}  // namespace ferry::bench
