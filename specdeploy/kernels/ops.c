/* ONNX Runtime's side of specdeploy's operators (domain ai.specdeploy): registration, kernel state,
 * shapes, and activation rows quantized to int8 per block of 32 as every operator reads them. */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

const OrtApi *ort;

OrtStatus *fail(const char *message) { return ort->CreateStatus(ORT_INVALID_ARGUMENT, message); }

/* x [K] -> xq [K] int8, xd [K/32] scales, xs [K/32] zero x each block's int8 sum. Per block of 32:
 * d = max |x| / 127, q = x · (1/d) rounded to nearest even. The vector forms take the same float
 * operations and the same rounding (the default mode, as lrintf's; packing saturates where the
 * cast would wrap, and |q| <= 127 here), so every form gives the same
 * bytes; a row of a verify pass costs its quantization once per matmul, serially before the
 * columns' tasks start, which the scalar loop made a share of an extra row's cost at small K. */
static void quantize_block(const float *x, int32_t zero, int8_t *xq, float *xd, int32_t *xs) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 a0 = _mm512_loadu_ps(x), a1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, _mm512_set1_ps(inv)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, _mm512_set1_ps(inv)));
    _mm_storeu_si128((__m128i *)xq, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(xq + 16), _mm512_cvtepi32_epi8(q1));
    *xd = d;
    *xs = zero * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#elif defined(__AVX2__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        a[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, a[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(a[i], _mm256_set1_ps(inv)));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)xq, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *xd = d;
    *xs = zero * _mm_cvtsi128_si32(s4);
#else
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < QK; j++) {
        int v = (int)lrintf(x[j] * inv);
        xq[j] = (int8_t)v;
        sum += v;
    }
    *xd = d;
    *xs = zero * sum;
#endif
}

static void quantize_row(const float *x, int64_t k, int32_t zero, int8_t *xq, float *xd, int32_t *xs) {
    for (int64_t b = 0; b < k / QK; b++) quantize_block(x + b * QK, zero, xq + b * QK, xd + b, xs + b);
}

float half_to_float(uint16_t h) {
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

#define GROUPS_PER_TASK 2  /* 32 columns a task of ONNX Runtime's pool */

size_t group_tasks(int64_t groups) { return (size_t)((groups + GROUPS_PER_TASK - 1) / GROUPS_PER_TASK); }

void group_task(const void *work, int64_t m, int64_t groups, size_t task, GroupRows rows) {
    int64_t first = (int64_t)task * GROUPS_PER_TASK;
    int64_t last = first + GROUPS_PER_TASK < groups ? first + GROUPS_PER_TASK : groups;
    if (m <= TILE) {  /* decoding, a verify pass: every row in one sweep, one weight stream */
        for (int64_t g = first; g < last; g++) rows(work, g, 1, 0, (int)m);
        return;
    }
    for (int64_t g = first; g < last; g += 2) {  /* a prefill chunk: tiles of 4 rows x 2 column groups */
        int two = g + 1 < last ? 2 : 1;
        for (int64_t r = 0; r < m; r += 4) rows(work, g, two, r, m - r < 4 ? (int)(m - r) : 4);
    }
}

int quantized_rows(const float *x, int64_t m, int64_t k, int32_t zero, Rows *out) {
    int64_t nb = k / QK, rows = m ? m : 1;
    out->xq = malloc((size_t)rows * k);
    out->xd = malloc(sizeof(float) * rows * nb);
    out->xs = malloc(sizeof(int32_t) * rows * nb);
    if (!out->xq || !out->xd || !out->xs) {
        free_rows(out);
        return -1;
    }
    for (int64_t r = 0; r < m; r++)
        quantize_row(x + (size_t)r * k, k, zero, out->xq + (size_t)r * k, out->xd + r * nb, out->xs + r * nb);
    return 0;
}

/* The rows as the operators quantize them (zero 1: xs the plain block sums), for tests. */
void quantize_activations(const float *x, int64_t m, int64_t k, int8_t *xq, float *xd, int32_t *xs) {
    for (int64_t r = 0; r < m; r++) quantize_row(x + r * k, k, 1, xq + r * k, xd + r * (k / QK), xs + r * (k / QK));
}

void free_rows(Rows *rows) {
    free(rows->xq); free(rows->xd); free(rows->xs);
    rows->xq = NULL; rows->xd = NULL; rows->xs = NULL;
}

static OrtStatus *element_count(const OrtValue *value, size_t *count) {
    OrtTensorTypeAndShapeInfo *info;
    CHECK(ort->GetTensorTypeAndShape(value, &info));
    OrtStatus *status = ort->GetTensorShapeElementCount(info, count);
    ort->ReleaseTensorTypeAndShapeInfo(info);
    return status;
}

OrtStatus *bias_input(const Kernel *kernel, OrtKernelContext *context, const float **bias) {
    size_t inputs;
    CHECK(ort->KernelContext_GetInputCount(context, &inputs));
    const OrtValue *value = NULL;
    if (inputs > BIAS) CHECK(ort->KernelContext_GetInput(context, BIAS, &value));
    *bias = NULL;
    if (!value) return NULL;
    size_t have;
    CHECK(element_count(value, &have));
    if (have != (size_t)kernel->n) return fail("specdeploy operator: the bias must hold N values");
    void *p;
    CHECK(ort->GetTensorMutableData((OrtValue *)value, &p));
    *bias = p;
    return NULL;
}

void add_bias(float *y, int64_t rows, int64_t n, const float *bias) {
    if (!bias) return;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < n; c++) y[r * n + c] += bias[c];
}

OrtStatus *input_and_output(const Kernel *kernel, OrtKernelContext *context, const float **x, int64_t *rows,
                            float **y) {
    const OrtValue *input;
    CHECK(ort->KernelContext_GetInput(context, 0, &input));
    OrtTensorTypeAndShapeInfo *info;
    CHECK(ort->GetTensorTypeAndShape(input, &info));
    int64_t dims[8];
    size_t rank;
    OrtStatus *status = ort->GetDimensionsCount(info, &rank);
    if (!status && (rank < 1 || rank > 8)) status = fail("specdeploy operator: x must have 1 to 8 axes");
    if (!status) status = ort->GetDimensions(info, dims, rank);
    ort->ReleaseTensorTypeAndShapeInfo(info);
    if (status) return status;
    if (dims[rank - 1] != kernel->k) return fail("specdeploy operator: x's last axis is not the weight's K");
    *rows = 1;
    for (size_t i = 0; i + 1 < rank; i++) *rows *= dims[i];
    dims[rank - 1] = kernel->n;
    OrtValue *output;
    CHECK(ort->KernelContext_GetOutput(context, 0, dims, rank, &output));
    void *p;
    CHECK(ort->GetTensorMutableData((OrtValue *)input, &p));
    *x = p;
    CHECK(ort->GetTensorMutableData(output, &p));
    *y = p;
    return NULL;
}

OrtStatus *weight(OrtKernelContext *context, size_t index, const int64_t *dims, size_t rank, const void **data) {
    const OrtValue *value;
    CHECK(ort->KernelContext_GetInput(context, index, &value));
    OrtTensorTypeAndShapeInfo *info;
    CHECK(ort->GetTensorTypeAndShape(value, &info));
    int64_t have[4] = {0};
    size_t have_rank;
    OrtStatus *status = ort->GetDimensionsCount(info, &have_rank);
    if (!status && have_rank == rank) status = ort->GetDimensions(info, have, rank);
    ort->ReleaseTensorTypeAndShapeInfo(info);
    if (status) return status;
    for (size_t i = 0; i < rank; i++)
        if (have_rank != rank || have[i] != dims[i])
            return fail("specdeploy operator: a weight's shape does not match the node's K and N in this "
                        "library's layout (a bundle from another specdeploy version: export it again)");
    void *p;
    CHECK(ort->GetTensorMutableData((OrtValue *)value, &p));
    *data = p;
    return NULL;
}

/* ---- callbacks, the same for every SpecOp ---- */

static const SpecOp *spec(const OrtCustomOp *op) { return (const SpecOp *)op; }

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)api;
    Kernel *kernel = calloc(1, sizeof(Kernel));
    if (!kernel) return ort->CreateStatus(ORT_FAIL, "specdeploy operator: out of memory");
    kernel->op = spec(op);
    OrtStatus *status = ort->KernelInfoGetAttribute_int64(info, "K", &kernel->k);
    if (!status) status = ort->KernelInfoGetAttribute_int64(info, "N", &kernel->n);
    if (!status && (kernel->k <= 0 || kernel->k % QK || kernel->n <= 0 || kernel->n % kernel->op->column_multiple))
        status = fail("specdeploy operator: K must be a positive multiple of 32, and N of the operator's column group");
    if (status) { free(kernel); return status; }
    *out = kernel;
    return NULL;
}

static OrtStatus *compute(void *state, OrtKernelContext *context) {
    const Kernel *kernel = state;
    return kernel->op->compute(kernel, context);
}

static void destroy_kernel(void *state) { free(state); }
static const char *op_name(const OrtCustomOp *op) { return spec(op)->name; }
static const char *op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static size_t input_count(const OrtCustomOp *op) { (void)op; return BIAS + 1; }
static size_t output_count(const OrtCustomOp *op) { (void)op; return 1; }

static ONNXTensorElementDataType input_type(const OrtCustomOp *op, size_t index) {
    if (index == 0 || index == BIAS) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    return index < BIAS ? spec(op)->weights[index - 1] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

static ONNXTensorElementDataType output_type(const OrtCustomOp *op, size_t index) {
    (void)op; (void)index;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static OrtCustomOpInputOutputCharacteristic input_needed(const OrtCustomOp *op, size_t index) {
    (void)op;
    return index == BIAS ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t index) {
    (void)op; (void)index;
    return INPUT_OUTPUT_REQUIRED;
}

static OrtMemType memory_type(const OrtCustomOp *op, size_t index) { (void)op; (void)index; return OrtMemTypeDefault; }
static int one(const OrtCustomOp *op) { (void)op; return 1; }
static int first_version(const OrtCustomOp *op) { (void)op; return 1; }
static int last_version(const OrtCustomOp *op) { (void)op; return 1 << 30; }

static void fill(SpecOp *op, uint32_t version) {
    OrtCustomOp *base = &op->base;
    base->version = version;
    base->GetName = op_name;
    base->GetExecutionProviderType = op_provider;
    base->GetInputType = input_type;
    base->GetInputTypeCount = input_count;
    base->GetOutputType = output_type;
    base->GetOutputTypeCount = output_count;
    base->GetInputCharacteristic = input_needed;
    base->GetOutputCharacteristic = required;
    base->GetInputMemoryType = memory_type;
    base->GetVariadicInputMinArity = one;
    base->GetVariadicInputHomogeneity = one;
    base->GetVariadicOutputMinArity = one;
    base->GetVariadicOutputHomogeneity = one;
    base->CreateKernelV2 = create_kernel;
    base->KernelComputeV2 = compute;
    base->KernelDestroy = destroy_kernel;
    base->GetStartVersion = first_version;
    base->GetEndVersion = last_version;
}

static OrtCustomOpDomain *domain;

/* Called by ONNX Runtime (SessionOptions.register_custom_ops_library) for each session's options;
 * the domain is made once and lives as long as the process. */
OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    /* the newest API both know; what these files call is all in 17 (ONNX Runtime 1.17) */
    static uint32_t version = ORT_API_VERSION;
    for (; !ort && version >= 17; version--) {
        ort = base->GetApi(version);
        if (ort) break;
    }
    if (!ort) return NULL;  /* older than 1.17: the session then names the operators as unknown */
    if (!domain) {
        fill(&q4_0_op, version);
        fill(&q4_1_op, version);
        fill(&q4_k_op, version);
        fill(&q5_k_op, version);
        fill(&q5_1_op, version);
        fill(&q6_k_op, version);
        fill(&q8_op, version);
        CHECK(ort->CreateCustomOpDomain("ai.specdeploy", &domain));
        CHECK(ort->CustomOpDomain_Add(domain, &q4_0_op.base));
        CHECK(ort->CustomOpDomain_Add(domain, &q4_1_op.base));
        CHECK(ort->CustomOpDomain_Add(domain, &q4_k_op.base));
        CHECK(ort->CustomOpDomain_Add(domain, &q5_k_op.base));
        CHECK(ort->CustomOpDomain_Add(domain, &q5_1_op.base));
        CHECK(ort->CustomOpDomain_Add(domain, &q6_k_op.base));
        CHECK(ort->CustomOpDomain_Add(domain, &q8_op.base));
    }
    return ort->AddCustomOpDomain(options, domain);
}

/* Which form this build computes with (every operator's alike), for logs and tests. */
const char *q4_0_form(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return "avx512-vnni";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#elif ARM_DOT
    return "neon-dotprod";
#else
    return "c";
#endif
}

/* The bench's read-bandwidth probe (bench/roofline.py): the OR of [p, p + n) 64 bits at a time,
 * four independent chains so the loads, not the ORs, set the pace. n a multiple of 32. */
uint64_t read_bytes(const uint64_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a |= p[i];
        b |= p[i + 1];
        c |= p[i + 2];
        d |= p[i + 3];
    }
    return a | b | c | d;
}
