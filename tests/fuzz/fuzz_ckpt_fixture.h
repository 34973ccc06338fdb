/* tests/fuzz/fuzz_ckpt_fixture.h — the small checkpoint fuzz_ckpt_index.c opens (and
 * make_seeds.c writes the seed index of): step 7 of a world-2 run, "w" F32[4, 3] split by
 * rows over the two ranks with AdamW state, "b" F32[3] replicated without state. */
#ifndef HP_FUZZ_CKPT_FIXTURE_H
#define HP_FUZZ_CKPT_FIXTURE_H

#include "hp/checkpoint.h"

#define HP_FUZZ_CKPT_STEP 7

static const float hp_fuzz_w[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static const float hp_fuzz_b[3] = {-1, 0, 1};

static inline hp_status hp_fuzz_ckpt_save(const char *dir) {
    hp_ckpt_scalars sc = {.step = HP_FUZZ_CKPT_STEP,
                          .seed = 42,
                          .rng_offset = 3,
                          .data_step = HP_FUZZ_CKPT_STEP,
                          .data_fingerprint = 0x1234,
                          .loss_scale = 1};
    for (int r = 0; r < 2; r++) {
        hp_ckpt_shard ts[2] = {
            {.fqn = "w",
             .dtype = HP_F32,
             .rank = 2,
             .shape = {4, 3},
             .off = {2 * r, 0},
             .len = {2, 3},
             .param = hp_fuzz_w + 6 * r,
             .state_dtype = HP_F32,
             .exp_avg = hp_fuzz_w,
             .exp_avg_sq = hp_fuzz_w + 6},
            {.fqn = "b",
             .dtype = HP_F32,
             .rank = 1,
             .shape = {3},
             .off = {0},
             .len = {3},
             .param = hp_fuzz_b},
        };
        hp_status s = hp_ckpt_write_rank(dir, r, 2, &sc, ts, 2, NULL);
        if (s != HP_OK) return s;
    }
    return hp_ckpt_commit(dir, HP_FUZZ_CKPT_STEP, 2, 0, NULL);
}

#endif
