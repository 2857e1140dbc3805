/* The tokenizer's block path for ASCII text (see _tokens.c for the scalar loop).
 * Most text is ASCII, where folding is lower-casing and a word character is [a-z0-9]. A
 * block of 64 code points that are all ASCII (or NBSP, a separator) is classified at once
 * into a mask of word characters (16 at a time with SSE2, 64 with AVX-512); the tokens are
 * the runs of set bits, handled a run at a time, 8 characters per step, instead of a
 * character at a time. That removes the two mispredicted branches per token of the scalar
 * loop (the end of a word run, the end of a separator run). Same outputs: the block path is
 * only taken when the tables agree with this rule on all of ASCII and on NBSP
 * (ascii_rule_holds). */
#include "_tokens.h"

#define NBSP 0xA0 /* the one non-ASCII character the block path takes (a separator): 87 and
                   * 94 % of the non-ASCII characters of the WARC and httpbis texts */

int ascii_rule_holds(const unsigned char *cls, const uint32_t *fmap) {
    for (uint32_t b = 0; b < 128; b++) {
        int alpha = (b | 32) >= 'a' && (b | 32) <= 'z', digit = b >= '0' && b <= '9';
        uint32_t f = fmap[b];
        if (f >= 128) return 0;
        if (alpha || digit) {
            if (f != (alpha ? (b | 32) : b) || cls[f] != WORD) return 0;
        } else if (cls[f] != SEP) {
            return 0;
        }
    }
    return fmap[NBSP] < MAX_CP && cls[fmap[NBSP]] == SEP;
}

/* One block's runs of word characters (the set bits of `word`) into the state: the body of
 * the fast path, shared by its two builds. CHUNK(at, k, m) adds to `sum` the products of
 * the m <= 8 code points from position `at` (each lower-cased, plus one) with the keys at
 * k; STORE8(dst, at) writes those 8 code points, lower-cased, to dst (what lies past the
 * run end is overwritten later or dropped). Both read the string itself: for an ASCII word
 * character, lower-casing is setting bit 5. */
#define FAST_BLOCK(CHUNK, STORE8)                                                            \
    {                                                                                        \
        /* first and last character of every run, each mask consumed lowest bit first: */   \
        /* no chain of dependent bit scans from one run to the next */                       \
        uint64_t firsts = word & ~(word << 1), lasts = word & ~(word >> 1);                  \
        if (!(word & 1) && prev != SEP) canon[nc++] = 32;                                    \
        if (!word) prev = SEP;                                                               \
        while (lasts) {                                                                      \
            int s = __builtin_ctzll(firsts), e = __builtin_ctzll(lasts) + 1;                 \
            firsts &= firsts - 1;                                                            \
            lasts &= lasts - 1;                                                              \
            if (s != 0 || prev != WORD) { /* a token starts */                               \
                nt++;                                                                        \
                sum = 0;                                                                     \
                offset = 0;                                                                  \
            }                                                                                \
            int len = e - s;                                                                 \
            for (int j = 0; j < len; j += 8) {                                               \
                Py_ssize_t at = i + s + j;                                                   \
                int m = len - j < 8 ? len - j : 8;                                           \
                if (offset <= (unsigned)(MAX_OFFSET - m)) { /* the keys at offset.. exist */ \
                    CHUNK(at, key + offset, m);                                              \
                } else {                                                                     \
                    for (int b = 0; b < m; b++) {                                            \
                        unsigned o = offset + b;                                             \
                        uint64_t c = (uint64_t)(CP_AT(at + b) | 32) + 1;                     \
                        sum += c * key[o < MAX_OFFSET ? o : MAX_OFFSET];                     \
                    }                                                                        \
                }                                                                            \
                offset += m;                                                                 \
                STORE8(canon + nc + j, at);                                                  \
            }                                                                                \
            nc += len;                                                                       \
            hashes[nt] = sum;                                                                \
            prev = WORD;                                                                     \
            if (e < BLOCK) {                                                                 \
                canon[nc++] = 32;                                                            \
                prev = SEP;                                                                  \
            }                                                                                \
        }                                                                                    \
    }

#define CP_AT(AT)                                                                            \
    (kind == PyUnicode_1BYTE_KIND   ? (uint32_t)((const Py_UCS1 *)data)[AT]                  \
     : kind == PyUnicode_2BYTE_KIND ? (uint32_t)((const Py_UCS2 *)data)[AT]                  \
                                    : (uint32_t)((const Py_UCS4 *)data)[AT])

/* The fast path over blocks [i, ...) for as long as they are all ASCII or NBSP: returns where it
 * stopped (a block with a non-ASCII code point, or too few left: CHUNK and STORE8 read up
 * to 8 code points past the block). */
#define FAST_PATH(NAME, ATTR, CLASSIFY, CHUNK, STORE8)                                       \
    ATTR static Py_ssize_t NAME(TokState *st, const void *data, int kind, Py_ssize_t i,      \
                                Py_ssize_t n, const uint64_t *key) {                         \
        uint32_t *canon = st->canon;                                                         \
        uint64_t *hashes = st->hashes;                                                       \
        Py_ssize_t nc = st->nc, nt = st->nt;                                                 \
        int prev = st->prev;                                                                 \
        uint64_t sum = st->sum;                                                              \
        unsigned offset = st->offset;                                                        \
        for (; n - i >= BLOCK + 8; i += BLOCK) {                                             \
            uint64_t word;                                                                   \
            if (!CLASSIFY(data, kind, i, &word)) break;                                      \
            FAST_BLOCK(CHUNK, STORE8)                                                        \
        }                                                                                    \
        st->nc = nc;                                                                         \
        st->nt = nt;                                                                         \
        st->prev = prev;                                                                     \
        st->sum = sum;                                                                       \
        st->offset = offset;                                                                 \
        return i;                                                                            \
    }

/* Portable build: SSE2 (every x86-64) classifies 16 code points at a time. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline __m128i in_range(__m128i v, char lo, char hi) {
    return _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8((char)(lo - 1))),
                         _mm_cmplt_epi8(v, _mm_set1_epi8((char)(hi + 1))));
}
/* Every lane ASCII or NBSP (which packs to the byte 0xA0: signed, below every range above). */
static inline int ascii_or_nbsp16(__m128i v) {
    __m128i ok = _mm_or_si128(_mm_cmpeq_epi16(_mm_and_si128(v, _mm_set1_epi16((short)0xFF80)),
                                              _mm_setzero_si128()),
                              _mm_cmpeq_epi16(v, _mm_set1_epi16(NBSP)));
    return _mm_movemask_epi8(ok) == 0xFFFF;
}
static inline int ascii_or_nbsp32(__m128i v) {
    __m128i ok = _mm_or_si128(_mm_cmpeq_epi32(_mm_and_si128(v, _mm_set1_epi32((int)0xFFFFFF80)),
                                              _mm_setzero_si128()),
                              _mm_cmpeq_epi32(v, _mm_set1_epi32(NBSP)));
    return _mm_movemask_epi8(ok) == 0xFFFF;
}
#endif

/* 1 and the block's word mask if code points [i, i+BLOCK) are all ASCII or NBSP, else 0. */
static inline int ascii_block(const void *data, int kind, Py_ssize_t i, uint64_t *word) {
    uint64_t mask = 0;
    for (int q = 0; q < BLOCK; q += 16) {
#if defined(__SSE2__)
        __m128i v;
        if (kind == PyUnicode_1BYTE_KIND) {
            v = _mm_loadu_si128((const __m128i *)((const Py_UCS1 *)data + i + q));
            if (_mm_movemask_epi8(v) & ~_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8((char)NBSP))))
                return 0;
        } else if (kind == PyUnicode_2BYTE_KIND) {
            const Py_UCS2 *d = (const Py_UCS2 *)data + i + q;
            __m128i a = _mm_loadu_si128((const __m128i *)d);
            __m128i b = _mm_loadu_si128((const __m128i *)(d + 8));
            if (!ascii_or_nbsp16(a) || !ascii_or_nbsp16(b)) return 0;
            v = _mm_packus_epi16(a, b);
        } else {
            const Py_UCS4 *d = (const Py_UCS4 *)data + i + q;
            __m128i a = _mm_loadu_si128((const __m128i *)d);
            __m128i b = _mm_loadu_si128((const __m128i *)(d + 4));
            __m128i c = _mm_loadu_si128((const __m128i *)(d + 8));
            __m128i e = _mm_loadu_si128((const __m128i *)(d + 12));
            if (!ascii_or_nbsp32(a) || !ascii_or_nbsp32(b) || !ascii_or_nbsp32(c) ||
                !ascii_or_nbsp32(e))
                return 0;
            v = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, e));
        }
        __m128i w = _mm_or_si128(in_range(_mm_or_si128(v, _mm_set1_epi8(32)), 'a', 'z'),
                                 in_range(v, '0', '9'));
        mask |= (uint64_t)(unsigned)_mm_movemask_epi8(w) << q;
#else
        for (int j = q; j < q + 16; j++) {
            uint32_t c = CP_AT(i + j);
            if (c >= 128 && c != NBSP) return 0;
            mask |= (uint64_t)(((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9')) << j;
        }
#endif
    }
    *word = mask;
    return 1;
}

/* All 8 products, no loop of variable length: past m, a zero times the key at K[0] (the keys
 * past the run end may lie past the end of the key table, so they are not read). */
#define CHUNK_SCALAR(AT, K, M)                                                               \
    for (int b = 0; b < 8; b++)                                                              \
        sum += (b < (M) ? (uint64_t)(CP_AT((AT) + b) | 32) + 1 : 0) * (K)[b < (M) ? b : 0];
#define STORE8_SCALAR(DST, AT)                                                               \
    for (int b = 0; b < 8; b++) (DST)[b] = CP_AT((AT) + b) | 32;
FAST_PATH(fast_generic, , ascii_block, CHUNK_SCALAR, STORE8_SCALAR)

/* AVX-512 build: 64 code points classified at once into mask registers; a run's 8 code
 * points times 8 keys in one multiply (keys past the run end are loaded as zero). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define HAVE_AVX512_PATH 1
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

AVX512 static inline int ascii_block512(const void *data, int kind, Py_ssize_t i,
                                        uint64_t *word) {
    __m512i v;
    if (kind == PyUnicode_1BYTE_KIND) {
        v = _mm512_loadu_si512((const Py_UCS1 *)data + i);
        if (_mm512_movepi8_mask(v) & ~_mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8((char)NBSP)))
            return 0;
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *d = (const Py_UCS2 *)data + i;
        __m512i a = _mm512_loadu_si512(d), b = _mm512_loadu_si512(d + 32);
        __m512i big = _mm512_set1_epi16(127), nbsp = _mm512_set1_epi16(NBSP);
        if ((_mm512_cmpgt_epu16_mask(a, big) & ~_mm512_cmpeq_epi16_mask(a, nbsp)) |
            (_mm512_cmpgt_epu16_mask(b, big) & ~_mm512_cmpeq_epi16_mask(b, nbsp)))
            return 0;
        v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)),
                               _mm512_cvtepi16_epi8(b), 1);
    } else {
        const Py_UCS4 *d = (const Py_UCS4 *)data + i;
        __m512i big = _mm512_set1_epi32(127), nbsp = _mm512_set1_epi32(NBSP);
        v = _mm512_setzero_si512();
        for (int q = 0; q < 4; q++) {
            __m512i part = _mm512_loadu_si512(d + 16 * q);
            if (_mm512_cmpgt_epu32_mask(part, big) & ~_mm512_cmpeq_epi32_mask(part, nbsp)) return 0;
            v = _mm512_mask_blend_epi64((__mmask8)(3u << (2 * q)), v,
                                        _mm512_broadcast_i32x4(_mm512_cvtepi32_epi8(part)));
        }
    }
    __m512i low = _mm512_or_si512(v, _mm512_set1_epi8(32));
    *word = _mm512_cmplt_epu8_mask(_mm512_sub_epi8(low, _mm512_set1_epi8('a')),
                                   _mm512_set1_epi8(26)) |
            _mm512_cmplt_epu8_mask(_mm512_sub_epi8(v, _mm512_set1_epi8('0')),
                                   _mm512_set1_epi8(10));
    return 1;
}

/* The 8 code points from AT, zero-extended to 64-bit lanes. */
#define LANES64(AT)                                                                          \
    (kind == PyUnicode_1BYTE_KIND                                                            \
         ? _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)((const Py_UCS1 *)data + (AT)))) \
     : kind == PyUnicode_2BYTE_KIND                                                          \
         ? _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)((const Py_UCS2 *)data + (AT)))) \
         : _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)((const Py_UCS4 *)data + (AT)))))
#define CHUNK_512(AT, K, M)                                                                  \
    {                                                                                        \
        __m512i c_ = _mm512_add_epi64(_mm512_or_si512(LANES64(AT), _mm512_set1_epi64(32)),   \
                                      _mm512_set1_epi64(1));                                 \
        __m512i k_ = _mm512_maskz_loadu_epi64((__mmask8)((1u << (M)) - 1), (K));              \
        sum += (uint64_t)_mm512_reduce_add_epi64(_mm512_mullo_epi64(c_, k_));                \
    }
#define STORE8_256(DST, AT)                                                                  \
    _mm256_storeu_si256((__m256i *)(DST),                                                    \
                        _mm256_or_si256(_mm512_cvtepi64_epi32(LANES64(AT)), _mm256_set1_epi32(32)));
FAST_PATH(fast_avx512, AVX512, ascii_block512, CHUNK_512, STORE8_256)
#endif

typedef Py_ssize_t (*fast_fn)(TokState *, const void *, int, Py_ssize_t, Py_ssize_t,
                              const uint64_t *);
static fast_fn fast_path = fast_generic;

static int have_avx512(void) {
#ifdef HAVE_AVX512_PATH
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* block_path(name=None) -> the name of the tokenizer's block path in use ("avx512" or
 * "generic"); with a name, switch to it first (for tests: both must give the same tokens). */
PyObject *block_path(PyObject *self, PyObject *args) {
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|z", &name)) return NULL;
    if (name != NULL) {
        if (strcmp(name, "generic") == 0) {
            fast_path = fast_generic;
        } else if (strcmp(name, "avx512") == 0 && have_avx512()) {
#ifdef HAVE_AVX512_PATH
            fast_path = fast_avx512;
#endif
        } else {
            PyErr_Format(PyExc_ValueError, "no block path %s on this machine", name);
            return NULL;
        }
    }
    return PyUnicode_FromString(fast_path == fast_generic ? "generic" : "avx512");
}

Py_ssize_t ascii_blocks(TokState *st, const void *data, int kind, Py_ssize_t i, Py_ssize_t n,
                        const uint64_t *key) {
    return fast_path(st, data, kind, i, n, key);
}

/* At import: the AVX-512 block path where the CPU has it. */
void ascii_init(void) {
#ifdef HAVE_AVX512_PATH
    if (have_avx512()) fast_path = fast_avx512;
#endif
}
