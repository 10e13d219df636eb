// SPDX-License-Identifier: Apache-2.0
// sink::widen_to_f32: bf16 or f16 values as float32, exactly (every bf16 and f16 is a float), for a sink whose format
// keeps float32 where the capture holds 16-bit floats (ferry.arrow's SAELens layout: Array2D of float32). One pass,
// no temporary: bf16 by 16-byte vectors on x86-64 (a bf16 is the high half of its float: an unpack with zeros), f16
// by bits as the reduce kernels convert it (NaN payloads kept, as numpy keeps them; F16C's conversion would quiet
// a signalling NaN).
//   widen_to_f32(src_bits, widen_from::bf16, dst);   dst.size() == src_bits.size()
#pragma once

#include <cstdint>
#include <span>

namespace ferry::sink {

enum class widen_from : std::uint8_t { bf16, f16 };

/// dst[i] = the float of 16-bit value src[i] of type `from`. logic_error when the sizes differ (nothing written).
void widen_to_f32(std::span<const std::uint16_t> src, widen_from from, std::span<float> dst);

}  // namespace ferry::sink
