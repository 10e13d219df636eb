// SPDX-License-Identifier: Apache-2.0
// The hook schema from and to Python, and a delivered entry as an array: conversion only. What an entry's
// tensor is (its hook's dtype, [rows, *row_shape], the refusals) is the core's (d2h/typed_view.hpp:
// fd::typed over d2h/hook_schema.hpp); this file maps dtypes to numpy's and torch's and wraps the staging
// zero-copy. Used by Entry (d2h_entry.hpp), EntryBatch (d2h_batch.hpp), ShmEntry (shm_reader.cpp),
// Channel(schema=) and the sinks.
#pragma once

#include "arrays.hpp"

#include <nanobind/stl/optional.h>  // hook_tuple's shard
#include <nanobind/stl/tuple.h>

#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/hook_schema.hpp>
#include <ferry/d2h/typed_view.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace ferry::python {

namespace fd = ferry::d2h;

/// A tensor-parallel slice as Python gives it: (world, rank, dim, offset, full) (fd::shard_layout).
using shard_tuple = std::tuple<uint_arg, uint_arg, uint_arg, uint_arg, uint_arg>;
/// One hook of a schema as Python gives it: (hook id, name, safetensors dtype name or reducer, row_shape, shard or
/// None); ferry/schema.py makes these from {hook: (name, dtype, row_shape[, shard])} with torch / numpy dtypes.
using hook_tuple = std::tuple<uint_arg, std::string, std::string, std::vector<uint_arg>, std::optional<shard_tuple>>;
/// The schema of `tuples` (the core's hook_schema::add validates each: schema_error naming the hook).
[[nodiscard]] fd::hook_schema schema_of(const std::vector<hook_tuple>& tuples, const char* who);
/// The same from a Python object (a sequence of hook tuples); TypeError naming `who` for anything else.
[[nodiscard]] fd::hook_schema schema_of(nb::handle tuples, const char* who);
/// {hook: (name, dtype name, row_shape tuple)} (Channel.schema).
[[nodiscard]] nb::dict schema_dict(const fd::hook_schema& s);

/// A delivered entry's payload as an array over its staging (no copy; `keep` holds the staging and is the
/// array's base): the tensor [rows, *row_shape] of its hook's dtype when `s` names the hook (fd::typed: a size
/// that does not fit the schema raises the core's entry_shape_error), else its bytes (uint8, 1-D). `torch`: a
/// torch.Tensor of the hook's dtype (bfloat16 and float8 included); else a read-only numpy array, where numpy
/// has the dtype, and the elements' bits where it has not (BF16: uint16, F8_*: uint8).
[[nodiscard]] nb::object entry_array(const fd::entry_view& v, const fd::hook_schema* s,
                                     std::shared_ptr<const void> keep, bool torch);
/// A typed view (the core's fd::typed: an entry wherever its bytes are) as an array over its bytes, as
/// entry_array makes it for a declared hook: its shape and dtype; `keep` holds the bytes and is the array's base.
[[nodiscard]] nb::object typed_array(const fd::typed_view& t, std::shared_ptr<const void> keep, bool torch);
/// Bytes as a 1-D uint8 array over them (no copy; read-only numpy, or torch.uint8), as entry_array makes it for an
/// undeclared hook.
[[nodiscard]] nb::object bytes_array(std::span<const std::byte> b, std::shared_ptr<const void> keep, bool torch);

}  // namespace ferry::python
