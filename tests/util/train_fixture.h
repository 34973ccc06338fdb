/* tests/util/train_fixture.h — the tiny Llama-3 training job the training-loop tests share
 * (the debugmodel's layout at dim 64, 2 layers, 4 heads, 2 kv heads, ffn 96, vocab 128, seq
 * 16). Test code only: failures are Criterion assertions. */
#ifndef HP_TEST_TRAIN_FIXTURE_H
#define HP_TEST_TRAIN_FIXTURE_H

#include "hp/job.h"
#include "hp/models.h"

/* The tiny Llama's spec with `batch` sequences a micro-step (all ranks together). */
hp_model_spec hp_th_tiny_spec(int64_t batch);

/* A validated job of `steps` steps on it, after edit(job) (may be NULL) sets what the test is
 * about: lr 1e-3, warmup 2, log every step, train.global_batch = global (0: one micro-step). */
hp_job *hp_th_tiny_job(int64_t batch, int64_t global, int64_t steps, void (*edit)(hp_job *));

#endif
