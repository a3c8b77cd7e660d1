/* What specdeploy's ONNX Runtime operators share (ops.c): the API, activation rows quantized to
 * int8 per block of 32, and the glue every operator's compute calls. Each operator is a SpecOp:
 * ONNX Runtime's OrtCustomOp first, then its name, its two weight inputs' types, what N must be a
 * multiple of, and its product. Inputs: x, the two weights, and an optional float bias [N]. */
#ifndef SPECDEPLOY_OPS_H
#define SPECDEPLOY_OPS_H

#include <stdint.h>
#include <string.h>

#include <onnxruntime_c_api.h>

#define QK 32
/* Arm with the dot-product instructions (Armv8.2-A dotprod: Jetson Orin's Cortex-A78AE) */
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define ARM_DOT 1
#include <arm_neon.h>
#else
#define ARM_DOT 0
#endif
#define CHECK(call) do { OrtStatus *status_ = (call); if (status_) return status_; } while (0)

extern const OrtApi *ort;

typedef struct Kernel Kernel;
typedef struct {
    OrtCustomOp base;  /* first: ONNX Runtime hands this pointer back to every callback */
    const char *name;
    ONNXTensorElementDataType weights[2];
    int64_t column_multiple;
    OrtStatus *(*compute)(const Kernel *kernel, OrtKernelContext *context);
} SpecOp;
struct Kernel { int64_t k, n; const SpecOp *op; };

extern SpecOp q4_0_op, q4_1_op, q4_k_op, q5_k_op, q5_1_op, q6_k_op, q8_op;

static inline int32_t four_bytes(const int8_t *a) { int32_t v; memcpy(&v, a, 4); return v; }
float half_to_float(uint16_t h);  /* the plain C forms' float16 scales */

/* The operators over groups of sixteen output columns share one schedule: task `task` of
 * ceil(groups / 2) takes two groups; up to TILE rows (decoding, a verify pass) go through each
 * group in one tile, more (a prefill chunk) in tiles of four rows by two groups. `rows` computes
 * groups g .. g+count_groups-1 for rows r0 .. r0+count-1, each (row, column) sum the same
 * instructions whatever the tile, so a verify row is bitwise the one-row step. */
#define TILE 8
typedef void (*GroupRows)(const void *work, int64_t g, int groups, int64_t r0, int count);
void group_task(const void *work, int64_t m, int64_t groups, size_t task, GroupRows rows);
size_t group_tasks(int64_t groups);

/* Activation rows as int8 blocks of 32: xq [M, K], xd [M, K/32] scales, xs [M, K/32] zero x each
 * block's int8 sum (the unsigned weights' zero point comes off as that). */
typedef struct { int8_t *xq; float *xd; int32_t *xs; } Rows;
int quantized_rows(const float *x, int64_t m, int64_t k, int32_t zero, Rows *out);  /* 0, or -1: no memory */
void free_rows(Rows *rows);

OrtStatus *fail(const char *message);
/* x (input 0) and its rows, and y [.., N] made with x's leading axes */
OrtStatus *input_and_output(const Kernel *kernel, OrtKernelContext *context, const float **x, int64_t *rows,
                            float **y);
/* weight input `index`'s data, refused unless its shape is `dims` (rank <= 4) */
OrtStatus *weight(OrtKernelContext *context, size_t index, const int64_t *dims, size_t rank, const void **data);
/* The optional bias input [N] (Qwen2's q / k / v biases), or NULL; add_bias: y [rows, N] += it, the
 * Add it replaces value for value, one kernel fewer a layer */
#define BIAS 3
OrtStatus *bias_input(const Kernel *kernel, OrtKernelContext *context, const float **bias);
void add_bias(float *y, int64_t rows, int64_t n, const float *bias);

#endif
