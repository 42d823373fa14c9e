// The one copy of every 4-bit code table: NF4 and FP4 values, their CUDA decision thresholds, and
// bitsandbytes' 256-entry dynamic map used to double-quantize absmax. The CPU and CUDA kernels
// (and the checkpoint code that writes quant_map / nested_quant_map) read these; nothing else may
// hold a copy. Sources: bitsandbytes (functional.get_4bit_type, create_dynamic_map and the
// CUDA kernels' dQuantizeNF4 / dQuantizeFP4 decision trees), QLoRA paper appendix E.
#pragma once

namespace qlora::kernels {

// A 16- or 256-entry table passed by value (host code, and CUDA kernel parameters alike).
struct Codebook16 {
  float v[16];
};
struct Codebook256 {
  float v[256];
};
struct Nf4ThresholdTable {
  float v[15];
};

// NF4 value of each 4-bit code (bitsandbytes csrc/kernels.cu nf4_dequantization_lut). Sorted
// ascending; code 7 is exactly 0, code 15 is 1.
inline constexpr Codebook16 kNf4Values = {{
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f}};

// dQuantizeNF4's decision thresholds, between codes i and i+1 (midpoints of kNf4Values). A value
// goes to code i+1 when it is strictly greater than threshold i; NaN goes to code 0.
inline constexpr Nf4ThresholdTable kNf4Thresholds = {{
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,  0.2035212516784668f,  0.2920137718319893f,  0.3893125355243683f,
    0.5016634166240692f,  0.6427869200706482f,  0.8614784181118011f}};

// FP4 (1 sign, 2 exponent, 1 mantissa bit; magnitudes [0, 0.0625, 8, 12, 4, 6, 2, 3] / 12) as the
// CUDA dequantizer produces it: lut[code & 7] * (code & 8 ? -1 : 1), so code 8 is -0.0. The
// serialized quant_map differs only there (+0.0): see SerializedQuantMap() in quantize_4bit.h.
inline constexpr Codebook16 kFp4Values = {{
    0.0f, 0.005208333333f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f,
    -0.0f, -0.005208333333f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f}};

// dQuantizeFP4's pivots on |x| (its decision tree is in quantize_4bit_math.h).
struct Fp4Pivots {
  float top = 0.29166667f;      // 0b1xx (>) vs 0b0xx
  float high = 0.583333f;       // 0b01x vs 0b10x
  float highest = 0.8333333f;   // 0b011 vs 0b010
  float mid_high = 0.4166667f;  // 0b101 vs 0b100
  float low = 0.0859375f;       // 0b11x vs 0b00x
  float mid_low = 0.20833333f;  // 0b111 vs 0b110
  float lowest = 0.00260417f;   // 0b001 vs 0b000
};
inline constexpr Fp4Pivots kFp4Pivots{};

// bitsandbytes.functional.create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
// the code of double quantization (nested_quant_map). Dumped from bitsandbytes 0.50.2 by
// tests/kernels/dump_dynamic_map.py, checked against tests/assets/bnb/cuda/dynamic_map.bin.
// Sorted ascending; index 127 is 0, index 255 is 1.
inline constexpr Codebook256 kDynamicMap = {{
    -0.99296874f, -0.9789063f, -0.96484375f, -0.9507812f,
    -0.93671876f, -0.92265624f, -0.9085938f, -0.89453125f,
    -0.8804687f, -0.86640626f, -0.85234374f, -0.8382813f,
    -0.82421875f, -0.8101562f, -0.79609376f, -0.78203124f,
    -0.7679688f, -0.75390625f, -0.7398437f, -0.72578126f,
    -0.7117188f, -0.6976563f, -0.68359375f, -0.6695312f,
    -0.65546876f, -0.6414063f, -0.6273438f, -0.61328125f,
    -0.5992187f, -0.58515626f, -0.5710938f, -0.5570313f,
    -0.54296875f, -0.5289062f, -0.5148437f, -0.50078124f,
    -0.4867187f, -0.47265625f, -0.45859373f, -0.44453126f,
    -0.43046874f, -0.41640624f, -0.40234375f, -0.38828123f,
    -0.37421876f, -0.36015624f, -0.34609374f, -0.33203125f,
    -0.31796873f, -0.30390626f, -0.28984374f, -0.27578127f,
    -0.26171875f, -0.24765624f, -0.23359375f, -0.21953125f,
    -0.20546874f, -0.19140625f, -0.17734376f, -0.16328125f,
    -0.14921875f, -0.13515624f, -0.12109375f, -0.107031256f,
    -0.09859375f, -0.09578126f, -0.092968754f, -0.09015625f,
    -0.08734375f, -0.08453125f, -0.08171876f, -0.07890625f,
    -0.07609375f, -0.07328125f, -0.070468746f, -0.067656256f,
    -0.06484375f, -0.06203125f, -0.059218753f, -0.05640625f,
    -0.05359375f, -0.05078125f, -0.04796875f, -0.04515625f,
    -0.042343747f, -0.03953125f, -0.036718752f, -0.03390625f,
    -0.03109375f, -0.028281251f, -0.02546875f, -0.02265625f,
    -0.019843752f, -0.01703125f, -0.01421875f, -0.01140625f,
    -0.00971875f, -0.009156249f, -0.00859375f, -0.00803125f,
    -0.00746875f, -0.00690625f, -0.00634375f, -0.00578125f,
    -0.0052187503f, -0.0046562497f, -0.00409375f, -0.0035312497f,
    -0.00296875f, -0.00240625f, -0.00184375f, -0.0012812499f,
    -0.0009437501f, -0.00083125f, -0.00071875006f, -0.0006062501f,
    -0.00049375003f, -0.00038125002f, -0.00026875004f, -0.00015625001f,
    -0.00008875f, -0.00006625f, -0.00004375f, -0.000021249998f,
    -0.00000775f, -0.0000032500002f, -0.00000055000004f, 0.0f,
    0.00000055000004f, 0.0000032500002f, 0.00000775f, 0.000021249998f,
    0.00004375f, 0.00006625f, 0.00008875f, 0.00015625001f,
    0.00026875004f, 0.00038125002f, 0.00049375003f, 0.0006062501f,
    0.00071875006f, 0.00083125f, 0.0009437501f, 0.0012812499f,
    0.00184375f, 0.00240625f, 0.00296875f, 0.0035312497f,
    0.00409375f, 0.0046562497f, 0.0052187503f, 0.00578125f,
    0.00634375f, 0.00690625f, 0.00746875f, 0.00803125f,
    0.00859375f, 0.009156249f, 0.00971875f, 0.01140625f,
    0.01421875f, 0.01703125f, 0.019843752f, 0.02265625f,
    0.02546875f, 0.028281251f, 0.03109375f, 0.03390625f,
    0.036718752f, 0.03953125f, 0.042343747f, 0.04515625f,
    0.04796875f, 0.05078125f, 0.05359375f, 0.05640625f,
    0.059218753f, 0.06203125f, 0.06484375f, 0.067656256f,
    0.070468746f, 0.07328125f, 0.07609375f, 0.07890625f,
    0.08171876f, 0.08453125f, 0.08734375f, 0.09015625f,
    0.092968754f, 0.09578126f, 0.09859375f, 0.107031256f,
    0.12109375f, 0.13515624f, 0.14921875f, 0.16328125f,
    0.17734376f, 0.19140625f, 0.20546874f, 0.21953125f,
    0.23359375f, 0.24765624f, 0.26171875f, 0.27578127f,
    0.28984374f, 0.30390626f, 0.31796873f, 0.33203125f,
    0.34609374f, 0.36015624f, 0.37421876f, 0.38828123f,
    0.40234375f, 0.41640624f, 0.43046874f, 0.44453126f,
    0.45859373f, 0.47265625f, 0.4867187f, 0.50078124f,
    0.5148437f, 0.5289062f, 0.54296875f, 0.5570313f,
    0.5710938f, 0.58515626f, 0.5992187f, 0.61328125f,
    0.6273438f, 0.6414063f, 0.65546876f, 0.6695312f,
    0.68359375f, 0.6976563f, 0.7117188f, 0.72578126f,
    0.7398437f, 0.75390625f, 0.7679688f, 0.78203124f,
    0.79609376f, 0.8101562f, 0.82421875f, 0.8382813f,
    0.85234374f, 0.86640626f, 0.8804687f, 0.89453125f,
    0.9085938f, 0.92265624f, 0.93671876f, 0.9507812f,
    0.96484375f, 0.9789063f, 0.99296874f, 1.0f}};

}  // namespace qlora::kernels
