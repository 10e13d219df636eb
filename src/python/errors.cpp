// SPDX-License-Identifier: Apache-2.0
#include "errors.hpp"

#include "d2h_entry.hpp"  // report_dict: ShutdownError.report

#include <ferry/d2h/errors.hpp>
#include <ferry/error.hpp>
#include <ferry/sink/errors.hpp>

#include <string>

namespace ferry::python {

int status_of(const std::exception& e) noexcept
{
  if (dynamic_cast<const ferry::d2h::shutdown_error*>(&e) != nullptr) { return FERRY_ERR_SHUTDOWN; }
  if (dynamic_cast<const ferry::d2h::size_overflow_error*>(&e) != nullptr) { return FERRY_ERR_SIZE_OVERFLOW; }
  if (dynamic_cast<const ferry::sink::io_error*>(&e) != nullptr) { return FERRY_ERR_IO; }
  if (dynamic_cast<const ferry::sink::stream_busy_error*>(&e) != nullptr) { return FERRY_ERR_STREAM_BUSY; }
  if (dynamic_cast<const ferry::sink::layout_version_error*>(&e) != nullptr) { return FERRY_ERR_LAYOUT_VERSION; }
  if (dynamic_cast<const ferry::sink::reader_detached_error*>(&e) != nullptr) { return FERRY_ERR_READER_DETACHED; }
  if (dynamic_cast<const ferry::sink::producer_gone_error*>(&e) != nullptr) { return FERRY_ERR_PRODUCER_GONE; }
  if (dynamic_cast<const ferry::sink::attribution_overflow_error*>(&e) != nullptr) {
    return FERRY_ERR_ATTRIBUTION_OVERFLOW;
  }
  if (dynamic_cast<const ferry::logic_error*>(&e) != nullptr) { return FERRY_ERR_LOGIC; }
  if (dynamic_cast<const ferry::out_of_memory*>(&e) != nullptr) { return FERRY_ERR_OOM; }
  if (dynamic_cast<const ferry::timeout_error*>(&e) != nullptr) { return FERRY_ERR_TIMEOUT; }
  if (dynamic_cast<const ferry::invalidated_error*>(&e) != nullptr) { return FERRY_ERR_INVALIDATED; }
  if (dynamic_cast<const ferry::backend_error*>(&e) != nullptr) { return FERRY_ERR_BACKEND; }
  return FERRY_ERR_OTHER;
}

void set_python_error(int status, const char* msg) { PyErr_SetString(exception_of(status), msg); }

namespace {

struct exception_spec {
  int status;
  const char* doc;
  PyObject* extra_base;  // a builtin base beside ferry.Error (MemoryError, TimeoutError), or null
};

}  // namespace

void init_errors(nb::module_& m)
{
  auto& t = exception_types();
  const auto make = [&](int status, const char* doc, PyObject* base, PyObject* extra) {
    const char* name = ferry_status_name(status);
    const std::string qual = std::string{"ferry."} + name;
    nb::object bases = extra != nullptr ? nb::make_tuple(nb::handle(base), nb::handle(extra))
                                        : nb::make_tuple(nb::handle(base));
    PyObject* type = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases.ptr(), nullptr);
    if (type == nullptr) { throw nb::python_error(); }
    m.attr(name) = nb::handle(type);
    t[static_cast<std::size_t>(status)] = type;
  };
  make(FERRY_ERR_OTHER, "Base of every error ferry raises.", PyExc_Exception, nullptr);
  const exception_spec specs[] = {
    {FERRY_ERR_LOGIC, "A contract violation by the caller (bad input, misuse).", nullptr},
    {FERRY_ERR_OOM, "An allocation failed, or a full ring with on_full='fail_fast'.", PyExc_MemoryError},
    {FERRY_ERR_TIMEOUT, "A blocking wait gave up.", PyExc_TimeoutError},
    {FERRY_ERR_INVALIDATED, "An owner refuses work after an earlier backend failure.", nullptr},
    {FERRY_ERR_BACKEND, "A backend (CUDA, host) call failed.", nullptr},
    {FERRY_ERR_SHUTDOWN, "Channel.close() could not drain every reserved entry; .report lists them.", nullptr},
    {FERRY_ERR_SIZE_OVERFLOW, "A dynamic entry's GPU-resolved size exceeded its reservation.", nullptr},
    {FERRY_ERR_IO, "A sink's file operation failed (errno: .errno; ferry.sinks).", PyExc_OSError},
    {FERRY_ERR_STREAM_BUSY, "A shared-memory stream is taken: a second reader (.owner_pid: the first), or a name "
                            "a live producer holds.", nullptr},
    {FERRY_ERR_LAYOUT_VERSION, "A shared-memory stream of another layout version (.expected: the reader's, .got: the "
                               "stream's).", nullptr},
    {FERRY_ERR_READER_DETACHED, "The producer ended this reader's session (evicted under policy 'drop'); attach again.",
     nullptr},
    {FERRY_ERR_PRODUCER_GONE, "The shared-memory stream's producer died (raised once its entries were read).", nullptr},
    {FERRY_ERR_ATTRIBUTION_OVERFLOW,
     "A ShmEntry's forward attribution (requests, meta) needed a record larger than the stream's record region "
     "(.record_bytes, .capacity); its bytes are intact.",
     nullptr},
  };
  for (const auto& s : specs) { make(s.status, s.doc, t[FERRY_ERR_OTHER], s.extra_base); }

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ferry::d2h::shutdown_error& err) {
      nb::object inst = nb::handle(exception_of(FERRY_ERR_SHUTDOWN))(err.what());
      inst.attr("report") = report_dict(err.report());
      PyErr_SetObject(exception_of(FERRY_ERR_SHUTDOWN), inst.ptr());
    } catch (const ferry::sink::io_error& err) {
      // an OSError: .errno is the errno, str() the message
      nb::object inst = nb::handle(exception_of(FERRY_ERR_IO))(err.code(), err.what());
      PyErr_SetObject(exception_of(FERRY_ERR_IO), inst.ptr());
    } catch (const ferry::sink::stream_busy_error& err) {
      nb::object inst = nb::handle(exception_of(FERRY_ERR_STREAM_BUSY))(err.what());
      inst.attr("owner_pid") = err.owner_pid();
      PyErr_SetObject(exception_of(FERRY_ERR_STREAM_BUSY), inst.ptr());
    } catch (const ferry::sink::layout_version_error& err) {
      nb::object inst = nb::handle(exception_of(FERRY_ERR_LAYOUT_VERSION))(err.what());
      inst.attr("expected") = err.expected();
      inst.attr("got") = err.got();
      PyErr_SetObject(exception_of(FERRY_ERR_LAYOUT_VERSION), inst.ptr());
    } catch (const ferry::sink::attribution_overflow_error& err) {
      nb::object inst = nb::handle(exception_of(FERRY_ERR_ATTRIBUTION_OVERFLOW))(err.what());
      inst.attr("record_bytes") = err.record_bytes();
      inst.attr("capacity") = err.capacity();
      PyErr_SetObject(exception_of(FERRY_ERR_ATTRIBUTION_OVERFLOW), inst.ptr());
    } catch (const ferry::error& err) {
      set_python_error(status_of(err), err.what());
    }
  });
}

}  // namespace ferry::python
