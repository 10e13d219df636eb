// SPDX-License-Identifier: Apache-2.0
// The D2H typed suites on the host backend (CI) and the fault-injecting decorator, plus host-only tests.
#include "d2h/attribution.hpp"
#include "d2h/capacity.hpp"
#include "d2h/consumer.hpp"
#include "d2h/failure.hpp"
#include "d2h/gather.hpp"
#include "d2h/gather_rows.hpp"
#include "d2h/graph.hpp"
#include "d2h/lifecycle.hpp"
#include "d2h/misuse.hpp"
#include "d2h/multi_channel.hpp"
#include "d2h/on_error.hpp"
#include "d2h/ordering.hpp"
#include "d2h/planned_rows.hpp"
#include "d2h/replay_token.hpp"
#include "d2h/reduce_rows.hpp"
#include "d2h/select_rows.hpp"

namespace ferry::test {
using HostBackends = ::testing::Types<fb::host_backend, fb::faulty<fb::host_backend>>;
// Instantiation prefix = suite name: ctest names the tests <Suite>.<Test><Backend> (one naming scheme).
INSTANTIATE_TYPED_TEST_SUITE_P(D2hOrdering, D2hOrdering, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hCapacity, D2hCapacity, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGraph, D2hGraph, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hLifecycle, D2hLifecycle, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hFailure, D2hFailure, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGather, D2hGather, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hMultiChannel, D2hMultiChannel, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hMisuse, D2hMisuse, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hReplayToken, D2hReplayToken, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hOnError, D2hOnError, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hSelectRows, D2hSelectRows, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hReduceRows, D2hReduceRows, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hAttribution, D2hAttribution, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hConsumer, D2hConsumer, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hGatherRows, D2hGatherRows, HostBackends);
INSTANTIATE_TYPED_TEST_SUITE_P(D2hPlannedRows, D2hPlannedRows, HostBackends);
}  // namespace ferry::test

#include "d2h/host_only.hpp"
