/* The operators' products outside ONNX Runtime, for a build of another machine's form run under an
 * emulator (tests/test_q4_0_kernel.py: the Arm NEON form under qemu-aarch64).
 *
 *   kernel_harness q4_0|q4_1|q4_k|q5_1|q5_k|q6_k|q8 M K N x.bin weights.bin scales.bin y.bin
 *
 * x.bin float32 [M, K]; weights.bin and scales.bin as the operator reads them (q4_0: qs uint8
 * [N/16, K/32, 256] and d float16 [N/16, K/32, 16]; q4_1: the same qs and dm float16
 * [N/16, K/32, 32]; q4_k: the same qs and sc uint8
 * [N/16, K/256, 320]; q5_1 / q5_k: as q4_1 / q4_k with qs [N/16, K/32, 320]; q6_k: q uint8 [N/16, K/32, 384] and sc uint8 [N/16, K/256, 288]; q8: b uint8 [N, K/32, 32] and float32 scales [N * K/32]); writes y float32
 * [M, N] and prints the form built. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int q4_0_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *d, int64_t n, float *y);
int q4_1_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *dm, int64_t n, float *y);
int q4_k_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint8_t *sc, int64_t n, float *y);
int q5_1_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint16_t *dm, int64_t n, float *y);
int q5_k_matmul(const float *x, int64_t m, int64_t k, const uint8_t *qs, const uint8_t *sc, int64_t n, float *y);
int q6_k_matmul(const float *x, int64_t m, int64_t k, const uint8_t *q, const uint8_t *sc, int64_t n, float *y);
int q8_matmul(const float *x, int64_t m, int64_t k, const uint8_t *b, const float *scales, int64_t n, float *y);
const char *q4_0_form(void);

static void *slurp(const char *path, size_t size) {
    void *data = malloc(size ? size : 1);
    FILE *f = fopen(path, "rb");
    if (!data || !f || fread(data, 1, size, f) != size) { fprintf(stderr, "cannot read %zu bytes of %s\n", size, path); exit(2); }
    fclose(f);
    return data;
}

int main(int argc, char **argv) {
    if (argc != 9) { fprintf(stderr, "usage: %s q4_0|q4_1|q4_k|q5_1|q5_k|q6_k|q8 M K N x.bin weights.bin scales.bin y.bin\n", argv[0]); return 2; }
    int q8 = strcmp(argv[1], "q8") == 0, q4_k = strcmp(argv[1], "q4_k") == 0, q6_k = strcmp(argv[1], "q6_k") == 0;
    int q5_1 = strcmp(argv[1], "q5_1") == 0, q5_k = strcmp(argv[1], "q5_k") == 0;
    int q4_1 = strcmp(argv[1], "q4_1") == 0 || q5_1;
    q4_k = q4_k || q5_k;
    int64_t m = atoll(argv[2]), k = atoll(argv[3]), n = atoll(argv[4]), nb = k / 32;
    float *x = slurp(argv[5], sizeof(float) * m * k), *y = calloc(m * n, sizeof(float));
    void *weights = slurp(argv[6], q8 ? n * k : q6_k ? n * nb * 24 : q5_1 || q5_k ? n * nb * 20 : n * nb * 16);
    void *scales = slurp(argv[7], q8 ? sizeof(float) * n * nb : q4_k ? (size_t)n / 16 * (k / 256) * 320
                                  : q6_k ? (size_t)n / 16 * (k / 256) * 288 : sizeof(uint16_t) * n * nb * (q4_1 ? 2 : 1));
    int status = q8 ? q8_matmul(x, m, k, weights, scales, n, y)
                    : q5_k ? q5_k_matmul(x, m, k, weights, scales, n, y)
                    : q5_1 ? q5_1_matmul(x, m, k, weights, scales, n, y)
                    : q4_k ? q4_k_matmul(x, m, k, weights, scales, n, y)
                    : q6_k ? q6_k_matmul(x, m, k, weights, scales, n, y)
                    : q4_1 ? q4_1_matmul(x, m, k, weights, scales, n, y) : q4_0_matmul(x, m, k, weights, scales, n, y);
    FILE *out = fopen(argv[8], "wb");
    if (status || !out || fwrite(y, sizeof(float), m * n, out) != (size_t)(m * n)) return 1;
    fclose(out);
    printf("%s\n", q4_0_form());
    return 0;
}
