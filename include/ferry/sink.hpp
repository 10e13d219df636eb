// SPDX-License-Identifier: Apache-2.0
// Umbrella header of ferry's sinks: D2H consumers that put captured tensors somewhere (docs/api/sinks.md): the
// safetensors shard writer and the shared-memory stream to another process (its producer and its reader).
#pragma once

#include <ferry/sink/errors.hpp>
#include <ferry/sink/safetensors.hpp>
#include <ferry/sink/shm_reader.hpp>
#include <ferry/sink/sample_assembler.hpp>
#include <ferry/sink/shm_stream.hpp>
