/* train_mm_avx2.c — the AVX2/FMA micro-kernel of train_mm.c's packed GEMM
 * (compiled with -mavx2 -mfma by the _avx2.c rule; run only when CPUID has
 * them): a 6 x 16 tile of C in 12 registers, one k step = two B loads, six
 * broadcasts of A, twelve FMAs. */
#include "train/train_internal.h"

#include <immintrin.h>

void li_train_mm_kern_avx2(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int load) {
    enum { MR = LI_TRAIN_MR256 };
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        c0[r] = load ? _mm256_loadu_ps(C + r * ldc) : _mm256_setzero_ps();
        c1[r] = load ? _mm256_loadu_ps(C + r * ldc + 8) : _mm256_setzero_ps();
    }
    for (int64_t l = 0; l < kc; l++) {
        const __m256 b0 = _mm256_load_ps(Bp + l * 16), b1 = _mm256_load_ps(Bp + l * 16 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m256 a = _mm256_broadcast_ss(Ap + l * MR + r);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(C + r * ldc, c0[r]);
        _mm256_storeu_ps(C + r * ldc + 8, c1[r]);
    }
}

/* dst[l·nr + c] = W[c·ldw + l] for c < cn, l < kc; zero for cn <= c < nr:
 * packing W^T (the forward's B), 8 x 8 blocks transposed in registers
 * instead of scalar stores nr floats apart */
void li_train_mm_pack_bt_avx2(const float *W, int64_t ldw, float *dst, int nr, int cn, int64_t kc) {
    const int cv = cn / 8 * 8;
    const int64_t lv = kc / 8 * 8;
    for (int c0 = 0; c0 < cv; c0 += 8)
        for (int64_t l0 = 0; l0 < lv; l0 += 8) {
            __m256 r[8], t[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(W + (c0 + i) * ldw + l0);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
                r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
                r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
                r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            /* r[0..3]: columns (l) 0,1,2,3 of rows 0-3 | 4-7 lanes halves; r[4..7] the same for rows 4-7 */
            for (int i = 0; i < 4; i++) {
                t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
                t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
            }
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + (l0 + i) * nr + c0, t[i]);
        }
    for (int c = 0; c < cn; c++) {
        const int64_t l_from = c < cv ? lv : 0;
        for (int64_t l = l_from; l < kc; l++) dst[l * nr + c] = W[c * ldw + l];
    }
    for (int64_t l = 0; l < kc; l++)
        for (int c = cn; c < nr; c++) dst[l * nr + c] = 0;
}
