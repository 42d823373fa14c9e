// Varlen attention on the CPU (the masked path): the document layout from position ids, and the
// output and q/k/v gradients against attention run one document at a time and against the dense
// mask the model built before, in float32 (exact or near) and bfloat16, for packed layouts with
// one or many documents per row, documents of one token, GQA and windows shorter than documents.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/engine/torch_test_util.h"
#include "tests/engine/varlen_reference.h"
#include "worker/engine/varlen_attention.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::AttentionResult;
using ::qlora::testing::MaxAbsDiff;
using ::qlora::testing::PackedCase;

TEST(EngineVarlenLayout, DocumentsStartAtPositionZeroAndAtEveryRow) {
  // Row 0 opens with a run that has no 0 (a document of its own), then documents of 3, 1 and 2.
  const at::Tensor positions = at::tensor({3, 4, 0, 1, 2, 0, 0, 1, 0, 1, 2, 3, 4, 5, 6, 7},
                                          at::kLong).view({2, 8});
  const DocumentLayout layout = DocumentLayout::FromPositions(positions, at::kCPU);
  EXPECT_TRUE(at::equal(layout.cu_seqlens, at::tensor({0, 2, 5, 6, 8, 16}, at::kInt)))
      << layout.cu_seqlens;
  EXPECT_EQ(layout.cu_seqlens.scalar_type(), at::kInt);
  EXPECT_EQ(layout.max_length, 8);
  EXPECT_TRUE(at::equal(layout.document_ids,
                        at::tensor({0, 0, 1, 1, 1, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}, at::kLong)
                            .view({2, 8})))
      << layout.document_ids;
}

TEST(EngineVarlenLayout, RejectsBadShapes) {
  EXPECT_THROW(DocumentLayout::FromPositions(at::zeros({8}, at::kLong), at::kCPU), c10::Error);
  EXPECT_THROW(DocumentLayout::FromPositions(at::zeros({2, 0}, at::kLong), at::kCPU), c10::Error);
}

TEST(EngineVarlenLayout, FlashPathIsCudaHalfPrecisionOnly) {
  const at::Tensor bf16 = at::zeros({1, 2, 4, 16}, at::kBFloat16);
  EXPECT_FALSE(FlashVarlenApplies(bf16, bf16, bf16));
  const DocumentLayout layout =
      DocumentLayout::FromPositions(at::arange(4, at::kLong).unsqueeze(0), at::kCPU);
  EXPECT_THROW(FlashVarlenCausalAttention(bf16, bf16, bf16, layout, 0), c10::Error);
}

class EngineVarlenCpu : public ::testing::TestWithParam<PackedCase> {};

// max |a - b| over the output and the three gradients, each relative to b's largest magnitude
// (at least 1: a window of one token makes q's and k's gradients zero up to rounding).
void ExpectClose(const AttentionResult& a, const AttentionResult& b, double tolerance) {
  auto check = [&](const at::Tensor& x, const at::Tensor& y, const char* what) {
    const double scale = std::max(y.abs().max().item<double>(), 1.0);
    EXPECT_LT(MaxAbsDiff(x, y) / scale, tolerance) << what;
  };
  check(a.out, b.out, "output");
  check(a.grad_q, b.grad_q, "grad q");
  check(a.grad_k, b.grad_k, "grad k");
  check(a.grad_v, b.grad_v, "grad v");
}

TEST_P(EngineVarlenCpu, MatchesPerDocumentAttentionAndTheDenseMask) {
  const PackedCase& c = GetParam();
  const at::Tensor positions = testing::PositionIds(c);
  const DocumentLayout layout = DocumentLayout::FromPositions(positions, at::kCPU);
  auto varlen = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return VarlenCausalAttention(q, k, v, layout, c.window);
  };
  auto per_document = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return testing::PerDocumentAttention(q, k, v, layout, c.window);
  };
  auto dense = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return testing::OldDenseMaskAttention(q, k, v, positions, c.window);
  };
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const double tolerance = dtype == at::kFloat ? 1e-5 : 3e-2;
    const AttentionResult got = testing::RunAttention(c, varlen, dtype, at::kCPU);
    ExpectClose(got, testing::RunAttention(c, per_document, dtype, at::kCPU), tolerance);
    const AttentionResult old = testing::RunAttention(c, dense, dtype, at::kCPU);
    if (dtype == at::kFloat) {  // the same computation as before: the same bits
      EXPECT_TRUE(at::equal(got.out, old.out));
      EXPECT_TRUE(at::equal(got.grad_q, old.grad_q));
      EXPECT_TRUE(at::equal(got.grad_k, old.grad_k));
      EXPECT_TRUE(at::equal(got.grad_v, old.grad_v));
    } else {
      ExpectClose(got, old, tolerance);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineVarlenCpu, ::testing::ValuesIn(testing::PackedCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace qlora::engine
