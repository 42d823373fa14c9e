// Bit-exactness against bitsandbytes' own output. Reads tests/assets/bnb/<backend>/manifest.json
// (made by make_bnb_fixtures.py) and, for every case, on the CPU and (when present) the GPU:
//   - dequantizing bitsandbytes' packed/absmax (and nested state) gives its output bit for bit;
//   - quantizing its input gives the same packed bytes and absmax; the CPU may pick the
//     neighbouring code where x * (1/absmax) sits within a few ulps of a threshold (it uses the
//     exact reciprocal, bitsandbytes rcp.approx), every such difference is checked and counted;
//     the GPU must match exactly;
//   - double quantization: offset, codes and nested absmax equal bitsandbytes', both from its
//     offset (the 8-bit step alone) and end to end.
// Fixtures made by bitsandbytes' CPU backend ("backend": "cpu") are only checked on dequantize,
// with -0.0 == +0.0: that backend clamps instead of producing NaN for all-zero blocks.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/codebooks_4bit.h"
#include "kernels/quantize_4bit.h"
#include "tests/kernels/code_boundary.h"
#include "tests/util/files.h"

namespace qlora::kernels {
namespace {

using nlohmann::json;

// No std::filesystem here: libtorch.so exports a copy of it that crashes.
const std::string kRoot = QLORA_BNB_FIXTURES_DIR;
// Fixture folders by the backend that made them.
const char* const kBackends[] = {"cuda", "cpu"};

at::ScalarType DtypeOf(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  throw std::runtime_error("unknown dtype " + name);
}

at::Tensor ReadTensor(const std::string& path, at::ScalarType dtype) {
  if (!testing::FileExists(path)) throw std::runtime_error("cannot read " + path);
  const std::string bytes = testing::ReadFile(path);
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size()) / item}, at::dtype(dtype));
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Raw bit patterns of a float tensor, as int32 (float32) or int16 (16-bit types).
at::Tensor BitsOf(const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu();
  return c.scalar_type() == at::kFloat ? c.view(at::kInt) : c.view(at::kShort);
}

int64_t BitMismatches(const at::Tensor& a, const at::Tensor& b) {
  return (BitsOf(a) != BitsOf(b)).sum().item<int64_t>();
}

// Same value, where -0.0 and +0.0 count as equal (CPU-backend fixtures).
int64_t ValueMismatches(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.cpu().to(at::kFloat);
  at::Tensor y = b.cpu().to(at::kFloat);
  return (BitsOf(x.add(0.0)) != BitsOf(y.add(0.0))).sum().item<int64_t>();
}

struct Case {
  json meta;
  std::string dir;  // ends with '/'
  std::string backend;

  std::string Name() const { return meta["name"]; }
  QuantType Type() const { return meta["quant_type"] == "nf4" ? QuantType::kNF4 : QuantType::kFP4; }
  at::ScalarType Dtype() const { return DtypeOf(meta["dtype"]); }
  bool Nested() const { return meta["double_quant"]; }
  int64_t Blocksize() const { return meta["blocksize"]; }
  at::Tensor File(const char* field, at::ScalarType dtype) const {
    return ReadTensor(dir + meta[field].get<std::string>(), dtype);
  }
  at::Tensor Input() const {
    return File("input", Dtype()).view(meta["shape"].get<std::vector<int64_t>>());
  }
  // bitsandbytes' quantized state, as our struct.
  Quantized4bit State() const {
    Quantized4bit q;
    q.type = Type();
    q.blocksize = Blocksize();
    q.shape = meta["shape"].get<std::vector<int64_t>>();
    q.dtype = Dtype();
    q.packed = File("packed", at::kByte);
    q.double_quant = Nested();
    if (q.double_quant) {
      q.absmax = File("absmax", at::kByte);
      q.nested_absmax = File("nested_absmax", at::kFloat);
      q.nested_code = ReadTensor(dir + "dynamic_map.bin", at::kFloat);
      q.nested_offset = meta["nested_offset"].get<float>();
      q.nested_blocksize = meta["nested_blocksize"];
    } else {
      q.absmax = File("absmax", at::kFloat);
    }
    return q;
  }
};

std::vector<Case> LoadCases() {
  std::vector<Case> cases;
  for (const char* backend : kBackends) {
    const std::string dir = kRoot + "/" + backend + "/";
    std::ifstream in(dir + "manifest.json");
    if (!in) continue;
    const json m = json::parse(in);
    for (const json& c : m["cases"]) cases.push_back(Case{c, dir, m["backend"]});
  }
  return cases;
}

Quantized4bit ToDevice(Quantized4bit q, const at::Device& d) {
  q.packed = q.packed.to(d);
  q.absmax = q.absmax.to(d);
  if (q.double_quant) {
    q.nested_absmax = q.nested_absmax.to(d);
    q.nested_code = q.nested_code.to(d);
  }
  return q;
}

// Compares our packed bytes with bitsandbytes'; returns the number of differing codes, and
// fails for any difference that is not a neighbouring code at a decision boundary (or any at
// all when `exact`).
int64_t CompareCodes(const Case& c, const at::Tensor& ours, const at::Tensor& theirs,
                     const at::Tensor& input, const at::Tensor& absmax, bool exact) {
  const at::Tensor a = ours.cpu().contiguous();
  const at::Tensor b = theirs.cpu().contiguous();
  const at::Tensor x = input.cpu().to(at::kFloat).contiguous().view({-1});
  const at::Tensor am = absmax.cpu().contiguous();
  const uint8_t* pa = a.data_ptr<uint8_t>();
  const uint8_t* pb = b.data_ptr<uint8_t>();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (pa[i] == pb[i]) continue;
    for (int half = 0; half < 2; ++half) {
      const int ca = half == 0 ? pa[i] >> 4 : pa[i] & 15;
      const int cb = half == 0 ? pb[i] >> 4 : pb[i] & 15;
      if (ca == cb) continue;
      ++mismatches;
      const int64_t e = 2 * i + half;
      const float xv = e < x.numel() ? x[e].item<float>() : 0.0f;
      const float amv = am[e / c.Blocksize()].item<float>();
      EXPECT_TRUE(!exact && NearBoundary(xv, amv, BoundaryBetween(c.Type(), ca, cb)))
          << c.Name() << ": element " << e << " x=" << xv << " absmax=" << amv << " ours " << ca
          << " bitsandbytes " << cb;
    }
  }
  return mismatches;
}

// Same for the 8-bit dynamic-map codes of double quantization.
int64_t CompareNestedCodes(const Case& c, const at::Tensor& ours, const at::Tensor& theirs,
                           const at::Tensor& centered, const at::Tensor& absmax2, bool exact) {
  const at::Tensor a = ours.cpu().contiguous();
  const at::Tensor b = theirs.cpu().contiguous();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const int ca = a[i].item<uint8_t>();
    const int cb = b[i].item<uint8_t>();
    if (ca == cb) continue;
    ++mismatches;
    const float mid = std::abs(ca - cb) == 1
                          ? (kDynamicMap.v[ca] + kDynamicMap.v[cb]) * 0.5f
                          : NAN;
    const float x = centered[i].item<float>();
    const float amv = absmax2[i / c.meta["nested_blocksize"].get<int64_t>()].item<float>();
    EXPECT_TRUE(!exact && NearBoundary(x, amv, mid))
        << c.Name() << ": absmax code " << i << " ours " << ca << " bitsandbytes " << cb;
  }
  return mismatches;
}

std::vector<at::Device> Devices() {
  std::vector<at::Device> devices{at::kCPU};
  if (at::hasCUDA() && HasCudaKernels()) devices.emplace_back(at::kCUDA);
  return devices;
}

class KernelsBnbFixtures : public ::testing::Test {
 protected:
  void SetUp() override {
    cases_ = LoadCases();
    if (cases_.empty()) GTEST_SKIP() << "no fixtures under " << kRoot;
  }
  std::vector<Case> cases_;
};

TEST_F(KernelsBnbFixtures, DequantizeEqualsBitsandbytesBitForBit) {
  for (const at::Device& device : Devices()) {
    int64_t checked = 0;
    for (const Case& c : cases_) {
      const at::Tensor expected = c.File("dequant", c.Dtype());
      const at::Tensor ours = Dequantize4bit(ToDevice(c.State(), device)).cpu().view({-1});
      ASSERT_EQ(ours.numel(), expected.numel()) << c.Name();
      if (c.backend == "cuda") {
        EXPECT_EQ(BitMismatches(ours, expected), 0) << c.Name() << " on " << device;
      } else {
        EXPECT_EQ(ValueMismatches(ours, expected), 0) << c.Name() << " on " << device;
      }
      ++checked;
    }
    std::cout << "[          ] " << device << ": " << checked << " dequantize cases bit-exact\n";
  }
}

TEST_F(KernelsBnbFixtures, QuantizeGivesBitsandbytesBytesAndAbsmax) {
  for (const at::Device& device : Devices()) {
    const bool exact = device.is_cuda();
    int64_t codes = 0;
    int64_t mismatches = 0;
    for (const Case& c : cases_) {
      if (c.backend != "cuda") continue;  // the CPU backend's quantizer differs by design
      Quantize4bitOptions o;
      o.type = c.Type();
      o.blocksize = c.Blocksize();
      o.double_quant = false;
      const at::Tensor input = c.Input().to(device);
      const Quantized4bit q = Quantize4bit(input, o);
      const at::Tensor absmax = c.File("absmax_f32", at::kFloat);
      EXPECT_EQ(BitMismatches(q.absmax, absmax), 0) << c.Name() << " absmax on " << device;
      mismatches += CompareCodes(c, q.packed, c.File("packed", at::kByte), input, absmax, exact);
      codes += 2 * q.packed.numel();
    }
    std::cout << "[          ] " << device << ": " << mismatches << " of " << codes
              << " 4-bit codes differ from bitsandbytes (each a neighbour at a threshold)\n";
    RecordProperty(device.is_cuda() ? "cuda_code_mismatches" : "cpu_code_mismatches",
                   static_cast<int>(mismatches));
    EXPECT_LE(mismatches * 10000, codes) << "more than 0.01% of codes differ";
  }
}

TEST_F(KernelsBnbFixtures, DoubleQuantizationEqualsBitsandbytes) {
  for (const at::Device& device : Devices()) {
    const bool exact = device.is_cuda();
    int64_t offsets_differ = 0;
    int64_t mismatches = 0;
    int64_t nested_cases = 0;
    for (const Case& c : cases_) {
      if (c.backend != "cuda" || !c.Nested()) continue;
      ++nested_cases;
      const Quantized4bit theirs = c.State();
      const at::Tensor absmax = c.File("absmax_f32", at::kFloat).to(device);
      // The offset is torch's mean on the device; ours uses at::mean the same way.
      const float mean = at::mean(absmax).item<float>();
      if (std::memcmp(&mean, &theirs.nested_offset, sizeof mean) != 0) ++offsets_differ;
      if (exact) EXPECT_EQ(mean, theirs.nested_offset) << c.Name();
      // The 8-bit step from bitsandbytes' own offset.
      const at::Tensor centered = absmax - theirs.nested_offset;
      const Blockwise8bit nested = QuantizeBlockwise8bit(centered, theirs.nested_blocksize);
      EXPECT_EQ(BitMismatches(nested.absmax, theirs.nested_absmax), 0) << c.Name();
      mismatches += CompareNestedCodes(c, nested.codes, theirs.absmax, centered.cpu(),
                                       theirs.nested_absmax, exact);
      // End to end, when the offsets agree.
      if (mean == theirs.nested_offset) {
        Quantize4bitOptions o;
        o.type = c.Type();
        o.blocksize = c.Blocksize();
        const Quantized4bit q = Quantize4bit(c.Input().to(device), o);
        EXPECT_EQ(q.nested_offset, theirs.nested_offset) << c.Name();
        EXPECT_EQ(BitMismatches(q.nested_absmax, theirs.nested_absmax), 0) << c.Name();
        EXPECT_TRUE(at::equal(q.nested_code.cpu(), theirs.nested_code)) << c.Name();
        EXPECT_EQ((q.absmax.cpu() != theirs.absmax).sum().item<int64_t>(),
                  (nested.codes.cpu() != theirs.absmax).sum().item<int64_t>())
            << c.Name();
      }
    }
    std::cout << "[          ] " << device << ": " << nested_cases << " double-quant cases, "
              << offsets_differ << " offsets differ in the last bit (at::mean on this device), "
              << mismatches << " absmax codes differ (neighbours at a midpoint)\n";
  }
}

}  // namespace
}  // namespace qlora::kernels
