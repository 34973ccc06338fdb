/* hp/safetensors.h — read and write Hugging Face safetensors files.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
 *    "__metadata__": {"key": "value", ...}}          (metadata optional, strings only)
 * then the data region; offsets are relative to its start. Tensors are row-major,
 * little-endian, and tile the data region exactly (no gaps, no overlaps).
 *
 * Reading maps the file read-only and validates everything before returning: the header
 * length (at most HP_ST_MAX_HEADER and within the file), the JSON, every tensor's dtype,
 * shape (rank <= HP_ST_MAX_RANK, dims in [0, HP_MAX_DIM]), offsets (in range, END - BEGIN ==
 * numel * dtype size, contiguous) and unique names. Errors name the file, the tensor and the
 * field. Nothing is allocated in proportion to anything but the (bounded) header.
 *
 * Writing builds the header with jansson (metadata first, tensors in the order given, header
 * padded with spaces to a multiple of 8), then writes header and data to a temp file, fsyncs,
 * renames and fsyncs the directory.
 *
 * Not here: dtype conversion beyond hp_st_to_f32, big-endian hosts, lazy loading over a
 * network. Concurrency: an open file is immutable; reading it from many threads is safe.
 */
#ifndef HP_SAFETENSORS_H
#define HP_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hp/base.h"
#include "hp/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_ST_MAX_HEADER ((uint64_t)100 << 20) /* the reference implementation's bound */
#define HP_ST_MAX_RANK   8

/* The safetensors dtypes: X(ENUM, "name in the file", bytes per element). */
#define HP_ST_DTYPE_LIST(X)                                                                        \
    X(BOOL, "BOOL", 1)                                                                             \
    X(U8, "U8", 1)                                                                                 \
    X(I8, "I8", 1)                                                                                 \
    X(F8_E4M3, "F8_E4M3", 1)                                                                       \
    X(F8_E5M2, "F8_E5M2", 1)                                                                       \
    X(I16, "I16", 2)                                                                               \
    X(U16, "U16", 2)                                                                               \
    X(F16, "F16", 2)                                                                               \
    X(BF16, "BF16", 2)                                                                             \
    X(I32, "I32", 4)                                                                               \
    X(U32, "U32", 4)                                                                               \
    X(F32, "F32", 4)                                                                               \
    X(I64, "I64", 8)                                                                               \
    X(U64, "U64", 8)                                                                               \
    X(F64, "F64", 8)

typedef enum {
#define X(e, name, size) HP_ST_##e,
    HP_ST_DTYPE_LIST(X)
#undef X
        HP_ST_DTYPE_COUNT
} hp_st_dtype;

const char *hp_st_dtype_name(hp_st_dtype dt); /* "F32"; "?" when out of range */
size_t hp_st_dtype_size(hp_st_dtype dt);      /* 0 when out of range */
/* The hp IR dtype for a safetensors dtype; false where the IR has none (U8, F64, ...). */
bool hp_st_dtype_to_hp(hp_st_dtype dt, hp_dtype *out);
/* The safetensors dtype of an IR dtype (every IR dtype has one). */
hp_st_dtype hp_st_dtype_from_hp(hp_dtype dt);

/* One tensor. In a file read: all pointers point into the file's mapping and live until
 * hp_st_close; data is the raw bytes, NOT necessarily aligned for the element type (copy with
 * memcpy or hp_st_to_f32). For hp_st_write: everything is borrowed from the caller. */
typedef struct hp_st_tensor {
    const char *name;
    hp_st_dtype dtype;
    int rank;
    int64_t shape[HP_ST_MAX_RANK];
    const void *data;
    size_t nbytes; /* == numel * dtype size, checked */
} hp_st_tensor;

/* One metadata entry (both strings NUL-terminated). */
typedef struct hp_st_kv {
    const char *key;
    const char *value;
} hp_st_kv;

typedef struct hp_st_file hp_st_file;

/* Opens and validates path (see the header comment). On success *out owns the mapping; free
 * it with hp_st_close. Errors: HP_IO (open/stat/mmap, naming the path), HP_PARSE (anything
 * wrong in the file: "PATH: tensor 'w': data_offsets [0, 12] span 12 bytes, but F32[2,2]
 * needs 16"), HP_LIMIT (header over HP_ST_MAX_HEADER), HP_NOMEM. The file must not be
 * truncated while open (the mapping would fault). */
hp_status hp_st_open(const char *path, hp_st_file **out, hp_err *err);

/* Like hp_st_open over bytes already in memory. buf is borrowed and must outlive *out; what
 * names the source in error messages. */
hp_status hp_st_parse(const void *buf, size_t len, const char *what, hp_st_file **out, hp_err *err);

/* Frees f and its mapping (NULL is fine). Pointers from f are invalid afterwards. */
void hp_st_close(hp_st_file *f);

/* The tensors, in data-offset order (file order). 0 <= i < hp_st_count(f). */
int hp_st_count(const hp_st_file *f);
const hp_st_tensor *hp_st_at(const hp_st_file *f, int i);
/* The tensor called name, or NULL (O(log n)). */
const hp_st_tensor *hp_st_find(const hp_st_file *f, const char *name);
/* hp_st_find that reports a missing name as HP_NOT_FOUND naming the file and the tensor. */
hp_status hp_st_get(const hp_st_file *f, const char *name, const hp_st_tensor **t, hp_err *err);

/* The __metadata__ entries, in file order; hp_st_meta_get returns NULL when key is absent. */
int hp_st_meta_count(const hp_st_file *f);
const hp_st_kv *hp_st_meta_at(const hp_st_file *f, int i);
const char *hp_st_meta_get(const hp_st_file *f, const char *key);

/* Writes ts[0..n) and meta[0..n_meta) (either may be empty) to path atomically and durably.
 * Checks every tensor before writing anything: names non-empty, unique, not "__metadata__";
 * rank <= HP_ST_MAX_RANK; dims in [0, HP_MAX_DIM]; nbytes == numel * dtype size; data
 * non-NULL when nbytes > 0. Metadata keys unique. Errors: HP_INVALID naming the tensor and
 * field, HP_IO naming the path, HP_NOMEM. */
hp_status hp_st_write(const char *path, const hp_st_tensor *ts, int n, const hp_st_kv *meta,
                      int n_meta, hp_err *err);

/* Converts a floating tensor (F32, BF16, F16, F64) to n f32 values in out; n must equal
 * the tensor's element count. HP_INVALID names the tensor otherwise. */
hp_status hp_st_to_f32(const hp_st_tensor *t, float *out, int64_t n, hp_err *err);

/* Element count of t (product of its shape; 1 for rank 0). */
int64_t hp_st_numel(const hp_st_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
