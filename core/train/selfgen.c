/* selfgen.c — a model's own samples (selfgen.h), moved here from
 * core/cli/distill.c so distill and train-medusa share it. */
#include "train/selfgen.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "util/progress.h"

#include <math.h>
#include <stdlib.h>

/* n tokens sampled from the teacher at temperature 1 (seeded), in segments
 * of up to 256 that each start at BOS: self-distillation data. */
int li_train_self_generate(li_model *m, li_backend *be, int64_t n, uint64_t seed, int32_t **out, li_error *err) {
    const int64_t seg = 256;
    const int32_t V = m->hp.n_vocab, bos = li_tokenizer_bos(m->tok);
    li_session s;
    int rc = li_session_init(&s, m, be, seg, LI_TYPE_F32, 1, err);
    if (rc) return rc;
    int32_t *ids = li_xmalloc((size_t)n * sizeof *ids);
    float *lg = li_xmalloc((size_t)V * sizeof *lg);
    uint64_t rs = seed ? seed * 0x9e3779b97f4a7c15ull : 1;
    li_progress prog;
    li_progress_init(&prog, "self-generate", "tokens/s", n);
    int64_t i = 0, in_seg = 0;
    int32_t cur = bos >= 0 ? bos : 0;
    while (i < n && !rc) {
        if (in_seg == seg - 1) { /* the segment is full: start again at BOS */
            li_session_reset(&s);
            in_seg = 0;
            cur = bos >= 0 ? bos : 0;
        }
        if ((rc = li_session_eval(&s, &cur, 1, false, lg, err))) break;
        in_seg++;
        float mx = lg[0];
        for (int32_t j = 1; j < V; j++) mx = LI_MAX(mx, lg[j]);
        double z = 0;
        for (int32_t j = 0; j < V; j++) z += exp((double)lg[j] - mx);
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        double u = (double)(rs >> 11) * 0x1.0p-53 * z, acc = 0;
        int32_t pick = V - 1;
        for (int32_t j = 0; j < V; j++)
            if ((acc += exp((double)lg[j] - mx)) > u) {
                pick = j;
                break;
            }
        ids[i++] = cur = pick;
        if (i % 16 == 0) li_progress_update(&prog, i, NULL);
    }
    li_progress_finish(&prog);
    free(lg);
    li_session_free(&s);
    if (rc) {
        free(ids);
        return rc;
    }
    *out = ids;
    return 0;
}
