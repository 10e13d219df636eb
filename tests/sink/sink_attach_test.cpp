// SPDX-License-Identifier: Apache-2.0
// The channel's one-call attach of a sink (d2h/sink.hpp: channel(cfg, b, sink, schema)): the schema offered
// first (a sink without one takes the channel's; neither having one refused before the channel exists), then the
// callback, then the sink's staging (a shm_stream's segment, also through a type-erased sink_ref, the Python
// binding's path); a user's sink type and a bare callback (a capsule's) attach the same way.
#include "sink/sink_fixture.hpp"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace ferry::test {
namespace {

static_assert(fd::sink<fk::safetensors> && !fd::staging_sink<fk::safetensors>);
static_assert(fd::staging_sink<fk::shm_stream>);
static_assert(fd::staging_sink<fd::sink_ref>);
static_assert(!fd::sink<fd::channel<B>::callback_type>, "a callback is attached as sink_ref{callback}");

using SinkAttach = SafetensorsSink;

/// A safetensors sink without a schema takes its channel's in the one call (index.json rewritten with it) and
/// gets every entry.
TEST_F(SinkAttach, ASafetensorsSinkTakesItsChannelsSchemaInTheOneCall)
{
  auto sc = sink_config();
  sc.schema = {};
  fk::safetensors sink{sc};
  fb::stream<B> s{b};
  {
    fd::channel<B> ch{channel_config(), b, sink, schema()};
    EXPECT_EQ(sink.cfg().schema.size(), 3U);
    EXPECT_EQ(ch.schema()->size(), 3U) << "the schema is the channel's too";
    EXPECT_EQ(sinkread::read_run(dir).index["metadata"]["schema"]["2"]["name"].str(), "layers.0.mlp");
    forward(ch, s, 0, 10);
    forward(ch, s, 1, 11);
    EXPECT_TRUE(ch.close().clean());
  }
  EXPECT_EQ(sink.close().tensors_written, 6U);
  expect_run({{0, 10}, {1, 11}});
}

/// Neither the sink nor the channel having a schema is the sink's logic_error, from the constructor, before the
/// channel exists: the sink took nothing and attaches to a channel with a schema afterwards.
TEST_F(SinkAttach, NeitherHavingASchemaIsRefusedBeforeTheChannelExists)
{
  auto sc = sink_config();
  sc.schema = {};
  fk::safetensors sink{sc};
  const std::string msg = error_of<ferry::logic_error>([&] { fd::channel<B> ch{channel_config(), b, sink}; });
  EXPECT_NE(msg.find("expected a schema (safetensors_config::schema, or its channel's), got none from either"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.string()), std::string::npos) << "names the sink's directory: " << msg;
  EXPECT_TRUE(sink.cfg().schema.empty());
  fb::stream<B> s{b};
  {
    fd::channel<B> ch{channel_config(), b, sink, schema()};
    forward(ch, s, 0, 7);
    EXPECT_TRUE(ch.close().clean());
  }
  const fk::safetensors_stats st = sink.close();
  EXPECT_EQ(st.tensors_written, 3U);
  EXPECT_EQ(st.refused_entries, 0U);
  expect_run({{0, 7}});
}

/// A shm_stream attaches in one call: the channel's schema into the segment (a reader's entries typed), its
/// staging the channel's (no entry refused for bytes outside it), one channel at a time; directly, and through a
/// sink_ref (the type-erased path the Python binding takes).
TEST_F(SinkAttach, AShmStreamGivesItsStagingAndTakesTheSchemaInTheOneCall)
{
  fb::stream<B> s{b};
  for (const bool erased : {false, true}) {
    SCOPED_TRACE(erased ? "through a sink_ref" : "the stream itself");
    fk::shm_stream_config sc;
    sc.name = "ferry-attach-" + std::to_string(::getpid()) + (erased ? "-ref" : "");
    sc.staging_bytes = 1 << 20;
    fk::shm_stream stream{sc};
    fk::shm_reader reader{sc.name};
    fd::sink_ref ref = stream;
    std::vector<fk::shm_entry> got;
    {
      fd::channel<B> ch = erased ? fd::channel<B>{channel_config(), b, ref, schema()}
                                 : fd::channel<B>{channel_config(), b, stream, schema()};
      EXPECT_EQ(stream.cfg().schema.size(), 3U);
      EXPECT_EQ(reader.schema()->size(), 3U);
      const std::string busy = error_of<ferry::logic_error>([&] { fd::channel<B> other{channel_config(), b, stream}; });
      EXPECT_NE(busy.find("one channel at a time"), std::string::npos) << busy;
      forward(ch, s, 0, 20);
      wait_for([&] {
        for (auto& e : reader.poll(8, std::chrono::milliseconds(10))) { got.push_back(std::move(e)); }
        return got.size() >= hooks.size();
      }, "the reader's entries");
      EXPECT_TRUE(ch.close().clean());
    }
    ASSERT_EQ(got.size(), hooks.size());
    for (std::size_t k = 0; k < hooks.size(); ++k) {
      ASSERT_NE(got[k].spec(), nullptr) << "hook " << hooks[k].name << ": the schema is in the segment";
      EXPECT_EQ(got[k].typed().name(), hooks[k].name);
      EXPECT_EQ(got[k].tag(), 20U);
      const auto want = expected(0, hooks[k]);
      const auto bytes = got[k].bytes();
      ASSERT_EQ(bytes.size(), want.size());
      EXPECT_EQ(std::memcmp(bytes.data(), want.data(), want.size()), 0) << "hook " << hooks[k].name;
    }
    got.clear();
    reader.close();
    const fk::shm_stream_stats st = stream.close();
    EXPECT_EQ(st.entries_published, hooks.size());
    EXPECT_EQ(st.entries_released, hooks.size());
    EXPECT_EQ(st.refused_entries, 0U) << st.first_error;
    EXPECT_TRUE(st.first_error.empty()) << st.first_error;
  }
}

/// A user's type with callback() and adopt_schema() is a sink: offered the schema, then asked for its callback,
/// in that order; a bare callback attaches as sink_ref{callback} (no schema taken, the channel's own staging).
TEST_F(SinkAttach, AUserSinkAndABareCallbackAttachInOneCall)
{
  struct recording_sink {
    std::vector<std::string>* calls;
    std::shared_ptr<std::atomic<std::uint64_t>> entries = std::make_shared<std::atomic<std::uint64_t>>(0);
    std::function<void(fd::entry_view&&)> callback()
    {
      calls->push_back("callback");
      return [n = entries](fd::entry_view&&) { ++*n; };
    }
    void adopt_schema(const fd::hook_schema& h) { calls->push_back("adopt " + std::to_string(h.size())); }
  };
  static_assert(fd::sink<recording_sink> && !fd::staging_sink<recording_sink>);
  std::vector<std::string> calls;
  recording_sink user{&calls};
  fb::stream<B> s{b};
  {
    fd::channel<B> ch{channel_config(), b, user, schema()};
    EXPECT_EQ(calls, (std::vector<std::string>{"adopt 3", "callback"}));
    forward(ch, s, 0);
    EXPECT_TRUE(ch.close().clean());
  }
  EXPECT_EQ(user.entries->load(), hooks.size());

  std::atomic<std::uint64_t> bare_entries{0};
  fd::sink_ref bare{fd::sink_ref::callback_type{[&](fd::entry_view&& e) { bare_entries += e.ok() ? 1 : 0; }}};
  EXPECT_TRUE(bare.staging(fd::host_registration::of(b)).empty());
  fd::channel<B> ch{channel_config(), b, bare, schema()};
  EXPECT_EQ(ch.schema()->size(), 3U);
  forward(ch, s, 1);
  EXPECT_TRUE(ch.close().clean());
  EXPECT_EQ(bare_entries.load(), hooks.size());
}

}  // namespace
}  // namespace ferry::test
