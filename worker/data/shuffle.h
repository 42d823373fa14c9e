// Deterministic randomness for the data path: a seeded generator with a portable bounded draw
// (std::uniform_int_distribution differs between standard libraries) and a bounded streaming
// shuffle buffer.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace qlora::data {

// SplitMix64 (Steele, Lea, Flood 2014): tiny state, well mixed, the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0, without modulo bias.
  uint64_t Below(uint64_t n) {
    const uint64_t limit = -n % n;  // 2^64 mod n
    uint64_t x;
    do {
      x = Next();
    } while (x < limit);
    return x % n;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// One seed per (job seed, epoch, rank, ...): distinct streams that never depend on call order.
inline uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b = 0) {
  Rng rng(seed ^ (a * 0xD1B54A32D192ED03ull) ^ (b * 0x8CB92BA72F3D8DD7ull));
  rng.Next();
  return rng.Next();
}

// Streaming shuffle in O(capacity) memory: once full, each pushed item evicts a uniformly
// chosen one. Items end up within about `capacity` positions of a full shuffle's reach.
template <typename T>
class ShuffleBuffer {
 public:
  ShuffleBuffer(size_t capacity, Rng* rng) : capacity_(capacity < 1 ? 1 : capacity), rng_(rng) {}

  // Adds `item`; returns an item to emit once the buffer is full.
  std::optional<T> Push(T item) {
    if (items_.size() < capacity_) {
      items_.push_back(std::move(item));
      return std::nullopt;
    }
    size_t pick = static_cast<size_t>(rng_->Below(items_.size()));
    std::optional<T> out(std::move(items_[pick]));
    items_[pick] = std::move(item);
    return out;
  }
  // At the end of the stream: emits the rest in random order; false when empty.
  bool Drain(T* out) {
    if (items_.empty()) return false;
    size_t pick = static_cast<size_t>(rng_->Below(items_.size()));
    std::swap(items_[pick], items_.back());
    *out = std::move(items_.back());
    items_.pop_back();
    return true;
  }
  void Clear() { items_.clear(); }

 private:
  size_t capacity_;
  Rng* rng_;
  std::vector<T> items_;
};

}  // namespace qlora::data
