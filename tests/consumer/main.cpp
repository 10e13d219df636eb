// SPDX-License-Identifier: Apache-2.0
// Consumer check: the installed headers and ferry::core work from another project.
#include <ferry/backend.hpp>

#include <cstdio>
#include <cstring>

int main()
{
  using B = ferry::backend::host_backend;
  ferry::backend::stream<B> s;
  ferry::backend::device_buffer<B> d{64};
  ferry::backend::pinned_buffer<B> h{64};
  std::memset(h.data(), 0x5A, 64);
  B{}.memcpy_async(d.data(), h.data(), 64, ferry::backend::memcpy_kind::host_to_device, s.handle());
  B{}.memset_async(h.data(), 0, 64, s.handle());
  B{}.memcpy_async(h.data(), d.data(), 64, ferry::backend::memcpy_kind::device_to_host, s.handle());
  s.synchronize();
  const bool ok = h.as<unsigned char>()[63] == 0x5A;
  std::printf("ferry consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
