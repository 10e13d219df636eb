// SPDX-License-Identifier: Apache-2.0
// The top-k record of a row by a whole block (reduce_block.cuh says how the reduce bodies call it): radix select of
// the k-th largest order_key, the winners collected and bitonic-sorted in shared memory (value descending, index
// ascending), ties at the k-th value broken by the lowest indices.
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
      for (std::uint32_t e = 0; e < pv; ++e) {
        b.warp_count(hist, live ? digit(order_key(vec_bits(v[u], e, in), in)) : 256U);
      }
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

/// The top-k record of `row` (k values as f32, then k int32 indices) into `out` (4-byte aligned).
template <class Blk>
FERRY_HD void topk_record(const Blk& b, reduce_shared& sh, const std::byte* row, std::uint64_t width,
                          ferry::d2h::reduce_input in, std::uint32_t k, std::byte* out)
{
  auto key_at = [&](std::uint64_t c) { return order_key(element_bits(row, c, in), in); };
  const std::uint32_t bits = in == ferry::d2h::reduce_input::f32 ? 32U : 16U;
  const bool by_vec = vec_ok(row, width, in);  // on the GPU: every pass over the row by 16-byte vectors
  radix_select(
      b, sh, width, bits, k,
      [&](std::uint64_t c, std::uint32_t& key) {
        key = key_at(c);
        return true;
      },
      by_vec ? row : nullptr, in);
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
    sh.n_taken = 0;
    sh.n_ties = 0;
  }
  b.sync();
  auto consider = [&](std::uint64_t c, std::uint32_t key) {
    if (key < kth) { return; }
    if (key == kth && keep_ties) {
      sh.ties[b.add(&sh.n_ties, 1)] = static_cast<std::uint32_t>(c);
    } else if (key > kth || every_tie || ~static_cast<std::uint32_t>(c) >= last_index) {
      const std::uint32_t slot = b.add(&sh.n_taken, 1);
      sh.key[slot] = key;
      sh.idx[slot] = static_cast<std::int32_t>(c);
    }
  };
  bool collected = false;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if (by_vec) {  // each thread topk_vec_batch vectors in flight, then their elements
    const std::uint32_t pv = per_vec(in);
    const std::uint64_t nv = width / pv;
    for (std::uint64_t i0 = b.t; i0 < nv; i0 += topk_vec_batch * b.nt) {
      vec16 v[topk_vec_batch];
#pragma unroll
      for (std::uint32_t u = 0; u < topk_vec_batch; ++u) {
        if (i0 + u * b.nt < nv) { v[u] = vec_at(row, i0 + u * b.nt); }
      }
#pragma unroll
      for (std::uint32_t u = 0; u < topk_vec_batch; ++u) {
        const std::uint64_t i = i0 + u * b.nt;
        if (i >= nv) { continue; }
        for (std::uint32_t e = 0; e < pv; ++e) { consider(i * pv + e, order_key(vec_bits(v[u], e, in), in)); }
      }
    }
    collected = true;
  }
#endif
  for (std::uint64_t c0 = b.t; c0 < width && !collected; c0 += topk_batch * b.nt) {  // loads, then their uses
    std::uint32_t keys[topk_batch];
    for (std::uint32_t u = 0; u < topk_batch; ++u) {
      const std::uint64_t c = c0 + u * b.nt;
      keys[u] = c < width ? key_at(c) : 0U;
    }
    for (std::uint32_t u = 0; u < topk_batch; ++u) {
      if (c0 + u * b.nt < width) { consider(c0 + u * b.nt, keys[u]); }
    }
  }
  if (keep_ties) {  // the lowest `need` of the n_eq tie indices: sorted ascending, after the k - need larger keys
    std::uint32_t nt2 = 1;
    while (nt2 < n_eq) { nt2 <<= 1; }
    b.sync();
    for (std::uint32_t i = n_eq + b.t; i < nt2; i += b.nt) { sh.ties[i] = 0xffffffffU; }
    b.sync();
    for (std::uint32_t size = 2; size <= nt2; size <<= 1) {
      for (std::uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
        for (std::uint32_t i = b.t; i < nt2; i += b.nt) {
          const std::uint32_t j = i ^ stride;
          if (j > i && ((i & size) == 0 ? sh.ties[j] < sh.ties[i] : sh.ties[i] < sh.ties[j])) {
            const std::uint32_t x = sh.ties[i];
            sh.ties[i] = sh.ties[j];
            sh.ties[j] = x;
          }
        }
        b.sync();
      }
    }
    for (std::uint32_t i = b.t; i < need; i += b.nt) {
      sh.key[k - need + i] = kth;
      sh.idx[k - need + i] = static_cast<std::int32_t>(sh.ties[i]);
    }
  }
  std::uint32_t n2 = 1;
  while (n2 < k) { n2 <<= 1; }
  for (std::uint32_t i = k + b.t; i < n2; i += b.nt) {  // padding: after every element
    sh.key[i] = 0;
    sh.idx[i] = 0x7fffffff;
  }
  b.sync();
  auto before = [&](std::uint32_t x, std::uint32_t y) {  // x goes first: larger value, or equal and lower index
    return sh.key[x] > sh.key[y] || (sh.key[x] == sh.key[y] && sh.idx[x] < sh.idx[y]);
  };
  for (std::uint32_t size = 2; size <= n2; size <<= 1) {  // bitonic sort into `before` order
    for (std::uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (std::uint32_t i = b.t; i < n2; i += b.nt) {
        const std::uint32_t j = i ^ stride;
        if (j > i && ((i & size) == 0 ? before(j, i) : before(i, j))) {
          const std::uint32_t kk = sh.key[i];
          const std::int32_t ii = sh.idx[i];
          sh.key[i] = sh.key[j];
          sh.idx[i] = sh.idx[j];
          sh.key[j] = kk;
          sh.idx[j] = ii;
        }
      }
      b.sync();
    }
  }
  for (std::uint32_t i = b.t; i < k; i += b.nt) {
    const float v = float_of(bits_of_key(sh.key[i], in), in);
    std::memcpy(out + 4ULL * i, &v, 4);
    std::memcpy(out + 4ULL * (k + i), &sh.idx[i], 4);
  }
  b.sync();  // the next record reuses the scratch
}

}  // namespace ferry::kernels::d2h
