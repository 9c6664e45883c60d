/* quantize.h — `luainfer quantize`: a GGUF in, a requantized GGUF out.
 *
 * Every weight of the input is dequantized to f32 (any type the loader
 * reads, a scheme weight included: li_weight_dequant_row_ref) and
 * requantized by the method; norms are written as f32; every metadata key
 * is copied except general.file_type and luainfer.quant.*, which describe
 * the output instead (docs/quantization.md lists them). The output is
 * written to a temporary file and renamed; the same input and options give
 * the same bytes.
 *
 * Methods:
 *   f16 bf16 q8_0 q4_0 q4_1   GGUF types (ggml's reference quantizers)
 *   w8a8   int8 per-output-channel weights, int8 per-token activations,
 *          SmoothQuant migration (--alpha, calibration)
 *   fp8    fp8 e4m3 per-output-channel weights, fp8 per-token activations
 *   rtn4 awq gptq   u4 codes, per-(row, group) scales and zero points
 *          (--group, default 128, must divide every row), f32 activations
 *          (A16; A8 is the backend's choice at run time): round to
 *          nearest, AWQ (its per-input-channel scale folded upstream) or
 *          GPTQ (--damp, --act-order) over calibration (quant4.h)
 *   w4a4   u4 symmetric per-output-channel weights, int4 per-token activations
 * Scheme weights are stored as an I8 tensor of codes (row bytes x rows)
 * plus NAME.scale (f32, groups x rows); token_embd (tied to the output)
 * stays q8_0 in the scheme methods. */
#ifndef LI_QUANTIZE_H
#define LI_QUANTIZE_H

#include "util/common.h"

#define LI_QUANT_FORMAT_VERSION 1

typedef enum li_qmethod {
    LI_QMETHOD_F16 = 0,
    LI_QMETHOD_BF16,
    LI_QMETHOD_Q8_0,
    LI_QMETHOD_Q4_0,
    LI_QMETHOD_Q4_1,
    LI_QMETHOD_W8A8,
    LI_QMETHOD_FP8,
    LI_QMETHOD_RTN4,
    LI_QMETHOD_AWQ,
    LI_QMETHOD_GPTQ,
    LI_QMETHOD_W4A4,
    LI_QMETHOD_COUNT
} li_qmethod;

/* Which SmoothQuant migrations W8A8 applies (each exact in real arithmetic):
 * NORM folds the scales of q/k/v and gate/up into the RMSNorm weights; ALL
 * also folds o_proj's into v_proj's rows (one scale per kv-head channel,
 * shared by the query heads of a GQA group) and down_proj's into up_proj's. */
typedef enum li_smooth { LI_SMOOTH_NONE = 0, LI_SMOOTH_NORM, LI_SMOOTH_ALL } li_smooth;

typedef struct li_quant_opts {
    const char *in, *out;
    li_qmethod method;
    int64_t group;          /* 0: the method's default */
    const char *calib;      /* calibration text, or NULL */
    int64_t samples, seq_len;
    double alpha;           /* SmoothQuant migration strength in [0, 1] */
    li_smooth smooth;
    int64_t threads;        /* calibration threads (<= 0: all cores) */
    /* ---- 4-bit methods ---- */
    bool group_set;         /* --group given (0 then means one group per row) */
    double damp;            /* GPTQ: damping, a fraction of mean(diag H) (0.01) */
    bool act_order;         /* GPTQ: columns by decreasing diag(H) */
    /* GPTQ: each block's X^T X from the model whose blocks below it are
     * already quantized (the paper's sequential calibration), not from the
     * float model's inputs */
    bool sequential;
    bool no_clip;           /* AWQ: skip the clipping search */
    bool alpha_search;      /* W8A8: SmoothQuant's alpha per (layer, site) from 0, 0.1, .., 1 by the int8 matmul's error */
    bool gptq_grid;             /* W8A8, FP8, W4A4: the weights by GPTQ onto the scheme's per-row grid (else round to nearest) */
    /* ---- --rotate (rotate.h): the model rotated first, then calibrated and quantized ---- */
    bool rotate;
    int64_t rot_block;      /* the online Hadamard's block (0: LI_ROT_DEFAULT_BLOCK) */
    uint64_t rot_seed;
} li_quant_opts;

/* "w8a8" -> LI_QMETHOD_W8A8; unknown names: LI_EINVAL listing the methods */
int li_qmethod_parse(const char *s, li_qmethod *out, li_error *err);
const char *li_qmethod_name(li_qmethod m);
/* true for the 4-bit methods (rtn4, awq, gptq, w4a4) */
bool li_qmethod_is_q4(li_qmethod m);
/* true for the methods that run the model over --calib */
bool li_qmethod_needs_calib(const li_quant_opts *o);

/* With o->rotate: the rotated F32 model is written beside the output
 * (OUT.rot.tmp.PID, removed after), then quantized like any input. */
int li_quantize(const li_quant_opts *o, li_error *err);

#endif
