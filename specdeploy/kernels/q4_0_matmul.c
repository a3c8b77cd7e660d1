/* Q4_0MatMul (domain ai.specdeploy): y [.., N] = x [.., K] @ W for int4 weights stored as GGUF's
 * Q4_0 blocks (32 weights: a float16 scale and 16 bytes of q + 8; 4.5 bits a weight), laid out four
 * output columns at a time so that one 64-byte read holds a block of four columns:
 *   qs uint8   [N/4, K/32, 64]  column 4g+c's 16 bytes of block b at [g, b, 16c .. 16c+15];
 *                               byte j holds weight j (low nibble) and weight j+16 (high nibble)
 *   d  float16 [N/4, K/32, 4]   the four columns' scales
 * No packed copy: 4.5 bits a weight read per token against MatMulNBits' 6.
 *
 * Each row of x is quantized to int8 in blocks of 32 (one float scale a block) and dotted with the
 * unsigned nibbles; the zero point comes off as 8 x the block's int8 sum. Every row runs the same
 * instructions in the same order whatever the rows beside it, so a verify row is bitwise the
 * one-row step (the bundle's row check asserts it). Forms: AVX-512 VNNI, AVX2, plain C; the build
 * takes this machine's (-march=native), so rows agree within one machine, as every kernel's do.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define WIDE 1  /* AVX-512 VNNI: group_rows */
#else
#define WIDE 0  /* AVX2 or plain C: group_row, a row at a time */
#endif
#define GROUPS_PER_TASK 8  /* 32 columns a task of ONNX Runtime's pool */


#if !WIDE
static float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) { bits = sign; } else {
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) { bits = sign | 0x7f800000 | (man << 13); }
    else { bits = sign | ((exp + 127 - 15) << 23) | (man << 13); }
    float f; memcpy(&f, &bits, 4); return f;
#endif
}

#endif

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
/* y[r, 4g .. 4g+3] for one group of four columns and one row (the AVX2 and plain C forms). */
static void group_row(const Work *w, int64_t g, int64_t r) {
    const int64_t nb = w->k / QK;
    const uint8_t *wq = w->qs + (size_t)g * nb * 64;
    const uint16_t *wd = w->d + (size_t)g * nb * 4;
    const int8_t *a = w->xq + (size_t)r * w->k;
    const float *xd = w->xd + (size_t)r * nb;
    const int32_t *xs = w->xs + (size_t)r * nb;
    float *out = w->y + (size_t)r * w->n + 4 * g;
#if defined(__AVX2__) && defined(__FMA__)
    const __m128i low = _mm_set1_epi8(0x0f);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        __m256i act = _mm256_loadu_si256((const __m256i *)(a + b * QK));
        __m256i start = _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, -xs[b]);
        for (int c = 0; c < 4; c++) {
            __m128i raw = _mm_loadu_si128((const __m128i *)(wq + (size_t)b * 64 + 16 * c));
            __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
            __m256i dot = _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(q, act),
                                                                     _mm256_set1_epi16(1)));
            float scale = half_to_float(wd[b * 4 + c]) * xd[b];
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(dot), acc[c]);
        }
    }
    for (int c = 0; c < 4; c++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[c]), _mm256_extractf128_ps(acc[c], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[c] = _mm_cvtss_f32(s);
    }
#else
    for (int c = 0; c < 4; c++) {
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *q = wq + (size_t)b * 64 + 16 * c;
            int32_t dot = -xs[b];
            for (int j = 0; j < 16; j++) dot += (q[j] & 0x0f) * a[b * QK + j] + (q[j] >> 4) * a[b * QK + j + 16];
            total += half_to_float(wd[b * 4 + c]) * xd[b] * (float)dot;
        }
        out[c] = total;
    }
#endif
}

#endif

/* y[r, 4g .. 4g+4*groups-1] for `groups` (1 or 2) groups of four columns and rows r0 .. r0+count-1
 * (count <= TILE, or <= 4 with two groups): each block's weights are loaded and unpacked once for the tile's rows, each
 * row's activations broadcast once for its groups, and each (row, column) sum runs the same
 * instructions in the same order as alone, so a row's result does not depend on the tile. */
#define TILE 8  /* rows a tile holds: a verify pass's rows in one sweep over the weights */
#if WIDE
/* Inlined for each constant count and groups, so that the tile's sums stay in registers. */
static inline __attribute__((always_inline)) void tile_rows(const Work *w, int64_t g, int64_t r0, const int count,
                                                            const int groups) {
    const int64_t nb = w->k / QK;
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc0[TILE][2], acc1[TILE][2];
    for (int t = 0; t < count; t++)
        for (int j = 0; j < groups; j++) acc0[t][j] = acc1[t][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i lo[2], hi[2];
        __m512 s16w[2];
        for (int j = 0; j < groups; j++) {
            __m512i q = _mm512_loadu_si512((const void *)(w->qs + ((size_t)(g + j) * nb + b) * 64));
            lo[j] = _mm512_and_si512(q, low);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
            s16w[j] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(
                _mm_loadl_epi64((const __m128i *)(w->d + ((size_t)(g + j) * nb + b) * 4)))));  /* column c's in lanes 4c.. */
        }
        for (int t = 0; t < count; t++) {
            const int64_t r = r0 + t;
            const int8_t *a = w->xq + (size_t)r * w->k + b * QK;
            __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a));
            __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + 16)));
            __m512i start = _mm512_maskz_set1_epi32(0x1111, -w->xs[r * nb + b]);  /* once per column */
            __m512 xd = _mm512_set1_ps(w->xd[r * nb + b]);
            for (int j = 0; j < groups; j++) {
                __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, lo[j], alo), hi[j], ahi);
                __m512 s16 = _mm512_mul_ps(s16w[j], xd);
                if (b & 1) acc1[t][j] = _mm512_fmadd_ps(s16, _mm512_cvtepi32_ps(dot), acc1[t][j]);
                else acc0[t][j] = _mm512_fmadd_ps(s16, _mm512_cvtepi32_ps(dot), acc0[t][j]);
            }
        }
    }
    for (int t = 0; t < count; t++) {
        for (int j = 0; j < groups; j++) {
            __m512 acc = _mm512_add_ps(acc0[t][j], acc1[t][j]);
            __m128 part[4] = {_mm512_extractf32x4_ps(acc, 0), _mm512_extractf32x4_ps(acc, 1),
                              _mm512_extractf32x4_ps(acc, 2), _mm512_extractf32x4_ps(acc, 3)};
            float *out = w->y + (size_t)(r0 + t) * w->n + 4 * (g + j);
            for (int c = 0; c < 4; c++) {  /* lanes 4c .. 4c+3 are column 4(g+j)+c */
                __m128 s = _mm_add_ps(part[c], _mm_movehl_ps(part[c], part[c]));
                s = _mm_add_ss(s, _mm_movehdup_ps(s));
                out[c] = _mm_cvtss_f32(s);
            }
        }
    }
}
#endif

/* Groups g .. g+groups-1 (1 or 2) for rows r0 .. r0+count-1. */
static void group_rows(const Work *w, int64_t g, int groups, int64_t r0, int count) {
#if WIDE
    if (groups == 2) {  /* count <= 4: sixteen sums in registers */
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
#else
    for (int j = 0; j < groups; j++)
        for (int t = 0; t < count; t++) group_row(w, g + j, r0 + t);
#endif
}

static void run_task(void *data, size_t task) {
    const Work *w = (const Work *)data;
    int64_t groups = w->n / 4, first = (int64_t)task * GROUPS_PER_TASK;
    int64_t last = first + GROUPS_PER_TASK < groups ? first + GROUPS_PER_TASK : groups;
    if (w->m <= TILE) {  /* decoding, a verify pass: every row in one sweep, one weight stream */
        for (int64_t g = first; g < last; g++) group_rows(w, g, 1, 0, (int)w->m);
        return;
    }
    for (int64_t g = first; g < last; g += 2) {  /* a prefill chunk: tiles of 4 rows x 2 column groups */
        int groups = g + 1 < last ? 2 : 1;
        for (int64_t r = 0; r < w->m; r += 4) group_rows(w, g, groups, r, w->m - r < 4 ? (int)(w->m - r) : 4);
    }
}

static OrtStatus *compute(const Kernel *kernel, OrtKernelContext *context) {
    const float *x;
    float *y;
    int64_t rows, nb = kernel->k / QK;
    size_t blocks = (size_t)(kernel->n / 4) * (size_t)nb;
    const void *qs, *d;
    CHECK(input_and_output(kernel, context, &x, &rows, &y));
    CHECK(weight(context, 1, blocks * 64, &qs));
    CHECK(weight(context, 2, blocks * 4, &d));
    if (rows == 0) return NULL;
    Rows q;
    if (quantized_rows(x, rows, kernel->k, 8, &q)) return ort->CreateStatus(ORT_FAIL, "Q4_0MatMul: out of memory");
    Work w = {.m = rows, .k = kernel->k, .n = kernel->n, .qs = qs, .d = d, .xq = q.xq, .xd = q.xd, .xs = q.xs, .y = y};
    size_t tasks = (size_t)((kernel->n / 4 + GROUPS_PER_TASK - 1) / GROUPS_PER_TASK);
    OrtStatus *status = ort->KernelContext_ParallelFor(context, run_task, tasks, 0, &w);
    free_rows(&q);
    return status;
}

SpecOp q4_0_op = {.name = "Q4_0MatMul", .column_multiple = 4, .compute = compute,
                  .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16}};

/* The same product outside ONNX Runtime, one thread, for tests and the lab: 0, or -1 out of memory. */
int q4_0_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *d, int64_t n, float *y) {
    Rows q;
    if (quantized_rows(x, m, k, 8, &q)) return -1;
    Work w = {.m = m, .k = k, .n = n, .qs = qs, .d = d, .xq = q.xq, .xd = q.xd, .xs = q.xs, .y = y};
    for (size_t t = 0; t < (size_t)((n / 4 + GROUPS_PER_TASK - 1) / GROUPS_PER_TASK); t++) run_task(&w, t);
    free_rows(&q);
    return 0;
}
