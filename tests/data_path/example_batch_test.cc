// Examples and micro-batches: prompt masking, templates, truncation, the LLaMA-3 chat layout,
// and packing. Packed and unpacked batches hold the same (token, label, position) multiset and
// give the same loss under a reference causal-attention model that reads only what the
// engine gets (ids, positions, sequence lengths), so no attention crosses a packed boundary.
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/data_path/test_util.h"
#include "worker/data/batcher.h"
#include "worker/data/example_builder.h"
#include "common/dataset/record_layout.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {
namespace {

std::vector<int32_t> Bytes(const std::string& s) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(s.data()),
                              reinterpret_cast<const unsigned char*>(s.data()) + s.size());
}

Record MakeRecord(std::vector<std::pair<std::string, std::string>> fields) {
  Record r;
  r.fields = std::move(fields);
  r.path = "mem";
  return r;
}

class DataExampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteByteTokenizer(dir_.path());
    auto tokenizer = LoadTokenizer(dir_.path());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }
  ExampleBuilder Builder(std::vector<std::string> inputs, std::vector<std::string> outputs,
                         std::string tmpl = "", int max_len = 512,
                         DataFormat format = DataFormat::kJsonl) {
    auto options = ExampleBuilder::OptionsFor(format, inputs, outputs, tmpl, max_len);
    EXPECT_TRUE(options.ok()) << options.status();
    auto builder = ExampleBuilder::Create(*options, tokenizer_.get());
    EXPECT_TRUE(builder.ok()) << builder.status();
    return std::move(*builder);
  }

  TempDir dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(DataExampleTest, DefaultTemplateMasksBosAndPrompt) {
  ExampleBuilder builder = Builder({"instruction"}, {"output"});
  Example ex;
  ASSERT_TRUE(*builder.Build(MakeRecord({{"instruction", "Hi"}, {"output", "Yo"}}), &ex));
  std::vector<int32_t> prompt = Bytes("### Instruction:\nHi\n\n### Response:\n");
  std::vector<int32_t> ids = {kByteBos};
  ids.insert(ids.end(), prompt.begin(), prompt.end());
  ids.insert(ids.end(), {'Y', 'o', kByteEos});
  EXPECT_EQ(ex.input_ids, ids);
  std::vector<int32_t> labels(1 + prompt.size(), kIgnoreIndex);
  labels.insert(labels.end(), {'Y', 'o', kByteEos});
  EXPECT_EQ(ex.labels, labels);
}

TEST_F(DataExampleTest, DefaultTemplateLeavesOutEmptyOptionalSections) {
  ExampleBuilder builder = Builder({"instruction", "input"}, {"output"});
  Example with, without;
  ASSERT_TRUE(*builder.Build(
      MakeRecord({{"instruction", "Add"}, {"input", "1+1"}, {"output", "2"}}), &with));
  ASSERT_TRUE(*builder.Build(
      MakeRecord({{"instruction", "Add"}, {"input", ""}, {"output", "2"}}), &without));
  auto text = [&](const Example& e) { return *tokenizer_->Decode(std::vector<int32_t>(e.input_ids.begin() + 1, e.input_ids.end() - 1)); };
  EXPECT_EQ(text(with), "### Instruction:\nAdd\n\n### Input:\n1+1\n\n### Response:\n2");
  EXPECT_EQ(text(without), "### Instruction:\nAdd\n\n### Response:\n2");
}

TEST_F(DataExampleTest, CustomTemplateBracesAndMissingColumns) {
  ExampleBuilder builder = Builder({"q"}, {"a"}, "Q: {q} {{literal}}\nA: ");
  Example ex;
  ASSERT_TRUE(*builder.Build(MakeRecord({{"q", "why"}, {"a", "because"}}), &ex));
  EXPECT_EQ(*tokenizer_->Decode(std::vector<int32_t>(ex.input_ids.begin() + 1, ex.input_ids.end() - 1)),
            "Q: why {literal}\nA: because");
  auto missing = builder.Build(MakeRecord({{"a", "x"}}), &ex);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("missing column 'q'"), std::string::npos);

  auto options = ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"q"}, {"a"}, "Q: {q", 64);
  ASSERT_TRUE(options.ok());
  EXPECT_FALSE(ExampleBuilder::Create(*options, tokenizer_.get()).ok());
}

TEST_F(DataExampleTest, TruncationCutsTheTargetTailAndDropsPromptOnlyExamples) {
  // Prompt = BOS + 34 bytes; max 37 leaves 2 target tokens and no EOS.
  ExampleBuilder builder = Builder({"instruction"}, {"output"}, "", 37);
  Example ex;
  ASSERT_TRUE(*builder.Build(MakeRecord({{"instruction", "x"}, {"output", "abcdef"}}), &ex));
  ASSERT_EQ(ex.input_ids.size(), 37u);
  EXPECT_EQ(ex.input_ids[35], 'a');
  EXPECT_EQ(ex.input_ids[36], 'b');
  EXPECT_EQ(ex.labels[36], 'b');
  EXPECT_EQ(ex.labels[34], kIgnoreIndex);
  EXPECT_EQ(builder.stats().truncated, 1);
  auto dropped = builder.Build(MakeRecord({{"instruction", std::string(100, 'p')}, {"output", "t"}}), &ex);
  ASSERT_TRUE(dropped.ok());
  EXPECT_FALSE(*dropped);
  EXPECT_EQ(builder.stats().dropped_no_target, 1);
  EXPECT_EQ(builder.stats().examples, 1);
}

TEST_F(DataExampleTest, Llama3ChatTrainsOnlyAssistantTurns) {
  ExampleBuilder builder = Builder({"messages"}, {});
  Example ex;
  ASSERT_TRUE(*builder.Build(
      MakeRecord({{"messages",
                   R"([{"role":"system","content":"Be brief."},{"role":"user","content":" Hi "},)"
                   R"({"role":"assistant","content":"Hello!\n"}])"}}),
      &ex));
  std::vector<int32_t> want = {kByteBos};
  auto turn = [&](const std::string& role, const std::string& content) {
    want.push_back(kByteStartHeader);
    for (int32_t b : Bytes(role)) want.push_back(b);
    want.push_back(kByteEndHeader);
    want.insert(want.end(), {'\n', '\n'});
    for (int32_t b : Bytes(content)) want.push_back(b);
    want.push_back(kByteEot);
  };
  turn("system", "Be brief.");
  turn("user", "Hi");
  const size_t assistant_content = want.size() + 1 + 9 + 1 + 2;
  turn("assistant", "Hello!");
  EXPECT_EQ(ex.input_ids, want);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(ex.labels[i], i >= assistant_content ? want[i] : kIgnoreIndex) << i;
}

// ShareGPT's layout (a "conversations" column of {from, value} turns) gives the tokens and labels
// of the same conversation as {role, content} messages; an unknown speaker is a malformed record
// naming it.
TEST_F(DataExampleTest, ShareGptConversationsTrainAsTheSameMessages) {
  const std::string messages =
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},)"
      R"({"role":"assistant","content":"Hello!"},{"role":"user","content":"Bye"},)"
      R"({"role":"assistant","content":"Bye!"}])";
  const std::string conversations =
      R"([{"from":"system","value":"Be brief."},{"from":"human","value":"Hi"},)"
      R"({"from":"gpt","value":"Hello!"},{"from":"user","value":"Bye"},)"
      R"({"from":"assistant","value":"Bye!"}])";
  Example want, got;
  ASSERT_TRUE(*Builder({"messages"}, {}).Build(MakeRecord({{"messages", messages}}), &want));
  ExampleBuilder sharegpt = Builder({"conversations"}, {"output"});
  std::vector<std::string> required, optional;
  sharegpt.Columns(&required, &optional);
  EXPECT_EQ(required, std::vector<std::string>{"conversations"});
  ASSERT_TRUE(*sharegpt.Build(MakeRecord({{"conversations", conversations}}), &got));
  EXPECT_EQ(got.input_ids, want.input_ids);
  EXPECT_EQ(got.labels, want.labels);

  Example bad;
  absl::StatusOr<bool> refused = sharegpt.Build(
      MakeRecord({{"conversations", R"([{"from":"narrator","value":"Once"}])"}}), &bad);
  EXPECT_FALSE(refused.ok() && *refused);
  const std::string why = refused.ok() ? "" : std::string(refused.status().message());
  EXPECT_NE(why.find("unknown speaker 'narrator'"), std::string::npos) << why;
}

// A tiny causal model in double precision: embedding + position embedding, one attention
// head, an output projection. The attention mask comes only from what the data path hands
// the engine: unpacked rows use causal + key padding (the attention-mask path), packed rows
// use block-diagonal causal attention from sequence_lengths.
class ReferenceModel {
 public:
  static constexpr int kDim = 8, kVocab = 300, kMaxPos = 64;
  ReferenceModel() {
    std::mt19937 rng(7);
    std::normal_distribution<double> normal(0, 0.5);
    for (auto* m : {&embed_, &pos_, &out_}) m->resize(kVocab * kDim);
    for (auto* m : {&wq_, &wk_, &wv_}) m->resize(kDim * kDim);
    for (auto* m : {&embed_, &pos_, &out_, &wq_, &wk_, &wv_})
      for (double& x : *m) x = normal(rng);
  }

  // Sum of token losses and the number of labels in one micro-batch. `packed` selects the
  // mask source as described above.
  std::pair<double, int> Loss(const MicroBatch& batch, bool packed) const {
    double total = 0;
    int count = 0;
    for (int r = 0; r < batch.rows; ++r) {
      const int base = r * batch.seq_len;
      std::vector<int> segment(batch.seq_len, -1);  // segment id per position; -1 = padding
      int at = 0, id = 0;
      for (int32_t len : batch.sequence_lengths[r]) {
        for (int i = 0; i < len; ++i) segment[at + i] = packed ? id : 0;
        at += len;
        ++id;
      }
      std::vector<std::vector<double>> h(batch.seq_len, std::vector<double>(kDim));
      for (int t = 0; t < batch.seq_len; ++t)
        for (int d = 0; d < kDim; ++d)
          h[t][d] = embed_[batch.input_ids[base + t] * kDim + d] +
                    pos_[batch.position_ids[base + t] * kDim + d];
      for (int t = 1; t < batch.seq_len; ++t) {
        const int32_t label = batch.labels[base + t];
        if (label == kIgnoreIndex) continue;
        const int q = t - 1;  // logits at t-1 predict token t
        std::vector<double> query = Mul(wq_, h[q]), context(kDim, 0.0);
        std::vector<double> scores;
        std::vector<int> keys;
        for (int k = 0; k <= q; ++k) {
          if (segment[k] < 0 || segment[k] != segment[q]) continue;
          std::vector<double> key = Mul(wk_, h[k]);
          double s = 0;
          for (int d = 0; d < kDim; ++d) s += query[d] * key[d];
          scores.push_back(s / std::sqrt(static_cast<double>(kDim)));
          keys.push_back(k);
        }
        double mx = *std::max_element(scores.begin(), scores.end()), z = 0;
        for (double& s : scores) z += (s = std::exp(s - mx));
        for (size_t i = 0; i < keys.size(); ++i) {
          std::vector<double> v = Mul(wv_, h[keys[i]]);
          for (int d = 0; d < kDim; ++d) context[d] += scores[i] / z * v[d];
        }
        std::vector<double> logits(kVocab);
        double lmx = -1e300, lz = 0;
        for (int v = 0; v < kVocab; ++v) {
          for (int d = 0; d < kDim; ++d) logits[v] += out_[v * kDim + d] * (context[d] + h[q][d]);
          lmx = std::max(lmx, logits[v]);
        }
        for (double l : logits) lz += std::exp(l - lmx);
        total += -(logits[label] - lmx - std::log(lz));
        ++count;
      }
    }
    return {total, count};
  }

 private:
  static std::vector<double> Mul(const std::vector<double>& m, const std::vector<double>& x) {
    std::vector<double> y(kDim, 0.0);
    for (int i = 0; i < kDim; ++i)
      for (int j = 0; j < kDim; ++j) y[i] += m[i * kDim + j] * x[j];
    return y;
  }
  std::vector<double> embed_, pos_, out_, wq_, wk_, wv_;
};

std::vector<MicroBatch> Batches(const std::vector<Example>& examples, bool packing) {
  Batcher batcher({/*rows=*/3, /*seq_len=*/40, packing, /*pad_id=*/kByteEos});
  std::vector<MicroBatch> out;
  for (const Example& e : examples)
    if (auto b = batcher.Add(e)) out.push_back(std::move(*b));
  if (auto b = batcher.Flush()) out.push_back(std::move(*b));
  return out;
}

// A micro-batch is as wide as its longest row, rounded up to kPadMultiple and at most seq_len,
// packed or not; every row's tail is padding (label -100).
TEST(DataBatcher, MicroBatchesAreAsWideAsTheirLongestRow) {
  auto example = [](int n) {
    Example e;
    e.input_ids.assign(n, 7);
    e.labels.assign(n, 7);
    return e;
  };
  for (const bool packing : {false, true}) {
    SCOPED_TRACE(packing ? "packed" : "unpacked");
    Batcher wide({/*rows=*/2, /*seq_len=*/512, packing, /*pad_id=*/0});
    EXPECT_FALSE(wide.Add(example(10)).has_value());
    std::optional<MicroBatch> b = packing ? (wide.Add(example(70)), wide.Flush()) : wide.Add(example(70));
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->seq_len, 128);  // 80 packed in one row, or 70 in the longer row
    EXPECT_EQ(b->input_ids.size(), 2u * b->seq_len);
    EXPECT_EQ(b->labels[b->seq_len - 1], kIgnoreIndex);
    Batcher narrow({/*rows=*/1, /*seq_len=*/100, packing, /*pad_id=*/0});
    std::optional<MicroBatch> c = narrow.Add(example(90));
    if (!c) c = narrow.Flush();
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->seq_len, 100);  // 128 capped at max_sequence_length
    Batcher exact({/*rows=*/1, /*seq_len=*/512, packing, /*pad_id=*/0});
    std::optional<MicroBatch> d = exact.Add(example(64));
    if (!d) d = exact.Flush();
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->seq_len, 64);
  }
}

ExampleBuilder PreferenceBuilder(const Tokenizer* tokenizer, int max_len = 512) {
  auto options = PreferenceLayout(DataFormat::kJsonl, {"prompt"}, {"chosen", "rejected"}, max_len);
  EXPECT_TRUE(options.ok()) << options.status();
  auto builder = ExampleBuilder::Create(*options, tokenizer);
  EXPECT_TRUE(builder.ok()) << builder.status();
  return std::move(*builder);
}

// TRL's string pairs: [BOS] + prompt + completion + [EOS] per side, labels on the completion.
TEST_F(DataExampleTest, PreferencePairsTrainOnEachSidesCompletionWithEos) {
  ExampleBuilder builder = PreferenceBuilder(tokenizer_.get());
  Example ex;
  ASSERT_TRUE(*builder.Build(MakeRecord({{"prompt", "Q?"}, {"chosen", " yes"}, {"rejected", " no!"}}), &ex));
  auto side = [](const std::string& completion) {
    std::vector<int32_t> ids = {kByteBos};
    for (int32_t b : Bytes("Q?" + completion)) ids.push_back(b);
    ids.push_back(kByteEos);
    return ids;
  };
  EXPECT_EQ(ex.input_ids, side(" yes"));
  EXPECT_EQ(ex.rejected_input_ids, side(" no!"));
  const std::vector<int32_t> chosen_labels = {kIgnoreIndex, kIgnoreIndex, kIgnoreIndex, ' ', 'y', 'e', 's', kByteEos};
  EXPECT_EQ(ex.labels, chosen_labels);
  EXPECT_EQ(ex.rejected_labels[3], ' ');
  EXPECT_EQ(ex.rejected_labels[2], kIgnoreIndex);
}

TEST_F(DataExampleTest, PreferencePairsRefuseMixedKindsAndMissingPrompts) {
  ExampleBuilder builder = PreferenceBuilder(tokenizer_.get());
  Example ex;
  auto mixed = builder.Build(MakeRecord({{"prompt", "Q"}, {"chosen", R"([{"role": "assistant", "content": "a"}])"},
                                         {"rejected", "b"}}), &ex);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("all be strings or all be conversations"), std::string::npos) << mixed.status();
  auto missing = builder.Build(MakeRecord({{"chosen", "a"}, {"rejected", "b"}}), &ex);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing column 'prompt'"), std::string::npos) << missing.status();
  // A string that only looks like JSON stays a string.
  EXPECT_TRUE(*builder.Build(MakeRecord({{"prompt", "Q"}, {"chosen", "[1, 2]"}, {"rejected", "[3]"}}), &ex));
  // Conversations need the tokenizer's chat template (the byte tokenizer has none).
  auto conversation = builder.Build(
      MakeRecord({{"chosen", R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])"},
                  {"rejected", R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}])"}}),
      &ex);
  ASSERT_FALSE(conversation.ok());
  EXPECT_NE(conversation.status().message().find("chat template"), std::string::npos) << conversation.status();
}

TEST_F(DataExampleTest, PreferencePairsKeepTheStartAndDropPromptsThatFillTheWindow) {
  ExampleBuilder builder = PreferenceBuilder(tokenizer_.get(), /*max_len=*/8);
  Example ex;
  ASSERT_TRUE(*builder.Build(MakeRecord({{"prompt", "Q"}, {"chosen", " a long answer"}, {"rejected", " b"}}), &ex));
  EXPECT_EQ(ex.input_ids.size(), 8u);  // cut to max_sequence_length, its start kept
  EXPECT_EQ(ex.rejected_input_ids.size(), 5u);  // BOS Q ' ' b EOS
  EXPECT_EQ(builder.stats().truncated, 1);
  EXPECT_FALSE(*builder.Build(MakeRecord({{"prompt", "a prompt too long"}, {"chosen", "a"}, {"rejected", "b"}}), &ex));
  EXPECT_EQ(builder.stats().dropped_no_target, 1);
}

// Chosen rows first, then rejected ones (TRL's collator); a partial micro-batch holds only its
// real pairs.
TEST(DataBatcher, PairsLayChosenRowsBeforeRejectedOnes) {
  auto pair = [](int chosen, int rejected, int32_t id) {
    Example e;
    e.input_ids.assign(chosen, id);
    e.labels.assign(chosen, id);
    e.rejected_input_ids.assign(rejected, id + 1);
    e.rejected_labels.assign(rejected, id + 1);
    return e;
  };
  BatchOptions options;
  options.rows = 2;
  options.seq_len = 512;
  options.pad_id = 0;
  options.pairs = true;
  Batcher batcher(options);
  EXPECT_FALSE(batcher.Add(pair(5, 70, 10)).has_value());
  std::optional<MicroBatch> b = batcher.Add(pair(3, 4, 20));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->pairs, 2);
  EXPECT_EQ(b->rows, 4);
  EXPECT_EQ(b->seq_len, 128);
  const std::vector<int32_t> first_ids = {10, 20, 11, 21};
  const std::vector<int32_t> lengths = {5, 3, 70, 4};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(b->input_ids[r * b->seq_len + 1], first_ids[r]) << r;
    EXPECT_EQ(b->labels[r * b->seq_len], kIgnoreIndex) << r;
    EXPECT_EQ(b->sequence_lengths[r], std::vector<int32_t>{lengths[r]}) << r;
  }
  EXPECT_EQ(b->num_examples, 2);
  EXPECT_FALSE(batcher.Flush().has_value());
  EXPECT_FALSE(batcher.Add(pair(2, 2, 30)).has_value());
  std::optional<MicroBatch> last = batcher.Flush();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->pairs, 1);
  EXPECT_EQ(last->rows, 2);
}

TEST_F(DataExampleTest, PackedAndUnpackedGiveSameTokensLabelsPositionsAndLoss) {
  ExampleBuilder builder = Builder({"instruction"}, {"output"}, "{instruction}=", 40);
  std::mt19937 rng(3);
  std::vector<Example> examples;
  for (int i = 0; i < 25; ++i) {
    std::string prompt(1 + rng() % 12, static_cast<char>('a' + rng() % 26));
    std::string target(1 + rng() % 15, static_cast<char>('A' + rng() % 26));
    Example ex;
    ASSERT_TRUE(*builder.Build(MakeRecord({{"instruction", prompt}, {"output", target}}), &ex));
    examples.push_back(ex);
  }
  std::vector<MicroBatch> unpacked = Batches(examples, false), packed = Batches(examples, true);
  EXPECT_EQ(unpacked.size(), 9u);  // 25 examples, 3 rows each
  EXPECT_LT(packed.size(), unpacked.size());

  using Triple = std::tuple<int32_t, int32_t, int32_t>;
  auto triples = [](const std::vector<MicroBatch>& batches) {
    std::map<Triple, int> counts;
    int64_t examples = 0;
    for (const MicroBatch& b : batches) {
      examples += b.num_examples;
      for (int r = 0; r < b.rows; ++r) {
        int at = r * b.seq_len;
        for (int32_t len : b.sequence_lengths[r]) {
          EXPECT_EQ(b.position_ids[at], 0);
          EXPECT_EQ(b.labels[at], kIgnoreIndex);  // nothing predicts across a boundary
          for (int i = 0; i < len; ++i) {
            EXPECT_EQ(b.position_ids[at + i], i);
            ++counts[{b.input_ids[at + i], b.labels[at + i], b.position_ids[at + i]}];
          }
          at += len;
        }
        for (; at < (r + 1) * b.seq_len; ++at) EXPECT_EQ(b.labels[at], kIgnoreIndex);
      }
    }
    EXPECT_EQ(examples, 25);
    return counts;
  };
  EXPECT_EQ(triples(unpacked), triples(packed));

  ReferenceModel model;
  double unpacked_loss = 0, packed_loss = 0, crossing_loss = 0;
  int unpacked_n = 0, packed_n = 0;
  for (const MicroBatch& b : unpacked) {
    auto [sum, n] = model.Loss(b, /*packed=*/false);
    unpacked_loss += sum;
    unpacked_n += n;
  }
  for (const MicroBatch& b : packed) {
    auto [sum, n] = model.Loss(b, /*packed=*/true);
    packed_loss += sum;
    packed_n += n;
    crossing_loss += model.Loss(b, /*packed=*/false).first;  // attention allowed to cross
  }
  ASSERT_EQ(unpacked_n, packed_n);
  // Same per-token terms summed in another order: only rounding differs (double, ~1e-16
  // relative per term over a few hundred terms).
  EXPECT_NEAR(packed_loss / packed_n, unpacked_loss / unpacked_n, 1e-9);
  // The check can fail: letting attention cross packed boundaries changes the loss.
  EXPECT_GT(std::abs(crossing_loss / packed_n - unpacked_loss / unpacked_n), 1e-3);
}

}  // namespace
}  // namespace qlora::data
