/* tests/util/train_fixture.c — see train_fixture.h. */
#include "tests/util/train_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>

hp_model_spec hp_th_tiny_spec(int64_t batch) {
    hp_model_spec s;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &s, NULL), HP_OK);
    s.dim = 64, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.ffn_hidden = 96;
    s.vocab = 128, s.batch = batch, s.seq = 16;
    return s;
}

hp_job *hp_th_tiny_job(int64_t batch, int64_t global, int64_t steps, void (*edit)(hp_job *)) {
    hp_model_spec s = hp_th_tiny_spec(batch);
    hp_job *job = hp_job_new();
    cr_assert(job);
    job->model = s;
    hp_err e;
    cr_assert_eq(hp_model_build_joint(&s, &job->graph, &e), HP_OK, "%s", e.msg);
    job->train.steps = steps;
    job->train.local_batch = batch;
    job->train.global_batch = global;
    job->train.seq = s.seq;
    job->train.log_interval = 1;
    job->train.warmup_steps = 2;
    job->train.lr = 1e-3;
    if (edit) edit(job);
    cr_assert_eq(hp_job_validate(job, &e), HP_OK, "%s", e.msg);
    return job;
}
