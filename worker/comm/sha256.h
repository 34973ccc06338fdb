/* worker/comm/sha256.h — SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104), for the tcp
 * communicator's connection handshake (tcp.c): peers prove they hold the job's secret without
 * sending it. Small and dependency-free; not a general crypto API.
 */
#ifndef HP_WORKER_COMM_SHA256_H
#define HP_WORKER_COMM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define HP__SHA256_BYTES 32

typedef struct hp__sha256 {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t buf[64];
    size_t used;
} hp__sha256;

void hp__sha256_init(hp__sha256 *s);
void hp__sha256_update(hp__sha256 *s, const void *data, size_t n);
void hp__sha256_final(hp__sha256 *s, uint8_t out[HP__SHA256_BYTES]);

/* HMAC-SHA-256 of the concatenation of parts[0 .. n_parts) (lens[i] bytes each) under key. */
void hp__hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *lens,
                     int n_parts, uint8_t out[HP__SHA256_BYTES]);

#endif
