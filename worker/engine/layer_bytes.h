// A decoder layer's frozen base weights as one flat byte buffer, the unit that ZeRO stage 3
// partitions across ranks and that host streaming copies: each projection's 4-bit storage
// (packed codes, block scales and the nested double-quantization state, never a dequantized
// copy) or its dense weight, segment after segment. Unpacking gives the weights back as views
// of the buffer, so a layer gathered into one buffer costs no copy to use. Biases and norms are
// not in it: they are small and stay whole on every rank.
//
// A segment starts at a multiple of kSegmentAlignment bytes (what the CUDA kernels' vectorized
// loads and a float32 view need); the whole buffer is padded to `pad_multiple` bytes (a caller
// that cuts it into equal shards of 8-byte words asks for 8 x world size).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/quantize_4bit.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {

inline constexpr int64_t kSegmentAlignment = 256;

// Where one tensor lies in the buffer.
struct ByteSegment {
  int64_t offset = 0;
  int64_t nbytes = 0;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> sizes;
};

// One projection's frozen weight: the 4-bit descriptor with its tensors taken out (shape, block
// size, offset...) and where its tensors lie, or a dense weight's segment.
struct ProjectionBytes {
  std::optional<kernels::Quantized4bit> quantized;  // tensors undefined; metadata only
  ByteSegment packed, absmax, nested_absmax, nested_code;  // 4-bit
  ByteSegment dense;                                        // dense
};

struct LayerByteLayout {
  std::vector<ProjectionBytes> projections;  // kLinearModuleNames' order
  int64_t nbytes = 0;                        // padded
};

// The layout of `layer`'s frozen weights and a buffer (uint8 [layout.nbytes], on the weights'
// device) holding them; the padding is zero.
struct PackedLayer {
  LayerByteLayout layout;
  at::Tensor bytes;
};
PackedLayer PackLayerWeights(const DecoderLayer& layer, int64_t pad_multiple);

// Takes the frozen weights out of `layer` (their tensors undefined; shapes, biases, norms and
// adapters stay): what a layer keeps while its weights live elsewhere.
void StripLayerWeights(DecoderLayer& layer);

// `skeleton` with its frozen weights as views of `bytes` (laid out by `layout`, on any device).
DecoderLayer UnpackLayerWeights(const DecoderLayer& skeleton, const LayerByteLayout& layout,
                                const at::Tensor& bytes);

}  // namespace qlora::engine
