/* trainer_guard.c: the optimizer step behind the non-finite guard. A NaN or infinite loss or gradient norm would
 * poison AdamW's moments and every weight in one update, so the step is skipped before the update, reported with
 * what was not finite and where, and a run that keeps producing them stops instead of training on garbage. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/log.h"
#include "dsarl/trainer.h"

#define MAX_NONFINITE_KEY "policy.max_consecutive_nonfinite_steps"
#define POISON_ENV "DSARL_TEST_POISON_GRAD"

// "K" or "K-L" (1-based guarded calls) from the test hook's environment variable; anything else is refused so a
// typo does not silently test nothing.
static int parse_poison(const char *text, int64_t *first, int64_t *last, dsarl_error *err)
{
    char *end = NULL;
    long long a = strtoll(text, &end, 10), b = a;
    if (end != text && *end == '-') {
        const char *p = end + 1;
        b = strtoll(p, &end, 10);
        if (end == p)
            b = -1;
    }
    if (end == text || *end != '\0' || a < 1 || b < a)
        return DSARL_FAIL(err, DSARL_E_INVALID, POISON_ENV " (a test hook) must be K or K-L with 1 <= K <= L "
                          "(guarded optimizer steps), got \"%s\"", text);
    *first = a;
    *last = b;
    return DSARL_OK;
}

int dsarl_nonfinite_guard_from_recipe(const dsarl_node *root, dsarl_nonfinite_guard *g, dsarl_error *err)
{
    memset(g, 0, sizeof *g);
    g->struct_size = (uint32_t)sizeof *g;
    g->max_consecutive = 3;
    if (root)
        DSARL_TRY(dsarl_recipe_int_or(root, MAX_NONFINITE_KEY, 3, &g->max_consecutive, err));
    if (g->max_consecutive < 1)
        return dsarl_recipe_fail(root, MAX_NONFINITE_KEY, err, DSARL_E_INVALID, "must be >= 1 (1 = stop at the first "
                                 "non-finite step), got %" PRId64, g->max_consecutive);
    const char *poison = getenv(POISON_ENV);
    if (poison && *poison) {
        DSARL_TRY(parse_poison(poison, &g->poison_first, &g->poison_last, err));
        dsarl_log(DSARL_LOG_WARN, POISON_ENV "=%s: test hook on, guarded optimizer steps %" PRId64 "-%" PRId64
                  " see a NaN gradient norm", poison, g->poison_first, g->poison_last);
    }
    return DSARL_OK;
}

// The first parameter whose gradient holds a NaN or infinity (name into out), read back one tensor at a time;
// "" when none is found or the model cannot say. Only meaningful where one process holds every gradient.
static void first_nonfinite_gradient(const dsarl_model_ops *ops, dsarl_model *model, char *out, size_t size)
{
    out[0] = '\0';
    if (!ops->parameter_tensors || !ops->parameter_info || !ops->read_parameter)
        return;
    int64_t n = ops->parameter_tensors(model);
    for (int64_t i = 0; i < n && !out[0]; i++) {
        const char *name = NULL;
        int32_t ndim = 0;
        int64_t shape[DSARL_TENSOR_MAX_DIMS];
        int trainable = 0;
        dsarl_error ignored;
        if (ops->parameter_info(model, i, &name, &ndim, shape, &trainable, &ignored) != 0 || ndim < 0 ||
            ndim > DSARL_TENSOR_MAX_DIMS)
            return;
        if (!trainable)
            continue;
        int64_t numel = 1;
        for (int32_t d = 0; d < ndim; d++)
            numel = shape[d] > 0 && numel <= INT64_MAX / shape[d] ? numel * shape[d] : -1;
        if (numel < 1 || numel > ((int64_t)1 << 31))
            continue;
        float *grad = malloc((size_t)numel * sizeof *grad);
        if (grad && ops->read_parameter(model, i, NULL, grad, &ignored) == 0)
            for (int64_t k = 0; k < numel; k++)
                if (!isfinite(grad[k])) {
                    snprintf(out, size, "%s (element %" PRId64 " is %g)", name ? name : "?", k, (double)grad[k]);
                    break;
                }
        free(grad);
    }
}

int dsarl_session_optimizer_step(dsarl_session *s, const dsarl_optimizer_params *adam, double lr,
                                 double max_grad_norm, const char *loss_name, double loss, double *grad_norm,
                                 bool *skipped, dsarl_error *err)
{
    const dsarl_model_ops *ops = s->model_ops;
    dsarl_nonfinite_guard *g = &s->guard;
    if (g->struct_size == 0) { // a session opened without a recipe keeps the defaults
        DSARL_TRY(dsarl_nonfinite_guard_from_recipe(NULL, g, err));
    }
    *skipped = false;
    g->calls++;
    int64_t step = (ops->optimizer_steps ? ops->optimizer_steps(s->model) : g->calls - 1) + 1;
    bool loss_bad = !isfinite(loss);
    double norm = NAN;
    bool poisoned = false;
    if (!loss_bad) {
        // the reduction and norm of dsarl_trainer_optimizer_step, then its update only when the norm is finite
        if (DSARL_MODEL_HAS(ops, reduce_gradients))
            DSARL_TRY(ops->reduce_gradients(s->model, err));
        DSARL_TRY(ops->grad_norm(s->model, &norm, err));
        if (g->poison_first > 0 && g->calls >= g->poison_first && g->calls <= g->poison_last)
            norm = NAN, poisoned = true;
    }
    if (!loss_bad && isfinite(norm)) {
        double scale;
        DSARL_TRY(dsarl_grad_clip_scale(norm, max_grad_norm, &scale, err));
        dsarl_optimizer_params op = *adam;
        op.struct_size = sizeof op;
        op.lr = lr;
        op.grad_scale = scale;
        DSARL_TRY(ops->optimizer_step(s->model, &op, err));
        g->consecutive = 0;
        *grad_norm = norm;
        return DSARL_OK;
    }
    // skip: nothing reaches the weights or the moments, and the next step starts from clean gradients
    char what[384];
    if (loss_bad) {
        snprintf(what, sizeof what, "the loss (%s) is %g", loss_name ? loss_name : "loss", loss);
    } else {
        char tensor[256] = "";
        const dsarl_parallel *par = s->config.parallel;
        if (poisoned)
            snprintf(tensor, sizeof tensor, "none, the test hook " POISON_ENV " poisoned the norm");
        else if (!par || par->world_size <= 1)
            first_nonfinite_gradient(ops, s->model, tensor, sizeof tensor);
        snprintf(what, sizeof what, "the gradient norm is %g%s%s", norm, tensor[0] ? "; first non-finite gradient: "
                 : "", tensor);
    }
    DSARL_TRY(ops->zero_grad(s->model, err));
    g->consecutive++;
    g->skipped++;
    *skipped = true;
    *grad_norm = norm;
    if (g->consecutive >= g->max_consecutive)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "optimizer step %" PRId64 " (update %" PRId64 " of this process): %s; %" PRId64 " non-finite steps in a "
                          "row reached " MAX_NONFINITE_KEY "=%" PRId64 ", so the run stops (none was applied; "
                          "lower the learning rate or check the data)", step, g->calls, what, g->consecutive,
                          g->max_consecutive);
    dsarl_log(DSARL_LOG_WARN, "optimizer step %" PRId64 " (update %" PRId64 " of this process): %s; skipped (%" PRId64 " in a row, the run stops at "
              MAX_NONFINITE_KEY "=%" PRId64 ")", step, g->calls, what, g->consecutive, g->max_consecutive);
    return DSARL_OK;
}
