// SPDX-License-Identifier: Apache-2.0
#include "backend/contract.hpp"

namespace ferry::test {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Host, BackendContract, HostBackends);
}  // namespace ferry::test

namespace ferry::test {
/// The host backend validates stream handles: every call on a destroyed stream is a host_error
/// (invalid_resource_handle, naming the call), never a use-after-free or a hang; destroying twice is a no-op.
TEST(HostStreamRegistry, DestroyedStreamHandleIsAnErrorNotAHang)
{
  fb::host_backend b;
  auto* s = b.stream_create();
  auto* ev = b.event_create(fb::event_flags::disable_timing);
  void* dst = b.allocate_device(64);
  void* src = b.allocate_device(64);
  b.memcpy_async(dst, src, 64, fb::memcpy_kind::device_to_device, s);
  b.stream_destroy(s);  // the queued copy completes first (as cudaStreamDestroy)
  const auto expect_400 = [](const char* call, auto&& f) {
    try {
      f();
      ADD_FAILURE() << call << " on a destroyed stream was accepted";
    } catch (const ferry::host_error& e) {
      EXPECT_EQ(e.code(), 400) << e.what();
      EXPECT_EQ(e.call(), call) << e.what();
      EXPECT_NE(std::string{e.what()}.find("destroyed"), std::string::npos) << e.what();
    }
  };
  expect_400("stream_synchronize", [&] { b.stream_synchronize(s); });
  expect_400("stream_query", [&] { (void)b.stream_query(s); });
  expect_400("stream_is_capturing", [&] { (void)b.stream_is_capturing(s); });
  expect_400("event_record", [&] { b.event_record(ev, s); });
  expect_400("stream_wait_event", [&] { b.stream_wait_event(s, ev); });
  expect_400("memcpy_async", [&] { b.memcpy_async(dst, src, 64, fb::memcpy_kind::device_to_device, s); });
  expect_400("memset_async", [&] { b.memset_async(dst, 0, 64, s); });
  expect_400("host_func", [&] { b.host_func(s, [] {}); });
  expect_400("capture_begin", [&] { b.capture_begin(s); });
  expect_400("launch", [&] {
    b.launch(ferry::testing::probe::publish_kernel(fb::host_tag{}), fb::launch_config{{1}, {32}, 0}, s, nullptr,
             std::uint64_t{0}, nullptr, std::uint64_t{0});
  });
  b.stream_destroy(s);  // twice: a no-op
  auto* fresh = b.stream_create();
  EXPECT_NE(fresh, s) << "a destroyed stream's address is never reused";
  b.stream_synchronize(fresh);
  b.stream_destroy(fresh);
  b.event_destroy(ev);
  b.free_device(dst);
  b.free_device(src);
}
}  // namespace ferry::test
