/* Int4 weights with a minimum per block of 32 (domain ai.specdeploy), y [.., N] = x [.., K] @ W,
 * laid out sixteen output columns at a time as Q4_0MatMul's (q4_0_matmul.c):
 *   qs uint8 [N/16, K/32, 256]   the nibbles q in 0..15, exactly Q4_0MatMul's interleave
 * Q4_KMatMul: GGUF's Q4_K super-blocks (256 weights: float16 d and dmin, eight blocks of 32 each
 * with a 6-bit scale sc and minimum m; w = d·sc·q − dmin·m):
 *   sc uint8 [N/16, K/256, 320]  per super-block: the sixteen columns' d (float16, bytes 0..31) and
 *                                dmin (32..63), then per block j the sixteen sc (64 + 32j ..) and
 *                                the sixteen m (80 + 32j ..), the file's 6-bit values a byte each
 * 4.625 bits a weight against the file's 4.5 (the 6-bit scales and minima unpacked to bytes).
 * Q4_1MatMul: GGUF's Q4_1 blocks (float16 d and m per 32 weights; w = d·q + m), and our own
 * minmax / GPTQ grids with float16 scales and minima:
 *   dm float16 [N/16, K/32, 32]  per block the sixteen columns' d, then their m (5 bits a weight)
 * Q5_KMatMul and Q5_1MatMul: GGUF's Q5_K and Q5_1, the same with q in 0..31 (Q5_K_M files' layer
 * weights). Their qs hold a fifth bit a weight after each block's nibbles:
 *   qs uint8 [N/16, K/32, 320]   the nibbles as above (256 bytes), then per run i of 64 nibble bytes
 *                                two 64-bit masks (bytes 256 + 16i ..): bit t of the first is the
 *                                fifth bit of byte t's low-nibble weight, of the second its high one's
 * Q5_K: 5.625 bits a weight (the file's 5.5); Q5_1: 6 (the file's).
 *
 * Each row of x is quantized to int8 per block of 32 with its block sum (ops.c). Per block the
 * integer dot of q with the row, then two float multiply-adds for sixteen columns at once:
 * + scale·xd·dot and + minimum·(xd·sum) (Q4_K: d·sc and −dmin·m, exact in float32); so the minima
 * are applied exactly, as block sums of the activations. Every row runs the same instructions in the
 * same order whatever the rows beside it: a verify row is bitwise the one-row step. Forms: AVX-512
 * VNNI, AVX2, Arm NEON dotprod, plain C.
 */
#include <stdlib.h>

#include "ops.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define WIDE 1
#else
#define WIDE 0
#endif
#define COLUMNS 16
#define GROUP_BYTES 256   /* a group's sub-block of nibbles: 16 columns x 16 bytes */
#define FIVE_BYTES 320    /* the same with its fifth bits: 256 + 4 runs x two 64-bit masks */
#define SUB 8             /* sub-blocks of 32 a super-block */
#define SUPER_BYTES 320   /* a group's super-block scales: d, dmin, then sc / m per sub-block */
#define Q4_1_HALVES 32    /* a group's block scales: d, then m (float16) */
#define PREFETCH 16       /* blocks ahead */
enum { KIND_Q4_K, KIND_Q4_1 };

typedef struct {
    int64_t m, k, n;
    int kind;     /* the scales' form: KIND_Q4_K (super-blocks) or KIND_Q4_1 (per block) */
    int five;     /* q in 0..31: the fifth bits follow each block's nibbles */
    const uint8_t *qs;
    const uint8_t *sc;
    Rows x;
    float *y;
} Work;

/* Q4_K: the scales of group g's super-block holding block b, and its block's sc (then m) bytes */
static inline const uint8_t *scales_at(const Work *w, int64_t g, int64_t b) {
    return w->sc + ((size_t)g * (w->k / (QK * SUB)) + b / SUB) * SUPER_BYTES;
}
static inline const uint8_t *block_bytes(const Work *w, int64_t g, int64_t b) {
    return scales_at(w, g, b) + 64 + 32 * (b % SUB);
}
/* group g's block b: its nibbles (then, five, its fifth bits) */
static inline const uint8_t *nibbles_at(const Work *w, int64_t g, int64_t b) {
    return w->qs + ((size_t)g * (w->k / QK) + b) * (w->five ? FIVE_BYTES : GROUP_BYTES);
}
/* the 64-bit mask of run i's fifth bits: of the low nibbles' weights (high 0) or the high ones' */
static inline uint64_t fifth_mask(const uint8_t *block, int i, int high) {
    uint64_t mask;
    memcpy(&mask, block + GROUP_BYTES + 16 * i + 8 * high, 8);
    return mask;
}
/* Q4_1: group g's block b's d (then m), float16 */
static inline const uint16_t *q4_1_at(const Work *w, int64_t g, int64_t b) {
    return (const uint16_t *)w->sc + ((size_t)g * (w->k / QK) + b) * Q4_1_HALVES;
}

#if defined(__AVX2__)
/* A core streaming one group's blocks keeps too few reads in flight to reach the memory's
 * bandwidth by the hardware's prefetch alone (10 GB/s of a core's 16.6 at one row): ask for the
 * block PREFETCH ahead (4 KB), and a super-block's scales one ahead. */
static inline __attribute__((always_inline)) void prefetch_ahead(const Work *w, int64_t g, int64_t b) {
    const char *ahead = (const char *)nibbles_at(w, g, b + PREFETCH);
    for (int line = 0; line < (w->five ? FIVE_BYTES : GROUP_BYTES); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    if (w->kind == KIND_Q4_K && b % SUB == 0)
        for (int line = 0; line < SUPER_BYTES; line += 64)
            _mm_prefetch((const char *)scales_at(w, g, b) + SUPER_BYTES + line, _MM_HINT_T0);
}
#endif

#if !WIDE
#if defined(__AVX2__) && defined(__FMA__)
/* 0x10 in each of the 32 bytes whose bit is set in the 32-bit `bits` (byte t: bit t) */
static inline __m256i fifth_bits_8(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i picked = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(picked, bit), _mm256_set1_epi8(0x10));
}
/* lo / hi of run i, columns 8h .. 8h+7, with their fifth bits where the weights have them */
static inline void add_fifth_8(const Work *w, const uint8_t *block, int i, int h, __m256i *lo, __m256i *hi) {
    if (!w->five) return;
    *lo = _mm256_or_si256(*lo, fifth_bits_8((uint32_t)(fifth_mask(block, i, 0) >> (32 * h))));
    *hi = _mm256_or_si256(*hi, fifth_bits_8((uint32_t)(fifth_mask(block, i, 1) >> (32 * h))));
}
/* columns 8h .. 8h+7 of group g's block b: its scale and its minimum (added times xd·sum) */
static inline void scales_8(const Work *w, int64_t g, int64_t b, int h, __m256 *scale, __m256 *least) {
    if (w->kind == KIND_Q4_1) {
        const uint16_t *dm = q4_1_at(w, g, b);
        *scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + 8 * h)));
        *least = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + 16 + 8 * h)));
        return;
    }
    const uint8_t *s = scales_at(w, g, b), *j = block_bytes(w, g, b);
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * h)));
    __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32 + 16 * h)));
    *scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(j + 8 * h)))));
    *least = _mm256_xor_ps(_mm256_set1_ps(-0.0f),  /* −dmin·m: a sign flip, exact */
                           _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(j + 16 + 8 * h))))));
}
#elif ARM_DOT
/* 0x10 in each of the 16 bytes whose bit is set in the low 16 of `bits` (byte t: bit t) */
static inline int8x16_t fifth_bits_16(uint64_t bits) {
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t spread = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(0x10)));
}
static inline void scales_4(const Work *w, int64_t g, int64_t b, int h, float32x4_t *scale, float32x4_t *least) {
    if (w->kind == KIND_Q4_1) {
        const uint16_t *dm = q4_1_at(w, g, b);
        *scale = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(dm + 4 * h)));
        *least = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(dm + 16 + 4 * h)));
        return;
    }
    const uint8_t *s = scales_at(w, g, b), *j = block_bytes(w, g, b);
    float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)s + 4 * h)));
    float32x4_t dmin = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(s + 32) + 4 * h)));
    uint32x4_t sc = {j[4 * h], j[4 * h + 1], j[4 * h + 2], j[4 * h + 3]};
    uint32x4_t mn = {j[16 + 4 * h], j[17 + 4 * h], j[18 + 4 * h], j[19 + 4 * h]};
    *scale = vmulq_f32(d, vcvtq_f32_u32(sc));
    *least = vnegq_f32(vmulq_f32(dmin, vcvtq_f32_u32(mn)));
}
#else
static inline void scales_1(const Work *w, int64_t g, int64_t b, int c, float *scale, float *least) {
    if (w->kind == KIND_Q4_1) {
        const uint16_t *dm = q4_1_at(w, g, b);
        *scale = half_to_float(dm[c]);
        *least = half_to_float(dm[16 + c]);
        return;
    }
    const uint8_t *s = scales_at(w, g, b), *j = block_bytes(w, g, b);
    uint16_t dh, mh;
    memcpy(&dh, s + 2 * c, 2);
    memcpy(&mh, s + 32 + 2 * c, 2);
    *scale = half_to_float(dh) * (float)j[c];
    *least = -(half_to_float(mh) * (float)j[16 + c]);
}
#endif

/* y[r, 16g .. 16g+15] for one group and one row (the AVX2, Arm and plain C forms). */
static void group_row(const Work *w, int64_t g, int64_t r) {
    const int64_t nb = w->k / QK;
    const int8_t *a = w->x.xq + (size_t)r * w->k;
    const float *xd = w->x.xd + (size_t)r * nb;
    const int32_t *xs = w->x.xs + (size_t)r * nb;
    float *out = w->y + (size_t)r * w->n + COLUMNS * g;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {  /* columns 8h .. 8h+7, one int32 lane each */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i dot = _mm256_setzero_si256();
            const uint8_t *block = nibbles_at(w, g, b);
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(block + 64 * i + 32 * h));
                __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                add_fifth_8(w, block, i, h, &lo, &hi);
                __m256i alo = _mm256_set1_epi32(four_bytes(a + b * QK + 4 * i));
                __m256i ahi = _mm256_set1_epi32(four_bytes(a + b * QK + 16 + 4 * i));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), ones));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), ones));
            }
            __m256 scale, least;
            scales_8(w, g, b, h, &scale, &least);
            acc = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(xd[b])), _mm256_cvtepi32_ps(dot), acc);
            acc = _mm256_fmadd_ps(least, _mm256_set1_ps(xd[b] * (float)xs[b]), acc);
        }
        _mm256_storeu_ps(out + 8 * h, acc);
    }
#elif ARM_DOT
    const uint8x16_t low = vdupq_n_u8(0x0f);
    float32x4_t acc[4];
    for (int h = 0; h < 4; h++) acc[h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t dot[4];  /* columns 4h .. 4h+3, one lane each */
        for (int h = 0; h < 4; h++) dot[h] = vdupq_n_s32(0);
        const uint8_t *block = nibbles_at(w, g, b);
        for (int i = 0; i < 4; i++) {
            int8x16_t alo = vreinterpretq_s8_s32(vdupq_n_s32(four_bytes(a + b * QK + 4 * i)));
            int8x16_t ahi = vreinterpretq_s8_s32(vdupq_n_s32(four_bytes(a + b * QK + 16 + 4 * i)));
            for (int h = 0; h < 4; h++) {  /* q in 0..15 is its own signed byte */
                uint8x16_t q = vld1q_u8(block + 64 * i + 16 * h);
                int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(q, low)), hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
                if (w->five) {  /* q in 0..31, still its own signed byte */
                    lo = vorrq_s8(lo, fifth_bits_16(fifth_mask(block, i, 0) >> (16 * h)));
                    hi = vorrq_s8(hi, fifth_bits_16(fifth_mask(block, i, 1) >> (16 * h)));
                }
                dot[h] = vdotq_s32(vdotq_s32(dot[h], lo, alo), hi, ahi);
            }
        }
        float32x4_t x = vdupq_n_f32(xd[b]), sum = vdupq_n_f32(xd[b] * (float)xs[b]);
        for (int h = 0; h < 4; h++) {
            float32x4_t scale, least;
            scales_4(w, g, b, h, &scale, &least);
            acc[h] = vfmaq_f32(acc[h], vmulq_f32(scale, x), vcvtq_f32_s32(dot[h]));
            acc[h] = vfmaq_f32(acc[h], least, sum);
        }
    }
    for (int h = 0; h < 4; h++) vst1q_f32(out + 4 * h, acc[h]);
#else
    for (int c = 0; c < COLUMNS; c++) {
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            int32_t dot = 0;
            for (int e = 0; e < 16; e++) {
                const uint8_t *block = nibbles_at(w, g, b);
                int t = 4 * c + e % 4, lo = block[64 * (e / 4) + t] & 0x0f, hi = block[64 * (e / 4) + t] >> 4;
                if (w->five) {
                    lo |= (int)(fifth_mask(block, e / 4, 0) >> t & 1) << 4;
                    hi |= (int)(fifth_mask(block, e / 4, 1) >> t & 1) << 4;
                }
                dot += lo * a[b * QK + e] + hi * a[b * QK + e + 16];
            }
            float scale, least;
            scales_1(w, g, b, c, &scale, &least);
            total += scale * xd[b] * (float)dot;
            total += least * (xd[b] * (float)xs[b]);
        }
        out[c] = total;
    }
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
/* Up to four rows of group g at once in the AVX2 form: each block's nibbles unpacked once for the
 * rows, every row's sums the instructions group_row runs, in its order (bitwise its result). */
static inline __attribute__((always_inline)) void rows_avx2(const Work *w, int64_t g, int64_t r0, const int count) {
    const int64_t nb = w->k / QK;
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int t = 0; t < count; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (h == 0) prefetch_ahead(w, g, b);
            __m256i dot[4];
            for (int t = 0; t < count; t++) dot[t] = _mm256_setzero_si256();
            const uint8_t *block = nibbles_at(w, g, b);
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(block + 64 * i + 32 * h));
                __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                add_fifth_8(w, block, i, h, &lo, &hi);
                for (int t = 0; t < count; t++) {
                    const int8_t *a = w->x.xq + (size_t)(r0 + t) * w->k + b * QK;
                    __m256i alo = _mm256_set1_epi32(four_bytes(a + 4 * i)), ahi = _mm256_set1_epi32(four_bytes(a + 16 + 4 * i));
                    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), ones));
                    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), ones));
                }
            }
            __m256 scale, least;
            scales_8(w, g, b, h, &scale, &least);
            for (int t = 0; t < count; t++) {
                const float xd = w->x.xd[(r0 + t) * nb + b];
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(xd)), _mm256_cvtepi32_ps(dot[t]), acc[t]);
                acc[t] = _mm256_fmadd_ps(least, _mm256_set1_ps(xd * (float)w->x.xs[(r0 + t) * nb + b]), acc[t]);
            }
        }
        for (int t = 0; t < count; t++) _mm256_storeu_ps(w->y + (size_t)(r0 + t) * w->n + COLUMNS * g + 8 * h, acc[t]);
    }
}
#endif

#else
/* group g's block b: its sixteen scales and minima (added times xd·sum) */
static inline __attribute__((always_inline)) void scales_16(const Work *w, int64_t g, int64_t b, __m512 *scale,
                                                            __m512 *least) {
    if (w->kind == KIND_Q4_1) {
        const uint16_t *dm = q4_1_at(w, g, b);
        *scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dm));
        *least = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dm + 16)));
        return;
    }
    const uint8_t *s = scales_at(w, g, b), *j = block_bytes(w, g, b);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
    __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32)));
    *scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)j))));
    *least = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_set1_epi32((int)0x80000000),  /* −dmin·m: a sign flip */
        _mm512_castps_si512(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(j + 16))))))));
}

/* y[r, 16g .. 16(g+groups)-1] for `groups` (1 or 2) groups and rows r0 .. r0+count-1, as
 * Q4_0MatMul's tile: each block's nibbles unpacked once for the tile's rows; inlined for each
 * constant count and groups so that the sums stay in registers. */
static inline __attribute__((always_inline)) void tile_rows(const Work *w, int64_t g, int64_t r0, const int count,
                                                            const int groups, const int five) {
    const int64_t nb = w->k / QK;
    const __m512i low = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(16);
    __m512 acc[TILE][2];
    for (int t = 0; t < count; t++)
        for (int j = 0; j < groups; j++) acc[t][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i dot[TILE][2];
        for (int t = 0; t < count; t++)
            for (int j = 0; j < groups; j++) dot[t][j] = _mm512_setzero_si512();
        for (int j = 0; j < groups; j++) prefetch_ahead(w, g + j, b);
        for (int i = 0; i < 4; i++) {  /* bytes 4i .. 4i+3 of every column: weights 4i.. and 16+4i.. */
            __m512i lo[2], hi[2];
            for (int j = 0; j < groups; j++) {
                const uint8_t *block = nibbles_at(w, g + j, b);
                __m512i q = _mm512_loadu_si512((const void *)(block + 64 * i));
                lo[j] = _mm512_and_si512(q, low);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
                if (five) {  /* + 16 where the fifth bit is set: one masked add each */
                    lo[j] = _mm512_mask_add_epi8(lo[j], fifth_mask(block, i, 0), lo[j], sixteen);
                    hi[j] = _mm512_mask_add_epi8(hi[j], fifth_mask(block, i, 1), hi[j], sixteen);
                }
            }
            for (int t = 0; t < count; t++) {
                const int8_t *a = w->x.xq + (size_t)(r0 + t) * w->k + b * QK;
                __m512i alo = _mm512_set1_epi32(four_bytes(a + 4 * i)), ahi = _mm512_set1_epi32(four_bytes(a + 16 + 4 * i));
                for (int j = 0; j < groups; j++)
                    dot[t][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[t][j], lo[j], alo), hi[j], ahi);
            }
        }
        __m512 scale[2], least[2];
        for (int j = 0; j < groups; j++) scales_16(w, g + j, b, &scale[j], &least[j]);
        for (int t = 0; t < count; t++) {
            const float xd = w->x.xd[(r0 + t) * nb + b];
            __m512 x = _mm512_set1_ps(xd), sum = _mm512_set1_ps(xd * (float)w->x.xs[(r0 + t) * nb + b]);
            for (int j = 0; j < groups; j++) {
                acc[t][j] = _mm512_fmadd_ps(_mm512_mul_ps(scale[j], x), _mm512_cvtepi32_ps(dot[t][j]), acc[t][j]);
                acc[t][j] = _mm512_fmadd_ps(least[j], sum, acc[t][j]);
            }
        }
    }
    for (int t = 0; t < count; t++)
        for (int j = 0; j < groups; j++) _mm512_storeu_ps(w->y + (size_t)(r0 + t) * w->n + COLUMNS * (g + j), acc[t][j]);
}
#endif

#if WIDE
/* the tiles for groups g .. g+groups-1 (1 or 2) and rows r0 .. r0+count-1, `five` a constant */
static inline __attribute__((always_inline)) void wide_rows(const Work *w, int64_t g, int groups, int64_t r0,
                                                            int count, const int five) {
    if (groups == 2) {  /* count <= 4 */
        switch (count) {
            case 1: tile_rows(w, g, r0, 1, 2, five); break;
            case 2: tile_rows(w, g, r0, 2, 2, five); break;
            case 3: tile_rows(w, g, r0, 3, 2, five); break;
            default: tile_rows(w, g, r0, 4, 2, five); break;
        }
        return;
    }
    switch (count) {
        case 1: tile_rows(w, g, r0, 1, 1, five); break;
        case 2: tile_rows(w, g, r0, 2, 1, five); break;
        case 3: tile_rows(w, g, r0, 3, 1, five); break;
        case 4: tile_rows(w, g, r0, 4, 1, five); break;
        case 5: tile_rows(w, g, r0, 5, 1, five); break;
        case 6: tile_rows(w, g, r0, 6, 1, five); break;
        case 7: tile_rows(w, g, r0, 7, 1, five); break;
        default: tile_rows(w, g, r0, 8, 1, five); break;
    }
}
#endif

/* Groups g .. g+groups-1 (1 or 2) for rows r0 .. r0+count-1. */
static void group_rows(const void *work, int64_t g, int groups, int64_t r0, int count) {
    const Work *w = work;
#if WIDE
    if (w->five)
        wide_rows(w, g, groups, r0, count, 1);
    else
        wide_rows(w, g, groups, r0, count, 0);
#elif defined(__AVX2__) && defined(__FMA__)
    for (int j = 0; j < groups; j++)
        for (int t = 0; t < count; t += 4) {
            switch (count - t < 4 ? count - t : 4) {
                case 1: rows_avx2(w, g + j, r0 + t, 1); break;
                case 2: rows_avx2(w, g + j, r0 + t, 2); break;
                case 3: rows_avx2(w, g + j, r0 + t, 3); break;
                default: rows_avx2(w, g + j, r0 + t, 4); break;
            }
        }
#else
    for (int j = 0; j < groups; j++)
        for (int t = 0; t < count; t++) group_row(w, g + j, r0 + t);
#endif
}

static void run_task(void *data, size_t task) {
    const Work *w = (const Work *)data;
    group_task(w, w->m, w->n / COLUMNS, task, group_rows);
}

/* the shape of the scales input: Q4_K's per super-block, Q4_1's per block */
static void scale_dims(int kind, int64_t k, int64_t n, int64_t dims[3]) {
    dims[0] = n / COLUMNS;
    dims[1] = kind == KIND_Q4_K ? k / (QK * SUB) : k / QK;
    dims[2] = kind == KIND_Q4_K ? SUPER_BYTES : Q4_1_HALVES;
}

static OrtStatus *compute_kind(const Kernel *kernel, OrtKernelContext *context, int kind, int five) {
    const float *x;
    float *y;
    int64_t rows, sc_dims[3];
    const void *qs, *sc;
    if (kind == KIND_Q4_K && kernel->k % (QK * SUB))
        return fail(five ? "Q5_KMatMul: K must be a multiple of 256 (Q5_K's super-block)"
                         : "Q4_KMatMul: K must be a multiple of 256 (Q4_K's super-block)");
    CHECK(input_and_output(kernel, context, &x, &rows, &y));
    const int64_t qs_dims[] = {kernel->n / COLUMNS, kernel->k / QK, five ? FIVE_BYTES : GROUP_BYTES};
    scale_dims(kind, kernel->k, kernel->n, sc_dims);
    CHECK(weight(context, 1, qs_dims, 3, &qs));
    CHECK(weight(context, 2, sc_dims, 3, &sc));
    const float *bias;
    CHECK(bias_input(kernel, context, &bias));
    if (rows == 0) return NULL;
    Work w = {.m = rows, .k = kernel->k, .n = kernel->n, .kind = kind, .five = five, .qs = qs, .sc = sc, .y = y};
    if (quantized_rows(x, rows, kernel->k, 1, &w.x)) return ort->CreateStatus(ORT_FAIL, "specdeploy operator: out of memory");
    OrtStatus *status = ort->KernelContext_ParallelFor(context, run_task, group_tasks(kernel->n / COLUMNS), 0, &w);
    free_rows(&w.x);
    if (!status) add_bias(y, rows, kernel->n, bias);
    return status;
}

static OrtStatus *compute_q4_k(const Kernel *kernel, OrtKernelContext *context) {
    return compute_kind(kernel, context, KIND_Q4_K, 0);
}
static OrtStatus *compute_q4_1(const Kernel *kernel, OrtKernelContext *context) {
    return compute_kind(kernel, context, KIND_Q4_1, 0);
}
static OrtStatus *compute_q5_k(const Kernel *kernel, OrtKernelContext *context) {
    return compute_kind(kernel, context, KIND_Q4_K, 1);
}
static OrtStatus *compute_q5_1(const Kernel *kernel, OrtKernelContext *context) {
    return compute_kind(kernel, context, KIND_Q4_1, 1);
}

SpecOp q4_k_op = {.name = "Q4_KMatMul", .column_multiple = COLUMNS, .compute = compute_q4_k,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8}};
SpecOp q4_1_op = {.name = "Q4_1MatMul", .column_multiple = COLUMNS, .compute = compute_q4_1,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16}};
SpecOp q5_k_op = {.name = "Q5_KMatMul", .column_multiple = COLUMNS, .compute = compute_q5_k,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8}};
SpecOp q5_1_op = {.name = "Q5_1MatMul", .column_multiple = COLUMNS, .compute = compute_q5_1,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16}};

/* The same products outside ONNX Runtime, one thread, for tests and the lab: 0, -1 out of memory,
 * -2 K not a multiple of 256 (Q4_K, Q5_K). */
static int product(int kind, int five, const float *x, int64_t m, int64_t k, const uint8_t *qs, const void *sc,
                   int64_t n, float *y) {
    if (kind == KIND_Q4_K && k % (QK * SUB)) return -2;
    Work w = {.m = m, .k = k, .n = n, .kind = kind, .five = five, .qs = qs, .sc = sc, .y = y};
    if (quantized_rows(x, m, k, 1, &w.x)) return -1;
    for (size_t t = 0; t < group_tasks(n / COLUMNS); t++) run_task(&w, t);
    free_rows(&w.x);
    return 0;
}

int q4_k_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint8_t *sc, int64_t n, float *y) {
    return product(KIND_Q4_K, 0, x, m, k, qs, sc, n, y);
}
int q4_1_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *dm, int64_t n, float *y) {
    return product(KIND_Q4_1, 0, x, m, k, qs, dm, n, y);
}
int q5_k_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint8_t *sc, int64_t n, float *y) {
    return product(KIND_Q4_K, 1, x, m, k, qs, sc, n, y);
}
int q5_1_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *dm, int64_t n, float *y) {
    return product(KIND_Q4_1, 1, x, m, k, qs, dm, n, y);
}
