/* What the tokenizer (_tokens.c) and its ASCII block path (_ascii.c) share: the character
 * classes, the state a token carries from one into the other, and the block path's entry. */
#ifndef STREAM_DEDUP_TOKENS_H
#define STREAM_DEDUP_TOKENS_H
#include "_native.h"

enum { SEP = 0, WORD = 1, SOLO = 2, MAX_OFFSET = 255 };
#define MAX_CP 0x110000u /* the class and fold tables have one entry per code point */
#define BLOCK 64         /* code points the block path classifies at once */
#define SLACK 64 /* room past the last output: the block path writes 8 code points at a time */

/* The tokenizer's state between the scalar loop and the fast path. */
typedef struct {
    uint32_t *canon;
    uint64_t *hashes;
    Py_ssize_t nc, nt;
    int prev;
    uint64_t sum;
    unsigned offset; /* characters into the token (tokenize bounds the length: no wrap) */
} TokState;

/* Whether the tables agree with the block path's rule on all of ASCII and on NBSP. */
INTERNAL int ascii_rule_holds(const unsigned char *cls, const uint32_t *fmap);
/* The block path over blocks [i, ...) for as long as they are all ASCII or NBSP: returns
 * where it stopped (i itself if the first block is not). */
INTERNAL Py_ssize_t ascii_blocks(TokState *st, const void *data, int kind, Py_ssize_t i,
                                 Py_ssize_t n, const uint64_t *key);
#endif
