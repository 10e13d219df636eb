// SPDX-License-Identifier: Apache-2.0
// Umbrella header for the backend layer (host backend always; CUDA/HIP headers are included by users
// who link ferry::cuda / ferry::hip).
#pragma once

#include <ferry/backend/buffer.hpp>
#include <ferry/backend/concepts.hpp>
#include <ferry/backend/event.hpp>
#include <ferry/backend/faulty.hpp>
#include <ferry/backend/graph.hpp>
#include <ferry/backend/grid_dependency.hpp>
#include <ferry/backend/host/backend.hpp>
#include <ferry/backend/kernel.hpp>
#include <ferry/backend/stream.hpp>
#include <ferry/backend/system_atomic.hpp>
#include <ferry/backend/types.hpp>

static_assert(ferry::backend::backend<ferry::backend::host_backend>);
static_assert(ferry::backend::backend<ferry::backend::faulty<ferry::backend::host_backend>>);
