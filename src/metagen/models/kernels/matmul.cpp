// Weight-only int4 / int8 matrix kernels for decoding: Y (M, N) = X (M, K) · Wᵀ for the M = 1..64
// rows of decoding (any M works). Threads split the output columns into tiles of 16; a thread
// runs all rows over a tile (AVX-512: 4 rows at a time, AVX2: up to 64) while the tile's weights
// (≤ K·10 bytes) stay in its L1/L2, so every weight block is read from memory once per call.
//
// Numerics (the same on every path, and for every M: row r's output never depends on the other rows):
//   1. each row of X is quantized per block of 32 features, with L = 32258 = 127·254 levels
//      ("wide", the default) or L = 127 (llama.cpp's Q8_0):
//        a = max|x| / L,  xq = round_half_even(x · L / max|x|) ∈ [-L, L]   (a = 0, xq = 0 for a zero block)
//      Wide codes are split into two int8 digits, xq = 254·hi + lo with hi, lo ∈ [-127, 127], and
//      each digit takes one int8 dot product (twice the multiply-adds of L = 127);
//   2. per block, the integer dot  d = Σ xq·q  is exact (int32);
//   3. the float fold, per output column n and block g, in this order (fp32, fused multiply-adds):
//        int4: w = (q − 8)·s + z, q ∈ [0, 15], s and z bf16 per (n, g):
//              acc = fma(d, s·a, acc);  acc = fma(z − 8·s, a·Σxq, acc)
//        int8: w = q·s, q ∈ [-127, 127], s per column n:
//              acc = fma(d, a, acc);  after the last block acc = acc·s
//        grouped: w = (u − o)·s + z, u ∈ [0, 2^bits), s (and z) per (n, group of 16 or 32), o an
//              integer (2^(bits−1) for symmetric formats, 0 with zeros); per group h of the block
//              d_h = Σ xq·u − o·Σxq (exact):  acc = fma(d_h, s_h·a, acc);  acc = fma(z_h, a·Σ_h xq, acc)
//              (with groups of 32 the block's single d and a·Σxq are the int4 path's).
//              Two-level ("factored") values, as GGUF's K-quants store them: s = fl(S·σ) and
//              z = fl(Z·ζ) in fp32, σ, ζ int8 per group, S, Z per (n, 256 features); exact when S
//              and Z are fp16 (11 significant bits × 8)
//   4. + bias (fp32); the output has x's dtype: float32 as is, bf16 rounded once (half to even).
// The AVX-512 VNNI and the AVX2 paths compute the same integers and the same float operations
// lane by lane, so they agree bit for bit (the tests check this).
//
// Layouts (built by metagen/models/linear.py), columns in tiles of 16, K in blocks of 32:
//   int4: per tile, per block, 320 bytes: 4 × 64 bytes of nibbles, chunk c byte 4j + b holding
//         q[16t + j][32g + 4c + b] (low nibble) and q[16t + j][32g + 16 + 4c + b] (high nibble);
//         then 16 bf16 scales s and 16 bf16 zeros z of the tile's columns.
//   int8: per tile, per block, 512 bytes: 8 chunks of 64, chunk c byte 4j + b holding
//         q[16t + j][32g + 4c + b] + 128 (an unsigned byte); column scales separately (fp32).
//   grouped (bits 4, 5, 6 or 8; GGUF's Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 blocks hold exactly these codes):
//         per tile, per block: the codes — bits 8: as int8 (byte = u); bits 4: int4's nibbles; bits 5 / 6: the low four
//         bits as int4's nibbles (256 bytes), then the high bits in planes of 64 bytes laid out
//         like a chunk (byte 4j + b): 5 bits, one plane, bit c = bit 4 of u[16t + j][32g + 4c + b];
//         6 bits, two planes (chunks 0-3, 4-7), bits 2(c mod 4) and 2(c mod 4) + 1 = bits 4, 5 of
//         that u; then per group of the block (one or two) 16 scales (fp16 or fp32), then as many
//         zeros when the format has them. Factored: the per-group values are 16 int8 σ (then ζ),
//         and every 8 blocks (256 features) start with the 16 columns' S (then Z), fp16 or fp32.
// So one 64-byte chunk is 16 columns × 4 consecutive features: one int32 lane per column, the
// shape of VNNI's vpdpbusd (u8 × s8, 4 products per lane); AVX2 takes it as two 32-byte halves.
//
// Cost per call: M·N·K multiply-adds in int8 (twice that when wide) plus O(M·N·K/32) float operations; weight bytes
// read once: N·K/2 · 1.25 (int4), N·K (int8).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define METAGEN_X86 1
#else
#define METAGEN_X86 0
#endif

namespace {

constexpr int64_t kTile = 16;         // output columns per tile
constexpr int64_t kBlock = 32;        // input features per block
constexpr int64_t kRowChunk = 64;     // rows whose accumulators live together
constexpr int64_t kInt4BlockBytes = 320;
constexpr int64_t kInt8BlockBytes = 512;

enum Isa : int64_t { kNone = 0, kAvx2 = 1, kAvx512 = 2 };

// Activations quantized per row and block of 32 (step 1 above). codes (hi digits when wide) and
// low (wide only): (M, Kp) int8 with Kp = blocks·32 (zero padded); per (row, block): the scale a,
// a·Σxq, and 128·Σxq (vpdpbusd on u8 weights q + 128 counts it once too many).
struct QuantizedRows {
  std::vector<int8_t> codes;
  std::vector<int8_t> low;
  std::vector<int16_t> whole;  // xq itself (for the tests)
  std::vector<float> scale;
  std::vector<float> scaled_sum;
  std::vector<int32_t> offset;
  std::vector<int32_t> half_sum;  // Σxq over features 0..15 and 16..31 of each block: (rows, blocks, 2)
  int64_t blocks = 0;
  bool wide = true;
};

constexpr float kWideLevels = 32258.f;  // 127·254

inline float round_half_even(float v) {  // exact for |v| < 2^22 in the default rounding mode
  const float magic = 12582912.f;       // 1.5 · 2^23
  return (v >= 0.f) ? (v + magic) - magic : -((-v + magic) - magic);
}

// Step 1 for one block: max|x| (NaN ignored), then q = clamp(round_half_even(x · inverse)) and,
// when wide, its high digit round_half_even(q / 254). The AVX2 versions do the same fp32
// operations lane by lane (the codes are identical; the tests compare them with the formula).
inline float block_amax(const float* v, int64_t count) {
  float amax = 0.f;
  for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(v[i]));
  return amax;
}

inline void block_codes(const float* v, int64_t count, float inverse, float levels, bool wide, int32_t* q, int32_t* hi) {
  for (int64_t i = 0; i < count; ++i) {
    const float c = std::min(levels, std::max(-levels, round_half_even(v[i] * inverse)));
    q[i] = static_cast<int32_t>(c);
    hi[i] = wide ? static_cast<int32_t>(round_half_even(c / 254.f)) : 0;
  }
}

#if METAGEN_X86
__attribute__((target("avx2,fma"))) inline float block_amax_avx2(const float* v) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < kBlock; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_load_ps(v + i)), m);  // NaN -> m
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.f;
  for (float lane : lanes) amax = std::max(amax, lane);
  return amax;
}

__attribute__((target("avx2,fma"))) inline void block_codes_avx2(const float* v, float inverse, float levels, bool wide,
                                                                  int32_t* q, int32_t* hi) {
  const __m256 scale = _mm256_set1_ps(inverse), top = _mm256_set1_ps(levels), bottom = _mm256_set1_ps(-levels);
  const __m256 digit = _mm256_set1_ps(254.f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int i = 0; i < kBlock; i += 8) {
    __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_load_ps(v + i), scale), kNearest);
    c = _mm256_min_ps(_mm256_max_ps(c, bottom), top);  // NaN -> −levels, as std::max(−levels, NaN)
    _mm256_store_si256(reinterpret_cast<__m256i*>(q + i), _mm256_cvtps_epi32(c));
    const __m256i h = wide ? _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(c, digit), kNearest)) : _mm256_setzero_si256();
    _mm256_store_si256(reinterpret_cast<__m256i*>(hi + i), h);
  }
}
#else
inline float block_amax_avx2(const float* v) { return block_amax(v, kBlock); }
inline void block_codes_avx2(const float* v, float inverse, float levels, bool wide, int32_t* q, int32_t* hi) {
  block_codes(v, kBlock, inverse, levels, wide, q, hi);
}
#endif

int64_t best_isa();

template <typename In>
void quantize_rows(const In* x, int64_t rows, int64_t k, int64_t blocks, bool wide, QuantizedRows& out) {
  const int64_t padded = blocks * kBlock;
  const float levels = wide ? kWideLevels : 127.f;
  out.blocks = blocks;
  out.wide = wide;
  out.codes.assign(rows * padded, 0);
  out.low.assign(wide ? rows * padded : 0, 0);
  out.whole.assign(rows * padded, 0);
  out.scale.resize(rows * blocks);
  out.scaled_sum.resize(rows * blocks);
  out.offset.resize(rows * blocks);
  out.half_sum.resize(rows * blocks * 2);
  const bool vector = best_isa() >= kAvx2;
  alignas(32) float block[kBlock];
  alignas(32) int32_t q[kBlock], hi[kBlock];
  for (int64_t r = 0; r < rows; ++r) {
    const In* row = x + r * k;
    for (int64_t g = 0; g < blocks; ++g) {
      const int64_t begin = g * kBlock, end = std::min(k, begin + kBlock);
      for (int64_t i = begin; i < end; ++i) block[i - begin] = static_cast<float>(row[i]);
      const int64_t count = end - begin;
      const float amax = vector && count == kBlock ? block_amax_avx2(block) : block_amax(block, count);
      const float inverse = amax > 0.f ? levels / amax : 0.f;
      if (vector && count == kBlock) block_codes_avx2(block, inverse, levels, wide, q, hi);
      else block_codes(block, count, inverse, levels, wide, q, hi);
      int32_t sum = 0, first_half = 0;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t at = r * padded + begin + j;
        out.whole[at] = static_cast<int16_t>(q[j]);
        out.codes[at] = static_cast<int8_t>(wide ? hi[j] : q[j]);
        if (wide) out.low[at] = static_cast<int8_t>(q[j] - 254 * hi[j]);
        sum += q[j];
        if (j < kBlock / 2) first_half += q[j];
      }
      out.half_sum[(r * blocks + g) * 2] = first_half;
      out.half_sum[(r * blocks + g) * 2 + 1] = sum - first_half;
      const float a = amax / levels;
      out.scale[r * blocks + g] = a;
      out.scaled_sum[r * blocks + g] = a * static_cast<float>(sum);
      out.offset[r * blocks + g] = 128 * sum;
    }
  }
}

// fp32 -> bf16, round half to even, NaN kept quiet (as c10::BFloat16 does).
inline uint16_t to_bf16(float v) {
  if (std::isnan(v)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Where a call's (rows, N) result goes: bf16 (rounded once) or float32, as its input; row r
// starts `stride` elements after row r − 1 (N for a fresh result, more for a column slice).
struct Output {
  void* data;
  bool is_float;
  int64_t stride;
};

// The end of a tile: rows × 16 accumulators (+ column scale) (+ bias) -> output columns.
inline void store_tile(const float* acc, int64_t rows, int64_t tile, int64_t n, const float* column_scale,
                       const float* bias, Output out, int64_t row0) {
  const int64_t col0 = tile * kTile;
  const int64_t width = std::min(kTile, n - col0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      float v = acc[r * kTile + j];
      if (column_scale != nullptr) v *= column_scale[col0 + j];
      if (bias != nullptr) v += bias[col0 + j];
      const int64_t at = (row0 + r) * out.stride + col0 + j;
      if (out.is_float) static_cast<float*>(out.data)[at] = v;
      else static_cast<uint16_t*>(out.data)[at] = to_bf16(v);
    }
  }
}

constexpr int64_t kSuperBlocks = 8;  // blocks of 32 under one factored top value (256 features)

// A grouped weight's shape per block (see the layouts above).
struct GroupFormat {
  int64_t bits = 8;
  int64_t groups = 1;      // per block of 32: 1 (groups of 32) or 2 (groups of 16)
  bool zero = false;       // per-group zeros follow the scales
  bool half = false;       // scales and zeros (factored: the top values S, Z) stored as fp16, else fp32
  bool factored = false;   // per-group int8 σ (ζ) under a top S (Z) per 256 features
  int32_t offset = 0;      // o: w = (u − o)·s + z
  int64_t code_bytes() const { return bits == 8 ? 512 : 256 + (bits - 4) * 64; }
  int64_t value_bytes() const { return groups * kTile * (factored ? 1 : half ? 2 : 4); }
  int64_t block_bytes() const { return code_bytes() + value_bytes() * (zero ? 2 : 1); }
  int64_t top_bytes() const { return factored ? kTile * (half ? 2 : 4) * (zero ? 2 : 1) : 0; }
  int64_t tile_bytes(int64_t blocks) const { return blocks * block_bytes() + blocks / kSuperBlocks * top_bytes(); }
};

// Walks a tile's blocks in order: `block` is block g's first byte, `top` its factored top values.
struct BlockCursor {
  const uint8_t* block;
  const uint8_t* top;
  int64_t block_bytes, top_bytes;
  BlockCursor(const uint8_t* tile_weight, const GroupFormat& f)
      : block(tile_weight), top(tile_weight), block_bytes(f.block_bytes()), top_bytes(f.top_bytes()) {}
  void enter(int64_t g) {  // call before reading block g (g = 0, 1, ...)
    if (top_bytes != 0 && g % kSuperBlocks == 0) {
      top = block;
      block += top_bytes;
    }
  }
  void next() { block += block_bytes; }
};

#if METAGEN_X86

// ---------------------------------------------------------------- AVX-512 (F, BW, VNNI)
#define METAGEN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define METAGEN_AVX2 __attribute__((target("avx2,fma,f16c")))

METAGEN_AVX512 inline __m512 bf16x16_avx512(const uint8_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// The integer dot of a block from its digits' dots: hi alone, or 254·hi + lo.
template <bool Wide>
METAGEN_AVX512 inline __m512i combine_avx512(__m512i hi, __m512i lo) {
  if (!Wide) return hi;
  return _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(hi, 8), _mm512_slli_epi32(hi, 1)), lo);
}

// R rows (R ≤ 4) of one tile over all blocks, accumulators in registers: the rows' dot products
// interleave (independent dependency chains) and share each unpacked block. Every row runs the
// same instruction sequence whatever R is, so results do not depend on how rows are grouped.
// Int4: weights are the nibbles; Int8: the stored bytes q + 128 (minus 128·Σxq afterwards).
template <int R, bool Wide, bool Int4>
METAGEN_AVX512 inline void rows_avx512(const uint8_t* tile_weight, const QuantizedRows& act, int64_t row0,
                                       float* acc_out) {
  const int64_t blocks = act.blocks;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512 minus_eight = _mm512_set1_ps(-8.f);
  __m512 acc[R];
  const int32_t* hi[R];
  const int32_t* lo[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    hi[r] = reinterpret_cast<const int32_t*>(act.codes.data() + (row0 + r) * blocks * kBlock);
    lo[r] = Wide ? reinterpret_cast<const int32_t*>(act.low.data() + (row0 + r) * blocks * kBlock) : nullptr;
  }
  const float* scale = act.scale.data() + row0 * blocks;
  const float* scaled_sum = act.scaled_sum.data() + row0 * blocks;
  const int32_t* offset = act.offset.data() + row0 * blocks;
  for (int64_t g = 0; g < blocks; ++g) {
    __m512i w[8];
    __m512 s, zero;
    if (Int4) {
      const uint8_t* b = tile_weight + g * kInt4BlockBytes;
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(b + 64 * c);
        w[c] = _mm512_and_si512(v, nibble);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      }
      s = bf16x16_avx512(b + 256);
      zero = _mm512_fmadd_ps(s, minus_eight, bf16x16_avx512(b + 288));  // z − 8·s
    } else {
      const uint8_t* b = tile_weight + g * kInt8BlockBytes;
      for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(b + 64 * c);
    }
    __m512i dh[R], dl[R];
    for (int r = 0; r < R; ++r) dh[r] = dl[r] = _mm512_setzero_si512();
    for (int c = 0; c < 8; ++c) {
      for (int r = 0; r < R; ++r) {
        dh[r] = _mm512_dpbusd_epi32(dh[r], w[c], _mm512_set1_epi32(hi[r][g * 8 + c]));
        if (Wide) dl[r] = _mm512_dpbusd_epi32(dl[r], w[c], _mm512_set1_epi32(lo[r][g * 8 + c]));
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512i d = combine_avx512<Wide>(dh[r], dl[r]);
      if (Int4) {
        const __m512 sa = _mm512_mul_ps(s, _mm512_set1_ps(scale[r * blocks + g]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sa, acc[r]);
        acc[r] = _mm512_fmadd_ps(zero, _mm512_set1_ps(scaled_sum[r * blocks + g]), acc[r]);
      } else {
        d = _mm512_sub_epi32(d, _mm512_set1_epi32(offset[r * blocks + g]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(scale[r * blocks + g]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_store_ps(acc_out + r * kTile, acc[r]);
}

template <bool Wide, bool Int4>
METAGEN_AVX512 void tiles_avx512(const uint8_t* weight, const float* column_scale, const QuantizedRows& act,
                                 int64_t rows, int64_t n, const float* bias, Output out, int64_t tile_begin,
                                 int64_t tile_end) {
  constexpr int64_t kRows = Wide ? 4 : 8;
  alignas(64) float acc[kRows * kTile];
  const int64_t tile_bytes = act.blocks * (Int4 ? kInt4BlockBytes : kInt8BlockBytes);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile_weight = weight + t * tile_bytes;
    for (int64_t row0 = 0; row0 < rows; row0 += kRows) {
      const int64_t count = std::min<int64_t>(kRows, rows - row0);
      switch (count) {
        case 8: rows_avx512<Wide ? 4 : 8, Wide, Int4>(tile_weight, act, row0, acc); break;
        case 7: rows_avx512<Wide ? 4 : 7, Wide, Int4>(tile_weight, act, row0, acc); break;
        case 6: rows_avx512<Wide ? 4 : 6, Wide, Int4>(tile_weight, act, row0, acc); break;
        case 5: rows_avx512<Wide ? 4 : 5, Wide, Int4>(tile_weight, act, row0, acc); break;
        case 4: rows_avx512<4, Wide, Int4>(tile_weight, act, row0, acc); break;
        case 3: rows_avx512<3, Wide, Int4>(tile_weight, act, row0, acc); break;
        case 2: rows_avx512<2, Wide, Int4>(tile_weight, act, row0, acc); break;
        default: rows_avx512<1, Wide, Int4>(tile_weight, act, row0, acc); break;
      }
      store_tile(acc, count, t, n, column_scale, bias, out, row0);
    }
  }
}

// ---------------------------------------------------------------- grouped formats (bits 4, 5, 6, 8)

// How far chunk c's high bits sit from bit 4 in a plane byte (5 bits: bit c; 6 bits: bits
// 2(c mod 4), +1 of plane c / 4); > 0 shifts left. 16-bit lane shifts are exact here: what
// crosses from the neighbouring byte lands outside the bits kept.
constexpr int high_shift(int bits, int c) { return bits == 5 ? 4 - c : 4 - 2 * (c % 4); }

METAGEN_AVX512 inline __m512i shift_bytes_avx512(__m512i v, int s) {
  return s > 0 ? _mm512_slli_epi16(v, s) : s < 0 ? _mm512_srli_epi16(v, -s) : v;
}

METAGEN_AVX512 inline __m512 values_avx512(const uint8_t* p, bool half) {
  return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)) : _mm512_loadu_ps(p);
}

METAGEN_AVX512 inline __m512 int8x16_avx512(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

// A block's per-group scales s[h] and zeros z[h] (16 columns each), plain or factored (under `top`).
METAGEN_AVX512 inline void block_values_avx512(const uint8_t* top, const GroupFormat& f, const uint8_t* values,
                                               __m512* s, __m512* z) {
  const int64_t value_bytes = f.value_bytes();
  if (f.factored) {
    const __m512 top_s = values_avx512(top, f.half);
    const __m512 top_z = f.zero ? values_avx512(top + kTile * (f.half ? 2 : 4), f.half) : _mm512_setzero_ps();
    for (int h = 0; h < f.groups; ++h) {
      s[h] = _mm512_mul_ps(top_s, int8x16_avx512(values + kTile * h));
      z[h] = f.zero ? _mm512_mul_ps(top_z, int8x16_avx512(values + value_bytes + kTile * h)) : _mm512_setzero_ps();
    }
  } else {
    const int64_t step = f.half ? 32 : 64;
    for (int h = 0; h < f.groups; ++h) {
      s[h] = values_avx512(values + step * h, f.half);
      z[h] = f.zero ? values_avx512(values + value_bytes + step * h, f.half) : _mm512_setzero_ps();
    }
  }
}

// R rows (R ≤ 4) of one tile of a grouped weight; the same instruction sequence for every R.
template <int R, bool Wide, int Bits>
METAGEN_AVX512 inline void grouped_rows_avx512(const uint8_t* tile_weight, const GroupFormat& f, const QuantizedRows& act,
                                               int64_t row0, float* acc_out) {
  const int64_t blocks = act.blocks, code_bytes = f.code_bytes();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i high_mask = _mm512_set1_epi8(Bits == 6 ? 0x30 : 0x10);
  __m512 acc[R];
  const int32_t* hi[R];
  const int32_t* lo[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    hi[r] = reinterpret_cast<const int32_t*>(act.codes.data() + (row0 + r) * blocks * kBlock);
    lo[r] = Wide ? reinterpret_cast<const int32_t*>(act.low.data() + (row0 + r) * blocks * kBlock) : nullptr;
  }
  BlockCursor cursor(tile_weight, f);
  for (int64_t g = 0; g < blocks; ++g, cursor.next()) {
    cursor.enter(g);
    const uint8_t* b = cursor.block;
    __m512i w[8];
    if (Bits == 8) {
      for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(b + 64 * c);
    } else {
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(b + 64 * c);
        w[c] = _mm512_and_si512(v, nibble);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      }
    }
    if (Bits == 5 || Bits == 6) {
      const __m512i plane0 = _mm512_loadu_si512(b + 256);
      const __m512i plane1 = Bits == 6 ? _mm512_loadu_si512(b + 320) : plane0;
      for (int c = 0; c < 8; ++c) {
        const __m512i plane = (Bits == 6 && c >= 4) ? plane1 : plane0;
        w[c] = _mm512_or_si512(w[c], _mm512_and_si512(shift_bytes_avx512(plane, high_shift(Bits, c)), high_mask));
      }
    }
    __m512 s[2], z[2];
    block_values_avx512(cursor.top, f, b + code_bytes, s, z);
    // The rows' dot products interleave (independent dependency chains), as in rows_avx512.
    if (f.groups == 1) {  // one dot per block and row
      __m512i dh[R], dl[R];
      for (int r = 0; r < R; ++r) dh[r] = dl[r] = _mm512_setzero_si512();
      if (R == 1) {  // one row: two chains per digit (chunks 0-3, 4-7) halve the dependency latency
        __m512i dh2 = _mm512_setzero_si512(), dl2 = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          dh[0] = _mm512_dpbusd_epi32(dh[0], w[c], _mm512_set1_epi32(hi[0][g * 8 + c]));
          dh2 = _mm512_dpbusd_epi32(dh2, w[c + 4], _mm512_set1_epi32(hi[0][g * 8 + c + 4]));
          if (Wide) {
            dl[0] = _mm512_dpbusd_epi32(dl[0], w[c], _mm512_set1_epi32(lo[0][g * 8 + c]));
            dl2 = _mm512_dpbusd_epi32(dl2, w[c + 4], _mm512_set1_epi32(lo[0][g * 8 + c + 4]));
          }
        }
        dh[0] = _mm512_add_epi32(dh[0], dh2);
        dl[0] = _mm512_add_epi32(dl[0], dl2);
      } else {
        for (int c = 0; c < 8; ++c) {
          for (int r = 0; r < R; ++r) {
            dh[r] = _mm512_dpbusd_epi32(dh[r], w[c], _mm512_set1_epi32(hi[r][g * 8 + c]));
            if (Wide) dl[r] = _mm512_dpbusd_epi32(dl[r], w[c], _mm512_set1_epi32(lo[r][g * 8 + c]));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const int64_t rg = (row0 + r) * blocks + g;
        const int32_t* sums = act.half_sum.data() + rg * 2;
        __m512i d = combine_avx512<Wide>(dh[r], dl[r]);
        if (f.offset != 0) d = _mm512_sub_epi32(d, _mm512_set1_epi32(f.offset * (sums[0] + sums[1])));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s[0], _mm512_set1_ps(act.scale[rg])), acc[r]);
        if (f.zero) acc[r] = _mm512_fmadd_ps(z[0], _mm512_set1_ps(act.scaled_sum[rg]), acc[r]);
      }
      continue;
    }
    __m512i d0h[R], d1h[R], d0l[R], d1l[R];  // groups of 16: features 0-15 and 16-31 of the block
    for (int r = 0; r < R; ++r) d0h[r] = d1h[r] = d0l[r] = d1l[r] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      for (int r = 0; r < R; ++r) {
        d0h[r] = _mm512_dpbusd_epi32(d0h[r], w[c], _mm512_set1_epi32(hi[r][g * 8 + c]));
        d1h[r] = _mm512_dpbusd_epi32(d1h[r], w[c + 4], _mm512_set1_epi32(hi[r][g * 8 + c + 4]));
        if (Wide) {
          d0l[r] = _mm512_dpbusd_epi32(d0l[r], w[c], _mm512_set1_epi32(lo[r][g * 8 + c]));
          d1l[r] = _mm512_dpbusd_epi32(d1l[r], w[c + 4], _mm512_set1_epi32(lo[r][g * 8 + c + 4]));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t rg = (row0 + r) * blocks + g;
      const int32_t* sums = act.half_sum.data() + rg * 2;
      const float a = act.scale[rg];
      __m512i d0 = combine_avx512<Wide>(d0h[r], d0l[r]), d1 = combine_avx512<Wide>(d1h[r], d1l[r]);
      if (f.offset != 0) {
        d0 = _mm512_sub_epi32(d0, _mm512_set1_epi32(f.offset * sums[0]));
        d1 = _mm512_sub_epi32(d1, _mm512_set1_epi32(f.offset * sums[1]));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(s[0], _mm512_set1_ps(a)), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(s[1], _mm512_set1_ps(a)), acc[r]);
      if (f.zero) {
        acc[r] = _mm512_fmadd_ps(z[0], _mm512_set1_ps(a * static_cast<float>(sums[0])), acc[r]);
        acc[r] = _mm512_fmadd_ps(z[1], _mm512_set1_ps(a * static_cast<float>(sums[1])), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_store_ps(acc_out + r * kTile, acc[r]);
}

template <bool Wide, int Bits>
METAGEN_AVX512 void grouped_tiles_avx512(const uint8_t* weight, const GroupFormat& f, const QuantizedRows& act,
                                         int64_t rows, int64_t n, const float* bias, Output out, int64_t tile_begin,
                                         int64_t tile_end) {
  const int64_t max_rows = Wide || f.groups != 1 ? 4 : 8;  // 8 rows' accumulators fit the registers
  alignas(64) float acc[8 * kTile];
  const int64_t tile_bytes = f.tile_bytes(act.blocks);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile_weight = weight + t * tile_bytes;
    for (int64_t row0 = 0; row0 < rows; row0 += max_rows) {
      const int64_t count = std::min<int64_t>(max_rows, rows - row0);
      switch (count) {
        case 8: grouped_rows_avx512<Wide ? 4 : 8, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        case 7: grouped_rows_avx512<Wide ? 4 : 7, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        case 6: grouped_rows_avx512<Wide ? 4 : 6, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        case 5: grouped_rows_avx512<Wide ? 4 : 5, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        case 4: grouped_rows_avx512<4, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        case 3: grouped_rows_avx512<3, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        case 2: grouped_rows_avx512<2, Wide, Bits>(tile_weight, f, act, row0, acc); break;
        default: grouped_rows_avx512<1, Wide, Bits>(tile_weight, f, act, row0, acc); break;
      }
      store_tile(acc, count, t, n, nullptr, bias, out, row0);
    }
  }
}

// ---------------------------------------------------------------- AVX2 (+ FMA)

METAGEN_AVX2 inline __m256 bf16x8_avx2(const uint8_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

template <bool Wide>
METAGEN_AVX2 inline __m256i combine_avx2(__m256i hi, __m256i lo) {
  if (!Wide) return hi;
  return _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(hi, 8), _mm256_slli_epi32(hi, 1)), lo);
}

// Σ over a block's 8 chunks of (int4 codes u8 ∈ [0, 15]) × (one digit s8): each vpmaddubsw pair
// ≤ 2·15·127, 8 of them ≤ 30480 < 2^15, so the int16 sums are exact.
METAGEN_AVX2 inline __m256i dot_int4_avx2(const __m256i* w, const int32_t* x) {
  __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x[0]));
  for (int c = 1; c < 8; ++c) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(x[c])));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// Σ x·q for signed int8 weights: |x| · (q·sign x), u8 × s8 pairs ≤ 2·127·127 < 2^15 (q = −128 is
// refused at packing).
METAGEN_AVX2 inline __m256i dot_int8_avx2(const __m256i* w, const int32_t* x) {
  __m256i d = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    const __m256i xs = _mm256_set1_epi32(x[c]);
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(xs), _mm256_sign_epi8(w[c], xs));
    d = _mm256_add_epi32(d, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  return d;
}

template <bool Wide, bool Int4>
METAGEN_AVX2 void tiles_avx2(const uint8_t* weight, const float* column_scale, const QuantizedRows& act, int64_t rows,
                             int64_t n, const float* bias, Output out, int64_t tile_begin, int64_t tile_end) {
  const int64_t blocks = act.blocks;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256 minus_eight = _mm256_set1_ps(-8.f);
  const int64_t block_bytes = Int4 ? kInt4BlockBytes : kInt8BlockBytes;
  alignas(64) float acc[kRowChunk * kTile];
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    for (int64_t row0 = 0; row0 < rows; row0 += kRowChunk) {
      const int64_t chunk = std::min(kRowChunk, rows - row0);
      std::memset(acc, 0, sizeof(float) * chunk * kTile);
      for (int64_t g = 0; g < blocks; ++g) {
        const uint8_t* b = weight + (t * blocks + g) * block_bytes;
        for (int half = 0; half < 2; ++half) {  // columns 8·half .. 8·half + 7
          __m256i w[8];
          __m256 s, zero;
          if (Int4) {
            for (int c = 0; c < 4; ++c) {
              const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 64 * c + 32 * half));
              w[c] = _mm256_and_si256(v, nibble);
              w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            }
            s = bf16x8_avx2(b + 256 + 16 * half);
            zero = _mm256_fmadd_ps(s, minus_eight, bf16x8_avx2(b + 288 + 16 * half));
          } else {  // signed weights q = stored byte − 128
            for (int c = 0; c < 8; ++c) w[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(b + 64 * c + 32 * half)), flip);
          }
          for (int64_t r = 0; r < chunk; ++r) {
            const int64_t rg = (row0 + r) * blocks + g;
            const int64_t at = (row0 + r) * blocks * kBlock + g * kBlock;
            const int32_t* hi = reinterpret_cast<const int32_t*>(act.codes.data() + at);
            const int32_t* lo = Wide ? reinterpret_cast<const int32_t*>(act.low.data() + at) : nullptr;
            float* a = acc + r * kTile + 8 * half;
            if (Int4) {
              const __m256i d = combine_avx2<Wide>(dot_int4_avx2(w, hi), Wide ? dot_int4_avx2(w, lo) : _mm256_setzero_si256());
              const __m256 sa = _mm256_mul_ps(s, _mm256_set1_ps(act.scale[rg]));
              __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sa, _mm256_load_ps(a));
              v = _mm256_fmadd_ps(zero, _mm256_set1_ps(act.scaled_sum[rg]), v);
              _mm256_store_ps(a, v);
            } else {
              const __m256i d = combine_avx2<Wide>(dot_int8_avx2(w, hi), Wide ? dot_int8_avx2(w, lo) : _mm256_setzero_si256());
              _mm256_store_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(act.scale[rg]), _mm256_load_ps(a)));
            }
          }
        }
      }
      store_tile(acc, chunk, t, n, column_scale, bias, out, row0);
    }
  }
}

template <bool Int4>
void run_tiles(int64_t isa, const uint8_t* weight, const float* column_scale, const QuantizedRows& act, int64_t rows,
               int64_t n, const float* bias, Output out, int64_t begin, int64_t end) {
  if (isa == kAvx512) {
    if (act.wide) tiles_avx512<true, Int4>(weight, column_scale, act, rows, n, bias, out, begin, end);
    else tiles_avx512<false, Int4>(weight, column_scale, act, rows, n, bias, out, begin, end);
  } else {
    if (act.wide) tiles_avx2<true, Int4>(weight, column_scale, act, rows, n, bias, out, begin, end);
    else tiles_avx2<false, Int4>(weight, column_scale, act, rows, n, bias, out, begin, end);
  }
}


METAGEN_AVX2 inline __m256 values_avx2(const uint8_t* p, bool half) {
  return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)) : _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

METAGEN_AVX2 inline __m256 int8x8_avx2(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

// A block's per-group scales s[h] and zeros z[h] of columns 8·half .. 8·half + 7, plain or
// factored (under `tile_top`, the 16 columns' top values).
METAGEN_AVX2 inline void block_values_avx2(const uint8_t* tile_top, const GroupFormat& f, const uint8_t* values, int half,
                                           __m256* s, __m256* z) {
  const int64_t value_bytes = f.value_bytes();
  if (f.factored) {
    const int64_t width = f.half ? 2 : 4;
    const uint8_t* top = tile_top + 8 * width * half;
    const __m256 top_s = values_avx2(top, f.half);
    const __m256 top_z = f.zero ? values_avx2(top + kTile * width, f.half) : _mm256_setzero_ps();
    for (int h = 0; h < f.groups; ++h) {
      s[h] = _mm256_mul_ps(top_s, int8x8_avx2(values + kTile * h + 8 * half));
      z[h] = f.zero ? _mm256_mul_ps(top_z, int8x8_avx2(values + value_bytes + kTile * h + 8 * half)) : _mm256_setzero_ps();
    }
  } else {
    const int64_t step = f.half ? 32 : 64, lane = f.half ? 16 : 32;
    for (int h = 0; h < f.groups; ++h) {
      s[h] = values_avx2(values + lane * half + step * h, f.half);
      z[h] = f.zero ? values_avx2(values + value_bytes + lane * half + step * h, f.half) : _mm256_setzero_ps();
    }
  }
}

METAGEN_AVX2 inline __m256i shift_bytes_avx2(__m256i v, int s) {
  return s > 0 ? _mm256_slli_epi16(v, s) : s < 0 ? _mm256_srli_epi16(v, -s) : v;
}

// Σ over chunks [first, first + 4) of (unsigned codes ≤ 63) × (one digit s8), int32 per column:
// each vpmaddubsw pair ≤ 2·63·127 < 2^15, widened per chunk.
METAGEN_AVX2 inline __m256i dot_codes_avx2(const __m256i* w, const int32_t* x, int first) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i d = _mm256_setzero_si256();
  for (int c = first; c < first + 4; ++c)
    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(w[c], _mm256_set1_epi32(x[c])), ones));
  return d;
}

// The same for 8-bit codes taken as signed q = u − 128 (|q| ≤ 127: u = 0 is refused at packing):
// Σ q·x = Σ u·x − 128·Σx, computed with the sign trick.
METAGEN_AVX2 inline __m256i dot_signed_avx2(const __m256i* w, const int32_t* x, int first) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i d = _mm256_setzero_si256();
  for (int c = first; c < first + 4; ++c) {
    const __m256i xs = _mm256_set1_epi32(x[c]);
    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(xs), _mm256_sign_epi8(w[c], xs)), ones));
  }
  return d;
}

template <bool Wide, int Bits>
METAGEN_AVX2 void grouped_tiles_avx2(const uint8_t* weight, const GroupFormat& f, const QuantizedRows& act, int64_t rows,
                                     int64_t n, const float* bias, Output out, int64_t tile_begin, int64_t tile_end) {
  const int64_t blocks = act.blocks, code_bytes = f.code_bytes(), tile_bytes = f.tile_bytes(blocks);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i high_mask = _mm256_set1_epi8(Bits == 6 ? 0x30 : 0x10);
  // 8-bit codes are dotted as signed q = u − 128, so their offset is already taken.
  const int32_t offset = Bits == 8 ? f.offset - 128 : f.offset;
  alignas(64) float acc[kRowChunk * kTile];
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    for (int64_t row0 = 0; row0 < rows; row0 += kRowChunk) {
      const int64_t chunk = std::min(kRowChunk, rows - row0);
      std::memset(acc, 0, sizeof(float) * chunk * kTile);
      BlockCursor cursor(weight + t * tile_bytes, f);
      for (int64_t g = 0; g < blocks; ++g, cursor.next()) {
        cursor.enter(g);
        const uint8_t* b = cursor.block;
        for (int half = 0; half < 2; ++half) {  // columns 8·half .. 8·half + 7
          __m256i w[8];
          if (Bits == 8) {
            for (int c = 0; c < 8; ++c) w[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(b + 64 * c + 32 * half)), flip);
          } else {
            for (int c = 0; c < 4; ++c) {
              const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 64 * c + 32 * half));
              w[c] = _mm256_and_si256(v, nibble);
              w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            }
          }
          if (Bits == 5 || Bits == 6) {
            const __m256i plane0 = _mm256_loadu_si256((const __m256i*)(b + 256 + 32 * half));
            const __m256i plane1 = Bits == 6 ? _mm256_loadu_si256((const __m256i*)(b + 320 + 32 * half)) : plane0;
            for (int c = 0; c < 8; ++c) {
              const __m256i plane = (Bits == 6 && c >= 4) ? plane1 : plane0;
              w[c] = _mm256_or_si256(w[c], _mm256_and_si256(shift_bytes_avx2(plane, high_shift(Bits, c)), high_mask));
            }
          }
          __m256 s[2], z[2];
          block_values_avx2(cursor.top, f, b + code_bytes, half, s, z);
          for (int64_t r = 0; r < chunk; ++r) {
            const int64_t rg = (row0 + r) * blocks + g;
            const int64_t at = (row0 + r) * blocks * kBlock + g * kBlock;
            const int32_t* hi = reinterpret_cast<const int32_t*>(act.codes.data() + at);
            const int32_t* lo = Wide ? reinterpret_cast<const int32_t*>(act.low.data() + at) : nullptr;
            const int32_t* sums = act.half_sum.data() + rg * 2;
            const float a = act.scale[rg];
            __m256i d0, d1;
            if (Bits == 8) {
              d0 = combine_avx2<Wide>(dot_signed_avx2(w, hi, 0), Wide ? dot_signed_avx2(w, lo, 0) : _mm256_setzero_si256());
              d1 = combine_avx2<Wide>(dot_signed_avx2(w, hi, 4), Wide ? dot_signed_avx2(w, lo, 4) : _mm256_setzero_si256());
            } else {
              d0 = combine_avx2<Wide>(dot_codes_avx2(w, hi, 0), Wide ? dot_codes_avx2(w, lo, 0) : _mm256_setzero_si256());
              d1 = combine_avx2<Wide>(dot_codes_avx2(w, hi, 4), Wide ? dot_codes_avx2(w, lo, 4) : _mm256_setzero_si256());
            }
            float* out_acc = acc + r * kTile + 8 * half;
            __m256 v = _mm256_load_ps(out_acc);
            if (f.groups == 1) {
              const __m256i d = _mm256_sub_epi32(_mm256_add_epi32(d0, d1), _mm256_set1_epi32(offset * (sums[0] + sums[1])));
              v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(s[0], _mm256_set1_ps(a)), v);
              if (f.zero) v = _mm256_fmadd_ps(z[0], _mm256_set1_ps(act.scaled_sum[rg]), v);
            } else {
              d0 = _mm256_sub_epi32(d0, _mm256_set1_epi32(offset * sums[0]));
              d1 = _mm256_sub_epi32(d1, _mm256_set1_epi32(offset * sums[1]));
              v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s[0], _mm256_set1_ps(a)), v);
              v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s[1], _mm256_set1_ps(a)), v);
              if (f.zero) {
                v = _mm256_fmadd_ps(z[0], _mm256_set1_ps(a * static_cast<float>(sums[0])), v);
                v = _mm256_fmadd_ps(z[1], _mm256_set1_ps(a * static_cast<float>(sums[1])), v);
              }
            }
            _mm256_store_ps(out_acc, v);
          }
        }
      }
      store_tile(acc, chunk, t, n, nullptr, bias, out, row0);
    }
  }
}

template <bool Wide>
void grouped_dispatch(int64_t isa, const uint8_t* weight, const GroupFormat& f, const QuantizedRows& act, int64_t rows,
                      int64_t n, const float* bias, Output out, int64_t begin, int64_t end) {
  if (isa == kAvx512) {
    if (f.bits == 4) grouped_tiles_avx512<Wide, 4>(weight, f, act, rows, n, bias, out, begin, end);
    else if (f.bits == 5) grouped_tiles_avx512<Wide, 5>(weight, f, act, rows, n, bias, out, begin, end);
    else if (f.bits == 6) grouped_tiles_avx512<Wide, 6>(weight, f, act, rows, n, bias, out, begin, end);
    else grouped_tiles_avx512<Wide, 8>(weight, f, act, rows, n, bias, out, begin, end);
  } else {
    if (f.bits == 4) grouped_tiles_avx2<Wide, 4>(weight, f, act, rows, n, bias, out, begin, end);
    else if (f.bits == 5) grouped_tiles_avx2<Wide, 5>(weight, f, act, rows, n, bias, out, begin, end);
    else if (f.bits == 6) grouped_tiles_avx2<Wide, 6>(weight, f, act, rows, n, bias, out, begin, end);
    else grouped_tiles_avx2<Wide, 8>(weight, f, act, rows, n, bias, out, begin, end);
  }
}

#endif  // METAGEN_X86

int64_t detect_isa() {
#if METAGEN_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni"))
    return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return kAvx2;
#endif
  return kNone;
}

int64_t best_isa() {
  static const int64_t isa = detect_isa();
  return isa;
}

void check_isa(int64_t isa) {
  TORCH_CHECK(isa == kAvx2 || isa == kAvx512, "isa must be 1 (AVX2) or 2 (AVX-512 VNNI), got ", isa);
  TORCH_CHECK(isa <= best_isa(), "isa ", isa, " is not supported by this CPU (best: ", best_isa(), ")");
}

// x: (..., K) float32 or bf16 -> (rows, K) contiguous view + the quantized rows.
void quantize_input(const torch::Tensor& x, int64_t k, int64_t blocks, bool wide, QuantizedRows& act, int64_t& rows) {
  TORCH_CHECK(x.size(-1) == k, "x: last dimension must be in_features = ", k, ", got ", x.size(-1));
  auto flat = x.reshape({-1, k}).contiguous();
  rows = flat.size(0);
  if (flat.scalar_type() == at::kBFloat16) {
    quantize_rows(flat.data_ptr<at::BFloat16>(), rows, k, blocks, wide, act);
  } else {
    TORCH_CHECK(flat.scalar_type() == at::kFloat, "x: float32 or bfloat16, got ", flat.scalar_type());
    quantize_rows(flat.data_ptr<float>(), rows, k, blocks, wide, act);
  }
}

// (..., N) in x's dtype: float32 stays float32 (not rounded), bf16 is rounded once. With `out`
// (the caller's buffer, reused across calls): that buffer, checked to be (rows, N) in that dtype
// with unit stride along N (a column slice of a wider buffer is fine).
torch::Tensor output_like(const torch::Tensor& x, int64_t rows, int64_t n, const c10::optional<torch::Tensor>& out) {
  const auto dtype = x.scalar_type() == at::kFloat ? at::kFloat : at::kBFloat16;
  if (!out.has_value()) {
    auto sizes = x.sizes().vec();
    sizes.back() = n;
    return torch::empty(sizes, x.options().dtype(dtype));
  }
  TORCH_CHECK(out->scalar_type() == dtype, "out: must be ", dtype, " (the input's dtype), got ", out->scalar_type());
  TORCH_CHECK(out->dim() == 2 && out->size(0) == rows && out->size(1) == n && out->stride(1) == 1 &&
                  out->stride(0) >= n,
              "out: must be (rows, out_features) = (", rows, ", ", n, ") with unit stride along out_features, got ",
              out->sizes(), " with strides ", out->strides());
  return *out;
}

const float* bias_pointer(const c10::optional<torch::Tensor>& bias, int64_t n) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
              "bias: contiguous float32 of out_features = ", n, " values");
  return bias->data_ptr<float>();
}

// Tiles per task: enough work that a thread's share outweighs waking it.
int64_t grain(int64_t k, int64_t rows) { return std::max<int64_t>(1, 32768 / (kTile * k * std::min<int64_t>(rows, 4))); }

// What every matrix call shares: quantize x's rows, allocate y in x's dtype, split the column
// tiles over torch's threads; `tiles_of(act, rows, out, begin, end)` runs one range of tiles.
template <typename TilesOf>
torch::Tensor run_matmul(const torch::Tensor& x, int64_t n, int64_t k, int64_t blocks, int64_t tiles, bool wide,
                         const c10::optional<torch::Tensor>& out_buffer, TilesOf tiles_of) {
  // The caller's buffer, reused: no allocation per call once grown. Worker threads see it through
  // this reference (a thread_local named inside the parallel lambda would be each worker's own).
  static thread_local QuantizedRows buffer;
  QuantizedRows& act = buffer;
  int64_t rows = 0;
  quantize_input(x, k, blocks, wide, act, rows);
  auto out = output_like(x, rows, n, out_buffer);
  const Output o{out.data_ptr(), out.scalar_type() == at::kFloat, out.dim() == 2 ? out.stride(0) : n};
  if (rows == 0) return out;
#if METAGEN_X86
  at::parallel_for(0, tiles, grain(k, rows), [&](int64_t begin, int64_t end) { tiles_of(act, rows, o, begin, end); });
#endif
  return out;
}

// y = x · dequantize(weight)ᵀ (+ bias), weight in the int4 layout above.  x: (..., K) -> (..., N) bf16.
torch::Tensor int4_matmul(torch::Tensor x, torch::Tensor weight, int64_t n, int64_t k, c10::optional<torch::Tensor> bias,
                          int64_t isa, bool wide, c10::optional<torch::Tensor> out) {
  check_isa(isa);
  TORCH_CHECK(n % kTile == 0 && k % kBlock == 0, "int4: out_features must divide by 16 and in_features by 32, got ",
              n, " x ", k);
  const int64_t blocks = k / kBlock, tiles = n / kTile;
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous() && weight.numel() == tiles * blocks * kInt4BlockBytes,
              "int4 weight: contiguous uint8 of ", tiles * blocks * kInt4BlockBytes, " bytes");
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const float* b = bias_pointer(bias, n);
  return run_matmul(x, n, k, blocks, tiles, wide, out, [&](const QuantizedRows& act, int64_t rows, Output o, int64_t begin,
                                                       int64_t end) {
#if METAGEN_X86
    run_tiles<true>(isa, w, nullptr, act, rows, n, b, o, begin, end);
#endif
  });
}

// y = x · (q·s)ᵀ (+ bias), q in the int8 layout above (N padded to tiles, K to blocks), s: (N,) fp32.
torch::Tensor int8_matmul(torch::Tensor x, torch::Tensor weight, torch::Tensor column_scale, int64_t n, int64_t k,
                          c10::optional<torch::Tensor> bias, int64_t isa, bool wide, c10::optional<torch::Tensor> out) {
  check_isa(isa);
  const int64_t blocks = (k + kBlock - 1) / kBlock, tiles = (n + kTile - 1) / kTile;
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous() && weight.numel() == tiles * blocks * kInt8BlockBytes,
              "int8 weight: contiguous uint8 of ", tiles * blocks * kInt8BlockBytes, " bytes");
  TORCH_CHECK(column_scale.scalar_type() == at::kFloat && column_scale.is_contiguous() && column_scale.numel() == n,
              "int8 scales: contiguous float32 of out_features = ", n, " values");
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const float* s = column_scale.data_ptr<float>();
  const float* b = bias_pointer(bias, n);
  return run_matmul(x, n, k, blocks, tiles, wide, out, [&](const QuantizedRows& act, int64_t rows, Output o, int64_t begin,
                                                       int64_t end) {
#if METAGEN_X86
    run_tiles<false>(isa, w, s, act, rows, n, b, o, begin, end);
#endif
  });
}

// y = x · dequantize(weight)ᵀ (+ bias), weight in the grouped layout above (N padded to tiles).
// bits ∈ {4, 5, 6, 8}; group 16 or 32; zero: zeros follow the scales; half: fp16 scales (else fp32);
// factored: int8 per-group values under a top value per 256 features; offset o of w = (u − o)·s + z.
torch::Tensor grouped_matmul(torch::Tensor x, torch::Tensor weight, int64_t n, int64_t k, c10::optional<torch::Tensor> bias,
                             int64_t isa, bool wide, int64_t bits, int64_t group, bool zero, bool half, bool factored,
                             int64_t offset, c10::optional<torch::Tensor> out) {
  check_isa(isa);
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "grouped: bits must be 4, 5, 6 or 8, got ", bits);
  TORCH_CHECK(!factored || k % (kBlock * kSuperBlocks) == 0, "grouped: factored values need in_features divisible by ",
              kBlock * kSuperBlocks, ", got ", k);
  TORCH_CHECK(group == 16 || group == 32, "grouped: group must be 16 or 32, got ", group);
  TORCH_CHECK(k % kBlock == 0, "grouped: in_features must divide by 32, got ", k);
  TORCH_CHECK(offset >= 0 && offset < (int64_t{1} << bits), "grouped: offset must be in [0, 2^bits), got ", offset);
  TORCH_CHECK(bits != 8 || zero || offset == 128, "grouped: 8-bit codes without zeros take offset 128, got ", offset);
  GroupFormat f;
  f.bits = bits;
  f.groups = kBlock / group;
  f.zero = zero;
  f.half = half;
  f.factored = factored;
  f.offset = static_cast<int32_t>(offset);
  const int64_t blocks = k / kBlock, tiles = (n + kTile - 1) / kTile;
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous() && weight.numel() == tiles * f.tile_bytes(blocks),
              "grouped weight: contiguous uint8 of ", tiles * f.tile_bytes(blocks), " bytes");
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const float* b = bias_pointer(bias, n);
  return run_matmul(x, n, k, blocks, tiles, wide, out, [&](const QuantizedRows& act, int64_t rows, Output o, int64_t begin,
                                                       int64_t end) {
#if METAGEN_X86
    if (wide) grouped_dispatch<true>(isa, w, f, act, rows, n, b, o, begin, end);
    else grouped_dispatch<false>(isa, w, f, act, rows, n, b, o, begin, end);
#endif
  });
}

// The activation quantization of step 1, exposed for the tests: codes xq (M, Kp) int16, their
// digits hi and lo (M, Kp) int8 (lo all zero unless wide), scales a (M, blocks) float32.
std::vector<torch::Tensor> quantize_activations(torch::Tensor x, bool wide) {
  const int64_t k = x.size(-1), blocks = (k + kBlock - 1) / kBlock;
  QuantizedRows act;
  int64_t rows = 0;
  quantize_input(x, k, blocks, wide, act, rows);
  auto whole = torch::from_blob(act.whole.data(), {rows, blocks * kBlock}, torch::kInt16).clone();
  auto hi = torch::from_blob(act.codes.data(), {rows, blocks * kBlock}, torch::kInt8).clone();
  auto lo = wide ? torch::from_blob(act.low.data(), {rows, blocks * kBlock}, torch::kInt8).clone() : torch::zeros_like(hi);
  auto scales = torch::from_blob(act.scale.data(), {rows, blocks}, torch::kFloat).clone();
  return {whole, hi, lo, scales};
}

}  // namespace

// The kernels touch no Python object: each call lets other Python threads run meanwhile (the
// serve engine's HTTP thread, PEARL's drafting thread, metagen eval's workers). Arguments are
// converted before the GIL is released and the result after it is taken back.
bool gil_held() { return PyGILState_Check() != 0; }

// The core's peak for the instruction the AVX-512 kernels multiply with: `rounds` rounds of 12
// independent vpdpbusd (more chains than its latency × throughput needs), on one thread, each 64
// u8 × s8 multiply-adds. The caller times the call; the result is a checksum that keeps the
// loop from being optimized away. -1 when the CPU lacks AVX-512 VNNI.
METAGEN_AVX512 int64_t dot_peak_avx512(int64_t rounds) {
  __m512i acc[12];
  __m512i w = _mm512_set1_epi8(3);
  const __m512i x = _mm512_set1_epi8(5);
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_setzero_si512();
  for (int64_t i = 0; i < rounds; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], w, x);
    __asm__ volatile("" : "+v"(w));  // w may change: no folding across rounds
  }
  for (int j = 1; j < 12; ++j) acc[0] = _mm512_add_epi32(acc[0], acc[j]);
  return _mm512_reduce_add_epi32(acc[0]);
}

int64_t dot_peak(int64_t rounds) {
  return best_isa() == kAvx512 ? dot_peak_avx512(rounds) : -1;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("gil_held", &gil_held, "whether a kernel call holds the GIL (it does not: every call releases it)",
        release);
  m.def("best_isa", &best_isa, "2: AVX-512 VNNI, 1: AVX2 + FMA, 0: neither (the kernels cannot run)", release);
  m.def("int4_matmul", &int4_matmul, "x · int4 weightᵀ (+ bias), in x's dtype (into out when given)", py::arg("x"),
        py::arg("weight"), py::arg("n"), py::arg("k"), py::arg("bias"), py::arg("isa"), py::arg("wide"),
        py::arg("out") = py::none(), release);
  m.def("int8_matmul", &int8_matmul, "x · int8 weightᵀ (+ bias), in x's dtype (into out when given)", py::arg("x"),
        py::arg("weight"), py::arg("column_scale"), py::arg("n"), py::arg("k"), py::arg("bias"), py::arg("isa"),
        py::arg("wide"), py::arg("out") = py::none(), release);
  m.def("grouped_matmul", &grouped_matmul,
        "x · grouped (4-, 5-, 6- or 8-bit) weightᵀ (+ bias), in x's dtype (into out when given)", py::arg("x"),
        py::arg("weight"), py::arg("n"), py::arg("k"), py::arg("bias"), py::arg("isa"), py::arg("wide"),
        py::arg("bits"), py::arg("group"), py::arg("zero"), py::arg("half"), py::arg("factored"), py::arg("offset"),
        py::arg("out") = py::none(), release);
  m.def("dot_peak", &dot_peak, "12 × rounds independent vpdpbusd on this thread, 64 int8 MACs each, to be timed; -1 "
        "without AVX-512 VNNI", release);
  m.def("quantize_activations", &quantize_activations, "per-row, per-32 codes, their int8 digits and scales of x", release);
}
