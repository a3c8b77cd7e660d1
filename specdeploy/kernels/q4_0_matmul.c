/* Q4_0MatMul (domain ai.specdeploy): y [.., N] = x [.., K] @ W for int4 weights stored as GGUF's
 * Q4_0 blocks (32 weights: a float16 scale and 16 bytes of q + 8; 4.5 bits a weight), laid out
 * sixteen output columns at a time so that one 64-byte read holds four bytes of each column's block:
 *   qs uint8   [N/16, K/32, 256]  column 16g+c's bytes 4i .. 4i+3 of block b at [g, b, 64i + 4c ..];
 *                                 byte j holds weight j (low nibble) and weight j+16 (high nibble)
 *   d  float16 [N/16, K/32, 16]   the sixteen columns' scales
 * No packed copy: 4.5 bits a weight read per token against MatMulNBits' 6.
 *
 * Each row of x is quantized to int8 in blocks of 32 (one float scale a block) and dotted with the
 * unsigned nibbles; the zero point comes off as 8 x the block's int8 sum. Each integer lane holds
 * one column's whole block dot, so the float work (scale, convert, multiply-add) is one
 * instruction a block for sixteen columns. Every row runs the same instructions in the same order
 * whatever the rows beside it, so a verify row is bitwise the one-row step (the bundle's row check
 * asserts it). Forms: AVX-512 VNNI, AVX2, Arm NEON with dotprod (signed dots of q - 8: the same
 * integers), plain C; the build takes this machine's (-march=native), so rows agree within one
 * machine, as every kernel's do.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define WIDE 1  /* AVX-512 VNNI: tiles of rows and column groups */
#else
#define WIDE 0  /* AVX2 (rows_avx2, four rows a sweep) or plain C and Arm (group_row, a row at a time) */
#endif
#define COLUMNS 16         /* output columns a group: one int32 lane each */
#define GROUP_BYTES 256    /* a group's block: 16 columns x 16 bytes */
#define PREFETCH 16        /* blocks ahead */

typedef struct {
    int64_t m, k, n;
    const uint8_t *qs;
    const uint16_t *d;
    const int8_t *xq;
    const float *xd;
    const int32_t *xs;
    float *y;
} Work;

#if !WIDE
/* y[r, 16g .. 16g+15] for one group and one row (the AVX2, Arm and plain C forms). */
static void group_row(const Work *w, int64_t g, int64_t r) {
    const int64_t nb = w->k / QK;
    const uint8_t *wq = w->qs + (size_t)g * nb * GROUP_BYTES;
    const uint16_t *wd = w->d + (size_t)g * nb * COLUMNS;
    const int8_t *a = w->xq + (size_t)r * w->k;
    const float *xd = w->xd + (size_t)r * nb;
    const int32_t *xs = w->xs + (size_t)r * nb;
    float *out = w->y + (size_t)r * w->n + COLUMNS * g;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {  /* columns 8h .. 8h+7, one int32 lane each */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i dot = _mm256_set1_epi32(-xs[b]);
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(wq + (size_t)b * GROUP_BYTES + 64 * i + 32 * h));
                __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                __m256i alo = _mm256_set1_epi32(four_bytes(a + b * QK + 4 * i));
                __m256i ahi = _mm256_set1_epi32(four_bytes(a + b * QK + 16 + 4 * i));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), ones));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), ones));
            }
            __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + b * COLUMNS + 8 * h))),
                                         _mm256_set1_ps(xd[b]));
            acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc);
        }
        _mm256_storeu_ps(out + 8 * h, acc);
    }
#elif ARM_DOT
    const uint8x16_t low = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc[4];
    for (int h = 0; h < 4; h++) acc[h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t dot[4];  /* columns 4h .. 4h+3, one lane each */
        for (int h = 0; h < 4; h++) dot[h] = vdupq_n_s32(0);
        for (int i = 0; i < 4; i++) {
            int8x16_t alo = vreinterpretq_s8_s32(vdupq_n_s32(four_bytes(a + b * QK + 4 * i)));
            int8x16_t ahi = vreinterpretq_s8_s32(vdupq_n_s32(four_bytes(a + b * QK + 16 + 4 * i)));
            for (int h = 0; h < 4; h++) {
                uint8x16_t q = vld1q_u8(wq + (size_t)b * GROUP_BYTES + 64 * i + 16 * h);
                int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, low)), eight);
                int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
                dot[h] = vdotq_s32(vdotq_s32(dot[h], lo, alo), hi, ahi);
            }
        }
        float32x4_t x = vdupq_n_f32(xd[b]);
        for (int h = 0; h < 4; h++) {
            float32x4_t scale = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(wd + b * COLUMNS + 4 * h))), x);
            acc[h] = vfmaq_f32(acc[h], scale, vcvtq_f32_s32(dot[h]));
        }
    }
    (void)xs;  /* q - 8 carries the zero point */
    for (int h = 0; h < 4; h++) vst1q_f32(out + 4 * h, acc[h]);
#else
    for (int c = 0; c < COLUMNS; c++) {
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            int32_t dot = -xs[b];
            for (int j = 0; j < 16; j++) {
                uint8_t q = wq[(size_t)b * GROUP_BYTES + 64 * (j / 4) + 4 * c + j % 4];
                dot += (q & 0x0f) * a[b * QK + j] + (q >> 4) * a[b * QK + j + 16];
            }
            total += half_to_float(wd[b * COLUMNS + c]) * xd[b] * (float)dot;
        }
        out[c] = total;
    }
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
/* Up to four rows of group g at once in the AVX2 form: each block's nibbles unpacked once for the
 * rows, read ahead as the wide tiles are, every row's sums the instructions group_row runs, in its
 * order (bitwise its result). */
static inline __attribute__((always_inline)) void rows_avx2(const Work *w, int64_t g, int64_t r0, const int count) {
    const int64_t nb = w->k / QK;
    const uint8_t *wq = w->qs + (size_t)g * nb * GROUP_BYTES;
    const uint16_t *wd = w->d + (size_t)g * nb * COLUMNS;
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int t = 0; t < count; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (h == 0)
                for (int line = 0; line < GROUP_BYTES; line += 64)
                    _mm_prefetch((const char *)wq + (size_t)(b + PREFETCH) * GROUP_BYTES + line, _MM_HINT_T0);
            __m256i dot[4];
            for (int t = 0; t < count; t++) dot[t] = _mm256_set1_epi32(-w->xs[(r0 + t) * nb + b]);
            for (int i = 0; i < 4; i++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(wq + (size_t)b * GROUP_BYTES + 64 * i + 32 * h));
                __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                for (int t = 0; t < count; t++) {
                    const int8_t *a = w->xq + (size_t)(r0 + t) * w->k + b * QK;
                    __m256i alo = _mm256_set1_epi32(four_bytes(a + 4 * i)), ahi = _mm256_set1_epi32(four_bytes(a + 16 + 4 * i));
                    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo), ones));
                    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi), ones));
                }
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + b * COLUMNS + 8 * h)));
            for (int t = 0; t < count; t++) {
                __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(w->xd[(r0 + t) * nb + b]));
                acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot[t]), acc[t]);
            }
        }
        for (int t = 0; t < count; t++) _mm256_storeu_ps(w->y + (size_t)(r0 + t) * w->n + COLUMNS * g + 8 * h, acc[t]);
    }
}
#endif

#else
/* y[r, 16g .. 16(g+groups)-1] for `groups` (1 or 2) groups and rows r0 .. r0+count-1 (count <=
 * TILE, or <= 4 with two groups): each block's weights are loaded and unpacked once for the tile's
 * rows, and each (row, column) sum runs the same instructions in the same order as alone, so a
 * row's result does not depend on the tile. Inlined for each constant count and groups, so that
 * the tile's sums stay in registers. */
static inline __attribute__((always_inline)) void tile_rows(const Work *w, int64_t g, int64_t r0, const int count,
                                                            const int groups) {
    const int64_t nb = w->k / QK;
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[TILE][2];
    for (int t = 0; t < count; t++)
        for (int j = 0; j < groups; j++) acc[t][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i dot[TILE][2];
        for (int t = 0; t < count; t++)
            for (int j = 0; j < groups; j++) dot[t][j] = _mm512_set1_epi32(-w->xs[(r0 + t) * nb + b]);
        for (int j = 0; j < groups; j++)  /* as Q4_KMatMul: the block PREFETCH ahead, for a core's bandwidth */
            for (int line = 0; line < GROUP_BYTES; line += 64)
                _mm_prefetch((const char *)w->qs + ((size_t)(g + j) * nb + b + PREFETCH) * GROUP_BYTES + line, _MM_HINT_T0);
        for (int i = 0; i < 4; i++) {  /* bytes 4i .. 4i+3 of every column: weights 4i.. and 16+4i.. */
            __m512i lo[2], hi[2];
            for (int j = 0; j < groups; j++) {
                __m512i q = _mm512_loadu_si512((const void *)(w->qs + ((size_t)(g + j) * nb + b) * GROUP_BYTES + 64 * i));
                lo[j] = _mm512_and_si512(q, low);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
            }
            for (int t = 0; t < count; t++) {
                const int8_t *a = w->xq + (size_t)(r0 + t) * w->k + b * QK;
                __m512i alo = _mm512_set1_epi32(four_bytes(a + 4 * i)), ahi = _mm512_set1_epi32(four_bytes(a + 16 + 4 * i));
                for (int j = 0; j < groups; j++)
                    dot[t][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[t][j], lo[j], alo), hi[j], ahi);
            }
        }
        __m512 scale[2];
        for (int j = 0; j < groups; j++)
            scale[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + ((size_t)(g + j) * nb + b) * COLUMNS)));
        for (int t = 0; t < count; t++) {
            __m512 xd = _mm512_set1_ps(w->xd[(r0 + t) * nb + b]);
            for (int j = 0; j < groups; j++)
                acc[t][j] = _mm512_fmadd_ps(_mm512_mul_ps(scale[j], xd), _mm512_cvtepi32_ps(dot[t][j]), acc[t][j]);
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
    if (groups == 2) {  /* count <= 4 */
        switch (count) {
            case 1: tile_rows(w, g, r0, 1, 2); break;
            case 2: tile_rows(w, g, r0, 2, 2); break;
            case 3: tile_rows(w, g, r0, 3, 2); break;
            default: tile_rows(w, g, r0, 4, 2); break;
        }
        return;
    }
    switch (count) {
        case 1: tile_rows(w, g, r0, 1, 1); break;
        case 2: tile_rows(w, g, r0, 2, 1); break;
        case 3: tile_rows(w, g, r0, 3, 1); break;
        case 4: tile_rows(w, g, r0, 4, 1); break;
        case 5: tile_rows(w, g, r0, 5, 1); break;
        case 6: tile_rows(w, g, r0, 6, 1); break;
        case 7: tile_rows(w, g, r0, 7, 1); break;
        default: tile_rows(w, g, r0, 8, 1); break;
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

static OrtStatus *compute(const Kernel *kernel, OrtKernelContext *context) {
    const float *x;
    float *y;
    int64_t rows, nb = kernel->k / QK;
    const void *qs, *d;
    CHECK(input_and_output(kernel, context, &x, &rows, &y));
    const int64_t qs_dims[] = {kernel->n / COLUMNS, nb, GROUP_BYTES}, d_dims[] = {kernel->n / COLUMNS, nb, COLUMNS};
    CHECK(weight(context, 1, qs_dims, 3, &qs));
    CHECK(weight(context, 2, d_dims, 3, &d));
    const float *bias;
    CHECK(bias_input(kernel, context, &bias));
    if (rows == 0) return NULL;
    Rows q;
    if (quantized_rows(x, rows, kernel->k, 8, &q)) return ort->CreateStatus(ORT_FAIL, "Q4_0MatMul: out of memory");
    Work w = {.m = rows, .k = kernel->k, .n = kernel->n, .qs = qs, .d = d, .xq = q.xq, .xd = q.xd, .xs = q.xs, .y = y};
    OrtStatus *status = ort->KernelContext_ParallelFor(context, run_task, group_tasks(kernel->n / COLUMNS), 0, &w);
    free_rows(&q);
    if (!status) add_bias(y, rows, kernel->n, bias);
    return status;
}

SpecOp q4_0_op = {.name = "Q4_0MatMul", .column_multiple = COLUMNS, .compute = compute,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16}};

/* The same product outside ONNX Runtime, one thread, for tests and the lab: 0, or -1 out of memory. */
int q4_0_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *d, int64_t n, float *y) {
    Rows q;
    if (quantized_rows(x, m, k, 8, &q)) return -1;
    Work w = {.m = m, .k = k, .n = n, .qs = qs, .d = d, .xq = q.xq, .xd = q.xd, .xs = q.xs, .y = y};
    for (size_t t = 0; t < group_tasks(n / COLUMNS); t++) run_task(&w, t);
    free_rows(&q);
    return 0;
}
