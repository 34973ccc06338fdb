/* worker/checkpoint_internal.h — what the checkpoint writer (checkpoint.c) and reader
 * (checkpoint_read.c) share: the shard record both reduce rank files to, the opened
 * checkpoint, the loader that validates a step directory's rank files, and the strided box
 * copy both use. Folder-internal.
 */
#ifndef HP_WORKER_CHECKPOINT_INTERNAL_H
#define HP_WORKER_CHECKPOINT_INTERNAL_H

#include "hp/checkpoint.h"
#include "hp/safetensors.h"

#define HP__CKPT_RANK_FORMAT  "hp-checkpoint-rank"
#define HP__CKPT_INDEX_FORMAT "hp-checkpoint"

/* One rank's shard of one tensor, as found in a rank file (or claimed by the index). */
typedef struct hp__ckpt_rec {
    const char *fqn;
    int owner;                                  /* the rank whose file holds it */
    int64_t off[HP_MAX_RANK], len[HP_MAX_RANK]; /* the global box held (dims < nd) */
    hp_dtype dtype, state_dtype;
    bool has_state;
    int nd;
    int64_t shape[HP_MAX_RANK]; /* global */
    const hp_st_tensor *t[3];   /* param, exp_avg, exp_avg_sq (NULL for index records) */
} hp__ckpt_rec;

struct hp_ckpt {
    hp_arena arena;
    int64_t step;
    int world;
    hp_ckpt_scalars sc;
    hp_st_file **files; /* [world] */
    int n_rec;
    hp__ckpt_rec *recs; /* sorted by (fqn, off, len, owner): replicas are adjacent */
    int n;
    hp_ckpt_entry *e;   /* sorted by fqn */
    int *first, *count; /* e[i]'s records: recs[first[i] .. first[i] + count[i]) */
};

/* Tensor-name prefixes of the parts in a rank file: "", "exp_avg/", "exp_avg_sq/". */
extern const char *const hp__ckpt_part_prefix[3];

/* DIR/step-%08lld and STEPDIR/rank-%05d.safetensors as fresh strings (NULL: out of memory). */
char *hp__ckpt_step_dir(const char *dir, int64_t step);
char *hp__ckpt_rank_path(const char *sdir, int rank);
/* Elements of a box or shape of nd dims (1 for nd == 0). */
int64_t hp__ckpt_volume(const int64_t *len, int nd);

/* Copies the box of extents n[0..nd) from src (row-major of shape ss, box at origin so) to dst
 * (row-major of shape ds, box at origin dorg), elements of esz bytes, in runs as long as the
 * two layouts allow (one memcpy when both are contiguous). n must fit both; nd == 0 copies
 * one element. */
void hp__ckpt_copy_box(void *dst, const int64_t *ds, const int64_t *dorg, const void *src,
                       const int64_t *ss, const int64_t *so, const int64_t *n, int nd, size_t esz);

/* A fresh, empty checkpoint object for step/world. */
hp_status hp__ckpt_new(int64_t step, int world, hp_ckpt **out, hp_err *err);
void hp__ckpt_free(hp_ckpt *c);
/* Opens and validates every rank file of sdir (c->world of them) into c: files, records
 * (sorted, tiling checked), entries and scalars (all ranks equal). verify: also check every
 * tensor's CRC-32C (version 3 files; HP_PARSE naming the file and tensor on a mismatch). */
hp_status hp__ckpt_load_all(hp_ckpt *c, const char *sdir, bool verify, hp_err *err);

#endif
