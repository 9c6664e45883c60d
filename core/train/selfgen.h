/* selfgen.h — a model's own samples as training text (self-distillation:
 * `luainfer distill --self-generate`, `luainfer train-medusa --self-generate`). */
#ifndef LI_SELFGEN_H
#define LI_SELFGEN_H

#include "model/model.h"

/* n tokens sampled from m on backend be at temperature 1 (seeded), in
 * segments of up to 256 that each start at BOS (the BOS itself is not in
 * the output); progress on stderr. *out: malloc'd (n). */
int li_train_self_generate(li_model *m, li_backend *be, int64_t n, uint64_t seed, int32_t **out, li_error *err);

/* The same with n_streams sequences sampled side by side, one token of each
 * per forward pass (a batch of n_streams rows: the weights are read once
 * for all of them, several times faster than one stream on a CPU). Stream
 * j draws from its own generator (seed, j); the output holds each round's
 * segments one after another, stream 0 first, cut at n. n_streams 1 is
 * another stream than li_train_self_generate's (distill --streams 1 keeps
 * that one). */
int li_train_self_generate_n(li_model *m, li_backend *be, int64_t n, uint64_t seed, int n_streams, int32_t **out,
                             li_error *err);

#endif
