// SPDX-License-Identifier: Apache-2.0
// What each hook's bytes are: per hook id a name, an element type (dtype.hpp) and the shape of one row. An
// entry of n * row_bytes bytes is then the tensor [n, *row_shape]: a capture_rows entry of n rows, or an entry
// captured whole whose first dimension is its rows (a [tokens, hidden] activation: row_shape {hidden}). Sinks
// that write typed tensors (sink/safetensors.hpp) take one. Host-only.
//
//   fd::hook_schema schema;
//   schema.add(fd::hook_id{0}, "layers.0.resid_pre", fd::dtype::bf16, {1024})
//         .add(fd::hook_id{1}, "token_ids", fd::dtype::i64);             // row_shape {}: one element per row
//   schema.shape_of(fd::hook_id{0}, 3 * 2048);                             // {3, 1024}
#pragma once

#include <ferry/d2h/dtype.hpp>
#include <ferry/d2h/entry_view.hpp>
#include <ferry/d2h/reducer.hpp>
#include <ferry/d2h/types.hpp>
#include <ferry/error.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::d2h {

/// An invalid schema: an empty, duplicate or malformed hook name, a duplicate hook id, an unknown dtype name,
/// a zero dimension, or a row whose byte count overflows 64 bits. Raised by hook_schema::add.
class schema_error : public ferry::logic_error {
 public:
  using logic_error::logic_error;
};

/// An entry that does not fit the schema: its hook is not in it, its size is not a whole number of rows, or
/// its own row size (capture_rows) differs from the schema's. Carries the hook, the size and the row bytes.
class entry_shape_error : public ferry::logic_error {
 public:
  entry_shape_error(hook_id hook, std::uint64_t size, std::uint64_t row_bytes, const std::string& msg)
    : logic_error(msg), hook_{hook}, size_{size}, row_bytes_{row_bytes}
  {
  }
  [[nodiscard]] hook_id hook() const noexcept { return hook_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  /// The schema's row bytes of the hook (0: the hook is not in the schema).
  [[nodiscard]] std::uint64_t row_bytes() const noexcept { return row_bytes_; }

 private:
  hook_id hook_;
  std::uint64_t size_;
  std::uint64_t row_bytes_;
};

/// A tensor-parallel hook's slice (hook_schema::shard): rank `rank` of `world` holds [offset, offset + extent) of
/// dimension `dim` of the row (extent: row_shape[dim]), whose whole extent there is `full`. world 0: not sharded.
struct shard_layout {
  std::uint32_t world{0};
  std::uint32_t rank{0};
  std::uint32_t dim{0};
  std::uint64_t offset{0};
  std::uint64_t full{0};
  friend constexpr bool operator==(const shard_layout&, const shard_layout&) = default;
};

/// One hook of a schema.
struct hook_spec {
  hook_id id{};
  std::string name;                    ///< unique in the schema; no control character and no '#'
  d2h::dtype type{d2h::dtype::u8};
  std::vector<std::uint64_t> row_shape;  ///< the dimensions of one row ({}: one element)
  std::uint64_t row_bytes{0};          ///< product(row_shape) * dtype_bytes(type)
  std::string reduce;                  ///< a reduced hook (capture_reduced): its reducer's spec, "topk(64)", ...
  std::uint64_t reduce_width{0};       ///< a reduced hook: the elements of the rows it reduces
  shard_layout shard{};                ///< a tensor-parallel hook: the slice this rank holds (world 0: whole)
};

/// The hooks a consumer knows, by id. Value type; add() validates each hook as it comes.
class hook_schema {
 public:
  /// Adds hook `id`. Throws schema_error naming the hook for an id already added, an empty name, a name
  /// already used, holding a control character or '#' (sinks use it to number a hook's repeats), a zero
  /// dimension, or a row of more than 2^64 - 1 bytes.
  hook_schema& add(hook_id id, std::string name, d2h::dtype type, std::vector<std::uint64_t> row_shape = {})
  {
    FERRY_EXPECTS(!name.empty(), schema_error, "hook schema: hook {}: expected a non-empty name, got \"\"", id.value);
    const auto bad = std::find_if(name.begin(), name.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '#';
    });
    FERRY_EXPECTS(bad == name.end(), schema_error,
                  "hook schema: hook {} \"{}\": expected a name without control characters or '#', got character "
                  "{:#04x} at {}", id.value, printable(name), static_cast<unsigned>(static_cast<unsigned char>(*bad)),
                  bad - name.begin());
    const std::size_t bad_utf8 = utf8_error(name);
    FERRY_EXPECTS(
        bad_utf8 == name.size(), schema_error,
        "hook schema: hook {} \"{}\": expected a UTF-8 name (it is written into JSON), got byte {:#04x} at {}",
        id.value, printable(name), static_cast<unsigned>(static_cast<unsigned char>(name[bad_utf8])), bad_utf8);
    const auto it = std::lower_bound(hooks_.begin(), hooks_.end(), id.value,
                                     [](const hook_spec& h, std::uint32_t v) { return h.id.value < v; });
    FERRY_EXPECTS(it == hooks_.end() || it->id != id, schema_error,
                  "hook schema: expected each hook id once, got hook {} twice (\"{}\", then \"{}\")", id.value,
                  it->name, printable(name));
    for (const auto& h : hooks_) {
      FERRY_EXPECTS(h.name != name, schema_error,
                    "hook schema: expected unique hook names, got \"{}\" for hook {} and hook {}", printable(name),
                    h.id.value, id.value);
    }
    std::uint64_t bytes = dtype_bytes(type);
    for (std::size_t d = 0; d < row_shape.size(); ++d) {
      FERRY_EXPECTS(row_shape[d] != 0, schema_error,
                    "hook schema: hook {} \"{}\": expected row dimensions >= 1, got 0 at dimension {} of {}", id.value,
                    name, d, shape_text(row_shape));
      FERRY_EXPECTS(bytes <= std::numeric_limits<std::uint64_t>::max() / row_shape[d], schema_error,
                    "hook schema: hook {} \"{}\": expected a row of at most 2^64 - 1 bytes, got {} x {} ({} bytes per "
                    "element) overflowing it",
                    id.value, name, shape_text(row_shape), dtype_name(type), dtype_bytes(type));
      bytes *= row_shape[d];
    }
    hooks_.insert(it, hook_spec{id, std::move(name), type, std::move(row_shape), bytes, {}, 0, {}});
    return *this;
  }

  /// As above with the dtype by its safetensors name ("F32", "BF16", ...), or a reduced hook: `type` a reducer
  /// (reducer.hpp's spelling, "topk(64)", "fp8_e4m3", "mean", "stats") and `row_shape` the rows it reduces; its
  /// entries are records (U8, row_shape {record_bytes}). schema_error for another name, or a k the rows do not have.
  hook_schema& add(hook_id id, std::string name, std::string_view type, std::vector<std::uint64_t> row_shape = {})
  {
    d2h::dtype t{};
    if (parse_dtype(type, t)) { return add(id, std::move(name), t, std::move(row_shape)); }
    reducer r;
    FERRY_EXPECTS(parse_reducer(type, r), schema_error,
                  "hook schema: hook {} \"{}\": expected a dtype among {} or a reducer (topk(K), fp8_e4m3, mean, "
                  "stats), got \"{}\"", id.value, printable(name), dtype_names(), printable(type));
    std::uint64_t width = 1;
    for (const auto d : row_shape) { width = d != 0 && width <= (std::uint64_t{1} << 31) / d ? width * d : 0; }
    FERRY_EXPECTS(width > 0 && width < (std::uint64_t{1} << 31) &&
                      (r.op != reduce_op::topk || (r.k >= 1 && r.k <= topk_max && r.k <= width)),
                  schema_error,
                  "hook schema: hook {} \"{}\": expected {} of rows of 1 to 2^31 - 1 elements (topk: k <= min(width, "
                  "{})), got rows of {}", id.value, printable(name), printable(type), topk_max, shape_text(row_shape));
    add(id, name, dtype::u8, {record_bytes(r, width)});
    hook_spec* h = amend(id);
    h->reduce = std::string{type};
    h->reduce_width = width;
    return *this;
  }

  /// Marks hook `id` as rank l.rank's slice of a tensor-parallel tensor (shard_layout); sinks write the layout
  /// next to the data. schema_error naming the hook for one not in the schema, a reduced hook, world 0, rank >=
  /// world, dim outside the row, or a slice past `full`.
  hook_schema& shard(hook_id id, shard_layout l)
  {
    hook_spec* it = amend(id);
    FERRY_EXPECTS(it != nullptr, schema_error, "hook schema: shard: expected a hook of the schema, got hook {}",
                  id.value);
    FERRY_EXPECTS(it->reduce.empty() && l.world >= 1 && l.rank < l.world && l.dim < it->row_shape.size() &&
                      l.offset <= l.full && it->row_shape[l.dim] <= l.full - l.offset,
                  schema_error,
                  "hook schema: hook {} \"{}\": expected rank < world, dim < {} and offset + row_shape[dim] <= full "
                  "(row_shape {}{}), got rank {} of {}, dim {}, offset {}, full {}", id.value, it->name,
                  it->row_shape.size(), shape_text(it->row_shape), it->reduce.empty() ? "" : ", not a reduced hook",
                  l.rank, l.world, l.dim, l.offset, l.full);
    it->shard = l;
    return *this;
  }

  /// The hook `id`, or null.
  [[nodiscard]] const hook_spec* find(hook_id id) const noexcept
  {
    const auto it = std::lower_bound(hooks_.begin(), hooks_.end(), id.value,
                                     [](const hook_spec& h, std::uint32_t v) { return h.id.value < v; });
    return it != hooks_.end() && it->id == id ? &*it : nullptr;
  }
  /// The hooks, by increasing id.
  [[nodiscard]] const std::vector<hook_spec>& hooks() const noexcept { return hooks_; }
  [[nodiscard]] std::size_t size() const noexcept { return hooks_.size(); }
  [[nodiscard]] bool empty() const noexcept { return hooks_.empty(); }

  /// The schema's hook of an entry of `hook` holding `bytes` bytes, its own row size `entry_row_bytes`
  /// (entry_view::row_bytes(): 0 for an entry captured whole); `rows` receives bytes / row_bytes. Throws
  /// entry_shape_error for a hook not in the schema, a size that is not a whole number of rows, or an entry
  /// row size other than the schema's.
  [[nodiscard]] const hook_spec& check(hook_id hook, std::uint64_t bytes, std::uint64_t entry_row_bytes,
                                       std::uint64_t& rows) const
  {
    const hook_spec* h = find(hook);
    if (h == nullptr) {
      throw entry_shape_error(
          hook, bytes, 0,
          ferry::detail::format("ferry: hook schema: entry of hook {} ({} bytes): expected a hook of "
                                "the schema ({} hooks), got one it does not name [{}:{}]",
                                hook.value, bytes, hooks_.size(), __FILE__, __LINE__));
    }
    if (entry_row_bytes != 0 && entry_row_bytes != h->row_bytes) {
      throw entry_shape_error(
          hook, bytes, h->row_bytes,
          ferry::detail::format("ferry: hook schema: entry of hook {} \"{}\" ({} bytes): expected rows "
                                "of {} bytes ({} x {}), got capture_rows rows of {} bytes [{}:{}]",
                                hook.value, h->name, bytes, h->row_bytes, shape_text(h->row_shape), dtype_name(h->type),
                                entry_row_bytes, __FILE__, __LINE__));
    }
    if (bytes % h->row_bytes != 0) {
      throw entry_shape_error(
          hook, bytes, h->row_bytes,
          ferry::detail::format("ferry: hook schema: entry of hook {} \"{}\": expected a multiple of "
                                "its row bytes {} ({} x {}), got {} bytes [{}:{}]",
                                hook.value, h->name, h->row_bytes, shape_text(h->row_shape), dtype_name(h->type), bytes,
                                __FILE__, __LINE__));
    }
    rows = bytes / h->row_bytes;
    return *h;
  }

  /// The tensor shape [rows, *row_shape] of an entry of `hook` holding `bytes` bytes (check() above).
  [[nodiscard]] std::vector<std::uint64_t> shape_of(hook_id hook, std::uint64_t bytes,
                                                    std::uint64_t entry_row_bytes = 0) const
  {
    std::uint64_t rows = 0;
    const hook_spec& h = check(hook, bytes, entry_row_bytes, rows);
    std::vector<std::uint64_t> s{rows};
    s.insert(s.end(), h.row_shape.begin(), h.row_shape.end());
    return s;
  }
  /// The tensor shape of a delivered ok entry (its hook, size() and row_bytes()).
  [[nodiscard]] std::vector<std::uint64_t> shape_of(const entry_view& e) const
  {
    return shape_of(e.hook(), e.size(), e.row_bytes());
  }

  /// "[2, 3]" (for messages).
  [[nodiscard]] static std::string shape_text(const std::vector<std::uint64_t>& s)
  {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) { t += (i != 0 ? ", " : "") + std::to_string(s[i]); }
    return t + "]";
  }

 private:
  /// The hook `id` to amend (a reduced hook's reducer, a slice), or null: find()'s lookup.
  hook_spec* amend(hook_id id) noexcept { return const_cast<hook_spec*>(std::as_const(*this).find(id)); }
  /// The offset of the first byte of `s` that is not valid UTF-8 (s.size(): none).
  static std::size_t utf8_error(std::string_view s) noexcept
  {
    std::size_t i = 0;
    while (i < s.size()) {
      const auto c = static_cast<unsigned char>(s[i]);
      const std::size_t n = c < 0x80                        ? 1
                            : (c >> 5) == 0x6 && c >= 0xC2  ? 2
                            : (c >> 4) == 0xE               ? 3
                            : (c >> 3) == 0x1E && c <= 0xF4 ? 4
                                                            : 0;
      if (n == 0 || i + n > s.size()) { return i; }
      for (std::size_t k = 1; k < n; ++k) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) { return i; }
      }
      i += n;
    }
    return s.size();
  }
  /// `s` with its control characters (and, if it is not UTF-8, its non-ASCII bytes) escaped: a refused name
  /// is quoted in a message, which stays UTF-8.
  static std::string printable(std::string_view s)
  {
    const bool utf8 = utf8_error(s) == s.size();
    std::string t;
    for (const char c : s) {
      const auto u = static_cast<unsigned char>(c);
      t += u < 0x20 || u == 0x7f || (u >= 0x80 && !utf8) ? ferry::detail::format("\\x{:02x}", static_cast<unsigned>(u))
                                                         : std::string(1, c);
    }
    return t;
  }

  std::vector<hook_spec> hooks_;  // by increasing id
};

}  // namespace ferry::d2h
