// The code tables: NF4 shape and thresholds, FP4 values, the dynamic map's structure, and that
// each table equals what bitsandbytes itself serialized into the fixtures.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/codebooks_4bit.h"
#include "kernels/quantize_4bit_math.h"
#include "tests/util/files.h"

namespace qlora::kernels {
namespace {

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

std::vector<float> ReadFloats(const std::string& path) {
  const std::string bytes = testing::ReadFile(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

const std::string kFixtures = QLORA_BNB_FIXTURES_DIR "/cuda/";

TEST(KernelsCodebooks, Nf4IsSortedWithExactZeroAndOne) {
  for (int i = 0; i + 1 < 16; ++i) EXPECT_LT(kNf4Values.v[i], kNf4Values.v[i + 1]) << i;
  EXPECT_EQ(Bits(kNf4Values.v[7]), 0u) << "code 7 must be +0.0";
  EXPECT_EQ(kNf4Values.v[0], -1.0f);
  EXPECT_EQ(kNf4Values.v[15], 1.0f);
}

TEST(KernelsCodebooks, Nf4ThresholdsAreMidpoints) {
  for (int i = 0; i < 15; ++i) {
    const double mid = (double{kNf4Values.v[i]} + double{kNf4Values.v[i + 1]}) / 2;
    const float t = kNf4Thresholds.v[i];
    EXPECT_LE(std::fabs(t - mid), std::fabs(std::nextafter(t, 2.0f) - t)) << "threshold " << i;
  }
}

TEST(KernelsCodebooks, Nf4CodeIsStrictAndNaNGoesToZero) {
  for (int i = 0; i < 15; ++i) {
    const float t = kNf4Thresholds.v[i];
    EXPECT_EQ(math::Nf4Code(t, kNf4Thresholds), i) << "a value on a threshold takes the lower code";
    EXPECT_EQ(math::Nf4Code(std::nextafter(t, 2.0f), kNf4Thresholds), i + 1);
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(math::Nf4Code(kNf4Values.v[c], kNf4Thresholds), c);
  EXPECT_EQ(math::Nf4Code(std::nanf(""), kNf4Thresholds), 0);
}

TEST(KernelsCodebooks, Fp4IsSignMagnitudeOverTwelve) {
  const float magnitudes[8] = {0, 0.0625f, 8, 12, 4, 6, 2, 3};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(kFp4Values.v[c], magnitudes[c] / 12.0f) << c;
    EXPECT_EQ(kFp4Values.v[c + 8], -kFp4Values.v[c]) << c;
  }
  EXPECT_EQ(Bits(kFp4Values.v[8]), 0x80000000u) << "CUDA dequantizes FP4 code 8 to -0.0";
  // Every value encodes to its own code, and the sign of -0.0 and NaN is positive.
  for (int c = 0; c < 16; ++c) {
    if (c == 8) continue;
    EXPECT_EQ(math::Fp4Code(kFp4Values.v[c], kFp4Pivots), c);
  }
  EXPECT_EQ(math::Fp4Code(-0.0f, kFp4Pivots), 0);
  EXPECT_EQ(math::Fp4Code(std::nanf(""), kFp4Pivots), 0);
  EXPECT_EQ(math::Fp4Code(-1e-6f, kFp4Pivots), 8);
}

TEST(KernelsCodebooks, DynamicMapStructure) {
  for (int i = 0; i + 1 < 256; ++i) EXPECT_LT(kDynamicMap.v[i], kDynamicMap.v[i + 1]) << i;
  EXPECT_EQ(Bits(kDynamicMap.v[127]), 0u);
  EXPECT_EQ(kDynamicMap.v[255], 1.0f);
  EXPECT_NEAR(kDynamicMap.v[0], -0.99296875f, 1e-7f);
  EXPECT_NEAR(kDynamicMap.v[128], 5.5e-7f, 1e-12f);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(math::DynamicCode(kDynamicMap.v, kDynamicMap.v[i]), i) << "a code maps to itself";
  }
  // Nearest neighbour: just below / above the midpoint of two codes.
  const float mid = (kDynamicMap.v[200] + kDynamicMap.v[201]) * 0.5f;
  EXPECT_EQ(math::DynamicCode(kDynamicMap.v, std::nextafter(mid, -2.0f)), 200);
  EXPECT_EQ(math::DynamicCode(kDynamicMap.v, std::nextafter(mid, 2.0f)), 201);
}

TEST(KernelsCodebooks, TablesEqualWhatBitsandbytesSerialized) {
  const std::vector<float> dynamic = ReadFloats(kFixtures + "dynamic_map.bin");
  ASSERT_EQ(dynamic.size(), 256u) << "missing fixture " << kFixtures;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(Bits(dynamic[i]), Bits(kDynamicMap.v[i])) << i;
  const std::vector<float> nf4 = ReadFloats(kFixtures + "quant_map_nf4.bin");
  const std::vector<float> fp4 = ReadFloats(kFixtures + "quant_map_fp4.bin");
  ASSERT_EQ(nf4.size(), 16u);
  ASSERT_EQ(fp4.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(Bits(nf4[i]), Bits(kNf4Values.v[i])) << "nf4 " << i;
    // The serialized FP4 map has +0.0 at code 8, the kernel's table -0.0.
    EXPECT_EQ(Bits(fp4[i]), Bits(i == 8 ? 0.0f : kFp4Values.v[i])) << "fp4 " << i;
  }
}

}  // namespace
}  // namespace qlora::kernels
