/* worker/crc32c.h — CRC-32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected),
 * the checksum of checkpoint tensors. The SSE4.2 instruction where the CPU has it, else
 * slicing-by-8 tables; both give the same value. Folder-internal; thread-safe. */
#ifndef HP_WORKER_CRC32C_H
#define HP_WORKER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes at p: hp__crc32c(hp__crc32c(0, a, n), b, m) equals
 * the CRC of a then b. hp__crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t hp__crc32c(uint32_t crc, const void *p, size_t n);
/* The same with the portable tables only (for tests: both paths must agree). */
uint32_t hp__crc32c_portable(uint32_t crc, const void *p, size_t n);

#endif
