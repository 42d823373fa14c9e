// Packs and unpacks a decoder layer's frozen weights as one byte buffer (layer_bytes.h).
#include "worker/engine/layer_bytes.h"

#include <ATen/ATen.h>

namespace qlora::engine {
namespace {

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Reserves a segment for `t` (undefined: an empty segment) after `*end`.
ByteSegment Reserve(const at::Tensor& t, int64_t* end) {
  ByteSegment s;
  if (!t.defined()) return s;
  s.offset = RoundUp(*end, kSegmentAlignment);
  s.nbytes = static_cast<int64_t>(t.nbytes());
  s.dtype = t.scalar_type();
  s.sizes = t.sizes().vec();
  *end = s.offset + s.nbytes;
  return s;
}

void CopyInto(const at::Tensor& bytes, const ByteSegment& s, const at::Tensor& t) {
  if (s.nbytes == 0) return;
  bytes.narrow(0, s.offset, s.nbytes).copy_(t.contiguous().view({-1}).view(at::kByte));
}

at::Tensor ViewOf(const at::Tensor& bytes, const ByteSegment& s) {
  if (s.nbytes == 0) return at::Tensor();
  return bytes.narrow(0, s.offset, s.nbytes).view(s.dtype).view(s.sizes);
}

}  // namespace

PackedLayer PackLayerWeights(const DecoderLayer& layer, int64_t pad_multiple) {
  PackedLayer packed;
  int64_t end = 0;
  at::TensorOptions options;
  for (const char* name : kLinearModuleNames) {
    const FrozenWeight& base = layer.Linear(name).base;
    ProjectionBytes p;
    if (base.quantized) {
      const kernels::Quantized4bit& q = *base.quantized;
      options = q.absmax.options();
      p.packed = Reserve(q.packed, &end);
      p.absmax = Reserve(q.absmax, &end);
      p.nested_absmax = Reserve(q.nested_absmax, &end);
      p.nested_code = Reserve(q.nested_code, &end);
      kernels::Quantized4bit meta = q;
      meta.packed = meta.absmax = meta.nested_absmax = meta.nested_code = at::Tensor();
      p.quantized = std::move(meta);
    } else {
      options = base.dense.options();
      p.dense = Reserve(base.dense, &end);
    }
    packed.layout.projections.push_back(std::move(p));
  }
  packed.layout.nbytes = RoundUp(std::max<int64_t>(end, 1), std::max<int64_t>(pad_multiple, 1));
  packed.bytes = at::zeros({packed.layout.nbytes}, options.dtype(at::kByte));
  size_t k = 0;
  for (const char* name : kLinearModuleNames) {
    const FrozenWeight& base = layer.Linear(name).base;
    const ProjectionBytes& p = packed.layout.projections[k++];
    if (base.quantized) {
      const kernels::Quantized4bit& q = *base.quantized;
      CopyInto(packed.bytes, p.packed, q.packed);
      CopyInto(packed.bytes, p.absmax, q.absmax);
      CopyInto(packed.bytes, p.nested_absmax, q.nested_absmax);
      CopyInto(packed.bytes, p.nested_code, q.nested_code);
    } else {
      CopyInto(packed.bytes, p.dense, base.dense);
    }
  }
  return packed;
}

void StripLayerWeights(DecoderLayer& layer) {
  for (const char* name : kLinearModuleNames) {
    FrozenWeight& base = layer.Linear(name).base;
    base.quantized.reset();
    base.dense = at::Tensor();
    base.dequantized = at::Tensor();
  }
}

DecoderLayer UnpackLayerWeights(const DecoderLayer& skeleton, const LayerByteLayout& layout,
                                const at::Tensor& bytes) {
  DecoderLayer layer = skeleton;
  size_t k = 0;
  for (const char* name : kLinearModuleNames) {
    FrozenWeight& base = layer.Linear(name).base;
    const ProjectionBytes& p = layout.projections[k++];
    if (p.quantized) {
      kernels::Quantized4bit q = *p.quantized;
      q.packed = ViewOf(bytes, p.packed);
      q.absmax = ViewOf(bytes, p.absmax);
      q.nested_absmax = ViewOf(bytes, p.nested_absmax);
      q.nested_code = ViewOf(bytes, p.nested_code);
      base.quantized = std::move(q);
    } else {
      base.dense = ViewOf(bytes, p.dense);
    }
  }
  return layer;
}

}  // namespace qlora::engine
