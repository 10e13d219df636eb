// SPDX-License-Identifier: Apache-2.0
// Umbrella header of ferry's sinks: D2H consumers that put captured tensors somewhere (docs/api/sinks.md).
#pragma once

#include <ferry/sink/errors.hpp>
#include <ferry/sink/safetensors.hpp>
