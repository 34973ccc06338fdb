/* hp/optim.h — AdamW, gradient clipping and the LR schedule, as torch and torchtitan do them.
 *
 * AdamW is torch.optim.AdamW (torch 1.13, _single_tensor_adamw, amsgrad off, maximize off), one
 * fused pass per element in float32 with torch's exact operation order and rounding, so on
 * the same inputs the results equal torch's CPU (AVX2) kernels bit for bit:
 *
 *   p   = p * f32(1 - lr * wd)
 *   m   = fma(g, f32(1 - b1), m * f32(b1))                  exp_avg.mul_(b1).add_(g, 1 - b1)
 *   v   = fma(f32(1 - b2) * g, g, v * f32(b2))    exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
 *   den = sqrt(v) / f32(sqrt(1 - b2^t)) + f32(eps)
 *   p   = p + (f32(-lr / (1 - b1^t)) * m) / den
 *
 * (scalars computed in double as Python does, rounded to float where torch rounds them).
 * Gradient norms accumulate in double over fixed 16384-element blocks of the concatenated
 * gradient list, the block sums added in order, so the result is the same for any thread count.
 *
 * Buffers are borrowed: the runtime owns parameters, gradients and the two moment buffers
 * (they live in its arenas and in checkpoints); these functions only update them.
 */
#ifndef HP_OPTIM_H
#define HP_OPTIM_H

#include "hp/base.h"
#include "hp/threads.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- AdamW ----------------------------------------------------------------------------------- */

typedef struct hp_adamw_config {
    double beta1, beta2; /* in [0, 1) */
    double eps;          /* >= 0 */
    double weight_decay; /* >= 0, decoupled, applied to every tensor (as torchtitan) */
} hp_adamw_config;

/* torchtitan's defaults: betas (0.9, 0.95), eps 1e-8, weight decay 0.1. */
hp_adamw_config hp_adamw_defaults(void);

/* One parameter tensor (or this rank's shard of it) and its state, all float32, numel long. */
typedef struct hp_adamw_param {
    float *param;
    const float *grad;
    float *exp_avg;    /* first moment, zero before step 1 */
    float *exp_avg_sq; /* second moment, zero before step 1 */
    int64_t numel;
    /* NULL, or the parameter's bf16 copy (mixed precision's param_dtype): each updated
     * element is also stored there, rounded to nearest even, the bits _to_copy gives */
    uint16_t *param_bf16;
} hp_adamw_param;

/* Applies one AdamW update with learning rate lr to every tensor. `step` is the step count
 * after this update, 1 for the first (torch's state["step"] after its increment); every
 * tensor shares it. Work is spread over pool (NULL: calling thread); results do not depend on
 * the pool size. Errors (nothing updated): config out of range, lr negative or not finite,
 * step < 1, n_params < 0, a tensor with numel < 0 or a NULL buffer. NaN/inf gradients are
 * not errors: they propagate as in torch. */
hp_status hp_adamw_step(const hp_adamw_config *cfg, double lr, int64_t step,
                        const hp_adamw_param *params, int n_params, hp_pool *pool, hp_err *err);
/* The same step on gradients read times grad_scale (gradient clipping's coefficient, > 0 and
 * finite; 1: as read): the bits of hp_grad_scale(grads, grad_scale) then hp_adamw_step, with
 * one pass over the gradients fewer, and the gradients left as they were. */
hp_status hp_adamw_step_scaled(const hp_adamw_config *cfg, double lr, float grad_scale,
                               int64_t step, const hp_adamw_param *params, int n_params,
                               hp_pool *pool, hp_err *err);

/* ---- gradient norm and clipping ------------------------------------------------------------ */

/* A float32 buffer. */
typedef struct hp_fspan {
    float *data;
    int64_t n;
} hp_fspan;

/* Sum of squares of all elements of all spans in double, deterministic as described above:
 * the local part of a global norm (ranks all-reduce it, then take the square root). Errors:
 * n < 0, a span with n < 0 or NULL data with n > 0. NaN/inf elements give NaN/inf. */
hp_status hp_grad_sumsq(const hp_fspan *grads, int n, hp_pool *pool, double *sumsq, hp_err *err);

/* torch.nn.utils.clip_grad_norm_'s factor for a global norm: in float32, as torch computes
 * it, max_norm / (total_norm + 1e-6), clamped to at most 1. A non-finite norm gives NaN or 0,
 * as in torch (the caller decides whether to skip the step). */
float hp_clip_coef(double total_norm, double max_norm);

/* Multiplies every element by coef (float32). coef == 1 leaves the buffers untouched. Errors
 * as hp_grad_sumsq. */
hp_status hp_grad_scale(const hp_fspan *grads, int n, float coef, hp_pool *pool, hp_err *err);

/* Gradient accumulation: dst[i] += src[i] element by element (float32), span by span (first:
 * dst[i] = src[i], whatever dst held). Errors as hp_grad_sumsq, and a span pair whose lengths
 * differ; nothing is written then. */
hp_status hp_grad_accumulate(const hp_fspan *dst, const hp_fspan *src, int n, bool first,
                             hp_pool *pool, hp_err *err);

/* Single-rank clip_grad_norm_: total = sqrt(sumsq); scales by hp_clip_coef if it is < 1;
 * returns the norm before clipping in *total_norm (may be NULL). max_norm must be > 0 and
 * finite (HP_INVALID otherwise). */
hp_status hp_clip_grad_norm(const hp_fspan *grads, int n, double max_norm, hp_pool *pool,
                            double *total_norm, hp_err *err);

/* ---- learning-rate schedule ---------------------------------------------------------------- */

typedef enum {
    HP_LR_DECAY_LINEAR = 0,
    HP_LR_DECAY_SQRT,
    HP_LR_DECAY_COSINE,
    HP_LR_DECAY_NONE, /* constant after warmup */
} hp_lr_decay;

/* torchtitan's linear_warmup_stable_decay (components/lr_scheduler.py, the min_lr_factor
 * version), as a LambdaLR whose lambda is evaluated at c = step - 1 for training step `step`
 * (1-based):
 *
 *   warmup = min(warmup_steps, total_steps)
 *   decay  = round(total * decay_ratio) capped at total - warmup, or total - warmup without a
 *            ratio (decay_ratio < 0); 0 for HP_LR_DECAY_NONE
 *   stable = total + 1 - warmup - decay          (the "virtual last step" keeps lr > 0)
 *   c < warmup:            f = (c + 1) / warmup
 *   c < warmup + stable:   f = 1
 *   else:  p = (c + 1 - warmup - stable) / decay;  linear 1 - p, sqrt 1 - sqrt(p),
 *          cosine (1 + cos(pi p)) / 2;  f = min_lr_factor + (1 - min_lr_factor) * that
 *   lr = base_lr * f
 *
 * e.g. total 10, warmup 2, linear, min 0: steps 1..10 get 0.5, 1, 1, 0.875, ..., 0.125 of lr. */
typedef struct hp_lr_schedule {
    double base_lr;
    int64_t warmup_steps, stable_steps, decay_steps;
    hp_lr_decay decay;
    double min_lr_factor;
} hp_lr_schedule;

/* Fills *s. Errors: base_lr negative or not finite, total_steps < 1, warmup_steps < 0,
 * decay_ratio > 1 or NaN, min_lr_factor outside [0, 1], an unknown decay kind. */
hp_status hp_lr_schedule_init(hp_lr_schedule *s, double base_lr, int64_t total_steps,
                              int64_t warmup_steps, double decay_ratio, hp_lr_decay decay,
                              double min_lr_factor, hp_err *err);

/* The learning rate of training step `step` (1-based). Steps past the end keep decaying
 * along the formula; step < 1 counts as 1. */
double hp_lr_at(const hp_lr_schedule *s, int64_t step);

/* "linear", "sqrt", "cosine", "none" (also "constant") <-> the enum. */
const char *hp_lr_decay_name(hp_lr_decay d);
hp_status hp_lr_decay_parse(const char *name, hp_lr_decay *out, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
