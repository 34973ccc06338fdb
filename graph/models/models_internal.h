/* graph/models/models_internal.h — helpers shared by the model builders (hp__ prefix):
 * flavor lookup with the error message that lists the known names, and overflow-checked
 * size arithmetic for validating configurations against the IR's limits. */
#ifndef HP_MODELS_INTERNAL_H
#define HP_MODELS_INTERNAL_H

#include "hp/models.h"

/* A family's flavor names, indexed from 0; NULL past the end. Index 0 is the default. */
typedef const char *(*hp__flavor_name_fn)(int i);

const char *hp__llama3_flavor_name(int i);
const char *hp__mlp_flavor_name(int i);

/* Finds `flavor` (case-insensitive; "" is the default, index 0) among a family's flavors.
 * HP_NOT_FOUND otherwise: "unknown llama3 flavor '7B' (known: debugmodel, 8B, 70B, 405B)". */
hp_status hp__flavor_find(const char *family, hp__flavor_name_fn names, const char *flavor,
                          int *idx, hp_err *err);

/* *out = a * b; false when that overflows int64 or exceeds `limit` (operands >= 0). */
bool hp__mul_within(int64_t a, int64_t b, int64_t limit, int64_t *out);

/* Checks an override field: 0 keeps *dst, a positive value replaces it, a negative one is
 * HP_INVALID naming `family` and `field`. */
hp_status hp__override_i64(const char *family, const char *field, int64_t v, int64_t *dst,
                           hp_err *err);

#endif
