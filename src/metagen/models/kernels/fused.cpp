// Fused CPU kernels for metagen's Llama decode step.
//
// Eager PyTorch spends most of a small model's decode step dispatching ~20 tiny kernels per
// layer; these fuse the norms, RoPE and the cache write into three calls per layer and read the paged KV cache
// in place (no gather copy). Every kernel has a pure-PyTorch twin in metagen/models/decoder.py
// that the tests compare against.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// A kernel's result: the caller's buffer `out` when given (a decode step reuses one per
// intermediate, so the layer loop allocates nothing), checked to be contiguous, of `sizes` and
// `dtype`; else a fresh tensor.
torch::Tensor result_buffer(const c10::optional<torch::Tensor>& out, at::IntArrayRef sizes, at::ScalarType dtype,
                            const char* name) {
  if (!out.has_value()) return torch::empty(sizes, torch::TensorOptions().dtype(dtype));
  TORCH_CHECK(out->scalar_type() == dtype && out->is_contiguous() && out->sizes() == sizes, name,
              ": must be a contiguous ", dtype, " tensor of shape ", sizes, ", got ", out->scalar_type(), " ",
              out->sizes(), out->is_contiguous() ? "" : " (not contiguous)");
  return *out;
}

// A float32 attention result as the caller asked: itself, or rounded once to bf16 (into the
// caller's bf16 buffer when given).
torch::Tensor float_or_bf16(const torch::Tensor& out, bool bf16_out, const c10::optional<torch::Tensor>& out_buffer) {
  if (!bf16_out) return out;
  return out_buffer.has_value() ? result_buffer(out_buffer, out.sizes(), at::kBFloat16, "out").copy_(out)
                                : out.to(at::kBFloat16);
}

template <typename T>
inline float as_float(T value) { return static_cast<float>(value); }

// residual += delta (if given); out = rmsnorm(residual) * weight, cast to out's dtype.
// residual: (N, H) float32 contiguous, modified in place; delta: (N, H) float32 or bf16.
template <typename Delta, typename Out>
void add_rms_norm_impl(float* residual, const Delta* delta, const float* weight, Out* out,
                       int64_t rows, int64_t width, float eps) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* x = residual + r * width;
      if (delta != nullptr) {
        const Delta* d = delta + r * width;
        for (int64_t i = 0; i < width; ++i) x[i] += as_float(d[i]);
      }
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < width; ++i) sum += x[i] * x[i];
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(width) + eps);
      Out* o = out + r * width;
      for (int64_t i = 0; i < width; ++i) o[i] = static_cast<Out>(x[i] * inv * weight[i]);
    }
  });
}

torch::Tensor add_rms_norm(torch::Tensor residual, c10::optional<torch::Tensor> delta,
                           torch::Tensor weight, double eps, bool bf16_out, c10::optional<torch::Tensor> out_buffer) {
  TORCH_CHECK(residual.scalar_type() == at::kFloat && residual.is_contiguous(), "residual: contiguous float32");
  const int64_t width = residual.size(-1);
  const int64_t rows = residual.numel() / width;
  auto out = result_buffer(out_buffer, residual.sizes(), bf16_out ? at::kBFloat16 : at::kFloat, "out");
  float* x = residual.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float e = static_cast<float>(eps);
  auto run = [&](auto* o) {
    using O = std::remove_pointer_t<decltype(o)>;
    if (!delta.has_value()) {
      add_rms_norm_impl<float, O>(x, nullptr, w, o, rows, width, e);
    } else if (delta->scalar_type() == at::kBFloat16) {
      auto d = delta->contiguous();
      add_rms_norm_impl<at::BFloat16, O>(x, d.data_ptr<at::BFloat16>(), w, o, rows, width, e);
    } else {
      auto d = delta->contiguous();
      add_rms_norm_impl<float, O>(x, d.data_ptr<float>(), w, o, rows, width, e);
    }
  };
  if (bf16_out) run(out.data_ptr<at::BFloat16>()); else run(out.data_ptr<float>());
  return out;
}

// Cache element formats (the KV dtype, `models/cache.py`): float32; bfloat16 (stored as its
// 16 bits, rounded to nearest even like torch's .to(bfloat16)); int8 with one float32 scale per
// (slot, key/value, head): x̂ = q · s, s = max|x| / 127, q = nearbyint(x / s) (s = 0 for an
// all-zero head, divided as 1). `widen` reads one element back as float.
inline float widen(float x) { return x; }
inline float widen(int8_t x) { return static_cast<float>(x); }
inline float widen(uint16_t bf16_bits) {
  const uint32_t bits = static_cast<uint32_t>(bf16_bits) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Store one head's `dim` values `x` into the cache: converted to Elem; for int8 quantized with
// its scale written to *scale.
inline void store_head(const float* x, float* y, float*, int64_t dim) { std::memcpy(y, x, dim * sizeof(float)); }
inline void store_head(const float* x, uint16_t* y, float*, int64_t dim) {
  for (int64_t i = 0; i < dim; ++i) y[i] = c10::BFloat16(x[i]).x;  // round to nearest even
}
inline void store_head(const float* x, int8_t* y, float* scale, int64_t dim) {
  float top = 0.f;
  for (int64_t i = 0; i < dim; ++i) top = std::max(top, std::fabs(x[i]));
  const float s = top / 127.f;
  const float divisor = s > 0.f ? s : 1.f;
  for (int64_t i = 0; i < dim; ++i) {
    const float q = std::nearbyint(x[i] / divisor);
    y[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
  }
  *scale = s;
}

// RoPE on interleaved pairs for q and k, then k and v stored into their cache slots.
// qkv: (N, (H + 2·KVH)·D) float32 or bf16; cos, sin: (T_max, D/2) float32 tables;
// positions, slots: (N,) int64; pool: (S, 2, KVH, D) float32, bf16 or int8, with scales
// (S, 2, KVH) float32 for int8. Returns rotated q (N, H, D) float32.
template <typename In, typename Elem>
void rope_store_impl(const In* qkv, const float* cos, const float* sin, const int64_t* positions,
                     const int64_t* slots, Elem* pool, float* scales, float* q_out, int64_t n, int64_t heads,
                     int64_t kv_heads, int64_t dim) {
  const int64_t half = dim / 2;
  const int64_t stride = (heads + 2 * kv_heads) * dim;
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> head(dim);
    for (int64_t t = begin; t < end; ++t) {
      const In* row = qkv + t * stride;
      const float* c = cos + positions[t] * half;
      const float* s = sin + positions[t] * half;
      Elem* key_slot = pool + slots[t] * 2 * kv_heads * dim;
      Elem* value_slot = key_slot + kv_heads * dim;
      float* key_scales = scales != nullptr ? scales + slots[t] * 2 * kv_heads : nullptr;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const In* x = row + h * dim;
        float* y = h < heads ? q_out + (t * heads + h) * dim : head.data();
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = as_float(x[2 * i]), x1 = as_float(x[2 * i + 1]);
          y[2 * i] = x0 * c[i] - x1 * s[i];
          y[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
        if (h >= heads)
          store_head(y, key_slot + (h - heads) * dim, key_scales ? key_scales + (h - heads) : nullptr, dim);
      }
      const In* v = row + (heads + kv_heads) * dim;
      for (int64_t h = 0; h < kv_heads; ++h) {
        for (int64_t i = 0; i < dim; ++i) head[i] = as_float(v[h * dim + i]);
        store_head(head.data(), value_slot + h * dim, key_scales ? key_scales + kv_heads + h : nullptr, dim);
      }
    }
  });
}

// Calls fn(Elem* pool, float* scales) with the pool's element type (float, bf16 bits, int8);
// checks that int8 pools come with their (S, 2, KVH) float32 scales.
template <typename Fn>
void with_pool(torch::Tensor& pool, const c10::optional<torch::Tensor>& scales, Fn fn) {
  TORCH_CHECK(pool.is_contiguous(), "pool: contiguous (S, 2, KVH, D)");
  if (pool.scalar_type() == at::kChar) {
    TORCH_CHECK(scales.has_value() && scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                    scales->numel() == pool.numel() / pool.size(-1),
                "an int8 pool needs its scales: contiguous float32 (S, 2, KVH)");
    fn(pool.data_ptr<int8_t>(), scales->data_ptr<float>());
    return;
  }
  TORCH_CHECK(!scales.has_value(), "scales are for int8 pools only");
  if (pool.scalar_type() == at::kBFloat16) {
    fn(reinterpret_cast<uint16_t*>(pool.data_ptr<at::BFloat16>()), static_cast<float*>(nullptr));
  } else {
    TORCH_CHECK(pool.scalar_type() == at::kFloat, "pool: float32, bfloat16 or int8");
    fn(pool.data_ptr<float>(), static_cast<float*>(nullptr));
  }
}

torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor positions,
                         torch::Tensor slots, torch::Tensor pool, int64_t heads, int64_t kv_heads,
                         c10::optional<torch::Tensor> scales, c10::optional<torch::Tensor> out) {
  const int64_t dim = pool.size(-1);
  const int64_t n = positions.numel();
  auto flat = qkv.reshape({n, (heads + 2 * kv_heads) * dim}).contiguous();
  auto q = result_buffer(out, {n, heads, dim}, at::kFloat, "out");
  auto pos = positions.contiguous();
  auto sl = slots.contiguous();
  with_pool(pool, scales, [&](auto* elements, float* scale_data) {
    using Elem = std::remove_pointer_t<decltype(elements)>;
    if (flat.scalar_type() == at::kBFloat16) {
      rope_store_impl<at::BFloat16, Elem>(flat.data_ptr<at::BFloat16>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                                          pos.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), elements, scale_data,
                                          q.data_ptr<float>(), n, heads, kv_heads, dim);
    } else {
      TORCH_CHECK(flat.scalar_type() == at::kFloat, "qkv: float32 or bfloat16");
      rope_store_impl<float, Elem>(flat.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                                   pos.data_ptr<int64_t>(), sl.data_ptr<int64_t>(), elements, scale_data,
                                   q.data_ptr<float>(), n, heads, kv_heads, dim);
    }
  });
  return q;
}

// e^r for r = x − n·ln2, n the whole number nearest x / ln2 (Cody-Waite reduction: ln2 in two
// parts, so r is computed without cancellation), by a degree-6 polynomial (Cephes expf,
// relative error ~1e-7). T: float, or a GCC vector of floats (exp16_nonpositive), lane by lane.
template <typename T>
inline T exp_reduced(T x, T n) {
  const T r = x - n * 0.693359375f + n * 2.12194440e-4f;
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// e^x for x <= 0 (softmax after subtracting the max), branch-free so loops over it vectorize:
// e^x = e^r · 2^n (`exp_reduced`), 2^n assembled in the exponent bits.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return exp_reduced(x, n) * scale;
}

// Softmax numerators in place: s[t] <- e^(s[t] - max s); sets `top` = max s, returns Σ s[t].
inline float exp_from_max(float* s, int64_t length, float& top) {
  top = -INFINITY;
  for (int64_t t = 0; t < length; ++t) top = std::max(top, s[t]);
  for (int64_t t = 0; t < length; ++t) s[t] = exp_nonpositive(s[t] - top);
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t t = 0; t < length; ++t) total += s[t];
  return total;
}

// Dot product of two float vectors in `Lanes` independent lanes, so the compiler emits
// independent vector FMAs (a plain `sum += a[i] * b[i]` loop is a serial dependency chain it must
// not reorder; one 8-lane chain over D = 128 is 16 dependent FMAs, latency-bound).
template <int64_t Dim, int Lanes = 8>
inline float dot_lanes(const float* a, const float* b, int64_t dim) {
  float acc[Lanes] = {};
  const int64_t n = Dim > 0 ? Dim : dim;
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int j = 0; j < Lanes; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int width = Lanes / 2; width >= 1; width /= 2)  // pairwise, neighbours first
    for (int j = 0; j < width; ++j) acc[j] = acc[2 * j] + acc[2 * j + 1];
  return acc[0] + tail;
}

inline float dot(const float* a, const float* b, int64_t dim) {
  if (dim == 64) return dot_lanes<64>(a, b, dim);
  if (dim == 128) return dot_lanes<128, 32>(a, b, dim);  // 56 -> 21 µs per layer at 128 keys (Qwen2.5-1.5B)
  return dot_lanes<0>(a, b, dim);
}

// One query token per row attending to its cached keys, read in place through the page table.
// q: (B, H, D) float32; pool: (S, 2, KVH, D) float32, bf16 or int8 (then scales (S, 2, KVH)
// float32); table: (B, T_max) int64; lengths: (B,) int64 (row b attends to
// table[b, :lengths[b]]; with starts (B,) int64, a sliding window, to
// table[b, starts[b]:lengths[b]]). Returns (B, H·D) in out_dtype.
// softmax(q·kᵀ·scale)·v per head, heads h of one group sharing kv head h / (H / KVH).
// Compact keys and values are widened to float in the inner loops, an int8 head's scale applied
// once per dot product (q·k̂ = s_k · Σ q_i k_i) and once per value (p · s_v), so the result is
// attention over the dequantized keys and values without materializing them.
// A cached key or value row as float: the row itself for a float32 pool, else widened into
// `buffer` (once per row, shared by the group's heads).
inline const float* widen_row(const float* row, float*, int64_t) { return row; }
template <typename Elem>
inline const float* widen_row(const Elem* row, float* buffer, int64_t dim) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= dim; i += 8) {  // 8 elements: zero- / sign-extend to 32 bits, then to float
    if constexpr (std::is_same_v<Elem, uint16_t>) {
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
      _mm256_storeu_ps(buffer + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    } else {
      const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i)));
      _mm256_storeu_ps(buffer + i, _mm256_cvtepi32_ps(wide));
    }
  }
#endif
  for (; i < dim; ++i) buffer[i] = widen(row[i]);
  return buffer;
}

// One cached head (slot, kv = 0 key / 1 value, kv head) as `dim` floats: the pool's own memory for
// a float32 pool, else widened (times its int8 scale) into `buffer`.
template <typename Elem>
inline const float* cached_head(const Elem* pool, const float* scales, int64_t slot, int64_t kv, int64_t kv_heads,
                                int64_t kvh, int64_t dim, float* buffer) {
  const int64_t at = (slot * 2 + kv) * kv_heads + kvh;
  const float* row = widen_row(pool + at * dim, buffer, dim);
  if (scales != nullptr)  // int8: row is buffer
    for (int64_t i = 0; i < dim; ++i) buffer[i] *= scales[at];
  return row;
}

// Ask for the cache lines of the row `ahead` positions on: the rows are scattered through the
// pool (page table), so the hardware prefetcher cannot predict them.
template <typename Elem>
inline void prefetch_row(const Elem* row, int64_t dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t offset = 0; offset < dim * static_cast<int64_t>(sizeof(Elem)); offset += 64)
    __builtin_prefetch(bytes + offset);
}
constexpr int64_t PREFETCH_AHEAD = 8;

template <typename Elem>
void paged_attention_impl(const float* qp, const Elem* pp, const float* scales, const int64_t* tp,
                          const int64_t* lp, const int64_t* fp, float* op, int64_t batch, int64_t heads,
                          int64_t kv_heads, int64_t dim, int64_t t_max, float sc) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, norms(group), buffer(dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, kvh = item % kv_heads;
      const int64_t skip = fp != nullptr ? fp[b] : 0;
      const int64_t length = lp[b] - skip;
      scores.assign(group * length, 0.f);
      const int64_t* slots = tp + b * t_max + skip;
      for (int64_t t = 0; t < length; ++t) {
        if (t + PREFETCH_AHEAD < length) prefetch_row(pp + ((slots[t + PREFETCH_AHEAD] * 2) * kv_heads + kvh) * dim, dim);
        const float* key = widen_row(pp + ((slots[t] * 2) * kv_heads + kvh) * dim, buffer.data(), dim);
        const float key_scale = scales != nullptr ? sc * scales[(slots[t] * 2) * kv_heads + kvh] : sc;
        for (int64_t g = 0; g < group; ++g) {
          const float* query = qp + (b * heads + kvh * group + g) * dim;
          scores[g * length + t] = dot(query, key, dim) * key_scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * length;
        float top;
        const float total = exp_from_max(s, length, top);
        norms[g] = 1.f / total;
        float* o = op + (b * heads + kvh * group + g) * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = 0.f;
      }
      // One pass over the values for the whole group: each value row is read (and widened) once.
      for (int64_t t = 0; t < length; ++t) {
        if (t + PREFETCH_AHEAD < length)
          prefetch_row(pp + ((slots[t + PREFETCH_AHEAD] * 2 + 1) * kv_heads + kvh) * dim, dim);
        const float* value = widen_row(pp + ((slots[t] * 2 + 1) * kv_heads + kvh) * dim, buffer.data(), dim);
        const float value_scale = scales != nullptr ? scales[(slots[t] * 2 + 1) * kv_heads + kvh] : 1.f;
        for (int64_t g = 0; g < group; ++g) {
          const float p = scales != nullptr ? scores[g * length + t] * norms[g] * value_scale
                                            : scores[g * length + t] * norms[g];
          float* o = op + (b * heads + kvh * group + g) * dim;
#pragma omp simd
          for (int64_t i = 0; i < dim; ++i) o[i] += p * value[i];
        }
      }
    }
  });
}

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor pool, torch::Tensor table,
                                     torch::Tensor lengths, double scale, bool bf16_out,
                                     c10::optional<torch::Tensor> starts, c10::optional<torch::Tensor> scales,
                                     c10::optional<torch::Tensor> out_buffer) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous(), "q: contiguous float32");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = pool.size(2);
  const int64_t t_max = table.size(1);
  auto tab = table.contiguous();
  auto len = lengths.contiguous();
  // bf16_out: attention in float32, rounded once into out_buffer (or a fresh bf16 tensor).
  auto out = result_buffer(bf16_out ? c10::nullopt : out_buffer, {batch, heads * dim}, at::kFloat, "out");
  torch::Tensor first;
  if (starts.has_value()) first = starts->contiguous();
  const int64_t* fp = starts.has_value() ? first.data_ptr<int64_t>() : nullptr;
  with_pool(pool, scales, [&](auto* elements, float* scale_data) {
    paged_attention_impl(q.data_ptr<float>(), elements, scale_data, tab.data_ptr<int64_t>(), len.data_ptr<int64_t>(),
                         fp, out.data_ptr<float>(), batch, heads, kv_heads, dim, t_max, static_cast<float>(scale));
  });
  return float_or_bf16(out, bf16_out, out_buffer);
}

// Σ row[i] over threshold <= row[i] < upper, in 8 independent double lanes so it vectorizes
// (one running sum is a serial chain of dependent adds).
inline double window_mass(const float* row, int64_t n, float threshold, float upper) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float v = row[i + j];
      acc[j] += (v >= threshold && v < upper) ? static_cast<double>(v) : 0.0;
    }
  double tail = 0.0;
  for (; i < n; ++i) tail += (row[i] >= threshold && row[i] < upper) ? static_cast<double>(row[i]) : 0.0;
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// Top-p cutoff without sorting: the smallest probability kept by nucleus truncation, per row.
// n* = min{n : p_(1) + ... + p_(n) >= target} over probabilities in descending order; the cutoff
// is p_(n*). Found by narrowing scans and a three-way quickselect on values, carrying the mass
// already known to lie above the working range: O(V) per row instead of a sort. Masses in double.
// probs: (N, V) float32 contiguous. Returns (N, 1) float32.
torch::Tensor top_p_cutoff(torch::Tensor probs, double target) {
  TORCH_CHECK(probs.scalar_type() == at::kFloat && probs.dim() == 2, "probs: (N, V) float32");
  auto in = probs.contiguous();
  const int64_t rows = in.size(0), vocab = in.size(1);
  auto out = torch::empty({rows, 1}, in.options());
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> work, above, below, sample;
    for (int64_t r = begin; r < end; ++r) {
      // Narrow the search with cheap scans of the row: thresholds taken from a strided sample
      // at growing ranks (~512, ~4k, ~32k of V); each scan sums the mass in [threshold, upper).
      // The first window whose mass completes the target holds the cutoff; only its values are
      // copied for the quickselect below.
      const float* row = src + r * vocab;
      sample.clear();
      for (int64_t i = 0; i < vocab; i += 64) sample.push_back(row[i]);
      std::sort(sample.begin(), sample.end(), std::greater<float>());
      double known = 0.0;  // mass of values already known to be above the working set
      float upper = INFINITY;
      float lowest = 0.f;  // probabilities are >= 0
      for (const int64_t rank : {int64_t(8), int64_t(64), int64_t(512)}) {
        if (rank >= static_cast<int64_t>(sample.size())) break;
        const float threshold = sample[rank];
        const double mass = window_mass(row, vocab, threshold, upper);
        if (known + mass >= target) {
          lowest = threshold;  // the cutoff is at least this
          break;
        }
        known += mass;
        upper = threshold;
      }
      work.clear();
      for (int64_t i = 0; i < vocab; ++i) {
        const float v = row[i];
        if (v >= lowest && v < upper) work.push_back(v);
      }
      float cutoff = work.empty() ? lowest : *std::min_element(work.begin(), work.end());
      while (!work.empty()) {
        const float a = work.front(), b = work[work.size() / 2], c = work.back();
        const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of 3
        above.clear();
        below.clear();
        double mass_above = 0.0;
        int64_t equal = 0;
        for (const float v : work) {
          if (v > pivot) { above.push_back(v); mass_above += v; }
          else if (v < pivot) below.push_back(v);
          else ++equal;
        }
        if (!above.empty() && known + mass_above >= target) {  // ends strictly above the pivot
          work.swap(above);
          continue;
        }
        if (known + mass_above + static_cast<double>(pivot) * equal >= target) {
          cutoff = pivot;
          break;
        }
        known += mass_above + static_cast<double>(pivot) * equal;
        work.swap(below);
      }
      dst[r] = cutoff;
    }
  });
  return out;
}

// Token bitmask (constrained decoding): out[b, v] = logits[b, v] where bit v % 32 of word
// mask[b, v / 32] is 1, -inf where it is 0 or v >= 32 * W. Bits are little-endian within a
// word, as llguidance fills them. Whole words of ones are copied and words of zeros filled, so
// a typical JSON mask (a few allowed runs) costs about one pass over the row. The input is not
// modified. logits: (B, V) float32; mask: (B, W) int32. Returns (B, V) float32.
torch::Tensor apply_token_bitmask(torch::Tensor logits, torch::Tensor mask) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2, "logits: (B, V) float32");
  TORCH_CHECK(mask.scalar_type() == at::kInt && mask.dim() == 2, "mask: (B, W) int32");
  TORCH_CHECK(mask.size(0) == logits.size(0), "mask and logits must have the same number of rows");
  auto in = logits.contiguous();
  auto bits = mask.contiguous();
  const int64_t rows = in.size(0), vocab = in.size(1), words = bits.size(1);
  auto out = torch::empty_like(in);
  const float* src_all = in.data_ptr<float>();
  const int32_t* mask_all = bits.data_ptr<int32_t>();
  float* dst_all = out.data_ptr<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* src = src_all + r * vocab;
      const int32_t* row_mask = mask_all + r * words;
      float* dst = dst_all + r * vocab;
      const int64_t covered = std::min(vocab, words * 32);
      for (int64_t start = 0; start < covered; start += 32) {
        const uint32_t word = static_cast<uint32_t>(row_mask[start / 32]);
        const int64_t count = std::min<int64_t>(32, covered - start);
        if (word == 0xFFFFFFFFu) {
          std::memcpy(dst + start, src + start, count * sizeof(float));
        } else if (word == 0u) {
          std::fill(dst + start, dst + start + count, neg_inf);
        } else {
          for (int64_t j = 0; j < count; ++j) dst[start + j] = ((word >> j) & 1u) ? src[start + j] : neg_inf;
        }
      }
      std::fill(dst + covered, dst + vocab, neg_inf);
    }
  });
  return out;
}

// ---------------------------------------------------------------- shared-prefix (cascade) attention
// Attention over a key range split in parts, each part returning its softmax-normalized output
// and its log-sum-exp, combined exactly afterwards (metagen/models/shared_prefix.py):
//   lse_i = log Σ_{t∈part i} e^{s_t},  o_i = Σ_{t∈part i} e^{s_t − lse_i} v_t,
//   o = Σ_i e^{lse_i − lse} o_i with lse = log Σ_i e^{lse_i}   (Juravsky et al., 2024, Hydragen).

// One query per row n attending to table[n, starts[n]:lengths[n]] (a part of its keys).
// q: (N, H, D) float32; pool: (S, 2, KVH, D) float32, bf16 or int8 (then scales (S, 2, KVH),
// keys and values widened as they are read); table: (N, T_max) int64; lengths, starts: (N,) int64. Returns (out (N, H, D) float32, lse (N, H) float32); an empty range gives out = 0,
// lse = −inf. O(N·H·(lengths − starts)·D).
std::tuple<torch::Tensor, torch::Tensor> paged_attention_part(torch::Tensor q, torch::Tensor pool,
                                                              torch::Tensor table, torch::Tensor lengths,
                                                              torch::Tensor starts, double scale,
                                                              c10::optional<torch::Tensor> scales,
                                                              c10::optional<torch::Tensor> out_buffer,
                                                              c10::optional<torch::Tensor> lse_buffer) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous(), "q: contiguous float32");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = pool.size(2);
  const int64_t group = heads / kv_heads;
  const int64_t t_max = table.size(1);
  auto tab = table.contiguous();
  auto len = lengths.contiguous();
  auto first = starts.contiguous();
  auto out = result_buffer(out_buffer, {batch, heads, dim}, at::kFloat, "out");
  auto lse = result_buffer(lse_buffer, {batch, heads}, at::kFloat, "lse");
  const float* qp = q.data_ptr<float>();
  const int64_t* tp = tab.data_ptr<int64_t>();
  const int64_t* lp = len.data_ptr<int64_t>();
  const int64_t* fp = first.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  float* ep = lse.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  with_pool(pool, scales, [&](auto* pp, float* pool_scales) {
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, head(dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, kvh = item % kv_heads;
      const int64_t skip = fp[b];
      const int64_t length = std::max<int64_t>(lp[b] - skip, 0);
      const int64_t* slots = tp + b * t_max + skip;
      scores.assign(group * length, 0.f);
      for (int64_t t = 0; t < length; ++t) {
        const float* key = cached_head(pp, pool_scales, slots[t], 0, kv_heads, kvh, dim, head.data());
        for (int64_t g = 0; g < group; ++g) {
          const float* query = qp + (b * heads + kvh * group + g) * dim;
          scores[g * length + t] = dot(query, key, dim) * sc;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        float* o = op + (b * heads + h) * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = 0.f;
        if (length == 0) {
          ep[b * heads + h] = -INFINITY;
          continue;
        }
        float* s = scores.data() + g * length;
        float top;
        const float total = exp_from_max(s, length, top);
        const float norm = 1.f / total;
        for (int64_t t = 0; t < length; ++t) {
          const float* value = cached_head(pp, pool_scales, slots[t], 1, kv_heads, kvh, dim, head.data());
          const float p = s[t] * norm;
#pragma omp simd
          for (int64_t i = 0; i < dim; ++i) o[i] += p * value[i];
        }
        ep[b * heads + h] = top + std::log(total);
      }
    }
  });
  });
  return {out, lse};
}

constexpr int64_t kPrefixBlock = 64;  // keys per block: K block transposed (D × 64 floats) stays in L1
constexpr int64_t kQueryBlock = 6;    // queries sharing each load of a key or value vector

// 16 floats in one vector (GCC/Clang vector extension: one AVX-512 register, two AVX2 ones).
typedef float float16v __attribute__((vector_size(64), aligned(4)));
inline float16v load16(const float* p) { float16v v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store16(float* p, float16v v) { std::memcpy(p, &v, sizeof(v)); }
typedef int32_t int16v __attribute__((vector_size(64), aligned(4)));

// exp_nonpositive on 16 lanes (GCC does not vectorize the scalar one's floor and bit cast): the
// same reduction and polynomial (`exp_reduced`), n rounded to nearest by adding and subtracting 1.5·2^23.
inline float16v exp16_nonpositive(float16v x) {
  const float16v low = float16v{} - 87.0f;
  x = x < low ? low : x;
  const float16v shift = float16v{} + 12582912.0f;  // 1.5·2^23
  const float16v n = (x * 1.44269504088896341f + shift) - shift;
  const int16v bits = (__builtin_convertvector(n, int16v) + 127) << 23;
  return exp_reduced(x, n) * reinterpret_cast<const float16v&>(bits);
}

// One work item of shared_prefix_attention: the queries Q (rows of `queries`, (Q, D), already
// scaled) of one kv head against keys [0, length) of `slots`, flash-attention style over blocks of
// kPrefixBlock keys: running max m (Q,), running sum l (Q,) and unnormalized output o (Q, D)
// with o = Σ_t e^{s_t − m} v_t, l = Σ_t e^{s_t − m}. Scores of a block are a (Q × D)·(D × 64)
// matrix product, values a (Q × 64)·(64 × D) one, kQueryBlock query rows held in registers: every
// key and value vector is loaded once per kQueryBlock queries instead of once per query.
// Dim (the head dimension) is a multiple of 16.
template <int64_t Dim, typename Elem>
void prefix_block_attention(const float* queries, int64_t count, const Elem* pool, const float* pool_scales,
                            const int64_t* slots, int64_t length, int64_t kv_heads, int64_t kvh, float* m, float* l,
                            float* o) {
  constexpr int64_t kLanes = 16, kKeyVectors = kPrefixBlock / kLanes, kDimVectors = Dim / kLanes;
  std::vector<float> keys_t(Dim * kPrefixBlock), scores((count + kQueryBlock) * kPrefixBlock, 0.f), head(Dim);
  for (int64_t q = 0; q < count; ++q) {
    m[q] = -INFINITY;
    l[q] = 0.f;
  }
  std::fill(o, o + count * Dim, 0.f);
  for (int64_t first = 0; first < length; first += kPrefixBlock) {
    const int64_t block = std::min(kPrefixBlock, length - first);
    // keys_t[d][t] = key t of the block, dimension d (zero past the block's end)
    for (int64_t t = 0; t < kPrefixBlock; ++t) {
      if (t < block) {
        const float* key = cached_head(pool, pool_scales, slots[first + t], 0, kv_heads, kvh, Dim, head.data());
        for (int64_t d = 0; d < Dim; ++d) keys_t[d * kPrefixBlock + t] = key[d];
      } else {
        for (int64_t d = 0; d < Dim; ++d) keys_t[d * kPrefixBlock + t] = 0.f;
      }
    }
    // scores (count × 64) = queries (count × D) · keys_t (D × 64), kQueryBlock rows at a time
    for (int64_t q0 = 0; q0 < count; q0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, count - q0);
      float16v acc[kQueryBlock][kKeyVectors] = {};
      const float* qrow[kQueryBlock];
      for (int64_t r = 0; r < kQueryBlock; ++r) qrow[r] = queries + (q0 + std::min(r, rows - 1)) * Dim;
      for (int64_t d = 0; d < Dim; ++d) {
        float16v kt[kKeyVectors];
        for (int64_t j = 0; j < kKeyVectors; ++j) kt[j] = load16(keys_t.data() + d * kPrefixBlock + j * kLanes);
        for (int64_t r = 0; r < kQueryBlock; ++r) {
          const float x = qrow[r][d];
          for (int64_t j = 0; j < kKeyVectors; ++j) acc[r][j] += x * kt[j];
        }
      }
      for (int64_t r = 0; r < kQueryBlock; ++r)
        for (int64_t j = 0; j < kKeyVectors; ++j) store16(scores.data() + (q0 + r) * kPrefixBlock + j * kLanes, acc[r][j]);
    }
    // online softmax: rescale what came before to the new running max
    for (int64_t q = 0; q < count; ++q) {
      float* s = scores.data() + q * kPrefixBlock;
      float top = m[q];
      if (block == kPrefixBlock) {
        float16v most = load16(s);
        for (int64_t j = 1; j < kKeyVectors; ++j) {
          const float16v v = load16(s + j * kLanes);
          most = most < v ? v : most;
        }
        for (int64_t i = 0; i < kLanes; ++i) top = std::max(top, most[i]);
      } else {
        for (int64_t t = 0; t < block; ++t) top = std::max(top, s[t]);
      }
      const float correction = exp_nonpositive(m[q] - top);  // 0 when m was −inf
      float16v sum = {};
      for (int64_t j = 0; j < kKeyVectors; ++j) {
        const float16v e = exp16_nonpositive(load16(s + j * kLanes) - top);
        store16(s + j * kLanes, e);
        sum += e;
      }
      float total = 0.f;
      for (int64_t i = 0; i < kLanes; ++i) total += sum[i];
      for (int64_t t = block; t < kPrefixBlock; ++t) {  // keys past the block's end (zero keys)
        total -= s[t];
        s[t] = 0.f;
      }
      l[q] = l[q] * correction + total;
      m[q] = top;
      if (correction != 1.f) {
        float* oq = o + q * Dim;
        for (int64_t i = 0; i < Dim; ++i) oq[i] *= correction;
      }
    }
    // o (count × D) += p (count × 64) · values (64 × D), kQueryBlock rows in registers
    for (int64_t q0 = 0; q0 < count; q0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, count - q0);
      float16v acc[kQueryBlock][kDimVectors];
      for (int64_t r = 0; r < kQueryBlock; ++r)
        for (int64_t j = 0; j < kDimVectors; ++j)
          acc[r][j] = r < rows ? load16(o + (q0 + r) * Dim + j * kLanes) : float16v{};
      for (int64_t t = 0; t < block; ++t) {
        const float* value = cached_head(pool, pool_scales, slots[first + t], 1, kv_heads, kvh, Dim, head.data());
        float16v v[kDimVectors];
        for (int64_t j = 0; j < kDimVectors; ++j) v[j] = load16(value + j * kLanes);
        for (int64_t r = 0; r < kQueryBlock; ++r) {
          const float p = scores[(q0 + r) * kPrefixBlock + t];  // rows past count read zeros
          for (int64_t j = 0; j < kDimVectors; ++j) acc[r][j] += p * v[j];
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < kDimVectors; ++j) store16(o + (q0 + r) * Dim + j * kLanes, acc[r][j]);
    }
  }
}

// Attention of groups of queries to their group's shared prefix, each prefix's keys and values
// read once for all its queries. Group g: keys prefix_slots[prefix_offsets[g]:prefix_offsets[g+1]],
// queries query_index[query_offsets[g]:query_offsets[g+1]] (rows of q). q: (N, H, D) float32;
// pool: (S, 2, KVH, D) float32, bf16 or int8 (with scales) as paged_attention_part's. Returns
// (out (N, H, D), lse (N, H)) as paged_attention_part;
// queries in no group get out = 0, lse = −inf. Work items are (group, kv head, key split), the
// splits merged by log-sum-exp at the end. O(Σ_g |queries_g|·H·P_g·D) flops, O(Σ_g P_g·KVH·D)
// bytes of K/V read.
std::tuple<torch::Tensor, torch::Tensor> shared_prefix_attention(torch::Tensor q, torch::Tensor pool,
                                                                 torch::Tensor prefix_slots,
                                                                 torch::Tensor prefix_offsets,
                                                                 torch::Tensor query_index,
                                                                 torch::Tensor query_offsets, double scale,
                                                                 c10::optional<torch::Tensor> scales,
                                                                 c10::optional<torch::Tensor> out_buffer,
                                                                 c10::optional<torch::Tensor> lse_buffer) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous(), "q: contiguous float32");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  TORCH_CHECK(dim == 64 || dim == 128 || dim == 256, "shared_prefix_attention: head dim 64, 128 or 256, got ", dim);
  const int64_t kv_heads = pool.size(2);
  const int64_t group = heads / kv_heads;
  auto slots_all = prefix_slots.contiguous();
  auto poff = prefix_offsets.contiguous();
  auto qidx = query_index.contiguous();
  auto qoff = query_offsets.contiguous();
  const int64_t groups = poff.numel() - 1;
  const int64_t* sp = slots_all.data_ptr<int64_t>();
  const int64_t* pop = poff.data_ptr<int64_t>();
  const int64_t* qip = qidx.data_ptr<int64_t>();
  const int64_t* qop = qoff.data_ptr<int64_t>();
  auto out = result_buffer(out_buffer, {batch, heads, dim}, at::kFloat, "out").zero_();
  auto lse = result_buffer(lse_buffer, {batch, heads}, at::kFloat, "lse").fill_(-INFINITY);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* ep = lse.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  // Split each prefix so that there are about 4 items per thread (at least 256 keys each).
  const int64_t threads = at::get_num_threads();
  struct Item { int64_t g, kvh, first, length, scratch; };
  std::vector<Item> items;
  std::vector<int64_t> split_count(groups), split_base(groups);
  int64_t scratch_rows = 0;  // rows of (query·group) partial results
  const int64_t wanted = std::max<int64_t>(1, (4 * threads + groups * kv_heads - 1) / (groups * kv_heads));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t length = pop[g + 1] - pop[g];
    const int64_t count = (qop[g + 1] - qop[g]) * group;
    int64_t split = std::max<int64_t>(256, (length + wanted - 1) / wanted);
    split = (split + kPrefixBlock - 1) / kPrefixBlock * kPrefixBlock;
    split_count[g] = std::max<int64_t>(1, (length + split - 1) / split);
    split_base[g] = scratch_rows;
    for (int64_t kvh = 0; kvh < kv_heads; ++kvh)
      for (int64_t s = 0; s < split_count[g]; ++s) {
        const int64_t first = s * split;
        items.push_back({g, kvh, first, std::max<int64_t>(0, std::min(split, length - first)), scratch_rows});
        scratch_rows += count;
      }
  }
  std::vector<float> part_m(scratch_rows), part_l(scratch_rows), part_o(scratch_rows * dim);
  with_pool(pool, scales, [&](auto* pp, float* pool_scales) {
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> queries;
    for (int64_t i = begin; i < end; ++i) {
      const Item& item = items[i];
      const int64_t first_query = qop[item.g], count = (qop[item.g + 1] - first_query) * group;
      queries.resize(count * dim);
      for (int64_t j = 0; j < count / group; ++j)
        for (int64_t g = 0; g < group; ++g) {
          const float* src = qp + (qip[first_query + j] * heads + item.kvh * group + g) * dim;
          float* dst = queries.data() + (j * group + g) * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] = src[d] * sc;
        }
      const int64_t* slots = sp + pop[item.g] + item.first;
      float* m = part_m.data() + item.scratch;
      float* l = part_l.data() + item.scratch;
      float* o = part_o.data() + item.scratch * dim;
      if (dim == 64)
        prefix_block_attention<64>(queries.data(), count, pp, pool_scales, slots, item.length, kv_heads, item.kvh, m, l, o);
      else if (dim == 128)
        prefix_block_attention<128>(queries.data(), count, pp, pool_scales, slots, item.length, kv_heads, item.kvh, m, l, o);
      else if (dim == 256)
        prefix_block_attention<256>(queries.data(), count, pp, pool_scales, slots, item.length, kv_heads, item.kvh, m, l, o);
    }
  });
  });
  // Merge each query head's splits: lse = M + log Σ_s e^{m_s − M} l_s, out = Σ_s e^{m_s − M} o_s / Σ_s e^{m_s − M} l_s.
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first_query = qop[g], queries = qop[g + 1] - first_query, count = queries * group;
    const int64_t splits = split_count[g];
    at::parallel_for(0, count * kv_heads, 16, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t kvh = item / count, row = item % count;  // row = j·group + g'
        const int64_t j = row / group, h = kvh * group + row % group;
        const int64_t base = split_base[g] + kvh * splits * count + row;
        float top = -INFINITY;
        for (int64_t s = 0; s < splits; ++s) top = std::max(top, part_m[base + s * count]);
        float total = 0.f;
        float* o = op + (qip[first_query + j] * heads + h) * dim;
        for (int64_t s = 0; s < splits; ++s) {
          const int64_t at_split = base + s * count;
          if (part_l[at_split] == 0.f) continue;  // an empty split
          const float w = std::exp(part_m[at_split] - top);
          total += w * part_l[at_split];
          const float* os = part_o.data() + at_split * dim;
          for (int64_t i = 0; i < dim; ++i) o[i] += w * os[i];
        }
        const float norm = 1.f / total;
        for (int64_t i = 0; i < dim; ++i) o[i] *= norm;
        ep[qip[first_query + j] * heads + h] = top + std::log(total);
      }
    });
  }
  return {out, lse};
}

// Attention over the union of two disjoint key sets from each part's output and log-sum-exp:
// o = e^{lse_a − lse} o_a + e^{lse_b − lse} o_b, lse = log(e^{lse_a} + e^{lse_b}); a part with
// lse = −inf (no keys) gets weight 0, and at least one part per query head must have keys.
// out_a, out_b: (N, H, D) float32; lse_a, lse_b: (N, H) float32. Returns (N, H·D) in out dtype.
torch::Tensor combine_attention_parts(torch::Tensor out_a, torch::Tensor lse_a, torch::Tensor out_b,
                                      torch::Tensor lse_b, bool bf16_out, c10::optional<torch::Tensor> out_buffer) {
  TORCH_CHECK(out_a.scalar_type() == at::kFloat && out_b.scalar_type() == at::kFloat, "outputs: float32");
  TORCH_CHECK(out_a.sizes() == out_b.sizes() && lse_a.sizes() == lse_b.sizes(), "parts of different shapes");
  auto a = out_a.contiguous(), b = out_b.contiguous(), la = lse_a.contiguous(), lb = lse_b.contiguous();
  const int64_t batch = a.size(0), heads = a.size(1), dim = a.size(2);
  auto out = result_buffer(bf16_out ? c10::nullopt : out_buffer, {batch, heads * dim}, at::kFloat, "out");
  const float *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>();
  const float *lap = la.data_ptr<float>(), *lbp = lb.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, batch * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const float top = std::max(lap[item], lbp[item]);
      const float wa = std::exp(lap[item] - top), wb = std::exp(lbp[item] - top);
      const float norm = 1.f / (wa + wb);
      const float ca = wa * norm, cb = wb * norm;
      const float *x = ap + item * dim, *y = bp + item * dim;
      float* o = op + item * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[i] = ca * x[i] + cb * y[i];
    }
  });
  return float_or_bf16(out, bf16_out, out_buffer);
}

}  // namespace

// The kernels touch no Python object: each call lets other Python threads run meanwhile (the
// serve engine's HTTP thread, PEARL's drafting thread, metagen eval's workers). Arguments are
// converted before the GIL is released and the result after it is taken back.
bool gil_held() { return PyGILState_Check() != 0; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("gil_held", &gil_held, "whether a kernel call holds the GIL (it does not: every call releases it)",
        release);
  // Every `out` / `lse`: the caller's buffer to write the result into (None: a fresh tensor).
  m.def("add_rms_norm", &add_rms_norm, "residual += delta; rmsnorm(residual) * weight", py::arg("residual"),
        py::arg("delta"), py::arg("weight"), py::arg("eps"), py::arg("bf16_out"), py::arg("out") = py::none(), release);
  m.def("rope_store", &rope_store, "interleaved RoPE on q, k; store k, v into cache slots",
        py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("slots"), py::arg("pool"),
        py::arg("heads"), py::arg("kv_heads"), py::arg("scales") = py::none(), py::arg("out") = py::none(), release);
  m.def("paged_decode_attention", &paged_decode_attention, "one-token attention over paged K/V",
        py::arg("q"), py::arg("pool"), py::arg("table"), py::arg("lengths"), py::arg("scale"), py::arg("bf16_out"),
        py::arg("starts") = py::none(), py::arg("scales") = py::none(), py::arg("out") = py::none(), release);
  m.def("paged_attention_part", &paged_attention_part, "attention to table[n, starts[n]:lengths[n]]: (out, lse)",
        py::arg("q"), py::arg("pool"), py::arg("table"), py::arg("lengths"), py::arg("starts"), py::arg("scale"),
        py::arg("scales") = py::none(), py::arg("out") = py::none(), py::arg("lse") = py::none(), release);
  m.def("shared_prefix_attention", &shared_prefix_attention,
        "attention of groups of queries to their group's shared prefix, read once per group: (out, lse)",
        py::arg("q"), py::arg("pool"), py::arg("prefix_slots"), py::arg("prefix_offsets"), py::arg("query_index"),
        py::arg("query_offsets"), py::arg("scale"), py::arg("scales") = py::none(), py::arg("out") = py::none(),
        py::arg("lse") = py::none(), release);
  m.def("combine_attention_parts", &combine_attention_parts, "attention over two key sets from each one's (out, lse)",
        py::arg("out_a"), py::arg("lse_a"), py::arg("out_b"), py::arg("lse_b"), py::arg("bf16_out"),
        py::arg("out") = py::none(), release);
  m.def("top_p_cutoff", &top_p_cutoff, "smallest probability kept by top-p, per row (quickselect)", release);
  m.def("apply_token_bitmask", &apply_token_bitmask, "logits where the token's bit is 1, -inf elsewhere", release);
}
