// SPDX-License-Identifier: Apache-2.0
// ferry.Publisher (H2D) for one backend (bound by h2d.cpp; its Slot and Producer scopes: h2d_scopes.hpp):
// declare typed buffers, fill the slot's pinned sources through zero-copy numpy views inside
// begin()/producer() scopes, publish into fixed device destinations.
#pragma once

#include "arrays.hpp"

#include <ferry/h2d.hpp>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry::python {

namespace fh = ferry::h2d;

/// A declared buffer as Python sees it (backend-independent).
struct py_buffer {
  std::uint64_t publisher{0};  ///< the id of the Publisher that declared it (py_publisher::id)
  std::uint32_t index{0};
  std::string name;
  nb::dlpack::dtype dtype{};
  std::size_t itemsize{1};
  std::string unit;        ///< "elements", "rows" or "bytes"
  std::size_t row{0};      ///< elements per row (rows)
  std::size_t capacity{0}; ///< in units
  nb::object np_dtype;

  [[nodiscard]] std::size_t unit_bytes() const noexcept
  {
    return unit == "rows" ? row * itemsize : unit == "elements" ? itemsize : 1;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return capacity * unit_bytes(); }
  /// Shape of the numpy views of this buffer.
  [[nodiscard]] std::vector<std::size_t> shape() const
  {
    if (unit == "rows") { return {capacity, row}; }
    if (unit == "bytes") { return {capacity / itemsize}; }
    return {capacity};
  }
};

[[nodiscard]] inline nb::dlpack::dtype to_dlpack(nb::handle np_dtype, const std::string& who)
{
  const auto kind = nb::cast<std::string>(np_dtype.attr("kind"));
  const auto size = nb::cast<std::size_t>(np_dtype.attr("itemsize"));
  nb::dlpack::dtype d{};
  d.bits = static_cast<std::uint8_t>(size * 8);
  d.lanes = 1;
  if (kind == "i") {
    d.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int);
  } else if (kind == "u") {
    d.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt);
  } else if (kind == "f") {
    d.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float);
  } else if (kind == "b") {
    d.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool);
  } else {
    FERRY_FAIL(ferry::logic_error, "{}: expected an int, uint, float or bool dtype, got numpy kind '{}'", who, kind);
  }
  return d;
}

template <class B>
class py_publisher {
 public:
  explicit py_publisher(int device) : dev_{device}, id_{next_id()}
  {
    B b{};
    b.set_device(fb::device_id{device});
    pub_ = std::make_unique<fh::publisher<B>>(b);
    tie_ = std::make_shared<graph_tie>("Publisher #" + std::to_string(id_) + " (" + traits<B>::name + ", device " +
                                       std::to_string(device) + ")");
  }
  ~py_publisher()
  {
    gil_release g;
    tie_->kill("destroyed");  // graphs of its captured uploads refuse to launch (stream.hpp, graph_tie)
    pub_.reset();
  }

  [[nodiscard]] py_buffer declare(const std::string& name, nb::handle groups, nb::handle dtype, uint_arg capacity_arg,
                                  const std::string& unit, std::optional<uint_arg> row_arg, nb::handle dst)
  {
    const std::string who = "Publisher.declare('" + name + "')";
    const std::size_t capacity = capacity_arg.get(who.c_str(), "capacity");
    const std::optional<std::size_t> row =
      row_arg ? std::optional<std::size_t>{row_arg->get(who.c_str(), "row")} : std::nullopt;
    py_buffer pb;
    pb.publisher = id_;
    pb.name = name;
    pb.np_dtype = nb::module_::import_("numpy").attr("dtype")(dtype);
    pb.dtype = to_dlpack(pb.np_dtype, who);
    pb.itemsize = pb.dtype.bits / 8;
    pb.unit = unit;
    pb.capacity = capacity;
    fh::buffer_spec spec;
    spec.name = name;
    if (nb::isinstance<nb::str>(groups)) {
      spec.groups.push_back(nb::cast<std::string>(groups));
    } else {
      // a str or a sequence of str; anything else (bytes, ints, a non-iterable) is a TypeError naming it
      if (nb::isinstance<nb::bytes>(groups) || PySequence_Check(groups.ptr()) == 0) {
        throw nb::type_error(
            ("ferry: " + who + ": expected groups a str or a sequence of str, got " + type_of(groups)).c_str());
      }
      for (nb::handle g : groups) {
        if (!nb::isinstance<nb::str>(g)) {
          throw nb::type_error(("ferry: " + who + ": expected every group a str, got " + type_of(g)).c_str());
        }
        spec.groups.push_back(nb::cast<std::string>(g));
      }
    }
    spec.element_size = pb.itemsize;
    spec.capacity = capacity;
    if (unit == "elements") {
      spec.unit = fh::count_unit::elements;
    } else if (unit == "rows") {
      FERRY_EXPECTS(row.has_value() && *row > 0, ferry::logic_error,
                    "{}: unit 'rows' needs row= (elements per row) >= 1, got {}", who, row ? *row : 0);
      spec.unit = fh::count_unit::rows;
      spec.row_size = *row * pb.itemsize;
      pb.row = *row;
    } else if (unit == "bytes") {
      spec.unit = fh::count_unit::bytes;
      FERRY_EXPECTS(capacity % pb.itemsize == 0, ferry::logic_error,
                    "{}: unit 'bytes' needs a capacity that is a multiple of the item size {}, got {}", who,
                    pb.itemsize, capacity);
    } else {
      FERRY_FAIL(ferry::logic_error, "{}: expected unit 'elements', 'rows' or 'bytes', got '{}'", who, unit);
    }
    if (!dst.is_none()) {
      const any_array a = as_array(dst, "Publisher.declare");
      check_device_array<B>(a, dev_, who + " dst");
      FERRY_EXPECTS(a.dtype() == pb.dtype, ferry::logic_error, "{}: expected a dst of dtype {}, got {}", who,
                    dtype_str(pb.dtype), dtype_str(a.dtype()));
      FERRY_EXPECTS(a.nbytes() >= pb.bytes(), ferry::logic_error,
                    "{}: expected a dst of at least {} bytes (capacity), got {} bytes", who, pb.bytes(), a.nbytes());
      spec.device_ptr = const_cast<void*>(a.data());
      keep_.push_back(nb::borrow(dst));
    }
    const auto h = pub_->declare(std::move(spec));
    pb.index = h.value;
    bufs_.push_back(pb);
    return pb;
  }

  void initialize(uint_arg slots, nb::handle stream, std::optional<std::string> upload,
                  std::optional<bool> debug_sources)
  {
    auto s = resolve_stream<B>(stream, dev_, "Publisher.initialize");
    fh::config cfg;
    cfg.slots = slots.get("Publisher.initialize", "slots");
    cfg.device = fb::device_id{dev_};
    if (upload) {
      const auto k = fh::parse_upload_backend(*upload);
      FERRY_EXPECTS(k.has_value(), ferry::logic_error,
                    "Publisher.initialize: expected upload one of packed, direct, batch, zerocopy, auto, got '{}'",
                    *upload);
      cfg.backend = *k;
    }
    cfg.debug_sources = debug_sources;
    keep_.push_back(nb::borrow(stream));  // the owner stream must outlive the publisher
    gil_release g;
    set_dev();
    pub_->initialize(cfg, s);
  }

  [[nodiscard]] fh::slot_guard<B> begin(uint_arg slot)
  {
    const std::size_t k = slot.get("Publisher.begin", "slot");
    gil_release g;
    set_dev();
    return pub_->begin(k);
  }
  /// The group's producer scope; `slot`: the expected active slot (checked by the core).
  [[nodiscard]] fh::producer_guard<B> producer(const std::string& group, std::optional<uint_arg> slot)
  {
    return slot ? pub_->producer(group, slot->get("Publisher.producer", "slot")) : pub_->producer(group);
  }

  void set_count(const py_buffer& b, uint_arg n)
  {
    pub_->set_count(handle(b, "Publisher.set_count"), n.get("Publisher.set_count", "count"));
  }
  void publish(const std::string& group, nb::handle stream)
  {
    auto s = resolve_stream<B>(stream, dev_, "Publisher.publish");
    tie_to_capture(s, tie_);
    gil_release g;
    set_dev();
    pub_->publish(group, s);
  }
  void stage(const std::string& group) { pub_->stage(group); }
  void capture_upload(const std::string& group, uint_arg slot_arg, nb::handle stream)
  {
    const std::size_t slot = slot_arg.get("Publisher.capture_upload", "slot");
    auto s = resolve_stream<B>(stream, dev_, "Publisher.capture_upload");
    tie_to_capture(s, tie_);
    gil_release g;
    set_dev();
    pub_->capture_upload(group, slot, s);
  }
  void recover()
  {
    gil_release g;
    set_dev();
    pub_->recover();
  }
  [[nodiscard]] std::uintptr_t device_pointer(const py_buffer& b) const
  {
    return reinterpret_cast<std::uintptr_t>(pub_->device_pointer(handle(b, "Publisher.device_pointer")));
  }
  [[nodiscard]] nb::dict info(const std::string& group) const
  {
    const auto i = pub_->info(group);
    nb::dict d;
    d["name"] = i.name;
    d["backend"] = std::string{fh::to_string(i.backend)};
    d["graph_backend"] = std::string{fh::to_string(i.graph_backend)};
    d["arena_bytes"] = i.arena_bytes;
    d["members"] = i.members;
    return d;
  }
  [[nodiscard]] fh::publisher<B>& get() { return *pub_; }
  [[nodiscard]] int device() const noexcept { return dev_; }
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  /// `b` as this publisher declared it; a Buffer of another publisher (its index names another buffer here, or
  /// none) is a LogicError naming the call, the buffer and both publishers.
  [[nodiscard]] const py_buffer& buffer(const py_buffer& b, const char* who) const
  {
    FERRY_EXPECTS(b.publisher == id_ && b.index < bufs_.size(), ferry::logic_error,
                  "{}: expected a buffer declared by this publisher (Publisher #{}), got buffer '{}' of Publisher #{}",
                  who, id_, b.name, b.publisher);
    return bufs_[b.index];
  }
  /// The core's handle of `b` (buffer() checked).
  [[nodiscard]] fh::buffer_handle handle(const py_buffer& b, const char* who) const
  {
    return fh::buffer_handle{buffer(b, who).index};
  }

 private:
  void set_dev() const
  {
    B{}.set_device(fb::device_id{dev_});  // the host backend emulates devices too: its current one is per thread
  }
  static std::uint64_t next_id() noexcept
  {
    static std::atomic<std::uint64_t> n{0};
    return n.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  int dev_;
  std::uint64_t id_;  ///< Publisher #id_: names it in errors (a Buffer records it)
  std::unique_ptr<fh::publisher<B>> pub_;
  std::shared_ptr<graph_tie> tie_;  ///< killed by the destructor (stream.hpp)
  std::vector<py_buffer> bufs_;
  std::vector<nb::object> keep_;  // bound destinations and the owner stream
};

/// View of `bytes` at `p` shaped like buffer `b` (owner keeps the storage alive).
template <class Array>
[[nodiscard]] Array buffer_view(const py_buffer& b, void* p, nb::handle owner, int device_type, int device_id)
{
  const auto shape = b.shape();
  return Array(p, shape.size(), shape.data(), owner, nullptr, b.dtype, device_type, device_id);
}

/// Registers Buffer (backend-independent) in `m`.
void init_h2d_types(nb::module_& m);
/// Registers Publisher, Slot and Producer of backend B in `m`.
template <class B>
void init_h2d(nb::module_& m);

}  // namespace ferry::python
