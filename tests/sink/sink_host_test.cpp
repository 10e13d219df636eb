// SPDX-License-Identifier: Apache-2.0
// The safetensors sink behind a host-backend D2H channel (sink/safetensors.hpp): every forward written byte
// exact (names, dtypes, shapes, tags, CRC-32 per forward), shard rollover with whole forwards and a valid
// index after every shard, policies block and drop, refusals (schema, tags, flush, close), non-ok entries,
// the channel's schema taken by a sink without one, an existing run, an unwritable directory, and ENOSPC
// mid-shard on a tiny tmpfs (root only).
#include "sink/sink_fixture.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>

#include <sys/stat.h>

namespace ferry::test {
namespace {

TEST_F(SafetensorsSink, EveryForwardIsWrittenByteExactWithItsTag)
{
  auto sc = sink_config();
  sc.fsync = true;
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  std::vector<want> w;
  for (std::uint64_t f = 0; f < 6; ++f) {
    forward(ch, s, f, 1000 + f * 10);
    w.push_back({f, 1000 + f * 10});
  }
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.forwards_written, 6U);
  EXPECT_EQ(st.tensors_written, 18U);
  EXPECT_EQ(st.bytes_written, 6 * forward_bytes());
  EXPECT_EQ(st.shards_written, 1U);
  EXPECT_EQ(st.refused_entries + st.dropped_entries + st.failed_entries + st.lost_forwards, 0U);
  EXPECT_TRUE(st.first_error.empty());
  const auto r = expect_run(w);
  const auto& m = r.index["metadata"];
  EXPECT_EQ(m["format"].str(), "ferry.shards");
  EXPECT_EQ(m["ferry_version"].str(), std::string{ferry::version});
  EXPECT_EQ(m["tensor_name"].str(), "{tag}/{hook}");
  EXPECT_TRUE(m["complete"].boolean());
  EXPECT_FALSE(m.has("error"));
  EXPECT_EQ(m["schema"]["2"]["name"].str(), "layers.0.mlp");
  EXPECT_EQ(m["schema"]["2"]["dtype"].str(), "F32");
  EXPECT_EQ(m["schema"]["2"]["row_shape"].uints(), (std::vector<std::uint64_t>{2, 4}));
  EXPECT_EQ(m["schema"]["1"]["row_shape"].uints(), std::vector<std::uint64_t>{});
  EXPECT_FALSE(has_temporaries());
  EXPECT_NO_THROW((void)sink.close()) << "idempotent";
}

/// safetensors_tuning changes how the bytes are written, never which: one I/O thread, two buffers of one page
/// (every forward spans several writes) still write every forward byte-exact, and the writer's time is reported.
/// Out-of-range tuning is refused at construction, naming the sink.
TEST_F(SafetensorsSink, TuningChangesHowNotWhatIsWrittenAndOutOfRangeIsRefused)
{
  auto sc = sink_config();
  sc.fsync = true;
  sc.tuning = {.io_threads = 1, .write_buffers = 2, .write_bytes = 4096, .open_shards = 1};
  {
    fk::safetensors sink{sc};
    fb::stream<B> s{b};
    fd::channel<B> ch{channel_config(), b, sink.callback()};
    std::vector<want> w;
    for (std::uint64_t f = 0; f < 4; ++f) {
      forward(ch, s, f, 2000 + f);
      w.push_back({f, 2000 + f});
    }
    (void)ch.close();
    const auto st = sink.close();
    EXPECT_EQ(st.forwards_written, 4U);
    EXPECT_GT(st.writer_copy_seconds, 0.0);
    EXPECT_GE(st.writer_wait_seconds + st.writer_idle_seconds, 0.0);
    EXPECT_GT(st.writer_publish_seconds, 0.0);  // close() published the shard
    (void)expect_run(w);
  }
  for (const fk::safetensors_tuning bad : {fk::safetensors_tuning{.io_threads = 0},
                                           fk::safetensors_tuning{.io_threads = 4, .write_buffers = 4},
                                           fk::safetensors_tuning{.write_bytes = 1024},
                                           fk::safetensors_tuning{.open_shards = 65}}) {
    auto c = sink_config();
    c.overwrite = true;
    c.tuning = bad;
    EXPECT_THROW(
        {
          try {
            fk::safetensors sink{c};
          } catch (const ferry::logic_error& e) {
            const std::string want = bad.open_shards != 0 ? "expected tuning open_shards in [0, 64] (0: two on "
                                                            "tmpfs, else one), got 65"
                                                          : "expected tuning io_threads in [1, 64]";
            EXPECT_NE(std::string{e.what()}.find(want), std::string::npos) << e.what();
            throw;
          }
        },
        ferry::logic_error);
  }
}

/// Entries lent from the staging (tuning.lend_min_bytes: here every entry, on buffered shards with one page a write
/// and two buffers, one I/O thread, so that at most two lent writes are in flight and the staging waits): every
/// forward byte-exact, each entry counted in lent_entries, and the views released by the I/O threads (the channel
/// closes with every staging region back). The sanitizer stage runs this suite (tests/reliability).
TEST_F(SafetensorsSink, EntriesLentFromTheStagingAreWrittenByteExact)
{
  auto sc = sink_config();
  sc.fsync = false;
  sc.shard_bytes = 3 * forward_bytes();  // forwards move to the next shard with lent writes in flight
  sc.tuning = {.io_threads = 1, .write_buffers = 2, .write_bytes = 4096, .lend_min_bytes = 1, .open_shards = 1};
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  std::vector<want> w;
  for (std::uint64_t f = 0; f < 12; ++f) {
    forward(ch, s, f, 3000 + f);
    w.push_back({f, 3000 + f});
  }
  EXPECT_TRUE(ch.close().clean());
  const auto st = sink.close();
  EXPECT_EQ(st.forwards_written, 12U);
  EXPECT_EQ(st.lent_entries, st.tensors_written);
  EXPECT_EQ(st.refused_entries + st.dropped_entries + st.failed_entries + st.lost_forwards, 0U);
  (void)expect_run(w);
}

TEST_F(SafetensorsSink, UntaggedForwardsAreNamedByIndexAndRepeatsAreNumbered)
{
  fk::safetensors sink{sink_config()};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 0);
  ch.begin_forward(s);  // forward 1: hook 0 twice
  ch.capture(fd::hook_id{0}, src_ptr(1, 0), 48, s);
  ch.capture(fd::hook_id{0}, src_ptr(2, 0), 16, s);
  (void)ch.end_forward(s);
  (void)ch.close();
  (void)sink.close();
  const auto r = sinkread::read_run(dir);
  ASSERT_EQ(r.tensors.size(), 5U);
  EXPECT_EQ(r.tensors[0].name, "0/embed");
  EXPECT_EQ(r.tensors[3].name, "1/embed");
  EXPECT_EQ(r.tensors[4].name, "1/embed#1");
  EXPECT_EQ(r.tensors[4].shape, (std::vector<std::uint64_t>{1, 8}));
  EXPECT_EQ(r.tags.at(0), (std::vector<std::uint64_t>{0, 1}));
}

/// shard_bytes fits two forwards: each shard holds two whole forwards (published when the third forward's first
/// entry arrives: a forward the size of the last would cross the limit), and after every forward the index
/// reads back and names exactly the shards due by then.
TEST_F(SafetensorsSink, ShardsHoldWholeForwardsAndTheIndexIsValidAfterEveryShard)
{
  auto sc = sink_config();
  sc.shard_bytes = 2 * forward_bytes() + 64;
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  std::vector<want> w;
  for (std::uint64_t f = 0; f < 9; ++f) {
    forward(ch, s, f);
    w.push_back({f, f});
    wait_written(ch, sink, (f + 1) * hooks.size());
    // the finisher publishes a sealed shard after the writer moved on
    wait_for([&] { return sink.stats().shards_written == f / 2; }, "the finisher");
    const auto r = sinkread::read_run(dir);  // throws if the index or a shard it names is not valid
    EXPECT_EQ(r.files.size(), f / 2) << "after forward " << f;
    EXPECT_FALSE(r.index["metadata"]["complete"].boolean());
  }
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.shards_written, 5U);
  EXPECT_EQ(st.relocations, 0U) << "forwards of one size: each shard published at the first entry of the forward "
                                   "that would not fit, nothing written twice";
  const auto r = expect_run(w);
  ASSERT_EQ(r.files.size(), 5U);
  for (std::size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(r.files[k], fk::detail::shard_name(k));
    EXPECT_EQ(r.tags[k].size(), k < 4 ? 2U : 1U);
    EXPECT_LE(fs::file_size(dir / r.files[k]), sc.shard_bytes + 8192);
  }
}

/// With two open shards (tuning.open_shards, tmpfs's default) the forwards are dealt to them in turn: each shard
/// holds every other forward, whole, the shards are numbered as they are opened and published as they fill, and
/// index.json's "order" gives the forwards back in the order they were captured.
TEST_F(SafetensorsSink, TwoOpenShardsHoldEveryOtherForwardAndReadBackInForwardOrder)
{
  auto sc = sink_config();
  sc.shard_bytes = 2 * forward_bytes() + 64;
  sc.tuning.open_shards = 2;
  fk::safetensors sink{sc};
  EXPECT_EQ(sink.stats().open_shards, 2U) << "stats() tell the shard files written at once from the start";
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  std::vector<want> w;
  for (std::uint64_t f = 0; f < 9; ++f) {
    forward(ch, s, f, 100 + f);
    w.push_back({f, 100 + f});
  }
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.shards_written, 5U);
  EXPECT_EQ(st.forwards_written, 9U);
  const auto r = expect_run(w);  // every forward, in forward order
  const std::vector<std::vector<std::uint64_t>> tags{{100, 102}, {101, 103}, {104, 106}, {105, 107}, {108}};
  ASSERT_EQ(r.files.size(), tags.size());
  for (std::size_t k = 0; k < tags.size(); ++k) {
    EXPECT_EQ(r.files[k], fk::detail::shard_name(k));
    EXPECT_EQ(r.tags[k], tags[k]) << r.files[k];
  }
}

TEST_F(SafetensorsSink, AForwardLargerThanAShardGetsAShardOfItsOwn)
{
  auto sc = sink_config();
  sc.shard_bytes = forward_bytes() / 2;
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  for (std::uint64_t f = 0; f < 4; ++f) { forward(ch, s, f, 7 - f); }
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.shards_written, 4U);
  EXPECT_EQ(st.open_shards, 1U) << "the fixture's tuning: one shard file at a time";
  const auto r = expect_run({{0, 7}, {1, 6}, {2, 5}, {3, 4}});
  for (const auto& t : r.tags) { EXPECT_EQ(t.size(), 1U); }
}

/// The writer fills the next shard while the last one is published: with the finisher held, the writer takes
/// every entry of six forwards (two sealed shards and an open one), none is published (index.json lists no shard,
/// no shard file has its final name), and once released the finisher publishes them in order.
TEST_F(SafetensorsSink, TheWriterFillsTheNextShardWhileTheLastIsPublished)
{
  auto sc = sink_config();
  sc.shard_bytes = 2 * forward_bytes();  // two forwards a shard
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_finisher(sink, true);
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  std::vector<want> w;
  for (std::uint64_t f = 0; f < 6; ++f) {
    forward(ch, s, f);
    w.push_back({f, f});
  }
  wait_written(ch, sink, 6 * hooks.size());  // the writer took every entry, the finisher held
  const auto st = sink.stats();
  EXPECT_EQ(st.shards_written, 0U);
  EXPECT_EQ(st.forwards_written, 0U);
  EXPECT_TRUE(sinkread::read_run(dir).files.empty()) << "index.json lists no shard";
  for (std::uint64_t k = 0; k < 3; ++k) { EXPECT_FALSE(fs::exists(dir / fk::detail::shard_name(k))) << k; }
  ferry::testing::sink_access::hold_finisher(sink, false);
  (void)ch.close();
  EXPECT_EQ(sink.close().shards_written, 3U);
  const auto r = expect_run(w);
  ASSERT_EQ(r.files.size(), 3U);
  for (std::size_t k = 0; k < 3; ++k) { EXPECT_EQ(r.files[k], fk::detail::shard_name(k)); }
}

/// Policy block: with the writer held, the drain thread waits block_timeout per entry, then queues it past
/// the limit and records a stall_error; nothing is lost.
TEST_F(SafetensorsSink, BlockWaitsThenRecordsAStallErrorAndLosesNothing)
{
  auto sc = sink_config();
  sc.max_queue_bytes = 100;
  sc.block_timeout = 20ms;
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_writer(sink, true);
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  for (std::uint64_t f = 0; f < 3; ++f) { forward(ch, s, f); }
  wait_for([&] { return ch.stats().entries_drained == 9; }, "the drain");
  auto st = sink.stats();
  EXPECT_EQ(st.queue_entries, 9U);
  EXPECT_EQ(st.queue_bytes, 3 * forward_bytes());
  EXPECT_GE(st.stalls, 7U);
  EXPECT_EQ(st.stall_timeouts, st.stalls);
  EXPECT_GT(st.writer_lag_seconds, 0.0);
  EXPECT_NE(st.first_error.find("expected queue space within block_timeout 20 ms"), std::string::npos) << st.first_error;
  ferry::testing::sink_access::hold_writer(sink, false);
  (void)ch.close();
  EXPECT_NE(error_of<fk::stall_error>([&] { (void)sink.close(); }).find("the entry was queued anyway"), std::string::npos);
  expect_run({{0, 0}, {1, 1}, {2, 2}});
  EXPECT_EQ(sink.stats().queue_high_watermark, 3 * forward_bytes());
}

TEST_F(SafetensorsSink, BlockWithinItsTimeoutIsOnlyAStall)
{
  auto sc = sink_config();
  sc.max_queue_bytes = 100;
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_writer(sink, true);
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 0);
  wait_for([&] { return sink.stats().stalls >= 1; }, "a stall");
  ferry::testing::sink_access::hold_writer(sink, false);
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_GE(st.stalls, 1U);
  EXPECT_EQ(st.stall_timeouts, 0U);
  EXPECT_LE(st.queue_high_watermark, 100U);
  expect_run({{0, 0}});
}

/// Policy drop, the writer held: forward 0 fits the queue, forwards 1-3 are dropped whole at their first
/// entry; once the writer runs again, forwards delivered after it caught up are written.
TEST_F(SafetensorsSink, DropDropsWholeForwards)
{
  auto sc = sink_config();
  sc.policy = fk::queue_policy::drop;
  sc.max_queue_bytes = forward_bytes() + 32;
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_writer(sink, true);
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  for (std::uint64_t f = 0; f < 4; ++f) { forward(ch, s, f); }
  wait_for([&] { return ch.stats().entries_drained == 12; }, "the drain");
  ferry::testing::sink_access::hold_writer(sink, false);
  wait_written(ch, sink, 12);
  for (std::uint64_t f = 4; f < 6; ++f) {
    forward(ch, s, f);
    wait_written(ch, sink, (f + 1) * 3);
  }
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.dropped_forwards, 3U);
  EXPECT_EQ(st.dropped_entries, 9U);
  EXPECT_EQ(st.dropped_bytes, 3 * forward_bytes());
  EXPECT_EQ(st.stalls, 0U);
  EXPECT_EQ(st.forwards_written, 3U);
  expect_run({{0, 0}, {4, 4}, {5, 5}});
}

/// Policy drop charges each request of a dropped forward once (dropped_requests: the engine's per-request report),
/// with the rows the forward held for it, however many entries the forward had.
TEST_F(SafetensorsSink, DropChargesEachRequestOfADroppedForwardOnce)
{
  auto sc = sink_config();
  sc.policy = fk::queue_policy::drop;
  sc.max_queue_bytes = forward_bytes() + 32;
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_writer(sink, true);
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  for (std::uint64_t f = 0; f < 4; ++f) { forward(ch, s, f, {}, {{7, 0, 1}, {100 + f, 1, 2}}); }
  wait_for([&] { return ch.stats().entries_drained == 12; }, "the drain");
  ferry::testing::sink_access::hold_writer(sink, false);
  (void)ch.close();
  const auto st = sink.close();
  ASSERT_EQ(st.dropped_forwards, 3U);
  const std::vector<fk::request_drop> want{{7, 3, 3}, {101, 1, 2}, {102, 1, 2}, {103, 1, 2}};
  EXPECT_EQ(sink.dropped_requests(), want) << "request 0 was written; each forward of 1..3 counted once";
  EXPECT_EQ(st.dropped_entries, 9U);
}

/// Policy drop never holds the channel's staging for the writer: the admitted entries are copied, so a writer
/// that does not move (a dead disk) cannot stop the staging ring from wrapping. Forwards beyond the queue are
/// dropped whole, none waits (held staging would stall the D2H behind it: the captures time out), and the
/// admitted ones are written exact once the writer runs.
TEST_F(SafetensorsSink, DropNeverHoldsTheChannelsStagingForTheWriter)
{
  auto sc = sink_config();
  sc.policy = fk::queue_policy::drop;
  sc.max_queue_bytes = 2 * forward_bytes();
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_writer(sink, true);
  fb::stream<B> s{b};
  auto cc = channel_config();
  cc.timeout = 2s;
  cc.ring_bytes = 4096;  // staging of the same size: the fixture's max_forwards wrap it twice and more
  fd::channel<B> ch{cc, b, sink.callback()};
  const std::uint64_t n = max_forwards;  // the sources hold max_forwards forwards
  ASSERT_GT(n * forward_bytes(), 2 * cc.ring_bytes);
  for (std::uint64_t f = 0; f < n; ++f) { forward(ch, s, f); }
  wait_for([&] { return ch.stats().entries_drained == 3 * n; }, "the drain");
  ferry::testing::sink_access::hold_writer(sink, false);
  EXPECT_TRUE(ch.close().clean());
  const auto st = sink.close();
  EXPECT_EQ(st.forwards_written, 2U);
  EXPECT_EQ(st.dropped_forwards, n - 2);
  EXPECT_EQ(st.stalls, 0U);
  expect_run({{0, 0}, {1, 1}});
}

/// Policy drop of a forward the writer had already begun: what it wrote is rolled back, nothing torn.
TEST_F(SafetensorsSink, DropRollsBackWhatTheWriterWroteOfTheForward)
{
  auto sc = sink_config();
  sc.policy = fk::queue_policy::drop;
  sc.max_queue_bytes = 100;  // the first two entries of a forward (72 bytes) fit, the third does not
  fk::safetensors sink{sc};
  ferry::testing::sink_access::hold_writer(sink, true);
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 0);
  forward(ch, s, 1);
  wait_for([&] { return ch.stats().entries_drained == 6; }, "the drain");
  ferry::testing::sink_access::hold_writer(sink, false);
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.dropped_forwards, 2U);
  EXPECT_EQ(st.dropped_entries, 6U) << "2 written then rolled back, 4 dropped at the drain";
  EXPECT_EQ(st.dropped_bytes, 2 * forward_bytes());
  EXPECT_EQ(st.tensors_written, 0U);
  expect_run({});
  EXPECT_FALSE(has_temporaries());
}

/// capture_rows: a row entry is [rows, *row_shape]; a refused selection (selection_error) is counted, not written.
TEST_F(SafetensorsSink, RowEntriesAreTensorsAndFailedEntriesAreCounted)
{
  fk::safetensors sink{sink_config()};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  const std::vector<std::int32_t> idx{2, 0, 99};
  fb::device_buffer<B> didx{idx.size() * 4, b};
  {
    fb::pinned_buffer<B> h{idx.size() * 4, b};
    std::memcpy(h.data(), idx.data(), idx.size() * 4);
    b.memcpy_async(didx.data(), h.data(), idx.size() * 4, fb::memcpy_kind::host_to_device, s.handle());
    s.synchronize();
  }
  const auto* rows = static_cast<const std::int32_t*>(didx.data());
  ch.begin_forward(s);
  ch.capture_rows(fd::hook_id{2}, src_ptr(0, 2), 3, 32, fd::row_selection::rows(rows, 2), s);      // rows 2, 0
  ch.capture_rows(fd::hook_id{2}, src_ptr(0, 2), 3, 32, fd::row_selection::rows(rows + 1, 2), s);  // row 99: refused
  (void)ch.end_forward(s);
  (void)ch.close();
  const auto st = sink.close();
  EXPECT_EQ(st.failed_entries, 1U);
  EXPECT_EQ(st.tensors_written, 1U);
  const auto r = sinkread::read_run(dir);
  ASSERT_EQ(r.tensors.size(), 1U);
  EXPECT_EQ(r.tensors[0].name, "0/layers.0.mlp");
  EXPECT_EQ(r.tensors[0].shape, (std::vector<std::uint64_t>{2, 2, 4}));
  auto e = expected(0, hooks[2]);
  std::vector<std::uint8_t> want(e.begin() + 64, e.begin() + 96);
  want.insert(want.end(), e.begin(), e.begin() + 32);
  EXPECT_EQ(r.tensors[0].bytes, want);
}

TEST_F(SafetensorsSink, EntriesOutsideTheSchemaAreRefusedAndCloseRaisesTheFirst)
{
  fk::safetensors sink{sink_config()};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  ch.begin_forward(s);
  ch.capture(fd::hook_id{0}, src_ptr(0, 0), 48, s);
  ch.capture(fd::hook_id{7}, src_ptr(0, 0), 16, s);  // not in the schema
  ch.capture(fd::hook_id{0}, src_ptr(0, 0), 40, s);  // not a whole number of 16-byte rows
  (void)ch.end_forward(s);
  (void)ch.close();
  const std::string msg = error_of<fd::entry_shape_error>([&] { (void)sink.close(); });
  EXPECT_NE(msg.find("entry of hook 7 (16 bytes): expected a hook of the schema (3 hooks)"), std::string::npos) << msg;
  const auto st = sink.stats();
  EXPECT_EQ(st.refused_entries, 2U);
  EXPECT_EQ(st.tensors_written, 1U);
  EXPECT_EQ(st.first_error, msg);
  EXPECT_FALSE(st.failed) << "a refused entry does not end the run";
}

/// A sink made without a schema takes its channel's (adopt_schema, before its first entry): index.json has it
/// from the start, the forwards are written as with a schema of its own; a sink with one keeps its own; neither
/// having one, or a schema offered after entries arrived, is refused naming the directory.
TEST_F(SafetensorsSink, ASinkWithoutASchemaTakesItsChannels)
{
  auto sc = sink_config();
  sc.schema = {};
  fk::safetensors sink{sc};
  EXPECT_NE(error_of<ferry::logic_error>([&] { sink.adopt_schema(fd::hook_schema{}); })
              .find("expected a schema (safetensors_config::schema, or its channel's), got none from either"),
            std::string::npos);
  sink.adopt_schema(schema());
  EXPECT_EQ(sink.cfg().schema.size(), 3U);
  {
    const auto r = sinkread::read_run(dir);
    EXPECT_EQ(r.index["metadata"]["schema"]["2"]["name"].str(), "layers.0.mlp") << "index.json rewritten with it";
  }
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback(), {}, schema()};
  forward(ch, s, 0, 10);
  forward(ch, s, 1, 11);
  wait_written(ch, sink, 6);
  EXPECT_NO_THROW(sink.adopt_schema(fd::hook_schema{})) << "it has one now: kept, nothing refused";
  (void)ch.close();
  EXPECT_EQ(sink.close().tensors_written, 6U);
  expect_run({{0, 10}, {1, 11}});

  fd::hook_schema other;
  other.add(fd::hook_id{0}, "other", fd::dtype::u8);
  auto oc = sink_config();
  oc.overwrite = true;  // the run above was checked
  fk::safetensors own{oc};
  own.adopt_schema(other);
  EXPECT_EQ(own.cfg().schema.find(fd::hook_id{0})->name, "embed") << "a sink's own schema wins";
  (void)own.close();
}

TEST_F(SafetensorsSink, ASchemaOfferedAfterEntriesArrivedIsRefused)
{
  auto sc = sink_config();
  sc.schema = {};
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 0);
  wait_for([&] { return ch.stats().entries_drained >= 3; }, "the drain");
  const std::string msg = error_of<ferry::logic_error>([&] { sink.adopt_schema(schema()); });
  EXPECT_NE(msg.find("expected to take its channel's schema before its first entry (and before close()), got it after "
                     "entries were delivered"), std::string::npos) << msg;
  (void)ch.close();
  const std::string first = error_of<fd::entry_shape_error>([&] { (void)sink.close(); });
  EXPECT_NE(first.find("expected a hook of the schema (0 hooks)"), std::string::npos) << first;
  EXPECT_EQ(sink.stats().refused_entries, 3U) << "entries reaching a sink without a schema are refused, counted";
}

TEST_F(SafetensorsSink, ARepeatedTagIsRefused)
{
  fk::safetensors sink{sink_config()};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 0, 5);
  forward(ch, s, 1, 5);
  forward(ch, s, 2, 6);
  (void)ch.close();
  EXPECT_NE(error_of<ferry::logic_error>([&] { (void)sink.close(); }).find("forward 1: expected a tag no earlier forward had"),
            std::string::npos);
  EXPECT_EQ(sink.stats().refused_entries, 3U);
  expect_run({{0, 5}, {2, 6}});
}

/// flush() publishes the forwards so far (a shard below shard_bytes); an entry of the forward it completed,
/// arriving later, is refused. The sink is fed by hand from try_pop() here, to place flush() between entries.
TEST_F(SafetensorsSink, FlushPublishesAPartialShardAndRefusesLateEntriesOfItsForward)
{
  fk::safetensors sink{sink_config()};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b};
  const auto pop = [&] {
    for (;;) {
      if (auto v = ch.try_pop()) { return std::move(*v); }
      std::this_thread::sleep_for(100us);
    }
  };
  forward(ch, s, 0);
  forward(ch, s, 1);
  for (int i = 0; i < 3; ++i) { sink(pop()); }
  sink.flush();
  auto r = sinkread::read_run(dir);
  EXPECT_EQ(r.files.size(), 1U);
  EXPECT_EQ(r.tensors.size(), 3U);
  sink(pop());   // forward 1, hook 0
  sink.flush();  // completes forward 1 (misuse: it had more entries)
  sink(pop());
  sink(pop());
  (void)ch.close();
  const std::string msg = error_of<ferry::logic_error>([&] { (void)sink.close(); });
  EXPECT_NE(msg.find("entry of forward 1 (tag 1): expected a forward after 1, which flush() completed"),
            std::string::npos) << msg;
  r = sinkread::read_run(dir);
  EXPECT_EQ(r.files.size(), 2U);
  EXPECT_EQ(r.tensors.size(), 4U);
  EXPECT_EQ(sink.stats().refused_entries, 2U);
}

TEST_F(SafetensorsSink, EntriesAfterCloseAreRefused)
{
  fk::safetensors sink{sink_config()};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 0);
  wait_written(ch, sink, 3);
  (void)sink.close();  // forward 0 completed by close()
  forward(ch, s, 1);
  (void)ch.close();
  const auto st = sink.stats();
  EXPECT_EQ(st.refused_entries, 3U);
  EXPECT_NE(st.first_error.find("expected entries before close() (close the channel first)"), std::string::npos);
  EXPECT_NO_THROW((void)sink.close());
  expect_run({{0, 0}});
}

TEST_F(SafetensorsSink, AnotherRunIsRefusedUnlessOverwrite)
{
  {
    fk::safetensors sink{sink_config()};
    fb::stream<B> s{b};
    fd::channel<B> ch{channel_config(), b, sink.callback()};
    forward(ch, s, 0);
    forward(ch, s, 1);
    (void)ch.close();
    sink.flush();
  }
  { std::ofstream{dir / "notes.txt"} << "mine"; }
  try {
    fk::safetensors again{sink_config()};
    ADD_FAILURE() << "expected existing_run_error";
  } catch (const fk::existing_run_error& e) {
    EXPECT_EQ(e.code(), EEXIST);
    EXPECT_EQ(e.path(), dir);
    EXPECT_NE(std::string(e.what()).find("expected no other run's files (or overwrite = true), got 2 of them"),
              std::string::npos) << e.what();
  }
  auto sc = sink_config();
  sc.overwrite = true;
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  fd::channel<B> ch{channel_config(), b, sink.callback()};
  forward(ch, s, 5, 50);
  (void)ch.close();
  (void)sink.close();
  expect_run({{5, 50}});
  EXPECT_TRUE(fs::exists(dir / "notes.txt")) << "overwrite removes the run's files only";
}

TEST_F(SafetensorsSink, AnUnwritableDirectoryIsAnIoError)
{
  fs::create_directories(dir);
  { std::ofstream{dir / "file"} << "x"; }
  auto sc = sink_config();
  sc.directory = dir / "file" / "run";
  try {
    fk::safetensors sink{sc};
    ADD_FAILURE() << "expected io_error";
  } catch (const fk::io_error& e) {
    EXPECT_NE(e.code(), 0);
    EXPECT_NE(std::string(e.what()).find("creating the run directory " + sc.directory.string()), std::string::npos) << e.what();
  }
  // a directory this process may not write: read-only for a user; a read-only tmpfs for root
  sc.directory = dir / "ro";
  fs::create_directories(sc.directory);
  if (::geteuid() == 0) {
    if (std::system(("mount -t tmpfs -o ro,size=64k tmpfs '" + sc.directory.string() + "' 2>/dev/null").c_str()) != 0) {
      GTEST_SKIP() << "running as root without permission to mount a read-only tmpfs (a container without "
                      "CAP_SYS_ADMIN): the read-only case needs it";
    }
  } else {
    ::chmod(sc.directory.c_str(), 0555);
  }
  try {
    fk::safetensors sink{sc};
    ADD_FAILURE() << "expected io_error";
  } catch (const fk::io_error& e) {
    EXPECT_TRUE(e.code() == EROFS || e.code() == EACCES) << e.code();
    EXPECT_NE(std::string(e.what()).find(".index.json.tmp: expected a writable file"), std::string::npos) << e.what();
  }
  if (::geteuid() == 0) { (void)std::system(("umount '" + sc.directory.string() + "'").c_str()); }
  ::chmod(sc.directory.c_str(), 0755);
}

/// ENOSPC while shards are written (a 160 KiB tmpfs): the shard that met it is not published and its temporary is
/// removed, the index names complete shards only (byte exact), later entries are refused, close() raises the
/// io_error (of a shard's write, or of the index rewrite when that met the full disk first).
TEST_F(SafetensorsSink, NoSpaceMidShardPublishesNothingTornAndRefusesLaterForwards)
{
  if (::geteuid() != 0) { GTEST_SKIP() << "needs root to mount a tiny tmpfs (ENOSPC on demand)"; }
  fs::create_directories(dir);
  // 160 KiB: room for the three shards the writer may hold before the first is finished (one open, two sealed:
  // about 108 KiB) and the index, so the first shard is always published; the 40 forwards' 640 KiB never fit.
  if (std::system(("mount -t tmpfs -o size=160k tmpfs '" + dir.string() + "' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "mount -t tmpfs is not permitted here (a container without CAP_SYS_ADMIN)";
  }
  mounted = true;
  hooks = {{0, "a", fd::dtype::u8, {1024}, 8}, {1, "b", fd::dtype::f32, {256}, 8}};  // 8 KiB each
  upload_sources();
  auto sc = sink_config();
  sc.shard_bytes = 2 * forward_bytes();  // 32 KiB: two forwards per shard
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  auto cc = channel_config();
  cc.ring_bytes = 1 << 20;
  fd::channel<B> ch{cc, b, sink.callback()};
  // 40 forwards: the writer sees the failure at most three shards (six forwards) after the one that failed (two
  // sealed shards wait for the finisher), long before the disk's 160 KiB would take them all
  for (std::uint64_t f = 0; f < 40; ++f) { forward(ch, s, f); }
  (void)ch.close();
  try {
    (void)sink.close();
    ADD_FAILURE() << "expected io_error";
  } catch (const fk::io_error& e) {
    EXPECT_EQ(e.code(), ENOSPC) << e.what();
    // The write that met the full disk first: a shard's (its temporary) or, when the finisher's index rewrite came
    // first (shards on tmpfs are written buffered, to the byte), the index's temporary.
    const std::string what = e.what();
    EXPECT_TRUE(what.find(".shard-0000") != std::string::npos || what.find(".index.json.tmp") != std::string::npos)
        << what;
  }
  const auto st = sink.stats();
  EXPECT_TRUE(st.failed);
  EXPECT_GE(st.lost_forwards, 1U);
  EXPECT_GE(st.refused_entries, 1U);
  EXPECT_LT(st.forwards_written + st.lost_forwards, 40U) << "later forwards were refused";
  EXPECT_FALSE(has_temporaries());
  std::vector<want> w;
  for (std::uint64_t f = 0; f < st.forwards_written; ++f) { w.push_back({f, f}); }
  ASSERT_GE(w.size(), 2U) << "at least one shard before the disk filled";
  expect_run(w);
}

}  // namespace
}  // namespace ferry::test
