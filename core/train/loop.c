/* loop.c — training steps: gradient accumulation over micro-batches, the
 * NaN/Inf guard, and a run with periodic and on-interrupt checkpoints. */
#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int li_train_step(li_train_model *tm, li_train_grads *g, li_adamw *opt, const li_train_batch *mb, int n_micro,
                  const li_train_loss_opts *lo, const li_adamw_opts *ao, li_train_ws *ws, struct li_threadpool *tp,
                  double *loss, double *kl, double *gnorm, li_error *err) {
    if (n_micro < 1) return li_error_set(err, LI_EINVAL, "train: %d micro-batches", n_micro);
    li_train_loss_opts o = lo ? *lo : (li_train_loss_opts){0};
    o.grad_scale = 1.0f / (float)n_micro;
    li_train_grads_zero(g);
    double sum = 0, ksum = 0;
    for (int j = 0; j < n_micro; j++) {
        double l = 0, k = 0;
        int rc = li_train_forward_backward(tm, g, &mb[j], &o, ws, tp, &l, &k, err);
        if (rc) return rc;
        if (!isfinite(l))
            return li_error_set(err, LI_ERANGE, "train: step %lld: the loss is %g (micro-batch %d)",
                                (long long)opt->step + 1, l, j + 1);
        sum += l;
        ksum += k;
    }
    if (loss) *loss = sum / n_micro;
    if (kl) *kl = ksum / n_micro;
    /* --train scales: the matrices' dW made into their scales' gradients */
    li_train_scales_grad(tm, g, ao->tp ? ao->tp : tp);
    const int rc = li_adamw_step(opt, tm, g, ao, gnorm, err);
    /* QAT: AdamW stepped the masters; the passes see them rounded again */
    if (!rc) li_train_qat_refresh(tm, true, ao->tp ? ao->tp : tp);
    /* trained scales: the matrices' values from their new scales */
    if (!rc) li_train_scales_refresh(tm, ao->tp ? ao->tp : tp);
    return rc;
}

int li_train_run(li_train_model *tm, const li_train_run_opts *o, int *steps_done, li_error *err) {
    if (steps_done) *steps_done = 0;
    if (o->steps < 0 || o->n_micro < 1 || !o->next_batch)
        return li_error_set(err, LI_EINVAL, "train: bad run options (%d steps, %d micro-batches)", o->steps,
                            o->n_micro);
    li_train_grads g = {0};
    li_adamw opt = {0};
    li_train_ws ws = {0};
    li_train_batch mb[64];
    if (o->n_micro > (int)LI_ARRAY_LEN(mb))
        return li_error_set(err, LI_EINVAL, "train: at most %d micro-batches per step", (int)LI_ARRAY_LEN(mb));
    int rc = 0;
    if (li_train_grads_init(&g, &tm->L) || li_adamw_init(&opt, &tm->L)) {
        rc = li_error_set(err, LI_ENOMEM, "train: cannot allocate gradients and optimizer state (%zu floats)",
                          tm->L.n_grads * 2 + LI_MAX(tm->L.n_grads, tm->L.n_grads_all));
        goto done;
    }
    int step = 0, last_ckpt = 0;
    while (step < o->steps) {
        if (o->stop && *o->stop) break;
        for (int j = 0; j < o->n_micro && !rc; j++) rc = o->next_batch(o->ctx, step + 1, j, &mb[j], err);
        if (rc) goto done;
        if (!ws.buf || ws.B != mb[0].B || ws.T != mb[0].T) {
            li_train_ws_free(&ws);
            if ((rc = li_train_ws_init(&ws, &tm->L, mb[0].B, mb[0].T, err))) goto done;
        }
        double loss = 0, kl = 0, gn = 0;
        li_adamw_opts ao = o->adamw;
        if (!ao.tp) ao.tp = o->tp;
        ao.lr = (float)li_train_lr_at(&o->sched, o->adamw.lr, step + 1, o->steps);
        if ((rc = li_train_step(tm, &g, &opt, mb, o->n_micro, &o->loss, &ao, &ws, o->tp, &loss, &kl, &gn,
                                err))) {
            if (rc == LI_ERANGE && o->out) {
                /* the message names the step; say what is kept */
                const size_t n = strlen(err->msg);
                if (last_ckpt)
                    snprintf(err->msg + n, sizeof err->msg - n, "; training stopped, the checkpoint keeps step %d",
                             last_ckpt);
                else
                    snprintf(err->msg + n, sizeof err->msg - n, "; training stopped before any checkpoint");
            }
            goto done;
        }
        step++;
        if (steps_done) *steps_done = step;
        if (o->on_step) o->on_step(o->ctx, step, loss, kl, gn, ao.lr);
        if (o->out && o->ckpt_every > 0 && step % o->ckpt_every == 0 && step < o->steps &&
            (rc = li_train_save(tm, o->src, o->dtype, o->out, err)))
            goto done;
        if (o->out && o->ckpt_every > 0 && step % o->ckpt_every == 0) last_ckpt = step;
    }
    /* the end of the run, or an interrupt */
    if (o->out) rc = li_train_save(tm, o->src, o->dtype, o->out, err);
done:
    li_train_ws_free(&ws);
    li_train_grads_free(&g);
    li_adamw_free(&opt);
    return rc;
}
