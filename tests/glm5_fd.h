/* glm5_fd.h: central finite differences of a scalar loss of a glm5 model on the cpu device against its analytic
 * gradient, shared by check_glm5_grad.c and check_glm5_mtp.c. Hard choices (indexer top-k, expert choice) make the
 * loss piecewise smooth: an element whose difference quotients at h and h/2 disagree sits on a kink and is skipped
 * (counted; the suites require it to be rare). Header-only: each suite is its own executable. */
#ifndef DSARL_TESTS_GLM5_FD_H
#define DSARL_TESTS_GLM5_FD_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "glm5_model.h"

typedef struct glm5_fd_stats {
    int checked, skipped, failed;
    double worst;
    char worst_name[128];
} glm5_fd_stats;

/* For up to per_tensor elements of every trainable tensor of m (built by ops) that pick selects (spread over the tensor by a hash of its
 * index), the central differences at h = 1e-2 and 5e-3 of loss(user) against grads (m->n_weights float32 values in
 * the parameter buffer's layout); an element fails past 2e-2 of its tensor's largest gradient (at least 1e-3). */
static inline void glm5_fd_check(const dsarl_model_ops *ops, dsarl_model *m, const float *grads,
                                 bool (*pick)(const glm5_param *), int per_tensor, double (*loss)(void *user),
                                 void *user, glm5_fd_stats *st)
{
    dsarl_error err;
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        if (!p->trainable || !pick(p))
            continue;
        float *w = malloc((size_t)p->numel * sizeof(float));
        const float *g = grads + p->offset;
        ck_assert_int_eq(ops->read_parameter(m, i, w, NULL, &err), 0);
        double gmax = 0;
        for (int64_t j = 0; j < p->numel; j++)
            gmax = fmax(gmax, fabs(g[j]));
        for (int s = 0; s < per_tensor && s < p->numel; s++) {
            int64_t j = (int64_t)((uint64_t)(s * 2654435761u + (uint64_t)i * 40503u) % (uint64_t)p->numel);
            float saved = w[j];
            double fd[2];
            for (int k = 0; k < 2; k++) {
                float h = k ? 5e-3f : 1e-2f;
                w[j] = saved + h;
                ck_assert_int_eq(ops->write_parameter(m, i, w, &err), 0);
                double lp = loss(user);
                w[j] = saved - h;
                ck_assert_int_eq(ops->write_parameter(m, i, w, &err), 0);
                double lm = loss(user);
                fd[k] = (lp - lm) / (2.0 * h);
            }
            w[j] = saved;
            ck_assert_int_eq(ops->write_parameter(m, i, w, &err), 0);
            double scale = fmax(gmax, 1e-3);
            if (fabs(fd[0] - fd[1]) > 0.05 * scale) { // a top-k or routing choice flipped inside the step
                st->skipped++;
                continue;
            }
            double e = fabs(fd[1] - g[j]) / scale;
            st->checked++;
            if (e > st->worst) {
                st->worst = e;
                snprintf(st->worst_name, sizeof st->worst_name, "%s[%lld] fd %.5g analytic %.5g", p->name,
                         (long long)j, fd[1], g[j]);
            }
            if (e > 2e-2)
                st->failed++;
        }
        free(w);
    }
}

#endif /* DSARL_TESTS_GLM5_FD_H */
