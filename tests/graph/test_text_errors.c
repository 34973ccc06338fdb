/* The .hpir parser on bad input: each error names the line, column and offender; bounds;
 * random and mutated input; every prefix of a valid file; allocation failure at every step
 * (no leak: checked by LeakSanitizer in an HP_SANITIZE build). */
#include "hp/models.h"
#include "hp/text.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define HP_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HP_HAVE_LSAN 1
#endif
#endif
#ifdef HP_HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

/* The first node most cases build on: %0 = zeros f32[2]. */
#define H "hpir 1\n%0: f32[2] = zeros() {shape=[2]}\n"

typedef struct bad_case {
    const char *text;
    hp_status status;
    const char *msg; /* expected substring of the message */
} bad_case;

static const bad_case bad_cases[] = {
    /* header */
    {"", HP_PARSE, "line 1:1: expected the header 'hpir 1', got end of input"},
    {"hpir 2\nreturn\n", HP_UNSUPPORTED, "line 1:6: unsupported hpir version 2"},
    {"hpir\n", HP_PARSE, "line 1:5: expected a version number after 'hpir', got end of line"},
    {"hpir 1 x\n", HP_PARSE, "line 1:8: expected end of line after the header, got 'x'"},
    {"graph 1\n", HP_PARSE, "line 1:1: expected the header 'hpir 1', got 'graph'"},
    /* truncated text */
    {"hpir 1\n%0: f32[2", HP_PARSE,
     "line 2:10: expected ']' after the dimensions, got end of input"},
    {"hpir 1\n%0: f32[2] = zeros(", HP_PARSE,
     "line 2:20: expected a value such as %3 or %3.1, got end of input"},
    {H "%1: f32[2] = neg(%0) {", HP_PARSE,
     "line 3:23: expected an attribute name, got end of input"},
    {H, HP_PARSE, "line 3: missing 'return' line at end of input (after 1 nodes)"},
    /* names */
    {H "%1: f32[2] = matmul(%0, %0)\nreturn %1\n", HP_PARSE, "line 3:14: unknown op 'matmul'"},
    {H "%1: f32[] = sum(%0) {dimz=[0]}\n", HP_PARSE, "line 3:22: unknown attribute 'dimz' for sum"},
    {H "%1: f32[] = sum(%0) {dim=0}\n", HP_PARSE,
     "line 3:22: unknown attribute 'dim' for sum (it takes: dims, keepdim)"},
    {H "%1: f32[2] = neg(%0) {dims=[0]}\n", HP_PARSE,
     "unknown attribute 'dims' for neg (it takes: none)"},
    {"hpir 1\n%0: f33[2] = zeros() {shape=[2]}\n", HP_PARSE,
     "line 2:5: unknown dtype 'f33' (known: f32, bf16, f16, i32, i64, bool)"},
    {"hpir 1\n%0: f32[2] = zeros() {shape=[2], dtype=f64}\n", HP_PARSE,
     "line 2:40: unknown dtype 'f64'"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=weight}\n", HP_PARSE,
     "line 2:34: expected an input kind (param, buffer, data), got 'weight'"},
    {H "%1: f32[2] = all_reduce(%0) {group_size=2, reduce_op=mean}\n", HP_PARSE,
     "line 3:54: expected a reduce op (sum, avg, max), got 'mean'"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w\", init=gaussian(0,1)}\n", HP_PARSE,
     "line 2:55: unknown init 'gaussian'"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w\", init=normal(0,-1)}\n", HP_PARSE,
     "line 2:55: init normal: std -1 must be > 0"},
    /* attribute kinds */
    {H "%1: f32[] = sum(%0) {dims=0}\n", HP_PARSE,
     "line 3:27: expected an integer list such as [0,1] for 'dims', got '0'"},
    {H "%1: f32[] = sum(%0) {dims=[0], keepdim=1.5}\n", HP_PARSE,
     "line 3:40: expected an integer for 'keepdim', got '1.5'"},
    {H "%1: f32[2] = mul_scalar(%0) {value=\"x\"}\n", HP_PARSE,
     "line 3:36: expected a number for 'value', got '\"x\"'"},
    {H "%1: f32[2] = mul_scalar(%0) {value=1.2.3}\n", HP_PARSE,
     "expected a number for 'value', got '1.2.3'"},
    {H "%1: f32[2] = mul_scalar(%0) {value=0x10}\n", HP_PARSE,
     "expected a number for 'value', got '0x10'"},
    {H "%1: f32[2] = mul_scalar(%0) {value=1e999}\n", HP_PARSE,
     "line 3:36: float '1e999' out of range"},
    {H "%1: f32[2] = all_gather_into_tensor(%0) {group_size=2, group=dp}\n", HP_PARSE,
     "expected a string, got 'dp'"},
    {H "%1: f32[] = sum(%0) {dims=[0], dims=[0]}\n", HP_PARSE,
     "line 3:32: duplicate attribute 'dims'"},
    {H "%1: f32[] = sum(%0)\nreturn %1\n", HP_PARSE, "line 3:13: sum requires attribute dims"},
    {H "%1: f32[4] = slice(%0) {dim=0}\n", HP_PARSE, "slice requires attributes start, end"},
    /* references and ids */
    {H "%1: f32[2] = neg(%2)\n", HP_PARSE,
     "line 3:18: %2 is used before it is defined (forward reference)"},
    {H "%1: f32[2] = neg(%1)\n", HP_PARSE, "line 3:18: %1 is used before it is defined"},
    {H "%1: f32[2] = neg(%0.1)\n", HP_PARSE, "line 3:18: %0.1: %0 (zeros) has 1 output"},
    {H "%0: f32[2] = zeros() {shape=[2]}\n", HP_PARSE,
     "line 3:1: duplicate node id %0 (the next node is %1)"},
    {H "%5: f32[2] = neg(%0)\n", HP_PARSE,
     "line 3:1: node id %5 out of order (the next node is %1)"},
    {H "%1.1: f32[2] = neg(%0)\n", HP_PARSE, "line 3:1: a node is defined as %N, not %N.K"},
    {H "return %", HP_PARSE, "line 3:8: expected a number after '%'"},
    {H "return %99999999999\n", HP_LIMIT, "line 3:8: value reference out of range"},
    {H "return %7\n", HP_PARSE, "line 3:8: %7 is used before it is defined"},
    {H "return %0 %0\n", HP_PARSE, "line 3:11: expected ',' between outputs, got '%0'"},
    {H "return %0\n%1: f32[2] = neg(%0)\n", HP_PARSE,
     "line 4:1: expected end of input after 'return', got '%1'"},
    /* arity and types */
    {H "%1: f32[2] = neg(%0, %0)\n", HP_PARSE, "line 3:14: neg takes 1 input, got 2"},
    {H "%1: (f32[2], f32[2]) = neg(%0)\n", HP_PARSE, "line 3:5: neg has 1 output, got 2 types"},
    {H "%1: f32(2) = neg(%0)\n", HP_PARSE, "line 3:8: expected '[' after the dtype, got '('"},
    {H "%1: f32[2] neg(%0)\n", HP_PARSE,
     "line 3:12: expected '=' after the output types, got 'neg'"},
    {H "%1: f32[2] = neg(%0) junk\n", HP_PARSE, "line 3:22: expected end of line, got 'junk'"},
    {H "%1: f32[2] = neg(%0 %0)\n", HP_PARSE, "line 3:21: expected ')' after the inputs, got '%0'"},
    {H "%1: f32[3] = neg(%0)\nreturn %1\n", HP_INVALID,
     "line 3: node 1 (neg): output 0 is declared f32[3] but its shape rule gives f32[2]"},
    {H "%1: f32[2,2] = zeros() {shape=[2,2]}\n%2: f32[2,2] = mm(%0, %1)\nreturn %2\n", HP_INVALID,
     "line 4: node 2 (mm)"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=data}\n"
     "%1: f32[2] = placeholder() {kind=param, fqn=\"w\"}\nreturn %1\n",
     HP_INVALID, "line 3: node 1 (placeholder): inputs must be ordered parameters, buffers"},
    /* bounds */
    {"hpir 1\n%0: f32[1099511627777] = zeros() {shape=[1]}\n", HP_LIMIT,
     "line 2:9: dimension 1099511627777 out of range [0, 1099511627776]"},
    {"hpir 1\n%0: f32[-1] = zeros() {shape=[1]}\n", HP_LIMIT,
     "line 2:9: dimension -1 out of range"},
    {"hpir 1\n%0: f32[1099511627776,1099511627776] = zeros() {shape=[1]}\n", HP_INVALID,
     "line 2:5: "},
    {"hpir 1\n%0: f32[99999999999999999999] = zeros() {shape=[1]}\n", HP_LIMIT,
     "line 2:9: integer '99999999999999999999' out of range"},
    {H "%1: f32[] = sum(%0) {dims=[-9223372036854775809]}\n", HP_LIMIT,
     "integer '-9223372036854775809' out of range"},
    {"hpir 1\n%0: f32[1,1,1,1,1,1,1,1,1] = zeros() {shape=[1]}\n", HP_LIMIT,
     "line 2:25: more than 8 dimensions"},
    {H "%1: f32[] = sum(%0) {dims=[0,0,0,0,0,0,0,0,0]}\n", HP_LIMIT,
     "line 3:44: more than 8 integers in 'dims'"},
    {H "%1: (f32[],f32[],f32[],f32[],f32[]) = neg(%0)\n", HP_LIMIT,
     "line 3:30: more than 4 outputs"},
    /* strings and bytes */
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w}\n", HP_PARSE,
     "line 2:45: unterminated string"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w\\q\"}\n", HP_PARSE,
     "line 2:47: unknown escape in string"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w\\x00\"}\n", HP_PARSE,
     "line 2:47: bad escape '\\x00' in string"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w\\x4\"}\n", HP_PARSE,
     "line 2:47: bad escape '\\x4' in string"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"w\\xg1\"}\n", HP_PARSE,
     "bad escape '\\xg1' in string"},
    {"hpir 1\n%0: f32[2] = placeholder() {kind=param, fqn=\"a\tb\"}\n", HP_PARSE,
     "line 2:47: control byte 0x09 in a string (write it as \\x09)"},
    {"hpir 1\n@", HP_PARSE, "line 2:1: unexpected character '@'"},
    {"hpir 1\n\xff", HP_PARSE, "line 2:1: unexpected byte 0xff"},
    /* deep garbage: long runs are rejected at their first token */
    {H "%1: f32[2] = neg((((((((((((((((((((((((((((((((((((((((((((((((((((((\n", HP_PARSE,
     "line 3:18: expected a value such as %3 or %3.1, got '('"},
    {"hpir 1\n%0: f32[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
     HP_PARSE, "line 2:9: expected a dimension, got '['"},
};

static void check_bad(const char *text, size_t len, hp_status status, const char *want) {
    hp_graph *g = (hp_graph *)1;
    hp_err err = {0};
    hp_status s = hp_graph_parse(text, len, &g, &err);
    cr_expect_eq(s, status, "status %s, want %s for:\n%s\nmessage: %s", hp_status_str(s),
                 hp_status_str(status), text, err.msg);
    cr_expect_null(g);
    cr_expect(strstr(err.msg, want), "message\n  %s\nlacks\n  %s\nfor:\n%s", err.msg, want, text);
}

Test(text_errors, each_names_the_offender) {
    for (size_t i = 0; i < HP_ARRAY_LEN(bad_cases); i++)
        check_bad(bad_cases[i].text, strlen(bad_cases[i].text), bad_cases[i].status,
                  bad_cases[i].msg);
}

Test(text_errors, nul_byte_and_length) {
    const char text[] = "hpir 1\n\0return\n";
    check_bad(text, sizeof text - 1, HP_PARSE, "line 2:1: unexpected byte 0x00");
    /* the length bounds the text: bytes past it are never read */
    const char *ok = H "return %0\ngarbage";
    hp_graph *g;
    cr_assert_eq(hp_graph_parse(ok, strlen(ok) - 7, &g, NULL), HP_OK);
    hp_graph_free(g);
}

/* An op name with a NUL inside ("mm\0evil") is never read as "mm"; a string that is not
 * valid UTF-8 (raw or through \x escapes) is refused: strings go out as proto `string`s. */
Test(text_errors, nul_in_names_and_invalid_utf8_in_strings) {
    const char op[] = "hpir 1\n%0: f32[2] = placeholder() {kind=data, fqn=\"x\"}\n"
                      "%1: f32[2] = relu\0evil(%0)\nreturn %1\n";
    check_bad(op, sizeof op - 1, HP_PARSE, "line 3:18: unexpected byte 0x00");
    const char *bad[] = {"\xc3\x28", "\\xc0\\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"};
    for (size_t i = 0; i < HP_ARRAY_LEN(bad); i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "hpir 1\n%%0: f32[2] = placeholder() {kind=data, fqn=\"x%s\"}\nreturn %%0\n",
                 bad[i]);
        check_bad(text, strlen(text), HP_PARSE, "string is not valid UTF-8 (byte 1 of its value");
    }
    /* valid UTF-8 still reads past the lexer (the fqn rules then apply) */
    const char *ok =
        "hpir 1\n%0: f32[2] = placeholder() {kind=data, fqn=\"x\xc3\xa9\"}\nreturn %0\n";
    hp_graph *g = NULL;
    hp_err err = {0};
    hp_graph_parse(ok, strlen(ok), &g, &err);
    cr_expect(!strstr(err.msg, "UTF-8"), "%s", err.msg);
    hp_graph_free(g);
}

Test(text_errors, text_length_limit) {
    /* refused before a byte is read, so the short buffer is never overrun */
    check_bad("hpir 1\n", HP_TEXT_MAX_FILE + 1, HP_LIMIT, "over the limit of 1073741824");
}

Test(text_errors, string_length_limit) {
    char text[HP_MAX_STR + 200];
    char name[HP_MAX_STR + 2];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = 0; /* HP_MAX_STR + 1 bytes */
    snprintf(text, sizeof text, "hpir 1\n%%0: f32[2] = placeholder() {kind=param, fqn=\"%s\"}\n",
             name);
    check_bad(text, strlen(text), HP_LIMIT, "line 2:45: string longer than 256 bytes");
}

/* cat takes at most HP_MAX_INPUTS inputs: that many parse, one more is named. */
Test(text_errors, input_limit) {
    for (int n = HP_MAX_INPUTS; n <= HP_MAX_INPUTS + 1; n++) {
        size_t cap = 64 + (size_t)n * 5 + 64;
        char *text = malloc(cap);
        size_t o = (size_t)snprintf(text, cap, "%s%%1: f32[%d] = cat(", H, 2 * n);
        for (int i = 0; i < n; i++) o += (size_t)snprintf(text + o, cap - o, i ? ", %%0" : "%%0");
        snprintf(text + o, cap - o, ") {dim=0}\nreturn %%1\n");
        hp_graph *g;
        hp_err err = {0};
        hp_status s = hp_graph_parse(text, strlen(text), &g, &err);
        if (n == HP_MAX_INPUTS) {
            cr_assert_eq(s, HP_OK, "%s", err.msg);
            hp_graph_free(g);
        } else {
            cr_assert_eq(s, HP_LIMIT);
            cr_assert(strstr(err.msg, "line 3:") && strstr(err.msg, "more than 1024 inputs"), "%s",
                      err.msg);
        }
        free(text);
    }
}

/* ---- fuzzing --------------------------------------------------------------------------------- */

static char *model_text(size_t *len) {
    hp_model_spec spec;
    cr_assert_eq(hp_model_spec_parse("llama3:debugmodel", &spec, NULL), HP_OK);
    spec.batch = 2, spec.seq = 4, spec.dim = 32, spec.n_layers = 1, spec.n_heads = 4;
    spec.n_kv_heads = 2, spec.ffn_hidden = 48, spec.vocab = 64;
    hp_graph *g;
    hp_err err = {0};
    cr_assert_eq(hp_model_build_joint(&spec, &g, &err), HP_OK, "%s", err.msg);
    char *text;
    cr_assert_eq(hp_graph_print(g, &text, len, &err), HP_OK);
    hp_graph_free(g);
    return text;
}

/* Parse either succeeds with a verified graph or fails with a message; never crashes. */
static void parse_any(const char *text, size_t len) {
    hp_graph *g;
    hp_err err = {0};
    hp_status s = hp_graph_parse(text, len, &g, &err);
    if (s == HP_OK) {
        cr_assert_eq(hp_graph_verify(g, &err), HP_OK, "%s", err.msg);
        hp_graph_free(g);
    } else {
        cr_assert_null(g);
        cr_assert(err.msg[0], "empty message, status %s", hp_status_str(s));
        cr_assert(s == HP_PARSE || s == HP_LIMIT || s == HP_INVALID || s == HP_UNSUPPORTED,
                  "status %s: %s", hp_status_str(s), err.msg);
    }
}

Test(text_errors, random_bytes) {
    static const char alphabet[] = "%:=()[]{},.\"#\n \\-+0123456789abcdefhilmnoprstuxz_";
    srand(12345);
    char buf[512];
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = (size_t)(rand() % (int)sizeof buf);
        bool grammar = iter % 2;
        size_t start = 0;
        if (iter % 4 == 1) { /* a valid header lets the noise reach the node parser */
            memcpy(buf, "hpir 1\n%0: f32[", 15);
            start = 15;
            if (len < start) len = start;
        }
        for (size_t i = start; i < len; i++)
            buf[i] = grammar ? alphabet[rand() % (int)(sizeof alphabet - 1)] : (char)rand();
        parse_any(buf, len);
    }
}

Test(text_errors, mutated_model) {
    size_t len;
    char *text = model_text(&len);
    char *buf = malloc(len + 8);
    static const char alphabet[] = "%:=()[]{},.\"#\n 0123456789-ef_";
    srand(777);
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, text, len);
        size_t n = len;
        for (int m = 0; m < 1 + iter % 3; m++) {
            size_t at = (size_t)rand() % n;
            int how = rand() % 3;
            char c = alphabet[rand() % (int)(sizeof alphabet - 1)];
            if (how == 0)
                buf[at] = c;
            else if (how == 1)
                memmove(buf + at, buf + at + 1, --n - at);
            else if (n < len + 7)
                memmove(buf + at + 1, buf + at, n++ - at), buf[at] = c;
        }
        hp_graph *g;
        if (hp_graph_parse(buf, n, &g, NULL) == HP_OK) {
            accepted++;
            hp_graph_free(g);
        }
        parse_any(buf, n);
    }
    cr_assert_lt(accepted, 3000, "mutations never rejected");
    free(buf);
    hp_free(text);
}

Test(text_errors, every_prefix) {
    size_t len;
    char *text = model_text(&len);
    size_t ret = (size_t)(strstr(text, "\nreturn") - text) + 7;
    for (size_t n = 0; n < len; n++) {
        hp_graph *g;
        hp_err err = {0};
        hp_status s = hp_graph_parse(text, n, &g, &err);
        if (n < ret) {
            cr_assert_neq(s, HP_OK, "prefix of %zu bytes accepted", n);
            cr_assert(strncmp(err.msg, "line ", 5) == 0, "prefix %zu: %s", n, err.msg);
        } else if (s == HP_OK) {
            hp_graph_free(g); /* "return %1" is a prefix of "return %12" */
        }
    }
    hp_graph *g;
    cr_assert_eq(hp_graph_parse(text, len, &g, NULL), HP_OK);
    hp_graph_free(g);
    hp_free(text);
}

/* ---- allocation failure ---------------------------------------------------------------------- */

static void no_leaks(void) {
#ifdef HP_HAVE_LSAN
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "leaks (see the report above)");
#endif
}

Test(text_errors, fault_injection_parse) {
    size_t len;
    char *text = model_text(&len);
    long n;
    for (n = 0;; n++) {
        hp_graph *g = (hp_graph *)1;
        hp_err err = {0};
        hp_alloc_fail_at(n);
        hp_status s = hp_graph_parse(text, len, &g, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            hp_graph_free(g);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "allocation %ld: %s %s", n, hp_status_str(s), err.msg);
        cr_assert_null(g);
        cr_assert(err.msg[0]);
    }
    cr_assert_gt(n, 3, "parse made only %ld allocations", n);
    hp_free(text);
    no_leaks();
}

Test(text_errors, fault_injection_print) {
    size_t len;
    char *text = model_text(&len);
    hp_graph *g;
    cr_assert_eq(hp_graph_parse(text, len, &g, NULL), HP_OK);
    for (long n = 0;; n++) {
        char *out = (char *)1;
        hp_err err = {0};
        hp_alloc_fail_at(n);
        hp_status s = hp_graph_print(g, &out, NULL, &err);
        hp_alloc_fail_at(-1);
        if (s == HP_OK) {
            cr_assert_str_eq(out, text);
            hp_free(out);
            break;
        }
        cr_assert_eq(s, HP_NOMEM, "allocation %ld: %s", n, err.msg);
        cr_assert_null(out);
    }
    hp_graph_free(g);
    hp_free(text);
    no_leaks();
}
