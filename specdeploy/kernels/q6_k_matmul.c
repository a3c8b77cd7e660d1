/* Q6_KMatMul (domain ai.specdeploy): y [.., N] = x [.., K] @ W for weights stored as GGUF's Q6_K
 * super-blocks (256 weights: a float16 d, sixteen sub-blocks of 16 each with an int8 scale sc,
 * weights q in 0..63; w = d·sc·(q − 32)), laid out sixteen output columns at a time:
 *   q  uint8 [N/16, K/32, 384]   per block of 32: the low four bits of each weight in Q4_0MatMul's
 *                                interleave (256 bytes), then the high two bits (128 bytes): byte t
 *                                of run p (64 bytes) holds those of low-nibble byte t of runs 2p
 *                                (bits 0-1: its low nibble's weight, 2-3: its high nibble's) and
 *                                2p + 1 (bits 4-5, 6-7)
 *   sc uint8 [N/16, K/256, 288]  per super-block: the sixteen columns' d (float16, 32 bytes), then
 *                                per block of 32 their sc of weights 0..15 and of 16..31 (int8)
 * 6.5625 bits a weight, the file's own.
 *
 * Each row of x is quantized to int8 per block of 32 (ops.c), and its sums over each 16 taken
 * here. Per sub-block of 16 the integer dot of q with the row less 32 x the row's sum (exact), then
 * one float multiply-add for sixteen columns: + (d·sc)·xd·dot, d·sc exact in float32. Every row
 * runs the same instructions in the same order whatever the rows beside it: a verify row is
 * bitwise the one-row step. Forms: AVX-512 VNNI, AVX2, Arm NEON dotprod, plain C.
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
#define BLOCK_BYTES 384   /* a group's block of 32: 256 bytes of low nibbles, 128 of high bits */
#define SUB 8             /* blocks of 32 a super-block */
#define SUPER_BYTES 288   /* a group's super-block scales: d, then sc per block */
#define PREFETCH 16       /* blocks ahead */
#define ROWS_AT_ONCE 4    /* rows a wide tile of two groups holds: two sums a row fill the registers */

typedef struct {
    int64_t m, k, n;
    const uint8_t *q;
    const uint8_t *sc;
    Rows x;
    int32_t *sums;  /* [M, K/16] 32 x each 16 activations' int8 sum */
    float *y;
} Work;

static inline const uint8_t *scales_at(const Work *w, int64_t g, int64_t s) {
    return w->sc + ((size_t)g * (w->k / (QK * SUB)) + s) * SUPER_BYTES;
}

/* weight e (0..31) of column c in block b of group g, q in 0..63 (the plain C form's reader) */
static inline int weight_at(const uint8_t *block, int c, int e) {
    int byte = 64 * ((e % 16) / 4) + 4 * c + e % 4, high_nibble = e >= 16, run = (e % 16) / 4;
    int low = (block[byte] >> (4 * high_nibble)) & 0x0f;
    int bits = (block[256 + 64 * (run / 2) + 4 * c + e % 4] >> (4 * (run % 2) + 2 * high_nibble)) & 3;
    return low | bits << 4;
}

#if defined(__AVX2__)
/* the block PREFETCH ahead (6 KB) and a super-block's scales one ahead, as Q4_KMatMul asks:
 * the hardware's prefetch alone keeps too few reads in flight for a core's bandwidth */
static inline __attribute__((always_inline)) void prefetch_ahead(const Work *w, int64_t g, int64_t b) {
    const char *ahead = (const char *)(w->q + ((size_t)g * (w->k / QK) + b + PREFETCH) * BLOCK_BYTES);
    for (int line = 0; line < BLOCK_BYTES; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    if (b % SUB == 0)
        for (int line = 0; line < SUPER_BYTES; line += 64)
            _mm_prefetch((const char *)scales_at(w, g, b / SUB) + SUPER_BYTES + line, _MM_HINT_T0);
}
#endif

#if !WIDE
static void group_row(const Work *w, int64_t g, int64_t r) {
    const int64_t nb = w->k / QK;
    const uint8_t *wq = w->q + (size_t)g * nb * BLOCK_BYTES;
    const int8_t *a = w->x.xq + (size_t)r * w->k;
    const float *xd = w->x.xd + (size_t)r * nb;
    const int32_t *sums = w->sums + (size_t)r * 2 * nb;
    float *out = w->y + (size_t)r * w->n + COLUMNS * g;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256i low = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {  /* columns 8h .. 8h+7, one int32 lane each */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *block = wq + (size_t)b * BLOCK_BYTES, *s = scales_at(w, g, b / SUB);
            __m256i dot[2] = {_mm256_set1_epi32(-sums[2 * b]), _mm256_set1_epi32(-sums[2 * b + 1])};
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(block + 64 * i + 32 * h));
                __m256i bits = _mm256_loadu_si256((const __m256i *)(block + 256 + 64 * (i / 2) + 32 * h));
                bits = i % 2 ? _mm256_srli_epi16(bits, 4) : bits;  /* this run's two pairs in bits 0-3 */
                __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_and_si256(_mm256_slli_epi16(bits, 4), top));
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                             _mm256_and_si256(_mm256_slli_epi16(bits, 2), top));
                __m256i alo = _mm256_set1_epi32(four_bytes(a + b * QK + 4 * i));
                __m256i ahi = _mm256_set1_epi32(four_bytes(a + b * QK + 16 + 4 * i));
                dot[0] = _mm256_add_epi32(dot[0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), ones));
                dot[1] = _mm256_add_epi32(dot[1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), ones));
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * h))), x = _mm256_set1_ps(xd[b]);
            for (int half = 0; half < 2; half++) {
                const int8_t *sc = (const int8_t *)s + 32 + 32 * (b % SUB) + 16 * half + 8 * h;
                __m256 scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc))));
                acc = _mm256_fmadd_ps(_mm256_mul_ps(scale, x), _mm256_cvtepi32_ps(dot[half]), acc);
            }
        }
        _mm256_storeu_ps(out + 8 * h, acc);
    }
#elif ARM_DOT
    const uint8x16_t low = vdupq_n_u8(0x0f), top = vdupq_n_u8(0x30);
    float32x4_t acc[4];
    for (int h = 0; h < 4; h++) acc[h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = wq + (size_t)b * BLOCK_BYTES, *s = scales_at(w, g, b / SUB);
        int32x4_t dot[2][4];  /* [half][columns 4h .. 4h+3] */
        for (int h = 0; h < 4; h++) { dot[0][h] = vdupq_n_s32(-sums[2 * b]); dot[1][h] = vdupq_n_s32(-sums[2 * b + 1]); }
        for (int i = 0; i < 4; i++) {
            int8x16_t alo = vreinterpretq_s8_s32(vdupq_n_s32(four_bytes(a + b * QK + 4 * i)));
            int8x16_t ahi = vreinterpretq_s8_s32(vdupq_n_s32(four_bytes(a + b * QK + 16 + 4 * i)));
            for (int h = 0; h < 4; h++) {  /* q in 0..63 is its own signed byte */
                uint8x16_t q = vld1q_u8(block + 64 * i + 16 * h);
                uint8x16_t bits = vld1q_u8(block + 256 + 64 * (i / 2) + 16 * h);
                bits = i % 2 ? vshrq_n_u8(bits, 4) : bits;
                int8x16_t lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, low), vandq_u8(vshlq_n_u8(bits, 4), top)));
                int8x16_t hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), vandq_u8(vshlq_n_u8(bits, 2), top)));
                dot[0][h] = vdotq_s32(dot[0][h], lo, alo);
                dot[1][h] = vdotq_s32(dot[1][h], hi, ahi);
            }
        }
        float32x4_t x = vdupq_n_f32(xd[b]);
        for (int half = 0; half < 2; half++) {
            int8x16_t sc = vld1q_s8((const int8_t *)s + 32 + 32 * (b % SUB) + 16 * half);
            int16x8_t sc_half[2] = {vmovl_s8(vget_low_s8(sc)), vmovl_s8(vget_high_s8(sc))};
            for (int h = 0; h < 4; h++) {
                float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)s + 4 * h)));
                int16x4_t sc4 = h & 1 ? vget_high_s16(sc_half[h / 2]) : vget_low_s16(sc_half[h / 2]);
                float32x4_t scale = vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(sc4)));
                acc[h] = vfmaq_f32(acc[h], vmulq_f32(scale, x), vcvtq_f32_s32(dot[half][h]));
            }
        }
    }
    for (int h = 0; h < 4; h++) vst1q_f32(out + 4 * h, acc[h]);
#else
    for (int c = 0; c < COLUMNS; c++) {
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *block = wq + (size_t)b * BLOCK_BYTES, *s = scales_at(w, g, b / SUB);
            uint16_t dh;
            memcpy(&dh, s + 2 * c, 2);
            for (int half = 0; half < 2; half++) {
                int32_t dot = -sums[2 * b + half];
                for (int e = 16 * half; e < 16 * half + 16; e++) dot += weight_at(block, c, e) * a[b * QK + e];
                float scale = half_to_float(dh) * (float)((const int8_t *)s)[32 + 32 * (b % SUB) + 16 * half + c];
                total += scale * xd[b] * (float)dot;
            }
        }
        out[c] = total;
    }
#endif
}


#if defined(__AVX2__) && defined(__FMA__)
/* Up to four rows of group g at once in the AVX2 form: each block's weights put together once for
 * the rows, every row's sums the instructions group_row runs, in its order (bitwise its result). */
static inline __attribute__((always_inline)) void rows_avx2(const Work *w, int64_t g, int64_t r0, const int count) {
    const int64_t nb = w->k / QK;
    const uint8_t *wq = w->q + (size_t)g * nb * BLOCK_BYTES;
    const __m256i low = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int t = 0; t < count; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (h == 0) prefetch_ahead(w, g, b);
            const uint8_t *block = wq + (size_t)b * BLOCK_BYTES, *s = scales_at(w, g, b / SUB);
            __m256i dot[4][2];
            for (int t = 0; t < count; t++) {
                const int32_t *sums = w->sums + (size_t)(r0 + t) * 2 * nb;
                dot[t][0] = _mm256_set1_epi32(-sums[2 * b]), dot[t][1] = _mm256_set1_epi32(-sums[2 * b + 1]);
            }
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(block + 64 * i + 32 * h));
                __m256i bits = _mm256_loadu_si256((const __m256i *)(block + 256 + 64 * (i / 2) + 32 * h));
                bits = i % 2 ? _mm256_srli_epi16(bits, 4) : bits;
                __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_and_si256(_mm256_slli_epi16(bits, 4), top));
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                             _mm256_and_si256(_mm256_slli_epi16(bits, 2), top));
                for (int t = 0; t < count; t++) {
                    const int8_t *a = w->x.xq + (size_t)(r0 + t) * w->k + b * QK;
                    __m256i alo = _mm256_set1_epi32(four_bytes(a + 4 * i)), ahi = _mm256_set1_epi32(four_bytes(a + 16 + 4 * i));
                    dot[t][0] = _mm256_add_epi32(dot[t][0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), ones));
                    dot[t][1] = _mm256_add_epi32(dot[t][1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), ones));
                }
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * h))), scale[2];
            for (int half = 0; half < 2; half++) {
                const int8_t *sc = (const int8_t *)s + 32 + 32 * (b % SUB) + 16 * half + 8 * h;
                scale[half] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc))));
            }
            for (int t = 0; t < count; t++) {
                __m256 x = _mm256_set1_ps(w->x.xd[(r0 + t) * nb + b]);
                for (int half = 0; half < 2; half++)
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(scale[half], x), _mm256_cvtepi32_ps(dot[t][half]), acc[t]);
            }
        }
        for (int t = 0; t < count; t++) _mm256_storeu_ps(w->y + (size_t)(r0 + t) * w->n + COLUMNS * g + 8 * h, acc[t]);
    }
}
#endif

#else
/* y[r, 16g .. 16(g+groups)-1] for `groups` (1 or 2) groups and rows r0 .. r0+count-1 (count <=
 * ROWS_AT_ONCE with two groups, <= TILE with one): each block's weights put together once for the
 * tile's rows; inlined for each constant count and groups. Past four rows the sums no longer all
 * fit the registers and some live in L1, which still costs far less than a second sweep over the
 * weights (8 rows over 1,536 x 8,960: 1.1 ms against 2.2 ms in two tiles of four). */
static inline __attribute__((always_inline)) void tile_rows(const Work *w, int64_t g, int64_t r0, const int count,
                                                            const int groups) {
    const int64_t nb = w->k / QK;
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[TILE][2];
    for (int t = 0; t < count; t++)
        for (int j = 0; j < groups; j++) acc[t][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i dot[TILE][2][2];  /* [row][group][half] */
        for (int t = 0; t < count; t++)
            for (int j = 0; j < groups; j++)
                for (int half = 0; half < 2; half++)
                    dot[t][j][half] = _mm512_set1_epi32(-w->sums[(size_t)(r0 + t) * 2 * nb + 2 * b + half]);
        for (int j = 0; j < groups; j++) prefetch_ahead(w, g + j, b);
        for (int i = 0; i < 4; i++) {
            __m512i lo[2], hi[2];
            for (int j = 0; j < groups; j++) {
                const uint8_t *block = w->q + ((size_t)(g + j) * nb + b) * BLOCK_BYTES;
                __m512i q = _mm512_loadu_si512((const void *)(block + 64 * i));
                __m512i bits = _mm512_loadu_si512((const void *)(block + 256 + 64 * (i / 2)));
                bits = i % 2 ? _mm512_srli_epi16(bits, 4) : bits;
                /* (q & 0x0f) | (bits << 4 & 0x30), one ternary-logic op each: 0xD8 = c ? b : a per bit */
                lo[j] = _mm512_ternarylogic_epi32(_mm512_and_si512(q, low), _mm512_slli_epi16(bits, 4),
                                                  _mm512_set1_epi8(0x30), 0xD8);
                hi[j] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(q, 4), low),
                                                  _mm512_slli_epi16(bits, 2), _mm512_set1_epi8(0x30), 0xD8);
            }
            for (int t = 0; t < count; t++) {
                const int8_t *a = w->x.xq + (size_t)(r0 + t) * w->k + b * QK;
                __m512i alo = _mm512_set1_epi32(four_bytes(a + 4 * i)), ahi = _mm512_set1_epi32(four_bytes(a + 16 + 4 * i));
                for (int j = 0; j < groups; j++) {
                    dot[t][j][0] = _mm512_dpbusd_epi32(dot[t][j][0], lo[j], alo);
                    dot[t][j][1] = _mm512_dpbusd_epi32(dot[t][j][1], hi[j], ahi);
                }
            }
        }
        __m512 scale[2][2];
        for (int j = 0; j < groups; j++) {
            const uint8_t *s = scales_at(w, g + j, b / SUB);
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
            for (int half = 0; half < 2; half++) {
                __m128i sc = _mm_loadu_si128((const __m128i *)(s + 32 + 32 * (b % SUB) + 16 * half));
                scale[j][half] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
            }
        }
        for (int t = 0; t < count; t++) {
            __m512 x = _mm512_set1_ps(w->x.xd[(r0 + t) * nb + b]);
            for (int j = 0; j < groups; j++)
                for (int half = 0; half < 2; half++)
                    acc[t][j] = _mm512_fmadd_ps(_mm512_mul_ps(scale[j][half], x), _mm512_cvtepi32_ps(dot[t][j][half]),
                                                acc[t][j]);
        }
    }
    for (int t = 0; t < count; t++)
        for (int j = 0; j < groups; j++) _mm512_storeu_ps(w->y + (size_t)(r0 + t) * w->n + COLUMNS * (g + j), acc[t][j]);
}
#endif

/* Groups g .. g+groups-1 (1 or 2) for rows r0 .. r0+count-1. */
static void group_rows(const void *work, int64_t g, int groups, int64_t r0, int count) {
    const Work *w = work;
#if WIDE
    if (groups == 1 && count > ROWS_AT_ONCE) {  /* a verify pass's 5 to 8 rows: one sweep, sums spilled to L1 */
        switch (count) {
            case 5: tile_rows(w, g, r0, 5, 1); break;
            case 6: tile_rows(w, g, r0, 6, 1); break;
            case 7: tile_rows(w, g, r0, 7, 1); break;
            default: tile_rows(w, g, r0, 8, 1); break;
        }
        return;
    }
    for (int t = 0; t < count; t += ROWS_AT_ONCE) {
        int rows = count - t < ROWS_AT_ONCE ? count - t : ROWS_AT_ONCE;
        if (groups == 2) {
            switch (rows) {
                case 1: tile_rows(w, g, r0 + t, 1, 2); break;
                case 2: tile_rows(w, g, r0 + t, 2, 2); break;
                case 3: tile_rows(w, g, r0 + t, 3, 2); break;
                default: tile_rows(w, g, r0 + t, 4, 2); break;
            }
        } else {
            switch (rows) {
                case 1: tile_rows(w, g, r0 + t, 1, 1); break;
                case 2: tile_rows(w, g, r0 + t, 2, 1); break;
                case 3: tile_rows(w, g, r0 + t, 3, 1); break;
                default: tile_rows(w, g, r0 + t, 4, 1); break;
            }
        }
    }
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

/* 32 x the sum of each 16 of every row's int8 activations: [M, K/16] */
static int32_t *half_sums(const Rows *x, int64_t m, int64_t k) {
    int32_t *sums = malloc(sizeof(int32_t) * (size_t)(m ? m : 1) * (k / 16));
    if (!sums) return NULL;
    for (int64_t i = 0; i < m * (k / 16); i++) {
        int32_t total = 0;
        for (int e = 0; e < 16; e++) total += x->xq[16 * i + e];
        sums[i] = 32 * total;
    }
    return sums;
}

static OrtStatus *compute(const Kernel *kernel, OrtKernelContext *context) {
    const float *x;
    float *y;
    int64_t rows;
    const void *q, *sc;
    if (kernel->k % (QK * SUB)) return fail("Q6_KMatMul: K must be a multiple of 256 (Q6_K's super-block)");
    CHECK(input_and_output(kernel, context, &x, &rows, &y));
    const int64_t q_dims[] = {kernel->n / COLUMNS, kernel->k / QK, BLOCK_BYTES};
    const int64_t sc_dims[] = {kernel->n / COLUMNS, kernel->k / (QK * SUB), SUPER_BYTES};
    CHECK(weight(context, 1, q_dims, 3, &q));
    CHECK(weight(context, 2, sc_dims, 3, &sc));
    const float *bias;
    CHECK(bias_input(kernel, context, &bias));
    if (rows == 0) return NULL;
    Work w = {.m = rows, .k = kernel->k, .n = kernel->n, .q = q, .sc = sc, .y = y};
    if (quantized_rows(x, rows, kernel->k, 0, &w.x)) return ort->CreateStatus(ORT_FAIL, "Q6_KMatMul: out of memory");
    w.sums = half_sums(&w.x, rows, kernel->k);
    OrtStatus *status = w.sums ? ort->KernelContext_ParallelFor(context, run_task, group_tasks(kernel->n / COLUMNS), 0, &w)
                               : ort->CreateStatus(ORT_FAIL, "Q6_KMatMul: out of memory");
    free(w.sums);
    free_rows(&w.x);
    if (!status) add_bias(y, rows, kernel->n, bias);
    return status;
}

SpecOp q6_k_op = {.name = "Q6_KMatMul", .column_multiple = COLUMNS, .compute = compute,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8}};

/* The same product outside ONNX Runtime, one thread, for tests and the lab: 0, -1 out of memory,
 * -2 K not a multiple of 256. */
int q6_k_matmul(const float *x, int64_t m, int64_t k, const uint8_t *q, const uint8_t *sc, int64_t n, float *y) {
    if (k % (QK * SUB)) return -2;
    Work w = {.m = m, .k = k, .n = n, .q = q, .sc = sc, .y = y};
    if (quantized_rows(x, m, k, 0, &w.x)) return -1;
    w.sums = half_sums(&w.x, m, k);
    if (!w.sums) { free_rows(&w.x); return -1; }
    for (size_t t = 0; t < group_tasks(n / COLUMNS); t++) run_task(&w, t);
    free(w.sums);
    free_rows(&w.x);
    return 0;
}
