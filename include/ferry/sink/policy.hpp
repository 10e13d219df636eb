// SPDX-License-Identifier: Apache-2.0
// What a sink does when its consumer cannot take an entry now (a full writer queue: safetensors.hpp; a reader
// that released nothing: shm_stream.hpp).
#pragma once

namespace ferry::sink {

/// A sink's answer to a consumer that has no room for the next entry.
enum class queue_policy {
  block,  ///< wait up to the sink's timeout, then keep the entry anyway and record a stall_error (nothing lost)
  drop,   ///< drop the entry's whole forward (counted: dropped_forwards, dropped_entries, dropped_bytes)
};

}  // namespace ferry::sink
