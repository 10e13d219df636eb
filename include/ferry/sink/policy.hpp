// SPDX-License-Identifier: Apache-2.0
// What a sink does when its consumer cannot take an entry now (a full writer queue: safetensors.hpp; a reader
// that released nothing: shm_stream.hpp).
#pragma once

#include <cstdint>

namespace ferry::sink {

/// A sink's answer to a consumer that has no room for the next entry.
enum class queue_policy {
  block,  ///< wait up to the sink's timeout, then keep the entry anyway and record a stall_error (nothing lost)
  drop,   ///< drop the entry's whole forward (counted: dropped_forwards, dropped_entries, dropped_bytes)
};

/// What policy drop took from one request (a sink's dropped_requests()): the forwards it dropped whole or cut short
/// that held rows of the request (forward_meta::requests), and those rows (each forward counted once, whatever
/// its number of entries). A forward without attribution is only in the counters.
struct request_drop {
  std::uint64_t request{0};   ///< the engine's request id (request_rows::request)
  std::uint64_t forwards{0};  ///< its forwards that lost entries
  std::uint64_t rows{0};      ///< the rows those forwards held for it (its tokens lost, per captured hook)
  friend constexpr bool operator==(const request_drop&, const request_drop&) = default;
};

}  // namespace ferry::sink
