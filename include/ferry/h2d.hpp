// SPDX-License-Identifier: Apache-2.0
// Umbrella header for H2D publication (host backend always; include ferry/backend/cuda/backend.hpp and link
// ferry::cuda for the CUDA backend).
#pragma once

#include <ferry/h2d/publisher.hpp>
#include <ferry/h2d/types.hpp>
