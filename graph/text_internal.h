/* graph/text_internal.h — what the .hpir printer (text_print.c) and parser (text.c) share:
 * the growable string buffer and the names of the two named int attributes. */
#ifndef HP_TEXT_INTERNAL_H
#define HP_TEXT_INTERNAL_H

#include "hp/text.h"

#include <stdbool.h>
#include <stddef.h>

/* A growable string, or the caller's fixed buffer (truncating). Always NUL-terminated once
 * anything was written; `oom` is sticky. */
typedef struct strbuf {
    char *p;
    size_t len, cap;
    bool fixed;
    bool oom;
} strbuf;

void hp__sb_putn(strbuf *b, const char *s, size_t n);
void hp__sb_puts(strbuf *b, const char *s);
void hp__sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* kind=param|buffer|data, reduce_op=sum|avg|max */
extern const char *const hp__input_kind_names[3];
extern const char *const hp__reduce_op_names[3];

#endif
