/* hp/data.h — token data for training: sources, validation, and the batch sampler.
 *
 * Sources (hp_data_config.path):
 *   NULL or ""     the built-in corpus: the regular files (not symlinks) under
 *                  /usr/share/common-licenses, in byte-wise sorted name order, concatenated,
 *                  at most HP_DATA_TEXT_MAX bytes (the rest is cut). Present on every Debian
 *                  machine, about 260 KB of real English.
 *   "text:P"       the same byte-level treatment for a text file P, or for the regular files
 *                  of a directory P (sorted), at most HP_DATA_TEXT_MAX bytes.
 *   a file         one llm.c token shard (see below).
 *   a directory    every regular file named *.bin in it, sorted by name, as llm.c shards.
 *   a glob         (contains * ? or [) the matching files, sorted, as llm.c shards.
 * Byte-level text: token = byte value, so any vocab >= 256 fits. For a model vocab < 256
 * each byte is mapped to byte % vocab (lossy, but deterministic: fine for tiny test models).
 *
 * llm.c shards: a header of 256 little-endian int32 — [0] magic, [1] version, [2] token
 * count — then the tokens: magic 20240520 version 1 is uint16 tokens, magic 20240801
 * version 7 is uint32 tokens. Opening checks the magic and version, that the file holds
 * exactly the header plus count tokens, and that every token is < vocab; each error names
 * the file and the bad value (and for a token its index and byte offset). Shards are mapped
 * read-only, never copied.
 *
 * The sampler. Each shard of n tokens holds (n - 1) / T windows of T + 1 tokens; window k
 * starts at token k*T (consecutive windows share one token, as llm.c's loader). The windows
 * of all shards, in shard order, are numbered 0..W-1. The local sample b of rank r at step s
 * is the global sample
 *     g = s * (world * B) + r * B + b
 * which reads window perm_e(g mod W) of epoch e = g / W, where perm_e is a pseudo-random
 * permutation of [0, W) keyed by (seed, e) (a Feistel network with cycle walking; the
 * identity when cfg.sequential). tokens = window[0..T), labels = window[1..T+1).
 * Consequences: within an epoch no window is read twice, by any rank; a world-N run's local
 * batches, concatenated in rank order, are exactly a world-1 run's batch with B' = N*B; and
 * any step's batch is computed directly, so resuming at step s needs no replay.
 *
 * Data position for checkpoints: the step alone (plus the config). hp_data_position says how
 * many samples that is and which epoch; hp_data_info's fingerprint identifies the token
 * content so a resume can check it reads the same data.
 *
 * Concurrency: an opened hp_data is immutable; hp_data_next may run on many threads at once.
 */
#ifndef HP_DATA_H
#define HP_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "hp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_DATA_DEFAULT_DIR "/usr/share/common-licenses"
#define HP_DATA_TEXT_MAX    ((size_t)64 << 20) /* bytes of byte-level text read at most */
#define HP_DATA_MAX_SHARDS  100000
#define HP_LLMC_MAGIC_U16   20240520
#define HP_LLMC_MAGIC_U32   20240801
#define HP_LLMC_HEADER_INTS 256

typedef struct hp_data_config {
    const char *path; /* see the header comment; NULL = the built-in corpus */
    int64_t vocab;    /* model vocabulary: every token must be < vocab (> 0) */
    int64_t batch;    /* B: samples per rank per step (> 0) */
    int64_t seq;      /* T: tokens per sample (> 0) */
    int world;        /* ranks (> 0); global batch = world * batch */
    uint64_t seed;    /* keys the per-epoch permutations */
    bool sequential;  /* windows in order instead of shuffled (llm.c's unshuffled loader) */
} hp_data_config;

typedef struct hp_data_info {
    int n_shards;         /* 1 for byte-level text */
    int64_t n_tokens;     /* all sources together */
    int64_t n_windows;    /* W */
    uint64_t fingerprint; /* hash of the token bytes and the shard boundaries */
    bool byte_level;      /* text source (bytes as tokens) */
} hp_data_info;

/* Where a step's data comes from, for checkpoints and logs. */
typedef struct hp_data_position {
    int64_t samples; /* global samples consumed before the step: step * world * B */
    int64_t epoch;   /* epoch of the step's first sample */
} hp_data_position;

typedef struct hp_data hp_data;

/* Opens and validates the source in cfg (cfg and its strings are copied). Errors: HP_INVALID
 * (config values, naming the field), HP_IO (open/read/mmap, naming the path), HP_PARSE (a bad
 * shard: naming the file and the value), HP_NOT_FOUND (a directory or glob with no shard),
 * HP_LIMIT (more than HP_DATA_MAX_SHARDS shards; fewer than T + 1 tokens in every shard),
 * HP_NOMEM. On failure *out is NULL and nothing leaks. */
hp_status hp_data_open(const hp_data_config *cfg, hp_data **out, hp_err *err);

/* Frees d (NULL is fine). */
void hp_data_free(hp_data *d);

const hp_data_info *hp_data_get_info(const hp_data *d);

/* Fills rank's local batch for step: tokens[B*T] and labels[B*T], row-major [B, T] (labels
 * are the tokens shifted by one). Deterministic in (source, seed, world, B, T, rank, step).
 * Errors: HP_INVALID for a rank outside [0, world) or a negative step, HP_LIMIT when the
 * sample index would overflow int64. Thread-safe. */
hp_status hp_data_next(const hp_data *d, int rank, int64_t step, int64_t *tokens, int64_t *labels,
                       hp_err *err);

/* The data position at the start of step (see the header comment). */
hp_data_position hp_data_position_at(const hp_data *d, int64_t step);

/* Writes an llm.c shard: tokens[0..n) with version 1 (uint16, every token < 65536) or 7
 * (uint32), atomically. For tests and small conversion tools. HP_INVALID names a token that
 * does not fit, HP_IO the path. */
hp_status hp_data_write_shard(const char *path, const uint32_t *tokens, int64_t n, int version,
                              hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
