/* Q8MatMul (domain ai.specdeploy): y [.., N] = x [.., K] @ W for int8 weights in blocks of 32, read
 * in MatMulNBits' own 8-bit layout, which is what a GGUF's Q8_0 LM head carries into:
 *   b      uint8   [N, K/32, 32]  q + 128, column n's blocks one after another
 *   scales float32 [N, K/32]
 * MatMulNBits packs its own copy of these at load (a float32 block sum beside each block); read as
 * they are, the bytes the runtime holds once serve this product and the tied embedding's gather.
 *
 * Each row of x is quantized to int8 per block of 32 (ops.c); the integer dot of the unsigned
 * weights with it, less 128 x the block's int8 sum, is the dot with q, exact; one float
 * multiply-add per block. Every (row, column) sum runs the same instructions in the same order
 * whatever rows share the call, so a verify row is bitwise the one-row step.
 */
#include <stdlib.h>

#include "ops.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define COLUMNS_PER_TASK 64


typedef struct {
    int64_t m, k, n;
    const uint8_t *b;
    const float *scales;
    Rows x;
    float *y;
} Work;

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* Sixteen columns a register, one lane a column, as the 4-bit operators hold them: each block of 32
 * of sixteen adjacent columns (512 contiguous-column bytes) is turned once a call into eight
 * registers whose lane c holds bytes 4j..4j+3 of column c (an 8 x 8 transpose of 4-byte words in
 * each half), and every row of the call takes eight dots against them with its own four bytes
 * broadcast. Each (row, column) sum is the block's exact integer dot, converted, times
 * (column scale x row scale), added to the running sum in block order: the same instructions
 * whatever rows share the call, so a verify row is bitwise the one-row step. */
#define GROUP 16
#define CHUNK 64  /* blocks a transposed stretch holds: 32 KB, in L1 / L2 while every row reads it */

typedef struct { __m512i w[CHUNK][8]; float s[CHUNK][GROUP]; } Stretch;

static inline void transpose_8x8(__m512i z[8]) {
    const __m512i low = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), high = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        z[j] = _mm512_permutex2var_epi64(u[j], low, u[j + 4]);
        z[j + 4] = _mm512_permutex2var_epi64(u[j], high, u[j + 4]);
    }
}

/* Blocks b0 .. b0+count-1 of columns c0 .. c0+15 (a column past N reads the last one), and their
 * scales; the next group's bytes are asked for as these are read. */
static void transpose_stretch(const Work *w, int64_t c0, int64_t b0, int64_t count, Stretch *st) {
    const int64_t nb = w->k / QK, last = w->n - 1;
    const uint8_t *next = w->b + (size_t)(c0 + GROUP) * w->k;
    const int prefetch = c0 + 2 * GROUP <= w->n;
    for (int64_t b = 0; b < count; b++) {
        __m512i z[8];
        for (int i = 0; i < 8; i++) {
            int64_t ca = c0 + i < last ? c0 + i : last, cb = c0 + i + 8 < last ? c0 + i + 8 : last;
            __m256i ra = _mm256_loadu_si256((const __m256i *)(w->b + (size_t)ca * w->k + (b0 + b) * QK));
            __m256i rb = _mm256_loadu_si256((const __m256i *)(w->b + (size_t)cb * w->k + (b0 + b) * QK));
            z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(ra), rb, 1);
            if (prefetch) _mm_prefetch((const char *)(next + ((b0 + b) * 8 + i) * 64), _MM_HINT_T0);
        }
        transpose_8x8(z);
        for (int j = 0; j < 8; j++) st->w[b][j] = z[j];
        for (int c = 0; c < GROUP; c++) st->s[b][c] = w->scales[(c0 + c < last ? c0 + c : last) * nb + b0 + b];
    }
}

static inline __attribute__((always_inline)) void tile(const Work *w, const Stretch *st, int64_t c0, int64_t b0,
                                                        int64_t count, int64_t r0, const int rows) {
    const int64_t nb = w->k / QK;
    const __mmask16 valid = w->n - c0 >= GROUP ? 0xFFFF : (__mmask16)((1u << (w->n - c0)) - 1);
    __m512 acc[TILE];
    for (int t = 0; t < rows; t++)
        acc[t] = b0 ? _mm512_maskz_loadu_ps(valid, w->y + (size_t)(r0 + t) * w->n + c0) : _mm512_setzero_ps();
    for (int64_t b = 0; b < count; b++) {
        const __m512 sw = _mm512_loadu_ps(st->s[b]);
        for (int t = 0; t < rows; t++) {
            const int64_t r = r0 + t;
            const int8_t *a = w->x.xq + (size_t)r * w->k + (b0 + b) * QK;
            __m512i dot = _mm512_set1_epi32(-w->x.xs[r * nb + b0 + b]);
            for (int j = 0; j < 8; j++) dot = _mm512_dpbusd_epi32(dot, st->w[b][j], _mm512_set1_epi32(four_bytes(a + 4 * j)));
            const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(w->x.xd[r * nb + b0 + b]));
            acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc[t]);
        }
    }
    for (int t = 0; t < rows; t++) _mm512_mask_storeu_ps(w->y + (size_t)(r0 + t) * w->n + c0, valid, acc[t]);
}

static void rows_of(const Work *w, const Stretch *st, int64_t c0, int64_t b0, int64_t count, int64_t r0, int rows) {
    switch (rows) {
        case 1: tile(w, st, c0, b0, count, r0, 1); break;
        case 2: tile(w, st, c0, b0, count, r0, 2); break;
        case 3: tile(w, st, c0, b0, count, r0, 3); break;
        case 4: tile(w, st, c0, b0, count, r0, 4); break;
        case 5: tile(w, st, c0, b0, count, r0, 5); break;
        case 6: tile(w, st, c0, b0, count, r0, 6); break;
        case 7: tile(w, st, c0, b0, count, r0, 7); break;
        default: tile(w, st, c0, b0, count, r0, 8); break;
    }
}

static void run_task(void *data, size_t task) {
    const Work *w = data;
    const int64_t nb = w->k / QK;
    int64_t first = (int64_t)task * COLUMNS_PER_TASK;
    int64_t last = first + COLUMNS_PER_TASK < w->n ? first + COLUMNS_PER_TASK : w->n;
    static _Thread_local _Alignas(64) Stretch stretch;  /* 36 KB a thread, reused by every call */
    Stretch *st = &stretch;
    for (int64_t c0 = first; c0 < last; c0 += GROUP)
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
            int64_t count = nb - b0 < CHUNK ? nb - b0 : CHUNK;
            transpose_stretch(w, c0, b0, count, st);
            for (int64_t r = 0; r < w->m; r += TILE) rows_of(w, st, c0, b0, count, r, w->m - r < TILE ? (int)(w->m - r) : TILE);
        }
}
#else
/* One (row, column) sum a block at a time: AVX2 multiplies |q| by a with q's sign (q = b - 128,
 * so no pair of products overflows 16 bits); Arm takes signed dots of b - 128 (q itself); plain C
 * the same integers. */
static void rows_of(const Work *w, int64_t col, int64_t r0, int count) {
    const int64_t nb = w->k / QK;
    const uint8_t *wb = w->b + (size_t)col * w->k;
    const float *ws = w->scales + (size_t)col * nb;
    for (int t = 0; t < count; t++) {
        const int64_t r = r0 + t;
        const int8_t *a = w->x.xq + (size_t)r * w->k;
        const float *xd = w->x.xd + r * nb;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + b * QK)), _mm256_set1_epi8((char)0x80));
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + b * QK));
            __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
            __m256i dot = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(ws[b] * xd[b]), _mm256_cvtepi32_ps(dot), acc);
        }
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        w->y[(size_t)r * w->n + col] = _mm_cvtss_f32(s);
#elif ARM_DOT
        float total = 0.0f;
        const uint8x16_t sign = vdupq_n_u8(0x80);
        for (int64_t b = 0; b < nb; b++) {  /* b - 128 as int8 is q: signed dots, no zero point */
            int8x16_t q0 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb + b * QK), sign));
            int8x16_t q1 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb + b * QK + 16), sign));
            int32x4_t dot = vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a + b * QK)), q1, vld1q_s8(a + b * QK + 16));
            total += ws[b] * xd[b] * (float)vaddvq_s32(dot);
        }
        w->y[(size_t)r * w->n + col] = total;
#else
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            int32_t dot = 0;
            for (int j = 0; j < QK; j++) dot += ((int32_t)wb[b * QK + j] - 128) * a[b * QK + j];
            total += ws[b] * xd[b] * (float)dot;
        }
        w->y[(size_t)r * w->n + col] = total;
#endif
    }
}

static void run_task(void *data, size_t task) {
    const Work *w = data;
    int64_t first = (int64_t)task * COLUMNS_PER_TASK;
    int64_t last = first + COLUMNS_PER_TASK < w->n ? first + COLUMNS_PER_TASK : w->n;
    for (int64_t col = first; col < last; col++)
        for (int64_t r = 0; r < w->m; r += TILE) rows_of(w, col, r, w->m - r < TILE ? (int)(w->m - r) : TILE);
}
#endif

static OrtStatus *compute(const Kernel *kernel, OrtKernelContext *context) {
    const float *x;
    float *y;
    int64_t rows, nb = kernel->k / QK;
    const void *b, *scales;
    CHECK(input_and_output(kernel, context, &x, &rows, &y));
    const int64_t b_dims[] = {kernel->n, nb, QK}, scale_dims[] = {kernel->n * nb};
    CHECK(weight(context, 1, b_dims, 3, &b));
    CHECK(weight(context, 2, scale_dims, 1, &scales));
    const float *bias;
    CHECK(bias_input(kernel, context, &bias));
    if (rows == 0) return NULL;
    Work w = {.m = rows, .k = kernel->k, .n = kernel->n, .b = b, .scales = scales, .y = y};
    if (quantized_rows(x, rows, kernel->k, 128, &w.x)) return ort->CreateStatus(ORT_FAIL, "Q8MatMul: out of memory");
    size_t tasks = (size_t)((kernel->n + COLUMNS_PER_TASK - 1) / COLUMNS_PER_TASK);
    OrtStatus *status = ort->KernelContext_ParallelFor(context, run_task, tasks, 0, &w);
    free_rows(&w.x);
    if (!status) add_bias(y, rows, kernel->n, bias);
    return status;
}

SpecOp q8_op = {.name = "Q8MatMul", .column_multiple = 1, .compute = compute,
                .weights = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}};

/* The same product outside ONNX Runtime, one thread, for tests: 0, or -1 out of memory. */
int q8_matmul(const float *x, int64_t m, int64_t k, const uint8_t *b, const float *scales, int64_t n, float *y) {
    Work w = {.m = m, .k = k, .n = n, .b = b, .scales = scales, .y = y};
    if (quantized_rows(x, m, k, 128, &w.x)) return -1;
    for (size_t t = 0; t < (size_t)((n + COLUMNS_PER_TASK - 1) / COLUMNS_PER_TASK); t++) run_task(&w, t);
    free_rows(&w.x);
    return 0;
}
