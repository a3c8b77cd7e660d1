/* Q4_0 weights times float rows, read as a GGUF stores them (a float16 scale and 16 bytes per 32
 * weights: 4.5 bits a weight), for lab/scripts/q4_0_kernel.py.
 *
 * Each row of x is quantized to int8 in blocks of 32 (one float scale a block) and dotted with the
 * 4-bit values as unsigned bytes; the zero point (8) comes off as 8 x the block's int8 sum. Every row
 * of a call runs the same code on its own, so a row's result never depends on the rows beside it.
 * Build: gcc -O3 -march=native -fopenmp -shared -fPIC q4_0_kernel.c -o q4_0_kernel.so
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32

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

/* x [K] -> xq [K] int8, xd [K/32] scales, xs [K/32] 8 x each block's int8 sum */
static void quantize_row(const float *x, int k, int8_t *xq, float *xd, int32_t *xs) {
    for (int b = 0; b < k / QK; b++) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[b * QK + j]));
        float d = amax / 127.0f, inv = d ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) {
            int v = (int)lrintf(x[b * QK + j] * inv);
            xq[b * QK + j] = (int8_t)v;
            sum += v;
        }
        xd[b] = d;
        xs[b] = 8 * sum;
    }
}

static float dot_row(const uint8_t *qs, const uint16_t *d, int nb, const int8_t *xq, const float *xd,
                     const int32_t *xs) {
#if defined(__AVX2__)
    const __m128i low = _mm_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(qs + (size_t)b * 16));
        __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
        __m256i a = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
        __m256i start = _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, -xs[b]);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        __m256i dot = _mm256_dpbusd_epi32(start, w, a);
#else
        __m256i dot = _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
#endif
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(d[b]) * xd[b]), _mm256_cvtepi32_ps(dot), acc);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
#else
    float total = 0.0f;
    for (int b = 0; b < nb; b++) {
        int32_t dot = -xs[b];
        for (int j = 0; j < 16; j++) {
            dot += (qs[b * 16 + j] & 0x0f) * xq[b * QK + j] + (qs[b * 16 + j] >> 4) * xq[b * QK + j + 16];
        }
        total += half_to_float(d[b]) * xd[b] * (float)dot;
    }
    return total;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* Two blocks an instruction: the 32 bytes of blocks b, b+1 give [b low, b+1 low, b high, b+1 high]
 * halves, against activations laid out in that order (pair_layout). Scales dw * xd for 8 blocks at
 * a time, spread over the lanes by a permute; the zero point's 8 x sum folded in once at the end. */
static float dot_row512(const uint8_t *qs, const uint16_t *d, int nb, const int8_t *xp, const float *xd,
                        const int32_t *xs) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 corr = _mm256_setzero_ps();  /* four sums: no fused multiply-add waits on the one before */
    for (int g = 0; g < nb; g += 8) {
        __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + g))), _mm256_loadu_ps(xd + g));
        corr = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(xs + g))), corr);
        __m512 sc512 = _mm512_castps256_ps512(sc);
        for (int p = 0; p < 4; p++) {
            int b = g + 2 * p;
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + (size_t)b * 16));
            __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(raw, low)),
                                           _mm256_and_si256(_mm256_srli_epi16(raw, 4), low), 1);
            __m512i a = _mm512_loadu_si512((const void *)(xp + (size_t)b * QK));
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
            __m512i idx = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p, 2 * p, 2 * p, 2 * p,
                                           2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p, 2 * p, 2 * p, 2 * p);
            acc[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, sc512), _mm512_cvtepi32_ps(dot), acc[p]);
        }
    }
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(corr), _mm256_extractf128_ps(corr, 1));
    c = _mm_add_ps(c, _mm_movehl_ps(c, c));
    c = _mm_add_ss(c, _mm_movehdup_ps(c));
    __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    return _mm512_reduce_add_ps(sum) - _mm_cvtss_f32(c);
}
#define WIDE 1
#else
#define WIDE 0
#endif

/* Blocks b, b+1 of a quantized row as [b 0..15, b+1 0..15, b 16..31, b+1 16..31] (dot_row512). */
static void pair_layout(const int8_t *xq, int nb, int8_t *xp) {
    for (int b = 0; b + 1 < nb; b += 2) {
        memcpy(xp + b * QK, xq + b * QK, 16);
        memcpy(xp + b * QK + 16, xq + (b + 1) * QK, 16);
        memcpy(xp + b * QK + 32, xq + b * QK + 16, 16);
        memcpy(xp + b * QK + 48, xq + (b + 1) * QK + 16, 16);
    }
}

/* y [M, N] = x [M, K] @ W, W as N rows of K/32 blocks: qs [N, K/32, 16] bytes (byte j holds weights
 * j and j+16 of its block), d [N, K/32] float16 scales. */
int q4_0_matmul(const float *x, int m, int k, const uint8_t *qs, const uint16_t *d, int n, float *y) {
    int nb = k / QK;
    int wide = WIDE && nb % 8 == 0;
    int8_t *xq = malloc((size_t)m * k), *xp = malloc((size_t)m * k);
    float *xd = malloc(sizeof(float) * m * nb);
    int32_t *xs = malloc(sizeof(int32_t) * m * nb);
    if (!xq || !xp || !xd || !xs) { free(xq); free(xp); free(xd); free(xs); return -1; }
    for (int r = 0; r < m; r++) {
        quantize_row(x + (size_t)r * k, k, xq + (size_t)r * k, xd + r * nb, xs + r * nb);
        pair_layout(xq + (size_t)r * k, nb, xp + (size_t)r * k);
    }
    #pragma omp parallel for schedule(static)
    for (int col = 0; col < n; col++) {
        const uint8_t *wq = qs + (size_t)col * nb * 16;
        const uint16_t *wd = d + (size_t)col * nb;
        for (int r = 0; r < m; r++) {
#if WIDE
            if (wide) {
                y[(size_t)r * n + col] = dot_row512(wq, wd, nb, xp + (size_t)r * k, xd + r * nb, xs + r * nb);
                continue;
            }
#endif
            y[(size_t)r * n + col] = dot_row(wq, wd, nb, xq + (size_t)r * k, xd + r * nb, xs + r * nb);
        }
    }
    free(xq); free(xp); free(xd); free(xs);
    return 0;
}

/* The same product over an interleaved layout of the same bytes: for each 4 columns and block, the
 * four columns' 16 bytes (64) and their four float16 scales together, so that one 512-bit load
 * holds a block of 4 columns and each activation half is broadcast once for all four: per 128
 * weights one load, an unpack, two VNNI dots, a scale spread and one multiply-add. Still 4.5 bits
 * a weight; a weights file written in this order is read in place. */
int q4_0x4_matmul(const float *x, int m, int k, const uint8_t *qs4, const uint16_t *d4, int n, float *y) {
#if WIDE
    int nb = k / QK;
    if (n % 4) return -2;
    int8_t *xq = malloc((size_t)m * k);
    float *xd = malloc(sizeof(float) * m * nb);
    int32_t *xs = malloc(sizeof(int32_t) * m * nb);
    if (!xq || !xd || !xs) { free(xq); free(xd); free(xs); return -1; }
    for (int r = 0; r < m; r++) quantize_row(x + (size_t)r * k, k, xq + (size_t)r * k, xd + r * nb, xs + r * nb);
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    #pragma omp parallel for schedule(static)
    for (int g = 0; g < n / 4; g++) {
        const uint8_t *wq = qs4 + (size_t)g * nb * 64;
        const uint16_t *wd = d4 + (size_t)g * nb * 4;
        for (int r = 0; r < m; r++) {
            const int8_t *a = xq + (size_t)r * k;
            __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                __m512i w = _mm512_loadu_si512((const void *)(wq + (size_t)b * 64));
                __m512i lo = _mm512_and_si512(w, low), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
                __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + b * QK)));
                __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + b * QK + 16)));
                __m512i dot = _mm512_maskz_set1_epi32(0x1111, -xs[r * nb + b]);
                dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot, lo, alo), hi, ahi);
                __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(wd + (size_t)b * 4))),
                                       _mm_set1_ps(xd[r * nb + b]));
                __m512 s16 = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s4));
                if (b & 1) acc1 = _mm512_fmadd_ps(s16, _mm512_cvtepi32_ps(dot), acc1);
                else acc0 = _mm512_fmadd_ps(s16, _mm512_cvtepi32_ps(dot), acc0);
            }
            __m512 acc = _mm512_add_ps(acc0, acc1);
            for (int c = 0; c < 4; c++) {  /* lanes 4c..4c+3 are column 4g+c */
                __m128 part = _mm512_extractf32x4_ps(acc, 0);
                if (c == 1) part = _mm512_extractf32x4_ps(acc, 1);
                if (c == 2) part = _mm512_extractf32x4_ps(acc, 2);
                if (c == 3) part = _mm512_extractf32x4_ps(acc, 3);
                part = _mm_add_ps(part, _mm_movehl_ps(part, part));
                part = _mm_add_ss(part, _mm_movehdup_ps(part));
                y[(size_t)r * n + 4 * g + c] = _mm_cvtss_f32(part);
            }
        }
    }
    free(xq); free(xd); free(xs);
    return 0;
#else
    (void)x; (void)m; (void)k; (void)qs4; (void)d4; (void)n; (void)y;
    return -3;  /* built without AVX-512 VNNI */
#endif
}
