/* hp/checkpoint.h — sharded training checkpoints that load into any mesh.
 *
 * Layout of a checkpoint root DIR (one per run):
 *   DIR/step-00000010/rank-00000.safetensors   rank 0's shards
 *   DIR/step-00000010/rank-00001.safetensors   ...
 *   DIR/step-00000010/index.json               written last: its presence marks the
 *                                              checkpoint complete
 * A rank holds of each tensor an N-D box: per dim an offset and an extent (FSDP splits dim 0;
 * tensor parallelism on a (dp, tp) mesh splits another dim too). A rank file is an ordinary
 * safetensors file: the parameter's box (shape = the box's extents, row-major, no padding)
 * under its FQN, AdamW's first and second moments under "exp_avg/FQN" and "exp_avg_sq/FQN"
 * (PyTorch's names), and in __metadata__ the scalars ("hp.step", "hp.seed", "hp.rng_offset",
 * "hp.data_step", "hp.data_fingerprint", "hp.loss_scale"), "hp.format", "hp.version",
 * "hp.rank", "hp.world", and "hp.shards", JSON mapping each FQN to its global shape and box:
 *   {"FQN": {"shape": [512, 256], "off": [256, 0], "len": [256, 128]}, ...}
 * So any safetensors tool can read the tensors. index.json maps each FQN to its global shape,
 * dtype, state dtype and every rank's box, one tensor a line:
 *   "FQN":{"dtype":"F32","shape":[5,3],"state_dtype":"F32",
 *          "shards":[{"rank":0,"off":[0,0],"len":[3,2]},{"rank":1,"off":[0,2],"len":[3,1]},...]}
 * A checkpoint written by one mesh is read by any other with hp_ckpt_read_box, which
 * assembles any box from whichever rank files hold it. A rank-0 tensor has no dims (off and
 * len are empty arrays) and is one element.
 *
 * Checksums (version 3): each rank file's __metadata__ also holds "hp.crc32c", JSON mapping
 * every tensor name in the file (FQN, "exp_avg/FQN", "exp_avg_sq/FQN") to the CRC-32C
 * (Castagnoli) of its bytes as stored, 8 lowercase hex digits:
 *   {"tok_embeddings.weight": "1c2f9a07", "exp_avg/tok_embeddings.weight": "...", ...}
 * Per tensor, in the file it covers, so a corrupt tensor is named and a rank file checks on
 * its own. hp_ckpt_open verifies every tensor of every rank file before returning (a
 * mismatch is HP_PARSE naming the file and the tensor); hp_ckpt_commit checks that the
 * checksums are there but does not re-read the bytes. A version-3 file without them is
 * refused.
 *
 * Versions: this code writes version 3 (boxes + checksums). Version 2 (boxes, no checksums:
 * nothing to verify) and version 1 (row ranges: "hp.shards" FQN -> [start, end, global rows],
 * index shards [[rank, start, end], ...]) still open and read: a row range is the box
 * [start, end) x every other dim whole.
 *
 * Protocol: every rank calls hp_ckpt_write_rank (each file: temp name, fsync, rename, fsync
 * the directory); after all have returned (the caller's barrier), one rank calls
 * hp_ckpt_commit, which re-reads every rank file's header, checks that the boxes tile every
 * tensor and agree on the scalars, writes index.json the same durable way, and prunes old
 * checkpoints. A checkpoint interrupted anywhere before the index exists is ignored by
 * hp_ckpt_latest (found by scanning the step directories, not through a symlink) and removed
 * by a later prune once a newer checkpoint is complete.
 *
 * Replicated tensors (or replicated parts, e.g. a tp-split weight on every dp rank): save the
 * same box from several ranks (copies; one of them is read), or from one rank only and an
 * empty box (any len 0) or no shard elsewhere. Boxes of one tensor that partially overlap are
 * an error. Padding: a rank's local buffer may be larger than its box on any dim (held[]);
 * the padding is never saved, and reads leave the caller's padding untouched.
 *
 * Not here: async writes, compression, optimizer states other than AdamW's m and v.
 * Threads: an opened hp_ckpt is immutable (all rank files are mapped at open); reads from
 * many threads are safe. Writers of one step must be distinct ranks.
 */
#ifndef HP_CHECKPOINT_H
#define HP_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hp/base.h"
#include "hp/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_CKPT_VERSION   3 /* written; 2 (no checksums) and 1 (row ranges) still read */
#define HP_CKPT_INDEX     "index.json"
#define HP_CKPT_MAX_WORLD 65536
#define HP_CKPT_MAX_INDEX ((size_t)256 << 20) /* bytes of index.json read at most */

/* The run's scalar state at a checkpoint; the same on every rank. */
typedef struct hp_ckpt_scalars {
    int64_t step;              /* optimizer steps completed: names the checkpoint (>= 0) */
    uint64_t seed;             /* the run's seed (init RNG, data permutation) */
    uint64_t rng_offset;       /* counter-based RNG draws consumed after init; 0 when none */
    int64_t data_step;         /* the step to pass to hp_data_next next (the data position) */
    uint64_t data_fingerprint; /* hp_data_info.fingerprint of the data, to check on resume */
    double loss_scale;         /* dynamic loss scale; 1 when unused */
} hp_ckpt_scalars;

/* One tensor as one rank holds it, for hp_ckpt_write_rank. All pointers borrowed. */
typedef struct hp_ckpt_shard {
    const char *fqn; /* non-empty, no '/' */
    hp_dtype dtype;
    int rank;                   /* of the global tensor, 0..HP_MAX_RANK */
    int64_t shape[HP_MAX_RANK]; /* the global shape */
    int64_t off[HP_MAX_RANK];   /* the global box held: elements [off[d], off[d] + len[d]) */
    int64_t len[HP_MAX_RANK];   /* on each dim d < rank; any len 0: nothing of it is saved */
    int64_t held[HP_MAX_RANK];  /* the buffers' shape, held[d] >= len[d]: the box is their
                                   top-left corner, the rest padding (not saved); all zero:
                                   held == len */
    const void *param;          /* [held] of dtype, row-major */
    hp_dtype state_dtype;       /* of exp_avg / exp_avg_sq (usually HP_F32) */
    const void *exp_avg;        /* [held] like param, or NULL: no optimizer state */
    const void *exp_avg_sq;     /* NULL exactly when exp_avg is NULL */
} hp_ckpt_shard;

/* Writes DIR/step-<sc->step>/rank-<rank>.safetensors (creating directories as needed and
 * removing a stale index.json of the same step first). A box not contiguous in its held
 * buffer is packed into a temporary copy. Errors: HP_INVALID naming the shard and field (box
 * outside the shape, held smaller than the box, bad fqn, NULL data), HP_IO naming the path,
 * HP_NOMEM. */
hp_status hp_ckpt_write_rank(const char *dir, int rank, int world, const hp_ckpt_scalars *sc,
                             const hp_ckpt_shard *ts, int n, hp_err *err);

/* Completes checkpoint `step` written by `world` ranks: validates every rank file (all
 * present, same step/world/scalars, consistent dtypes and shapes, every box inside the shape,
 * any two boxes of a tensor identical (replicas) or disjoint, and the distinct boxes covering
 * every element), writes index.json durably, then hp_ckpt_prune(dir, keep). Errors (HP_PARSE)
 * name the rank file and the tensor; nothing is written then. */
hp_status hp_ckpt_commit(const char *dir, int64_t step, int world, int keep, hp_err *err);

/* hp_ckpt_write_rank + hp_ckpt_commit for a single-rank run. */
hp_status hp_ckpt_save(const char *dir, const hp_ckpt_scalars *sc, const hp_ckpt_shard *ts, int n,
                       int keep, hp_err *err);

/* The newest complete checkpoint's step in dir. HP_NOT_FOUND when there is none (a missing
 * dir included); HP_IO when dir cannot be read. */
hp_status hp_ckpt_latest(const char *dir, int64_t *step, hp_err *err);
/* The newest complete checkpoint's step below `before` (a resume's fallback when the newest
 * fails verification). HP_NOT_FOUND when there is none; HP_IO as hp_ckpt_latest. */
hp_status hp_ckpt_latest_before(const char *dir, int64_t before, int64_t *step, hp_err *err);

/* Keeps the `keep` newest complete checkpoints (keep <= 0 keeps all) and removes older ones,
 * plus incomplete step directories older than the newest complete one (interrupted writes;
 * newer incomplete ones may be in progress and stay). */
hp_status hp_ckpt_prune(const char *dir, int keep, hp_err *err);
/* Removes every step directory at a step >= from, complete or not (a resume below them: they
 * hold a future that is trained again, and must never be resumed from or pruned against). */
hp_status hp_ckpt_remove_from(const char *dir, int64_t from, hp_err *err);

/* ---- reading -------------------------------------------------------------------------------- */

typedef struct hp_ckpt hp_ckpt;

/* A tensor of an opened checkpoint (its global view). */
typedef struct hp_ckpt_entry {
    const char *fqn;
    hp_dtype dtype;
    int rank;
    int64_t shape[HP_MAX_RANK];
    int64_t rows;   /* shape[0], or 1 for rank 0 */
    bool has_state; /* exp_avg / exp_avg_sq present */
    hp_dtype state_dtype;
} hp_ckpt_entry;

typedef enum { HP_CKPT_PARAM, HP_CKPT_EXP_AVG, HP_CKPT_EXP_AVG_SQ } hp_ckpt_part;

/* Opens checkpoint `step` of dir (step < 0: the latest complete one) and validates the index
 * against every rank file it names (present, well-formed, same step and world, each listed
 * shard there with the right dtype and shape, every tensor's CRC-32C when the files carry
 * them: this reads all of the checkpoint's bytes once). Errors: HP_NOT_FOUND (no such complete
 * checkpoint), HP_PARSE naming the file and field, HP_IO, HP_NOMEM. */
hp_status hp_ckpt_open(const char *dir, int64_t step, hp_ckpt **out, hp_err *err);
void hp_ckpt_close(hp_ckpt *c); /* NULL is fine */

int64_t hp_ckpt_step(const hp_ckpt *c);
int hp_ckpt_world(const hp_ckpt *c); /* the world size that wrote it */
const hp_ckpt_scalars *hp_ckpt_get_scalars(const hp_ckpt *c);
int hp_ckpt_count(const hp_ckpt *c); /* tensors, sorted by FQN */
const hp_ckpt_entry *hp_ckpt_entry_at(const hp_ckpt *c, int i);
const hp_ckpt_entry *hp_ckpt_find(const hp_ckpt *c, const char *fqn); /* NULL when absent */

/* Copies the global box [off, off + len) of the FQN's `part` into the top-left corner of out,
 * a row-major buffer of shape held (NULL: held = len) of the entry's dtype for the parameter,
 * state_dtype for the moments, gathering it from whichever rank files hold it; elements of
 * out outside the box are left untouched. `rank` must equal the entry's rank (off, len and
 * held have that many dims; NULL is fine for a rank-0 tensor). out_bytes must equal
 * prod(held) * dtype size. Errors: HP_NOT_FOUND (FQN, or a moment of a tensor saved without
 * state), HP_INVALID naming the FQN (rank, box outside the shape, held smaller than the box,
 * size), HP_PARSE (part of the box in no rank file: cannot happen once opened). */
hp_status hp_ckpt_read_box(const hp_ckpt *c, const char *fqn, hp_ckpt_part part, int rank,
                           const int64_t *off, const int64_t *len, const int64_t *held, void *out,
                           size_t out_bytes, hp_err *err);

/* Writes the full parameters (not the optimizer state) as one safetensors file keyed by FQN,
 * loadable by PyTorch. Holds all parameters in memory while writing. */
hp_status hp_ckpt_export(const hp_ckpt *c, const char *path, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
