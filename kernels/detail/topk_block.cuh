// SPDX-License-Identifier: Apache-2.0
// The top-k record of a row by a whole block (reduce_block.cuh says how the reduce bodies call it): the k largest
// order_keys, value descending and, among equal values, index ascending (so ties at the k-th value take the lowest
// indices). Each element is packed as key << 32 | ~index, so that this order is the packed values' descending order.
//   topk_filtered   k <= topk_filter_k: two passes over the row. The first takes the max of each of topk_groups
//                   disjoint groups of elements; the k-th largest of those maxima, tau, is at most the row's k-th
//                   largest key (k distinct elements are >= it). The second keeps every element >= tau (at most
//                   topk_cand_cap of them, else it gives up), and a sort of those gives the record.
//   topk_radix      any k (and the rows topk_filtered gives up on): radix select of the k-th largest key, the
//                   elements above it and the lowest-index ties collected, then sorted.
#pragma once

#include "block_ops.cuh"  // host_block, gpu_block
#include "float_bits.cuh"
#include "reduce_shared.cuh"
#include "row_vec.cuh"  // vec16, vec_ok: rows read by vectors on the GPU

#include <ferry/d2h/reducer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ferry::kernels::d2h {

#if defined(__CUDA_ARCH__)
/// radix_select's histogram pass over a row read by vectors (vec_ok): hist[digit(order_key)] += 1 for every element
/// digit() admits (< 256), each lane `topk_vec_batch` vectors in flight, a warp's lanes with one digit adding once.
template <class Digit>
__device__ void histogram_vec(const gpu_block& b, std::uint32_t* hist, const std::byte* row, std::uint64_t width,
                              ferry::d2h::reduce_input in, Digit digit)
{
  const std::uint32_t pv = per_vec(in), lane = b.t & 31U;
  const std::uint64_t nv = width / pv;
  for (std::uint64_t base = b.t - lane; base < nv; base += topk_vec_batch * b.nt) {
    vec16 v[topk_vec_batch];
#pragma unroll
    for (std::uint32_t u = 0; u < topk_vec_batch; ++u) {
      const std::uint64_t i = base + u * b.nt + lane;
      if (i < nv) { v[u] = vec_at(row, i); }
    }
#pragma unroll
    for (std::uint32_t u = 0; u < topk_vec_batch; ++u) {
      const bool live = base + u * b.nt + lane < nv;
      for_each_in_vec(v[u], in, [&](std::uint32_t, std::uint32_t bits) {
        b.warp_count(hist, live ? digit(order_key(bits, in)) : 256U);
      });
    }
  }
}
#endif

/// Radix select over the elements of [0, width) that `key_of(c, key)` admits: afterwards sh.prefix is the
/// `want`-th largest key (`bits` wide), sh.krem how many elements equal to it are among the `want` largest and
/// sh.n_eq how many equal it. Ends with a barrier. `vrow` (not null: a row that vec_ok reads by vectors, of `in`,
/// whose every element key_of admits with its order_key) lets a CUDA block read it by vectors.
template <class Blk, class KeyOf>
FERRY_HD void radix_select(const Blk& b, reduce_shared& sh, std::uint64_t width, std::uint32_t bits, std::uint32_t want,
                           KeyOf key_of, const std::byte* vrow = nullptr,
                           ferry::d2h::reduce_input in = ferry::d2h::reduce_input::f32)
{
  (void)vrow, (void)in;  // read on the GPU only
  if (b.t == 0) {
    sh.prefix = 0;
    sh.krem = want;
  }
  std::uint32_t mask = 0;
  for (int shift = static_cast<int>(bits) - 8; shift >= 0; shift -= 8) {
    for (std::uint32_t i = b.t; i < 256; i += b.nt) { sh.hist[i] = 0; }
    b.sync();
    const std::uint32_t prefix = sh.prefix;
    auto digit = [&](std::uint32_t key) { return (key & mask) == prefix ? (key >> shift) & 255U : 256U; };
    bool done = false;
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<Blk, gpu_block>) {
      if (vrow != nullptr) {
        histogram_vec(b, sh.hist, vrow, width, in, digit);
        done = true;
      }
    }
#endif
    if (!done) {
      b.histogram(sh.hist, width, [&](std::uint64_t c) {
        std::uint32_t key = 0;
        return key_of(c, key) ? digit(key) : 256U;
      });
    }
    b.sync();
    if (b.t == 0) {  // the digit where the count from the top reaches what is left to take
      std::uint32_t above = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + sh.hist[d] >= sh.krem) {
          sh.krem -= above;
          sh.n_eq = sh.hist[d];
          sh.prefix |= static_cast<std::uint32_t>(d) << shift;
          break;
        }
        above += sh.hist[d];
      }
    }
    mask |= 255U << shift;
    b.sync();
  }
}

inline constexpr std::uint32_t topk_filter_k = 256;  ///< topk_record: k above it goes to topk_radix at once

FERRY_HD inline std::uint64_t topk_pack(std::uint32_t key, std::uint64_t c) noexcept
{
  return (std::uint64_t{key} << 32) | (0xffffffffU - static_cast<std::uint32_t>(c));
}

/// The record from sh.cand[0, n) (n >= k, every element of the record among them): sorted descending, the first k
/// as k values (f32), then k int32 indices, into `out`. Ends with a barrier.
template <class Blk>
FERRY_HD void topk_emit(const Blk& b, reduce_shared& sh, std::uint32_t n, std::uint32_t k,
                        ferry::d2h::reduce_input in, std::byte* out)
{
  std::uint32_t n2 = 1;
  while (n2 < n) { n2 <<= 1; }
  for (std::uint32_t i = n + b.t; i < n2; i += b.nt) { sh.cand[i] = 0; }  // below every element
  b.sync();
  block_sort(b, sh.cand, n2, true);
  for (std::uint32_t i = b.t; i < k; i += b.nt) {
    const std::uint64_t p = sh.cand[i];
    const float v = float_of(bits_of_key(static_cast<std::uint32_t>(p >> 32), in), in);
    const auto idx = static_cast<std::int32_t>(0xffffffffU - static_cast<std::uint32_t>(p));
    std::memcpy(out + 4ULL * i, &v, 4);
    std::memcpy(out + 4ULL * (k + i), &idx, 4);
  }
  b.sync();  // the next record reuses the scratch
}

/// topk_filtered (the file's comment): false, nothing written, when more than topk_cand_cap elements are >= tau.
template <class Blk>
FERRY_HD bool topk_filtered(const Blk& b, reduce_shared& sh, const std::byte* row, std::uint64_t width,
                            ferry::d2h::reduce_input in, std::uint32_t k, std::byte* out)
{
  for (std::uint32_t i = b.t; i < topk_groups; i += b.nt) { sh.gmax[i] = 0; }  // an empty group's max: the least
  if (b.t == 0) { sh.n_cand = 0; }
  b.sync();
  std::uint32_t m[topk_batch] = {};  // GPU: the thread's max per load slot u (group u x nt + t, mod topk_groups)
  for_each_element<topk_vec_batch, topk_batch>(b, row, width, in, [&](std::uint64_t c, std::uint32_t bits,
                                                                      std::uint32_t u) {
    const std::uint32_t key = order_key(bits, in);
    if constexpr (Blk::lanes == 1) {  // the host's one thread: group c mod topk_groups
      b.max(&sh.gmax[c % topk_groups], key);
    } else {
      m[u] = key > m[u] ? key : m[u];
    }
  });
  if constexpr (Blk::lanes != 1) {
    for (std::uint32_t u = 0; u < topk_batch; ++u) { b.max(&sh.gmax[(u * b.nt + b.t) % topk_groups], m[u]); }
  }
  b.sync();
  block_sort(b, sh.gmax, topk_groups, true);
  const std::uint32_t tau = sh.gmax[k - 1];
  for_each_element<topk_vec_batch, topk_batch>(b, row, width, in, [&](std::uint64_t c, std::uint32_t bits,
                                                                      std::uint32_t) {
    const std::uint32_t key = order_key(bits, in);
    const std::uint32_t slot = b.claim(&sh.n_cand, key >= tau);
    if (slot < topk_cand_cap) { sh.cand[slot] = topk_pack(key, c); }
  });
  b.sync();
  const std::uint32_t n = sh.n_cand;
  if (n > topk_cand_cap) {
    b.sync();  // every thread read the count before the next use of the scratch
    return false;
  }
  topk_emit(b, sh, n, k, in, out);
  return true;
}

/// topk_radix (the file's comment).
template <class Blk>
FERRY_HD void topk_radix(const Blk& b, reduce_shared& sh, const std::byte* row, std::uint64_t width,
                         ferry::d2h::reduce_input in, std::uint32_t k, std::byte* out)
{
  auto key_at = [&](std::uint64_t c) { return order_key(element_bits(row, c, in), in); };
  const std::uint32_t bits = in == ferry::d2h::reduce_input::f32 ? 32U : 16U;
  radix_select(
      b, sh, width, bits, k,
      [&](std::uint64_t c, std::uint32_t& key) {
        key = key_at(c);
        return true;
      },
      vec_ok(row, width, in) ? row : nullptr, in);  // on the GPU: every pass over such a row by 16-byte vectors
  const std::uint32_t kth = sh.prefix;
  const std::uint32_t need = sh.krem;
  const bool every_tie = need == sh.n_eq;
  const bool keep_ties = !every_tie && sh.n_eq <= topk_tie_cap;  // the ties' indices fit: sorted, the lowest taken
  const std::uint32_t n_eq = sh.n_eq;
  b.sync();  // every thread read the first select's result before the second one starts over
  std::uint32_t last_index = 0;  // ~index of the last tie taken: the ties of ~index >= it, the lowest indices
  if (!every_tie && !keep_ties) {
    radix_select(b, sh, width, 32U, need, [&](std::uint64_t c, std::uint32_t& key) {
      key = ~static_cast<std::uint32_t>(c);
      return key_at(c) == kth;
    });
    last_index = sh.prefix;
    b.sync();
  }
  if (b.t == 0) {
    sh.n_cand = 0;
    sh.n_ties = 0;
  }
  b.sync();
  for_each_element<topk_vec_batch, topk_batch>(b, row, width, in, [&](std::uint64_t c, std::uint32_t bits,
                                                                      std::uint32_t) {
    const std::uint32_t key = order_key(bits, in);
    if (key < kth) { return; }
    if (key == kth && keep_ties) {
      sh.ties[b.add(&sh.n_ties, 1)] = static_cast<std::uint32_t>(c);
    } else if (key > kth || every_tie || ~static_cast<std::uint32_t>(c) >= last_index) {
      sh.cand[b.add(&sh.n_cand, 1)] = topk_pack(key, c);
    }
  });
  if (keep_ties) {  // the lowest `need` of the n_eq tie indices: sorted ascending, after the k - need larger keys
    std::uint32_t nt2 = 1;
    while (nt2 < n_eq) { nt2 <<= 1; }
    b.sync();
    for (std::uint32_t i = n_eq + b.t; i < nt2; i += b.nt) { sh.ties[i] = 0xffffffffU; }
    b.sync();
    block_sort(b, sh.ties, nt2, false);
    for (std::uint32_t i = b.t; i < need; i += b.nt) { sh.cand[k - need + i] = topk_pack(kth, sh.ties[i]); }
  }
  b.sync();
  topk_emit(b, sh, k, k, in, out);
}

/// The top-k record of `row` (k values as f32, then k int32 indices) into `out` (4-byte aligned).
template <class Blk>
FERRY_HD void topk_record(const Blk& b, reduce_shared& sh, const std::byte* row, std::uint64_t width,
                          ferry::d2h::reduce_input in, std::uint32_t k, std::byte* out)
{
  if (k <= topk_filter_k && topk_filtered(b, sh, row, width, in, k, out)) { return; }
  topk_radix(b, sh, row, width, in, k, out);
}

}  // namespace ferry::kernels::d2h
