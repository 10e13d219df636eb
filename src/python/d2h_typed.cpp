// SPDX-License-Identifier: Apache-2.0
// The hook schema from and to Python, and entry payloads as numpy / torch arrays (d2h_typed.hpp).
#include "d2h_typed.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <span>

namespace ferry::python {

namespace {

namespace dl = nb::dlpack;

/// numpy's element type of `t`: its own where numpy has it, else the elements' bits (BF16, F8).
dl::dtype numpy_dtype(fd::dtype t)
{
  const auto bits = static_cast<std::uint8_t>(fd::dtype_bytes(t) * 8);
  switch (t) {
    case fd::dtype::f64:
    case fd::dtype::f32:
    case fd::dtype::f16: return {static_cast<std::uint8_t>(dl::dtype_code::Float), bits, 1};
    case fd::dtype::i64:
    case fd::dtype::i32:
    case fd::dtype::i16:
    case fd::dtype::i8: return {static_cast<std::uint8_t>(dl::dtype_code::Int), bits, 1};
    case fd::dtype::boolean: return {static_cast<std::uint8_t>(dl::dtype_code::Bool), 8, 1};
    default: return {static_cast<std::uint8_t>(dl::dtype_code::UInt), bits, 1};  // unsigned; BF16, F8: the bits
  }
}

/// torch's name of `t` (torch.<name>).
const char* torch_name(fd::dtype t)
{
  switch (t) {
    case fd::dtype::f64: return "float64";
    case fd::dtype::f32: return "float32";
    case fd::dtype::f16: return "float16";
    case fd::dtype::bf16: return "bfloat16";
    case fd::dtype::f8_e4m3: return "float8_e4m3fn";
    case fd::dtype::f8_e5m2: return "float8_e5m2";
    case fd::dtype::i64: return "int64";
    case fd::dtype::i32: return "int32";
    case fd::dtype::i16: return "int16";
    case fd::dtype::i8: return "int8";
    case fd::dtype::u64: return "uint64";
    case fd::dtype::u32: return "uint32";
    case fd::dtype::u16: return "uint16";
    case fd::dtype::u8: return "uint8";
    case fd::dtype::boolean: return "bool";
  }
  return "uint8";
}

nb::capsule keep_capsule(std::shared_ptr<const void> keep)
{
  auto* k = new std::shared_ptr<const void>(std::move(keep));
  return nb::capsule(k, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
}

/// `bytes` as `shape` elements of `t` (a torch tensor or a read-only numpy array), based on `keep`.
nb::object wrap(std::span<const std::byte> bytes, const std::vector<std::size_t>& shape, fd::dtype t,
                std::shared_ptr<const void> keep, bool torch)
{
  nb::capsule owner = keep_capsule(std::move(keep));
  if (!torch) {
    return nb::cast(nb::ndarray<nb::numpy, nb::ro>(bytes.data(), shape.size(), shape.data(), owner, nullptr,
                                                   numpy_dtype(t)));
  }
  // torch gets a signed integer of the element's width (every torch takes those through DLPack), then a
  // view as the hook's dtype: one path for bfloat16, float8 and the unsigned types alike.
  const auto bits = static_cast<std::uint8_t>(fd::dtype_bytes(t) * 8);
  const dl::dtype as_int{static_cast<std::uint8_t>(dl::dtype_code::Int), bits, 1};
  nb::object x = nb::cast(nb::ndarray<nb::pytorch>(const_cast<std::byte*>(bytes.data()), shape.size(), shape.data(),
                                                   owner, nullptr, as_int));
  const std::string name = torch_name(t);
  if (name == "int" + std::to_string(bits)) { return x; }
  return x.attr("view")(nb::module_::import_("torch").attr(name.c_str()));
}

}  // namespace

fd::hook_schema schema_of(const std::vector<hook_tuple>& tuples, const char* who)
{
  fd::hook_schema s;
  for (const auto& [id, name, dtype, shape, shard] : tuples) {
    std::vector<std::uint64_t> dims;
    for (const auto& d : shape) { dims.push_back(d.get(who, "a row dimension")); }
    const fd::hook_id h{static_cast<std::uint32_t>(id.get(who, "a hook id", UINT32_MAX))};
    s.add(h, name, dtype, std::move(dims));
    if (shard) {
      const auto& [world, rank, dim, offset, full] = *shard;
      s.shard(h, {static_cast<std::uint32_t>(world.get(who, "shard world", UINT32_MAX)),
                  static_cast<std::uint32_t>(rank.get(who, "shard rank", UINT32_MAX)),
                  static_cast<std::uint32_t>(dim.get(who, "shard dim", UINT32_MAX)), offset.get(who, "shard offset"),
                  full.get(who, "shard full")});
    }
  }
  return s;
}

fd::hook_schema schema_of(nb::handle tuples, const char* who)
{
  std::vector<hook_tuple> t;
  if (!nb::try_cast(tuples, t)) {
    throw nb::type_error((std::string{"ferry: "} + who + ": expected schema a sequence of (hook, name, dtype name, "
                          "row_shape, shard or None) tuples (ferry.Channel makes them from {hook: (name, dtype, "
                          "row_shape)}), got " + type_of(tuples)).c_str());
  }
  return schema_of(t, who);
}

nb::dict schema_dict(const fd::hook_schema& s)
{
  nb::dict d;
  for (const auto& h : s.hooks()) {
    nb::list row;  // a reduced hook: (name, its reducer, the rows it reduces), as it was given
    if (!h.reduce.empty()) { row.append(h.reduce_width); }
    for (auto x : h.reduce.empty() ? h.row_shape : std::vector<std::uint64_t>{}) { row.append(x); }
    const std::string type = h.reduce.empty() ? std::string{fd::dtype_name(h.type)} : h.reduce;
    if (h.shard.world == 0) {
      d[nb::int_(h.id.value)] = nb::make_tuple(h.name, type, nb::tuple(row));
      continue;
    }
    nb::dict l;  // a tensor-parallel slice: the 4th element, as ferry/schema.py takes it
    l["world"] = h.shard.world;
    l["rank"] = h.shard.rank;
    l["dim"] = h.shard.dim;
    l["offset"] = h.shard.offset;
    l["full"] = h.shard.full;
    d[nb::int_(h.id.value)] = nb::make_tuple(h.name, type, nb::tuple(row), l);
  }
  return d;
}

nb::object typed_array(const fd::typed_view& t, std::shared_ptr<const void> keep, bool torch)
{
  const std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
  return wrap(t.bytes(), shape, t.type(), std::move(keep), torch);
}

nb::object bytes_array(std::span<const std::byte> b, std::shared_ptr<const void> keep, bool torch)
{
  return wrap(b, {b.size()}, fd::dtype::u8, std::move(keep), torch);
}

nb::object entry_array(const fd::entry_view& v, const fd::hook_schema* s, std::shared_ptr<const void> keep, bool torch)
{
  if (s != nullptr && s->find(v.hook()) != nullptr) {
    return typed_array(fd::typed(*s, v), std::move(keep), torch);  // the core's checks: whole rows of its row size
  }
  return bytes_array(v.bytes(), std::move(keep), torch);
}

}  // namespace ferry::python
