// SPDX-License-Identifier: Apache-2.0
// ferry_test_sink: a native consumer for tests/python/test_native_sink.py, standing in for an engine's own
// extension. make() returns a "ferry.sink" capsule (ferry_capi.h) whose function records, per entry, the
// hook, seq, size and a 64-bit FNV-1a of the bytes, and whether it ran with the GIL held; entries(capsule)
// and gil_calls(capsule) read them back. No Python runs per entry.
#include "ferry_capi.h"

#include <Python.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace {

struct record {
  std::uint32_t hook;
  std::uint32_t ok;
  std::uint64_t seq;
  std::uint64_t size;
  std::uint64_t fnv;
};

struct state {
  ferry_sink sink{};
  std::mutex mu;
  std::vector<record> got;
  std::uint64_t gil_calls{0};
};

std::uint64_t fnv1a(const void* p, std::uint64_t n)
{
  std::uint64_t h = 1469598103934665603ULL;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::uint64_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ULL;
  }
  return h;
}

void on_entry(void* ctx, const ferry_entry* e)
{
  auto* st = static_cast<state*>(ctx);
  const std::uint64_t h = e->data != nullptr ? fnv1a(e->data, e->size) : 0;
  const bool gil = PyGILState_Check() != 0;
  std::lock_guard lk{st->mu};
  st->got.push_back({e->hook, e->ok, e->seq, e->size, h});
  st->gil_calls += gil ? 1 : 0;
}

void destroy(PyObject* cap)
{
  delete static_cast<state*>(PyCapsule_GetContext(cap));
}

state* from(PyObject* cap)
{
  if (PyCapsule_IsValid(cap, FERRY_SINK_NAME) == 0) {
    PyErr_SetString(PyExc_TypeError, "ferry_test_sink: expected a capsule from make()");
    return nullptr;
  }
  return static_cast<state*>(PyCapsule_GetContext(cap));
}

PyObject* make(PyObject*, PyObject*)
{
  auto* st = new state;
  st->sink = ferry_sink{FERRY_SINK_VERSION, &on_entry, st};
  PyObject* cap = PyCapsule_New(&st->sink, FERRY_SINK_NAME, &destroy);
  if (cap == nullptr) {
    delete st;
    return nullptr;
  }
  PyCapsule_SetContext(cap, st);
  return cap;
}

PyObject* make_bad_version(PyObject*, PyObject*)
{
  static ferry_sink bad{FERRY_SINK_VERSION + 100, &on_entry, nullptr};
  return PyCapsule_New(&bad, FERRY_SINK_NAME, nullptr);
}

PyObject* entries(PyObject*, PyObject* cap)
{
  state* st = from(cap);
  if (st == nullptr) { return nullptr; }
  std::vector<record> got;
  {
    std::lock_guard lk{st->mu};
    got = st->got;
  }
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(got.size()));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const record& r = got[i];
    PyList_SET_ITEM(l, static_cast<Py_ssize_t>(i),
                    Py_BuildValue("(IKKK)", r.hook, static_cast<unsigned long long>(r.seq),
                                  static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(r.fnv)));
  }
  return l;
}

PyObject* gil_calls(PyObject*, PyObject* cap)
{
  state* st = from(cap);
  if (st == nullptr) { return nullptr; }
  std::lock_guard lk{st->mu};
  return PyLong_FromUnsignedLongLong(st->gil_calls);
}

PyMethodDef methods[] = {
  {"make", &make, METH_NOARGS, "A new recording sink capsule (\"ferry.sink\")."},
  {"make_bad_version", &make_bad_version, METH_NOARGS, "A sink capsule of an unknown version."},
  {"entries", &entries, METH_O, "[(hook, seq, size, fnv1a64)] recorded so far."},
  {"gil_calls", &gil_calls, METH_O, "Entries whose callback ran with the GIL held (expected 0)."},
  {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module{PyModuleDef_HEAD_INIT, "ferry_test_sink", "A native ferry sink for tests.", -1, methods,
                   nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_ferry_test_sink() { return PyModule_Create(&module); }
