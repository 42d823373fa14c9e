// SentencePiece in a process that also uses the system libprotobuf (as the worker does for
// gRPC): Debian's libsentencepiece carries its own protobuf-lite, so qlora_data loads it via
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND) from libqlora_spm. This binary links libprotobuf, uses it,
// then tokenizes with a shipped SentencePiece model and gets the reference ids.
#include <google/protobuf/struct.pb.h>

#include <string>

#include "gtest/gtest.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {
namespace {

TEST(DataSpmIsolationTest, SentencePieceWorksBesideSystemProtobuf) {
  google::protobuf::Struct message;
  (*message.mutable_fields())["k"].set_string_value("v");
  std::string bytes = message.SerializeAsString();
  ASSERT_FALSE(bytes.empty());

  const char* source = std::getenv("QLORA_SOURCE_DIR");
  ASSERT_NE(source, nullptr);
  auto tokenizer = LoadTokenizer(std::string(source) + "/tests/assets/spm_bpe");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->kind(), "tokenizer.model (SentencePiece)");
  // From sentencepiece.SentencePieceProcessor(model_file=...).encode (see fixtures/README.md).
  EXPECT_EQ(*(*tokenizer)->Encode("Hello, world! 日本語 🙂"),
            (std::vector<int32_t>{352, 437, 353, 315, 354, 381, 337, 354, 359, 360, 361, 405,
                                  352, 568, 462, 573, 352, 599}));
  EXPECT_EQ(*(*tokenizer)->Encode("numbers 1234"),
            (std::vector<int32_t>{297, 271, 372, 268, 356, 352, 374, 377, 393, 396}));
  EXPECT_EQ((*tokenizer)->special().bos_id, 1);
  EXPECT_TRUE((*tokenizer)->special().add_bos);
  EXPECT_EQ((*tokenizer)->special().eos_id, 2);

  google::protobuf::Struct parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.fields().at("k").string_value(), "v");
}

}  // namespace
}  // namespace qlora::data
