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
#define PREFETCH 1024  /* bytes ahead */


typedef struct {
    int64_t m, k, n;
    const uint8_t *b;
    const float *scales;
    Rows x;
    float *y;
} Work;

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* Two blocks a 512-bit register: lanes 0-7 block 2p, lanes 8-15 block 2p+1 (an odd last block
 * loads zeros beside it). */
static inline __attribute__((always_inline)) void tile(const Work *w, int64_t col, int64_t r0, const int count) {
    const int64_t nb = w->k / QK;
    const uint8_t *wb = w->b + (size_t)col * w->k;
    const float *ws = w->scales + (size_t)col * nb;
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[TILE];
    for (int t = 0; t < count; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        const __mmask64 bytes = two ? ~(__mmask64)0 : 0xFFFFFFFFull;
        _mm_prefetch((const char *)(wb + b * QK) + PREFETCH, _MM_HINT_T0);  /* as Q4_KMatMul: reads in flight */
        __m512i q = _mm512_maskz_loadu_epi8(bytes, wb + b * QK);
        __m128 sw = two ? _mm_castpd_ps(_mm_load_sd((const double *)(ws + b))) : _mm_load_ss(ws + b);
        for (int t = 0; t < count; t++) {
            const int64_t r = r0 + t;
            __m512i a = _mm512_maskz_loadu_epi8(bytes, w->x.xq + (size_t)r * w->k + b * QK);
            const int32_t *xs = w->x.xs + r * nb + b;
            const float *xd = w->x.xd + r * nb + b;
            __m512i start = _mm512_maskz_set1_epi32(0x0001, -xs[0]);
            if (two) start = _mm512_mask_set1_epi32(start, 0x0100, -xs[1]);
            __m512i dot = _mm512_dpbusd_epi32(start, q, a);
            __m128 sx = two ? _mm_castpd_ps(_mm_load_sd((const double *)xd)) : _mm_load_ss(xd);
            __m512 s = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_mul_ps(sw, sx)));
            acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc[t]);
        }
    }
    for (int t = 0; t < count; t++) w->y[(size_t)(r0 + t) * w->n + col] = _mm512_reduce_add_ps(acc[t]);
}

static void rows_of(const Work *w, int64_t col, int64_t r0, int count) {
    switch (count) {
        case 1: tile(w, col, r0, 1); break;
        case 2: tile(w, col, r0, 2); break;
        case 3: tile(w, col, r0, 3); break;
        case 4: tile(w, col, r0, 4); break;
        case 5: tile(w, col, r0, 5); break;
        case 6: tile(w, col, r0, 6); break;
        case 7: tile(w, col, r0, 7); break;
        default: tile(w, col, r0, 8); break;
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
#endif

static void run_task(void *data, size_t task) {
    const Work *w = data;
    int64_t first = (int64_t)task * COLUMNS_PER_TASK;
    int64_t last = first + COLUMNS_PER_TASK < w->n ? first + COLUMNS_PER_TASK : w->n;
    for (int64_t col = first; col < last; col++)
        for (int64_t r = 0; r < w->m; r += TILE) rows_of(w, col, r, w->m - r < TILE ? (int)(w->m - r) : TILE);
}

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
