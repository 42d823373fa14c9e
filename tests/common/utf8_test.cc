// UTF-8 checks and repair: what the API's string fields need (protobuf refuses to serialize a
// string field that is not UTF-8, so an error quoting a record's bytes would be lost).
#include "common/text/utf8.h"

#include <string>

#include "gtest/gtest.h"
#include "qlora/v1/worker_service.pb.h"

namespace qlora {
namespace {

TEST(CommonUtf8Test, FirstInvalidByteIsFoundAndWellFormedTextPasses) {
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), std::string::npos);
  EXPECT_EQ(FirstInvalidUtf8("caf\xC3\xA9 \xF0\x9F\x98\x80"), std::string::npos);
  EXPECT_EQ(FirstInvalidUtf8("ab\xFF"), 2u);
  EXPECT_EQ(FirstInvalidUtf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("x\xED\xA0\x80"), 1u);     // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xE2\x82"), 0u);          // cut short
}

TEST(CommonUtf8Test, ValidUtf8ReplacesEachBadByteAndKeepsTheRest) {
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(ValidUtf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(ValidUtf8("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8(std::string("nul\0ok", 6)), std::string("nul\0ok", 6));
  EXPECT_EQ(FirstInvalidUtf8(ValidUtf8("\xC0\xAF\xED\xA0\x80\xF4\x90\x80\x80 tail")),
            std::string::npos);
}

TEST(CommonUtf8Test, Utf8PrefixNeverCutsACharacter) {
  EXPECT_EQ(Utf8Prefix("abc", 8), "abc");
  EXPECT_EQ(Utf8Prefix("abcdef", 3), "abc");
  EXPECT_EQ(Utf8Prefix("ab\xC3\xA9", 3), "ab");              // U+00E9 would be cut
  EXPECT_EQ(Utf8Prefix("a\xF0\x9F\x98\x80z", 4), "a");       // U+1F600 would be cut
  EXPECT_EQ(Utf8Prefix("a\xF0\x9F\x98\x80z", 5), "a\xF0\x9F\x98\x80");
}

// The failure that was lost: a completion report whose error quotes invalid bytes does not
// parse at the coordinator's end (the call fails with INTERNAL), and does once repaired, with
// the readable part of the cause intact.
TEST(CommonUtf8Test, AnErrorQuotingInvalidBytesCrossesTheWireOnceRepaired) {
  const std::string error = "train.jsonl:3: malformed record: {\"instruction\": \"\xFF\xFE\"}";
  v1::CompletionReport raw;
  raw.set_error(error);
  v1::CompletionReport back;
  EXPECT_FALSE(back.ParseFromString(raw.SerializeAsString()));
  v1::CompletionReport repaired;
  repaired.set_error(ValidUtf8(error));
  ASSERT_TRUE(back.ParseFromString(repaired.SerializeAsString()));
  EXPECT_EQ(back.error().rfind("train.jsonl:3: malformed record", 0), 0u);
}

}  // namespace
}  // namespace qlora
