// SPDX-License-Identifier: Apache-2.0
// ferry::detail::format, the dependency-free formatter of ferry's error messages: every argument kind and
// format spec ferry's messages use, fmt's spelling of each (so messages read as they did with fmt), and
// the rule that a malformed field never throws.
#include <ferry/backend/buffer.hpp>
#include <ferry/detail/format.hpp>
#include <ferry/error.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace {

using ferry::detail::format;

enum class plain_enum : std::int16_t { a = -3, b = 7 };

TEST(Format, LiteralTextAndEscapes)
{
  EXPECT_EQ(format("no fields"), "no fields");
  EXPECT_EQ(format(""), "");
  EXPECT_EQ(format("{{}} {{{}}}", 5), "{} {5}");
  EXPECT_EQ(format("a}}b"), "a}b");
}

TEST(Format, Integers)
{
  EXPECT_EQ(format("{} {} {}", 0, -42, 42U), "0 -42 42");
  EXPECT_EQ(format("{}", std::numeric_limits<std::int64_t>::min()), "-9223372036854775808");
  EXPECT_EQ(format("{}", std::numeric_limits<std::uint64_t>::max()), "18446744073709551615");
  EXPECT_EQ(format("{}", std::size_t{1} << 40), "1099511627776");
  EXPECT_EQ(format("{}", static_cast<std::uint8_t>(200)), "200");  // as fmt: a number, not a character
  EXPECT_EQ(format("{:#x}", 0xdeadU), "0xdead");
  EXPECT_EQ(format("{:x} {:X} {:#X}", 255, 255, 255), "ff FF 0XFF");
  EXPECT_EQ(format("{:#b} {:o} {:#o}", 5, 8, 8), "0b101 10 010");
  EXPECT_EQ(format("{:08x}", 0xbeefU), "0000beef");
  EXPECT_EQ(format("{:#010x}", 0xbeefU), "0x0000beef");
  EXPECT_EQ(format("{:5}|{:<5}|{:^5}|{:*>5}", 42, 42, 42, 42), "   42|42   | 42  |***42");
  EXPECT_EQ(format("{:+} {:+}", 3, -3), "+3 -3");
  EXPECT_EQ(format("{:c}", 65), "A");
}

TEST(Format, FloatingPoint)
{
  EXPECT_EQ(format("{}", 1.5), "1.5");
  EXPECT_EQ(format("{}", 0.1), "0.1");
  EXPECT_EQ(format("{}", -2.0F), "-2");
  EXPECT_EQ(format("{:.3f}", 3.14159), "3.142");
  EXPECT_EQ(format("{:.2f}", -0.5), "-0.50");
  EXPECT_EQ(format("{:8.1f}|", 2.25), "     2.2|");
  EXPECT_EQ(format("{:e}", 1234.5), "1.234500e+03");
  EXPECT_EQ(format("{}", std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format("{}", -std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(format("{}", std::numeric_limits<double>::quiet_NaN()), "nan");
}

TEST(Format, TextBoolCharPointers)
{
  const std::string s{"string"};
  const std::string_view sv{"view"};
  const char* cp = "pointer";
  const char* null_cp = nullptr;
  EXPECT_EQ(format("{} {} {} {}", s, sv, cp, "literal"), "string view pointer literal");
  EXPECT_EQ(format("{}", null_cp), "(null)");
  EXPECT_EQ(format("'{:>6}' '{:<6}' '{:.3}'", "ab", "ab", "abcdef"), "'    ab' 'ab    ' 'abc'");
  EXPECT_EQ(format("{} {}", true, false), "true false");
  EXPECT_EQ(format("{}{}", 'o', 'k'), "ok");
  int x = 0;
  const void* p = reinterpret_cast<const void*>(std::uintptr_t{0x1000});
  EXPECT_EQ(format("{}", p), "0x1000");
  EXPECT_EQ(format("{}", nullptr), "0x0");
  EXPECT_EQ(format("{}", static_cast<void*>(nullptr)), "0x0");
  EXPECT_EQ(format("{}", &x).substr(0, 2), "0x");
}

TEST(Format, EnumsUseToStringWhenThereIsOne)
{
  EXPECT_EQ(format("{}", ferry::backend::memory_kind::pinned_mapped), "pinned mapped");  // ADL to_string
  EXPECT_EQ(format("{} {}", plain_enum::a, plain_enum::b), "-3 7");                       // underlying value
}

TEST(Format, PositionalArguments)
{
  EXPECT_EQ(format("{1} {0} {1}", "a", "b"), "b a b");
  EXPECT_EQ(format("{0:#x} {0}", 16), "0x10 16");
}

TEST(Format, MalformedFieldsAreWrittenAsIsAndNeverThrow)
{
  EXPECT_EQ(format("{} {}", 1), "1 {}");          // missing argument
  EXPECT_EQ(format("{:q!}", 1), "{:q!}");         // bad spec
  EXPECT_EQ(format("{x}", 1), "{x}");             // bad index
  EXPECT_EQ(format("open {", 1), "open {");       // unterminated
  EXPECT_EQ(format("{:.}", 1.0), "{:.}");         // precision without digits
  EXPECT_EQ(format("{}", 1, 2), "1");             // extra arguments are ignored
}

TEST(Format, ErrorMacrosNameWhatAndWhere)
{
  try {
    FERRY_FAIL(ferry::logic_error, "buffer '{}': expected {} bytes, got {}", "ids", 64, 65);
    FAIL() << "FERRY_FAIL did not throw";
  } catch (const ferry::logic_error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("ferry: buffer 'ids': expected 64 bytes, got 65 [", 0), 0U) << m;
    EXPECT_NE(m.find("format_test.cpp:"), std::string::npos) << m;
  }
  const ferry::backend_error be{"host", 7, "bad_thing", "call(x)", "f.cpp:3", "detail"};
  EXPECT_STREQ(be.what(), "ferry: host call 'call(x)' failed at f.cpp:3: bad_thing (7): detail");
}

}  // namespace
