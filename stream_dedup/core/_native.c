/* Compiled kernels of the pure core: the same arithmetic as the numpy code in tokens.py,
 * sketch.py and ldsig.py (which stays as the reference the tests compare against), without
 * numpy's temporaries and Python calls per token; and the memory index's hot loops, whose
 * Python twins are in index/memory.py (tests/test_index.py compares them).
 *
 *   visible_text(parser, drop, brk) walk of a lexbor tree parsed by selectolax
 *   too_deep, nesting_depth         the nesting model of nesting.py (in _nesting.c)
 *   tokenize(text, classes, keys)  canonical code points and one hash per token
 *   block_path(name=None)          which build of the tokenizer's ASCII block path runs
 *   shingles(hashes, mult)         w-token window fingerprints
 *   minhash(shingles, a, b, fam)   k*s minima (32-bit values)
 *   ld_signature(cps, c, mult)     Coates' signature bytes
 *   sketch_page(...)               shingles, min-hashes, features, band keys, signature and the
 *                                  shingles' top halves in one call
 *   set_overlap(x, y, mask)        two pages' shingle tops: the exact Jaccard's counts
 *   multimap_get(runs, mem, k, cap) values of keys in the memory index (runs, then memtable;
 *                                  with `each`, a list per key)
 *   memtable_add, memtable_arrays  the memory index's memtable: add a page; dump it for a run
 *
 * The tree walk calls lexbor through the functions selectolax's own module exports (the
 * "_noi" accessors lexbor provides for bindings), bound once by bind_lexbor(). Where a text
 * node keeps its characters is found by calibration on a node whose text is known, not
 * assumed from a header, so a selectolax built from another lexbor either binds correctly
 * or refuses (and the Python walk is used).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include "_nesting.h"
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MULTIVERSION
#endif

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* --- growable byte buffer ---------------------------------------------------------------- */
/* The kernels reuse one scratch buffer each across calls: a fresh ~100 KB allocation per page
 * is returned to the OS on free and page-faulted back in on the next page, which cost more
 * than the work. The kept buffer is leased for the whole call, result building included:
 * allocating the result can run the garbage collector, whose finalizers and weakref callbacks
 * may call the same kernel, or let another thread call it. A call that finds the buffer leased
 * works in a fresh one of its own. A buffer grown past KEEP_MAX by a huge page is released
 * after use. */
#define KEEP_MAX ((size_t)8 << 20)

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

typedef struct {
    Buf buf;
    int leased;
} Scratch;

static Buf *scratch_take(Scratch *s, Buf *own) {
    if (s->leased) {
        *own = (Buf){0};
        return own;
    }
    s->leased = 1;
    s->buf.len = 0;
    return &s->buf;
}

static void scratch_give(Scratch *s, Buf *b) {
    if (b != &s->buf || b->cap > KEEP_MAX) {
        PyMem_Free(b->data);
        *b = (Buf){0};
    }
    if (b == &s->buf) s->leased = 0;
}

/* Room for `extra` more bytes; -1 (no exception set) when that is more than can be allocated. */
static int buf_reserve(Buf *b, size_t extra) {
    if (extra <= b->cap - b->len) return 0;
    if (extra > (size_t)PY_SSIZE_T_MAX - b->len) return -1;
    size_t need = b->len + extra, cap = b->cap ? b->cap : 4096;
    while (cap < need) cap = cap > (size_t)PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *p = PyMem_Realloc(b->data, cap);
    if (p == NULL) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

/* --- lexbor tree walk --------------------------------------------------------------------- */
typedef void *(*node_fn)(void *);
typedef uintptr_t (*tag_fn)(void *);
typedef const unsigned char *(*str_data_fn)(void *);
typedef size_t (*str_len_fn)(void *);
typedef size_t (*size_fn)(void *);
typedef unsigned (*set_text_fn)(void *, const unsigned char *, size_t);

static struct {
    node_fn first_child, next, parent;
    tag_fn tag_id;
    str_data_fn str_data;
    str_len_fn str_len;
    uintptr_t text_tag;
    size_t text_offset;     /* where a text node's lexbor_str_t sits */
    PyTypeObject *node_type, *parser_type; /* selectolax's LexborNode and LexborHTMLParser */
    int bound;
} lxb;

#define TAG_BITS 1024 /* standard HTML tag ids are small; custom elements get large ids */
#define MAX_NODE_SIZE 1024 /* a text node larger than this is not lexbor's */

static inline int tag_in(const unsigned char *bits, uintptr_t tag) {
    return tag < TAG_BITS && (bits[tag >> 3] >> (tag & 7)) & 1;
}

/* The lexbor node a selectolax LexborNode wraps; NULL with an exception if `obj` is not one
 * or its address is not an int. The caller holds `obj`, which holds its document. */
static void *node_of(PyObject *obj) {
    if (Py_TYPE(obj) != lxb.node_type) {
        PyErr_Format(PyExc_TypeError, "expected a %s, got %s", lxb.node_type->tp_name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyObject *id = PyObject_GetAttrString(obj, "mem_id");
    if (id == NULL) return NULL;
    void *node = PyLong_Check(id) ? PyLong_AsVoidPtr(id) : NULL;
    Py_DECREF(id);
    if (node == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "LexborNode.mem_id is not an address");
    return node;
}

static size_t field_at(const unsigned char *node, size_t off) {
    size_t v;
    memcpy(&v, node + off, sizeof v);
    return v;
}

/* bind_lexbor(path, text_node, marker, other): bind the walk to the selectolax module loaded
 * from `path`, calibrated on `text_node` (a LexborNode whose text is `marker`, in a document
 * of the caller's that this call may change). Where a text node keeps its lexbor_str_t
 * {data, length} is found without reading past the node or following a guessed pointer: only
 * the node's own allocation is read (its size as lexbor's allocator records it), a length field
 * must equal len(marker), then change to len(other) when lexbor itself sets the node's text to
 * `other`, and only then is the data field next to it read, and must hold `other`. */
static PyObject *bind_lexbor(PyObject *self, PyObject *args) {
    const char *path, *marker, *other;
    PyObject *text_node;
    Py_ssize_t marker_len, other_len;
    if (!PyArg_ParseTuple(args, "sOy#y#", &path, &text_node, &marker, &marker_len, &other,
                          &other_len))
        return NULL;
    lxb.bound = 0;
    if (!PyObject_HasAttrString(text_node, "mem_id") ||
        !PyObject_HasAttrString(text_node, "parser") ||
        !PyObject_HasAttrString(text_node, "tag_id")) {
        PyErr_Format(PyExc_TypeError, "expected a selectolax LexborNode, got %s",
                     Py_TYPE(text_node)->tp_name);
        return NULL;
    }
    if (marker_len == other_len || marker_len == 0 || other_len == 0) {
        PyErr_SetString(PyExc_ValueError, "marker and other must differ in length");
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) {
        PyErr_Format(PyExc_ImportError, "selectolax module not loaded: %s", dlerror());
        return NULL;
    }
    lxb.first_child = (node_fn)dlsym(h, "lxb_dom_node_first_child_noi");
    lxb.next = (node_fn)dlsym(h, "lxb_dom_node_next_noi");
    lxb.parent = (node_fn)dlsym(h, "lxb_dom_node_parent_noi");
    lxb.tag_id = (tag_fn)dlsym(h, "lxb_dom_node_tag_id_noi");
    lxb.str_data = (str_data_fn)dlsym(h, "lexbor_str_data_noi");
    lxb.str_len = (str_len_fn)dlsym(h, "lexbor_str_length_noi");
    size_fn alloc_size = (size_fn)dlsym(h, "lexbor_mraw_data_size_noi");
    set_text_fn set_text = (set_text_fn)dlsym(h, "lxb_dom_node_text_content_set");
    dlclose(h); /* the module stays loaded: Python holds it */
    if (!lxb.first_child || !lxb.next || !lxb.parent || !lxb.tag_id || !lxb.str_data ||
        !lxb.str_len || !alloc_size || !set_text) {
        PyErr_SetString(PyExc_ImportError, "selectolax does not export lexbor's accessors");
        return NULL;
    }
    PyObject *parser = PyObject_GetAttrString(text_node, "parser");
    PyObject *tag = PyObject_GetAttrString(text_node, "tag_id");
    if (parser == NULL || tag == NULL) goto fail;
    Py_XSETREF(lxb.node_type, (PyTypeObject *)Py_NewRef(Py_TYPE(text_node)));
    Py_XSETREF(lxb.parser_type, (PyTypeObject *)Py_NewRef(Py_TYPE(parser)));
    unsigned char *node = node_of(text_node);
    uintptr_t text_tag = (uintptr_t)PyLong_AsSize_t(tag);
    if (node == NULL || PyErr_Occurred()) goto fail;
    if (lxb.tag_id(node) != text_tag) {
        PyErr_SetString(PyExc_ImportError, "calibration node is not a text node");
        goto fail;
    }
    size_t size = alloc_size(node), step = sizeof(void *), pair = sizeof(void *) + sizeof(size_t);
    if (size < pair || size > MAX_NODE_SIZE) {
        PyErr_SetString(PyExc_ImportError, "a text node is not where lexbor's allocator says");
        goto fail;
    }
    char candidate[MAX_NODE_SIZE / sizeof(void *)] = {0};
    for (size_t off = 0; off + pair <= size; off += step)
        candidate[off / step] = field_at(node, off + step) == (size_t)marker_len;
    if (set_text(node, (const unsigned char *)other, (size_t)other_len) != 0) {
        PyErr_SetString(PyExc_ImportError, "lexbor could not set the calibration text");
        goto fail;
    }
    for (size_t off = 0; off + pair <= size; off += step) {
        void *str = node + off;
        if (!candidate[off / step] || field_at(node, off + step) != (size_t)other_len) continue;
        if (lxb.str_len(str) == (size_t)other_len &&
            memcmp(lxb.str_data(str), other, other_len) == 0) {
            lxb.text_offset = off;
            lxb.text_tag = text_tag;
            lxb.bound = 1;
            Py_DECREF(parser);
            Py_DECREF(tag);
            Py_RETURN_NONE;
        }
    }
    PyErr_SetString(PyExc_ImportError, "could not find a text node's characters");
fail:
    Py_XDECREF(parser);
    Py_XDECREF(tag);
    return NULL;
}

/* Depth-first over `root`'s descendants, without recursion (pages nest thousands deep):
 * text nodes are appended; elements with a tag in `drop` are skipped with their subtree;
 * elements with a tag in `brk` get a space before and after. Exactly what
 * extract._walk + body.text() produce. */
static int walk(void *root, const unsigned char *drop, const unsigned char *brk, Buf *out) {
    void *node = lxb.first_child(root);
    while (node != NULL) {
        uintptr_t tag = lxb.tag_id(node);
        void *down = NULL;
        if (tag == lxb.text_tag) {
            void *str = (unsigned char *)node + lxb.text_offset;
            const unsigned char *data = lxb.str_data(str);
            size_t len = lxb.str_len(str);
            if (data != NULL && len) {
                if (buf_reserve(out, len)) return -1;
                memcpy(out->data + out->len, data, len);
                out->len += len;
            }
        } else if (!tag_in(drop, tag)) {
            if (tag_in(brk, tag)) {
                if (buf_reserve(out, 1)) return -1;
                out->data[out->len++] = ' ';
            }
            down = lxb.first_child(node);
        }
        if (down != NULL) {
            node = down;
            continue;
        }
        /* leave finished elements, closing their spaces, until one has a next sibling */
        while (node != NULL) {
            uintptr_t done = lxb.tag_id(node);
            if (done != lxb.text_tag && tag_in(brk, done) && !tag_in(drop, done)) {
                if (buf_reserve(out, 1)) return -1;
                out->data[out->len++] = ' ';
            }
            void *next = lxb.next(node);
            if (next != NULL) {
                node = next;
                break;
            }
            node = lxb.parent(node);
            if (node == root) {
                node = NULL;
            }
        }
    }
    return 0;
}

/* visible_text(parser, drop, brk) -> str: the walk over the body of a LexborHTMLParser
 * (the type bind_lexbor saw), "" if it has none. The document is kept alive by the parser
 * argument and the body node held here, not by an address. */
static PyObject *visible_text(PyObject *self, PyObject *args) {
    PyObject *parser;
    Py_buffer drop, brk;
    if (!lxb.bound) {
        PyErr_SetString(PyExc_RuntimeError, "bind_lexbor() has not succeeded");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "Oy*y*", &parser, &drop, &brk)) return NULL;
    PyObject *result = NULL, *body = NULL;
    static Scratch keep;
    Buf own, *out = scratch_take(&keep, &own);
    void *root;
    if (drop.len < TAG_BITS / 8 || brk.len < TAG_BITS / 8) {
        PyErr_SetString(PyExc_ValueError, "tag bitmaps must have TAG_BITS bits");
    } else if (Py_TYPE(parser) != lxb.parser_type) {
        PyErr_Format(PyExc_TypeError, "expected a %s, got %s", lxb.parser_type->tp_name,
                     Py_TYPE(parser)->tp_name);
    } else if ((body = PyObject_GetAttrString(parser, "body")) == NULL) {
        /* the exception is set */
    } else if (body == Py_None) {
        result = PyUnicode_New(0, 0);
    } else if ((root = node_of(body)) == NULL) {
        /* the exception is set */
    } else if (walk(root, drop.buf, brk.buf, out) != 0) {
        PyErr_NoMemory();
    } else {
        result = PyUnicode_DecodeUTF8(out->data ? out->data : "", (Py_ssize_t)out->len, "replace");
    }
    Py_XDECREF(body);
    scratch_give(&keep, out);
    PyBuffer_Release(&drop);
    PyBuffer_Release(&brk);
    return result;
}

/* --- tokens ------------------------------------------------------------------------------- */
enum { SEP = 0, WORD = 1, SOLO = 2, MAX_OFFSET = 255 };

typedef struct {
    const unsigned char *cls;
    const uint64_t *key;
    uint32_t *canon;
    uint64_t *hashes;
    Py_ssize_t nc, nt, cap; /* cap: room in canon and in hashes (one more slot) */
} Tok;

/* Room for `extra` more code points; -1 when that is more than can be allocated. */
static int tok_room(Tok *t, Py_ssize_t extra) {
    if (extra <= t->cap - t->nc) return 0;
    const Py_ssize_t most = PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(uint64_t) - 1;
    if (extra < 0 || extra > most - t->nc) return -1;
    Py_ssize_t cap = t->nc + extra;
    cap = t->cap <= (most - cap) / 2 ? cap + 2 * t->cap : most;
    uint32_t *canon = PyMem_Realloc(t->canon, cap * sizeof *canon);
    if (canon == NULL) return -1;
    t->canon = canon;
    uint64_t *hashes = PyMem_Realloc(t->hashes, (cap + 1) * sizeof *hashes);
    if (hashes == NULL) return -1;
    t->hashes = hashes;
    t->cap = cap;
    return 0;
}

#define MAX_CP 0x110000u          /* the class and fold tables have one entry per code point */
#define MAX_EXPANSION 32 /* code points one character folds to at most (NFKC: 18) */
#define MAX_TEXT ((uint64_t)1 << 27) /* code points: at MAX_EXPANSION each, offsets fit 32 bits */
#define FOLD_COMPLEX 0xFFFFFFFFu /* needs the whole-string NFKC */
#define FOLD_MULTI 0x80000000u   /* low bits: index into `multi` of (length, code points...) */

/* One code point into the tokenizer, on tok_run's locals. Branch-free (token boundaries are
 * unpredictable): the canonical slot and the running token sum are written for every code
 * point, and only the counters decide what is kept. hashes[1..nt] hold the unmixed token
 * sums (slot 0 absorbs the writes before the first token); tok_run mixes them at the end. */
#define TOK_FEED(CP)                                                                         \
    do {                                                                                     \
        uint32_t cp_ = (CP);                                                                 \
        int c_ = cls[cp_];                                                                   \
        int word_ = c_ != SEP;                                                               \
        int start_ = word_ & ((prev == SEP) | (c_ == SOLO) | (prev == SOLO));                \
        canon[nc] = 32u ^ ((cp_ ^ 32u) & (0u - (uint32_t)word_));                            \
        nc += word_ | (prev != SEP);                                                         \
        nt += start_;                                                                        \
        sum &= (uint64_t)0 - (uint64_t)!start_;                                              \
        offset &= 0u - (unsigned)!start_;                                                   \
        uint64_t add_ = ((uint64_t)cp_ + 1) * key[offset < MAX_OFFSET ? offset : MAX_OFFSET]; \
        sum += add_ & ((uint64_t)0 - (uint64_t)word_);                                       \
        offset += word_;                                                                     \
        hashes[nt] = sum;                                                                    \
        prev = c_;                                                                           \
    } while (0)

/* The scalar loop over code points [i, lim) of one string kind. 1: a FOLD_COMPLEX code point;
 * -1: no memory; -2: a corrupt fold table (falls through when done). Runs of word characters
 * and runs of separators go through tight loops; SOLO characters and multi-character mappings
 * go through TOK_FEED one by one. The room made up front is one output per input (plus
 * SLACK); a multi-character mapping makes room for its extra outputs. The state (prev, sum,
 * offset, nc, nt) lives in tok_run's locals, so a token may run on from the block path into
 * this loop and back. */
#define TOK_FOLD(CP, ON_SPECIAL)                                                             \
    if (fmap != NULL) {                                                                      \
        uint32_t f_ = fmap[CP];                                                              \
        if (f_ >= MAX_CP) ON_SPECIAL;                                                        \
        CP = f_;                                                                             \
    }

#define TOK_LOOP(TYPE)                                                                       \
    while (i < lim) {                                                                        \
        const TYPE *d = data;                                                                \
        uint32_t cp = d[i];                                                                  \
        TOK_FOLD(cp, goto special_##TYPE)                                                    \
        int c = cls[cp];                                                                     \
        if (c == WORD) {                                                                     \
            if (prev != WORD) { /* a token starts */                                         \
                nt++;                                                                        \
                sum = 0;                                                                     \
                offset = 0;                                                                  \
            }                                                                                \
            for (;;) {                                                                       \
                canon[nc++] = cp;                                                            \
                sum += ((uint64_t)cp + 1) * key[offset < MAX_OFFSET ? offset : MAX_OFFSET];  \
                offset++;                                                                    \
                if (++i >= lim) break;                                                       \
                cp = d[i];                                                                   \
                TOK_FOLD(cp, break)                                                          \
                if (cls[cp] != WORD) break;                                                  \
            }                                                                                \
            hashes[nt] = sum;                                                                \
            prev = WORD;                                                                     \
        } else if (c == SEP) {                                                               \
            if (prev != SEP) canon[nc++] = 32;                                               \
            prev = SEP;                                                                      \
            for (i++; i < lim; i++) {                                                        \
                cp = d[i];                                                                   \
                TOK_FOLD(cp, break)                                                          \
                if (cls[cp] != SEP) break;                                                   \
            }                                                                                \
        } else {                                                                             \
            TOK_FEED(cp);                                                                    \
            i++;                                                                             \
        }                                                                                    \
        continue;                                                                            \
    special_##TYPE : {                                                                       \
        uint32_t f = fmap[d[i]];                                                             \
        if (f == FOLD_COMPLEX) return 1;                                                     \
        Py_ssize_t at = f & ~FOLD_MULTI, len = at < mlen ? mseq[at] : 0;                     \
        if (f < FOLD_MULTI || at + len >= mlen || len > MAX_EXPANSION) return -2;            \
        for (Py_ssize_t j = 1; j <= len; j++)                                                \
            if (mseq[at + j] >= MAX_CP) return -2;                                           \
        t->nc = nc;                                                                          \
        if (tok_room(t, len + (n - i) + SLACK)) return -1;                                   \
        canon = t->canon;                                                                    \
        hashes = t->hashes;                                                                  \
        for (Py_ssize_t j = 1; j <= len; j++) TOK_FEED(mseq[at + j]);                        \
        i++;                                                                                 \
    }                                                                                        \
    }

/* --- the ASCII fast path ---
 * Most text is ASCII, where folding is lower-casing and a word character is [a-z0-9]. A
 * block of 64 code points that are all ASCII (or NBSP, a separator) is classified at once
 * into a mask of word characters (16 at a time with SSE2, 64 with AVX-512); the tokens are
 * the runs of set bits, handled a run at a time, 8 characters per step, instead of a
 * character at a time. That removes the two mispredicted branches per token of the scalar
 * loop (the end of a word run, the end of a separator run). Same outputs: the block path is
 * only taken when the tables agree with this rule on all of ASCII and on NBSP
 * (ascii_rule_holds). */
#define BLOCK 64
#define NBSP 0xA0 /* the one non-ASCII character the block path takes (a separator): 87 and
                   * 94 % of the non-ASCII characters of the WARC and httpbis texts */
#define SLACK 64 /* room past the last output: the fast path writes 8 code points at a time */

static int ascii_rule_holds(const unsigned char *cls, const uint32_t *fmap) {
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

/* The tokenizer's state between the scalar loop and the fast path. */
typedef struct {
    uint32_t *canon;
    uint64_t *hashes;
    Py_ssize_t nc, nt;
    int prev;
    uint64_t sum;
    unsigned offset; /* characters into the token (tokenize bounds the length: no wrap) */
} TokState;

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
static PyObject *block_path(PyObject *self, PyObject *args) {
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

static int tok_run(Tok *t, const void *data, int kind, Py_ssize_t n, const uint32_t *fmap,
                   const uint32_t *mseq, Py_ssize_t mlen) {
    const unsigned char *cls = t->cls;
    const uint64_t *key = t->key;
    uint32_t *canon = t->canon;
    uint64_t *hashes = t->hashes;
    Py_ssize_t nc = 0, nt = 0, i = 0;
    int prev = SEP;
    uint64_t sum = 0;
    unsigned offset = 0;
    int fast = fmap != NULL && ascii_rule_holds(cls, fmap);
    while (i < n) {
        Py_ssize_t lim = n;
        if (fast && n - i >= BLOCK) {
            TokState st = {canon, hashes, nc, nt, prev, sum, offset};
            Py_ssize_t stop = fast_path(&st, data, kind, i, n, key);
            nc = st.nc, nt = st.nt, prev = st.prev, sum = st.sum, offset = st.offset;
            if (stop != i) {
                i = stop;
                continue;
            }
            lim = i + BLOCK; /* a block with a non-ASCII code point: the scalar loop */
        }
        if (kind == PyUnicode_1BYTE_KIND) {
            TOK_LOOP(Py_UCS1)
        } else if (kind == PyUnicode_2BYTE_KIND) {
            TOK_LOOP(Py_UCS2)
        } else {
            TOK_LOOP(Py_UCS4)
        }
    }
    for (Py_ssize_t j = 1; j <= nt; j++) hashes[j] = mix64(hashes[j]);
    if (nc && canon[nc - 1] == 32) nc--;
    t->nc = nc;
    t->nt = nt;
    return 0;
}

/* tokenize(text, classes: uint8[0x110000], keys: uint64[256], fold: uint32[0x110000] | None,
 *          multi: uint32[]) -> (canon uint32 bytes, token hash uint64 bytes) or None.
 * `fold` maps each code point to lower(NFKC(ch)) where that is a per-character mapping;
 * None if the text holds a character that is not (the caller normalizes the whole string
 * and calls again with fold=None). See tokens.tokenize for the definitions. */
static PyObject *tokenize(PyObject *self, PyObject *args) {
    PyObject *text, *fold_obj;
    Py_buffer classes, keys, fold = {0}, multi = {0};
    if (!PyArg_ParseTuple(args, "Uy*y*Oy*", &text, &classes, &keys, &fold_obj, &multi))
        return NULL;
    PyObject *result = NULL;
    static Tok keep; /* kept across calls and leased as a Scratch is (see Buf) */
    static int leased;
    Tok own = {0}, *t = leased ? &own : &keep;
    leased |= t == &keep;
    int folding = fold_obj != Py_None;
    if (folding && PyObject_GetBuffer(fold_obj, &fold, PyBUF_SIMPLE) != 0) goto done;
    if (classes.len < 0x110000 || keys.len < (Py_ssize_t)((MAX_OFFSET + 1) * 8) ||
        (folding && fold.len < 0x110000 * 4)) {
        PyErr_SetString(PyExc_ValueError, "classes, keys or fold too short");
        goto done;
    }
    t->cls = classes.buf;
    t->key = keys.buf;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if ((uint64_t)n > MAX_TEXT) { /* keeps a token's 32-bit offset from wrapping */
        PyErr_SetString(PyExc_ValueError, "text longer than 2**27 code points");
        goto done;
    }
    t->nc = t->nt = 0;
    if (tok_room(t, n + SLACK)) goto nomem;
    int status = tok_run(t, PyUnicode_DATA(text), PyUnicode_KIND(text), n,
                         folding ? fold.buf : NULL, multi.buf, multi.len / 4);
    if (status == 1) {
        result = Py_NewRef(Py_None);
    } else if (status == -2) {
        PyErr_SetString(PyExc_ValueError, "fold table or multi holds a value past Unicode");
    } else if (status == 0) {
        result = Py_BuildValue("(y#y#)", (const char *)t->canon, t->nc * (Py_ssize_t)4,
                               (const char *)(t->hashes + 1), t->nt * (Py_ssize_t)8);
    } else {
        goto nomem;
    }
    goto done;
nomem:
    PyErr_NoMemory();
done:
    if (t != &keep || (size_t)t->cap * 12 > KEEP_MAX) {
        PyMem_Free(t->canon);
        PyMem_Free(t->hashes);
        t->canon = NULL;
        t->hashes = NULL;
        t->cap = 0;
    }
    if (t == &keep) leased = 0;
    PyBuffer_Release(&classes);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&multi);
    if (folding && fold.obj != NULL) PyBuffer_Release(&fold);
    return result;
}

/* --- shingles and min-hashes --------------------------------------------------------------- */
MULTIVERSION
static void shingles_k(const uint64_t *h, Py_ssize_t n, const uint64_t *mult, Py_ssize_t w,
                       uint64_t *out) {
    Py_ssize_t m = n - w + 1;
    for (Py_ssize_t i = 0; i < m; i++) out[i] = h[i] * mult[0];
    for (Py_ssize_t j = 1; j < w; j++) {
        const uint64_t *hj = h + j;
        uint64_t mj = mult[j];
        for (Py_ssize_t i = 0; i < m; i++) out[i] += hj[i] * mj;
    }
    for (Py_ssize_t i = 0; i < m; i++) out[i] = mix64(out[i]);
}

static PyObject *shingles(PyObject *self, PyObject *args) {
    Py_buffer h, mult;
    if (!PyArg_ParseTuple(args, "y*y*", &h, &mult)) return NULL;
    Py_ssize_t n = h.len / 8, w = mult.len / 8, m = n - w + 1;
    PyObject *result;
    if (w < 1 || m <= 0) {
        result = PyBytes_FromStringAndSize(NULL, 0);
    } else {
        result = PyBytes_FromStringAndSize(NULL, m * 8);
        if (result != NULL)
            shingles_k(h.buf, n, mult.buf, w, (uint64_t *)PyBytes_AS_STRING(result));
    }
    PyBuffer_Release(&h);
    PyBuffer_Release(&mult);
    return result;
}

/* Permutations per pass over the shingles, their state kept in registers: the default 84 in
 * two passes (32 took three, the last one a third empty: 74.5 -> 69 us/page on httpbis). */
#define PERM_BLOCK 44

/* Per permutation the minimum over shingles of a*x+b (affine64) or mix64(x^a) (mix64); the
 * shift to the top 32 bits is monotonic, so it is applied to the minima only. */
MULTIVERSION
static void minhash_k(const uint64_t *x, Py_ssize_t n, const uint64_t *a, const uint64_t *b,
                      Py_ssize_t k, int family, uint32_t *out) {
    for (Py_ssize_t p0 = 0; p0 < k; p0 += PERM_BLOCK) {
        uint64_t lo[PERM_BLOCK], pa[PERM_BLOCK], pb[PERM_BLOCK];
        Py_ssize_t np_ = k - p0 < PERM_BLOCK ? k - p0 : PERM_BLOCK;
        for (Py_ssize_t j = 0; j < PERM_BLOCK; j++) {
            lo[j] = UINT64_MAX;
            pa[j] = j < np_ ? a[p0 + j] : 1;
            pb[j] = j < np_ ? b[p0 + j] : 0;
        }
        if (family == 0) {
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t xi = x[i];
                for (int j = 0; j < PERM_BLOCK; j++) {
                    uint64_t v = pa[j] * xi + pb[j];
                    lo[j] = v < lo[j] ? v : lo[j];
                }
            }
        } else {
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t xi = x[i];
                for (int j = 0; j < PERM_BLOCK; j++) {
                    uint64_t v = mix64(xi ^ pa[j]);
                    lo[j] = v < lo[j] ? v : lo[j];
                }
            }
        }
        for (Py_ssize_t j = 0; j < np_; j++) out[p0 + j] = (uint32_t)(lo[j] >> 32);
    }
}

/* affine32: pi_i(x) = a_i*hi32(x) + b_i mod 2**32 (the low 32 bits of a_i, b_i): 16 lanes to a
 * 512-bit register instead of 8, so all 84 minima stay in registers through one pass. */
#define PERM_BLOCK32 96

MULTIVERSION
static void minhash32_k(const uint64_t *x, Py_ssize_t n, const uint64_t *a, const uint64_t *b,
                        Py_ssize_t k, uint32_t *out) {
    for (Py_ssize_t p0 = 0; p0 < k; p0 += PERM_BLOCK32) {
        uint32_t lo[PERM_BLOCK32], pa[PERM_BLOCK32], pb[PERM_BLOCK32];
        Py_ssize_t np_ = k - p0 < PERM_BLOCK32 ? k - p0 : PERM_BLOCK32;
        for (Py_ssize_t j = 0; j < PERM_BLOCK32; j++) {
            lo[j] = UINT32_MAX;
            pa[j] = j < np_ ? (uint32_t)a[p0 + j] : 1;
            pb[j] = j < np_ ? (uint32_t)b[p0 + j] : 0;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t xi = (uint32_t)(x[i] >> 32);
            for (int j = 0; j < PERM_BLOCK32; j++) {
                uint32_t v = pa[j] * xi + pb[j];
                lo[j] = v < lo[j] ? v : lo[j];
            }
        }
        for (Py_ssize_t j = 0; j < np_; j++) out[p0 + j] = lo[j];
    }
}

/* Family 0: affine64, 1: mix64, 2: affine32 (Params.family, in FAMILIES order). */
static void minhash_any(const uint64_t *x, Py_ssize_t n, const uint64_t *a, const uint64_t *b,
                        Py_ssize_t k, int family, uint32_t *out) {
    if (family == 2) minhash32_k(x, n, a, b, k, out);
    else minhash_k(x, n, a, b, k, family, out);
}

static PyObject *minhash(PyObject *self, PyObject *args) {
    Py_buffer x, a, b;
    int family;
    if (!PyArg_ParseTuple(args, "y*y*y*i", &x, &a, &b, &family)) return NULL;
    Py_ssize_t k = a.len / 8;
    PyObject *result = NULL;
    if (b.len != a.len || family < 0 || family > 2) {
        PyErr_SetString(PyExc_ValueError, "a and b differ in length, or unknown family");
    } else if ((result = PyBytes_FromStringAndSize(NULL, k * 4)) != NULL) {
        uint32_t *out = (uint32_t *)PyBytes_AS_STRING(result);
        if (x.len == 0) {
            memset(out, 0xFF, k * 4);
        } else {
            minhash_any(x.buf, x.len / 8, a.buf, b.buf, k, family, out);
        }
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

/* --- Coates' signature ----------------------------------------------------------------------- */
#define LD_BLOCK 1024

/* The mixed window hashes of m windows. The default window of 4 code points is one fused
 * loop (its multipliers in registers, no pass over the block per position). */
MULTIVERSION
static void window_hashes(const uint32_t *cp, Py_ssize_t m, const uint64_t *mult, Py_ssize_t n,
                          uint64_t *out) {
    if (n == 4) {
        uint64_t m0 = mult[0], m1 = mult[1], m2 = mult[2], m3 = mult[3];
        for (Py_ssize_t i = 0; i < m; i++)
            out[i] = mix64((uint64_t)cp[i] * m0 + (uint64_t)cp[i + 1] * m1 +
                           (uint64_t)cp[i + 2] * m2 + (uint64_t)cp[i + 3] * m3);
        return;
    }
    for (Py_ssize_t i = 0; i < m; i++) out[i] = (uint64_t)cp[i] * mult[0];
    for (Py_ssize_t j = 1; j < n; j++) {
        uint64_t mj = mult[j];
        for (Py_ssize_t i = 0; i < m; i++) out[i] += (uint64_t)cp[i + j] * mj;
    }
    for (Py_ssize_t i = 0; i < m; i++) out[i] = mix64(out[i]);
}

/* The symbols of the windows whose hash is 0 mod c, appended at `out` (room for m): written
 * for every window, kept only where chosen, so no branch mispredicts on the 1-in-c choice.
 * For c a power of two, 8 windows are first tested at once (one vector compare) and skipped
 * together when none is chosen, as (1 - 1/c)**8 of them are (78 % at c = 32).
 * Returns how many were kept. */
MULTIVERSION
static Py_ssize_t ld_select(const uint64_t *hs, Py_ssize_t m, uint64_t c, char *out) {
    Py_ssize_t k = 0;
    if ((c & (c - 1)) == 0) {
        uint64_t low = c - 1;
        Py_ssize_t i = 0;
        for (; i + 8 <= m; i += 8) {
            int any = 0;
            for (int j = 0; j < 8; j++) any |= (hs[i + j] & low) == 0;
            if (!any) continue;
            for (int j = 0; j < 8; j++) {
                out[k] = (char)(hs[i + j] >> 40);
                k += (hs[i + j] & low) == 0;
            }
        }
        for (; i < m; i++) {
            out[k] = (char)(hs[i] >> 40);
            k += (hs[i] & low) == 0;
        }
    } else {
        for (Py_ssize_t i = 0; i < m; i++) {
            out[k] = (char)(hs[i] >> 40);
            k += hs[i] % c == 0;
        }
    }
    return k;
}

/* Coates' signature of len code points appended to out; -1 when out cannot grow. */
static int ld_append(Buf *out, const uint32_t *cp, Py_ssize_t len, uint64_t c, const uint64_t *mult,
                     Py_ssize_t n) {
    uint64_t hs[LD_BLOCK];
    Py_ssize_t total = len - n + 1;
    for (Py_ssize_t lo = 0; lo < total; lo += LD_BLOCK) {
        Py_ssize_t m = total - lo < LD_BLOCK ? total - lo : LD_BLOCK;
        window_hashes(cp + lo, m, mult, n, hs);
        if (buf_reserve(out, (size_t)m)) return -1;
        out->len += (size_t)ld_select(hs, m, c, out->data + out->len);
    }
    return 0;
}

/* ld_signature(codepoints uint32 bytes, c, mult uint64[n]) -> bytes */
static PyObject *ld_signature(PyObject *self, PyObject *args) {
    Py_buffer cps, mult;
    unsigned long long c;
    if (!PyArg_ParseTuple(args, "y*Ky*", &cps, &c, &mult)) return NULL;
    PyObject *result = NULL;
    static Scratch keep;
    Buf own, *out = scratch_take(&keep, &own);
    if (c == 0 || mult.len < 8) {
        PyErr_SetString(PyExc_ValueError, "c and n must be >= 1");
    } else if (ld_append(out, cps.buf, cps.len / 4, c, mult.buf, mult.len / 8)) {
        PyErr_NoMemory();
    } else {
        result = PyBytes_FromStringAndSize(out->data ? out->data : "", (Py_ssize_t)out->len);
    }
    scratch_give(&keep, out);
    PyBuffer_Release(&cps);
    PyBuffer_Release(&mult);
    return result;
}

/* --- the whole sketch step in one call -------------------------------------------------------- */
#define FEATURE_GOLDEN 0x9E3779B97F4A7C15ULL

/* Broder's features: group g's s min-hashes absorbed one at a time into a mix64 chain started
 * from the seed and the group number (sketch.py's features_numpy is the same definition). */
static void features_k(const uint32_t *sk, Py_ssize_t groups, Py_ssize_t s, uint64_t seed,
                       uint64_t *out) {
    for (Py_ssize_t g = 0; g < groups; g++) {
        uint64_t h = mix64(seed + (uint64_t)(g + 1) * FEATURE_GOLDEN);
        for (Py_ssize_t j = 0; j < s; j++) h = mix64(h ^ sk[g * s + j]);
        out[g] = h;
    }
}

/* A uint32 read from any byte offset (a buffer may be a slice at any offset). */
static inline uint32_t load_u32(const char *p, Py_ssize_t i) {
    uint32_t x;
    memcpy(&x, p + 4 * i, 4);
    return x;
}

static int u32_order(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* v[0..n) ascending, each value once; returns how many are kept. */
static Py_ssize_t sort_distinct(uint32_t *v, Py_ssize_t n) {
    qsort(v, (size_t)n, sizeof *v, u32_order);
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (kept == 0 || v[i] != v[kept - 1]) v[kept++] = v[i];
    return kept;
}

/* The exact Jaccard's counts of two pages' stored shingle tops x[0..n), y[0..m) (any order,
 * repeats allowed), counting only the values v with v & mask == 0: out[0] = distinct of x,
 * out[1] = distinct of y, out[2] = in both. One open-addressing table of the union (a slot per
 * value or four: 2**bits >= 4 (n + m); a value's top bits pick its slot, as the values are
 * uniform hashes), a flag per slot saying which page holds it: one pass over each page (12 us
 * for two pages of 2,558 shingles; sorting both and merging took 31). Values that crowd the
 * table (chosen to collide) stop it after 16 probes a value, and both are sorted instead
 * (O(n log n)). Returns 0, or -1 with no memory (a Python error set). */
#define SET_MAX ((Py_ssize_t)1 << 28) /* values a page, at most (stored sets: ~2**16) */

static int overlap_counts(const char *x, Py_ssize_t n, const char *y, Py_ssize_t m,
                          uint32_t mask, Py_ssize_t out[3]) {
    int bits = 4;
    while (((Py_ssize_t)1 << bits) < 4 * (n + m)) bits++;
    size_t size = (size_t)1 << bits, probes = 0, budget = 16 * (size_t)(n + m);
    uint32_t *keys = PyMem_Malloc(size * (sizeof *keys + 1));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint8_t *flags = (uint8_t *)(keys + size);
    memset(flags, 0, size);
    const char *page[2] = {y, x};
    Py_ssize_t len[2] = {m, n}, distinct[2] = {0, 0}, common = 0;
    for (int p = 0; p < 2 && probes <= budget; p++) { /* flag 1: y's, then flag 2: x's */
        uint8_t mine = (uint8_t)(1 << p);
        for (Py_ssize_t i = 0; i < len[p] && probes <= budget; i++) {
            uint32_t v = load_u32(page[p], i);
            if (v & mask) continue;
            size_t s = v >> (32 - bits);
            while (flags[s] && keys[s] != v) s = (s + 1) & (size - 1), probes++;
            if (flags[s] & mine) continue; /* a repeat */
            if (flags[s]) common++; /* y holds it too */
            else keys[s] = v;
            flags[s] |= mine, distinct[p]++;
        }
    }
    if (probes > budget) { /* sort both (in keys: size >= 4 (n + m) values), then merge */
        uint32_t *sorted[2] = {keys, keys + m};
        for (int p = 0; p < 2; p++) {
            Py_ssize_t kept = 0;
            for (Py_ssize_t i = 0; i < len[p]; i++) {
                uint32_t v = load_u32(page[p], i);
                if ((v & mask) == 0) sorted[p][kept++] = v;
            }
            distinct[p] = sort_distinct(sorted[p], kept);
        }
        common = 0;
        for (Py_ssize_t i = 0, j = 0; i < distinct[1] && j < distinct[0];) {
            if (sorted[1][i] < sorted[0][j]) i++;
            else if (sorted[1][i] > sorted[0][j]) j++;
            else common++, i++, j++;
        }
    }
    PyMem_Free(keys);
    out[0] = distinct[1], out[1] = distinct[0], out[2] = common;
    return 0;
}

/* set_overlap(x, y, mask) -> (a, b, common): the exact Jaccard's counts of two pages' stored
 * shingle tops (uint32 values in any order, repeats allowed: sketch.py's shingle_tops without
 * its shift), counting only the values v with v & mask == 0 (the coarser page's MOD-m
 * sample; 0: all): a = distinct values of x, b = of y, common = in both. */
static PyObject *set_overlap(PyObject *self, PyObject *args) {
    Py_buffer x, y;
    unsigned int mask;
    Py_ssize_t out[3];
    if (!PyArg_ParseTuple(args, "y*y*I", &x, &y, &mask)) return NULL;
    int failed = -1;
    if (x.len / 4 > SET_MAX || y.len / 4 > SET_MAX) /* 4 (n + m) slots: checked before */
        PyErr_SetString(PyExc_ValueError, "set_overlap takes at most 2**28 values a page");
    else
        failed = overlap_counts(x.buf, x.len / 4, y.buf, y.len / 4, mask, out);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return failed ? NULL : Py_BuildValue("nnn", out[0], out[1], out[2]);
}

/* The MOD-2**s sample of its shingle set a page stores: all of them (s = 0) up to sample_at
 * shingles; past that, the smallest s that brings the set's size, as the sketch estimates it,
 * (k - 1) * 2**32 / the sum of the k minima (~11 % off at k = 84; at most the m shingles),
 * to sample_at or fewer. Integer arithmetic: sketch.py's numpy path finds the same s. */
static int set_shift(const uint32_t *sk, Py_ssize_t k, Py_ssize_t m, Py_ssize_t sample_at) {
    if (m <= sample_at) return 0;
    uint64_t sum = 0, distinct = (uint64_t)m;
    for (Py_ssize_t i = 0; i < k; i++) sum += sk[i]; /* < k * 2**32: no overflow */
    if (k >= 2 && sum > 0 && ((uint64_t)(k - 1) << 32) / sum < distinct)
        distinct = ((uint64_t)(k - 1) << 32) / sum;
    int shift = 0;
    while (shift < 31 && (distinct >> shift) > (uint64_t)sample_at) shift++;
    return shift;
}

/* sketch_page(token_hashes, shingle_mult, a, b, family, groups, feature_seed, codepoints, ld_c,
 * ld_mult, bands, band_size, band_seed, sets, sample_at) -> (sketch uint32 bytes, keys uint64
 * bytes, LD signature bytes, shingle set bytes): shingles, k*s min-hashes, the k features then
 * `bands` LSH band keys (band j: the same chain over min-hashes j*band_size .. (j+1)*band_size
 * - 1, from band_seed), Coates' signature, and a u32 sampling shift s (set_shift's, past
 * sample_at shingles) then the top 32 bits of each shingle = 0 mod 2**s, in text order (what exact
 * verification compares, by set_overlap; empty without shingles, or with `sets` 0), of one
 * page, with no Python in between. */
static PyObject *sketch_page(PyObject *self, PyObject *args) {
    Py_buffer th, sm, a, b, cps, lm;
    int family;
    Py_ssize_t groups, bands, band_size;
    unsigned long long seed, c, band_seed;
    int sets;
    Py_ssize_t sample_at;
    if (!PyArg_ParseTuple(args, "y*y*y*y*inKy*Ky*nnKpn", &th, &sm, &a, &b, &family, &groups,
                          &seed, &cps, &c, &lm, &bands, &band_size, &band_seed, &sets,
                          &sample_at))
        return NULL;
    static Scratch shingle_keep, sig_keep;
    Buf own_x, own_sig, *xs = scratch_take(&shingle_keep, &own_x),
                        *sig = scratch_take(&sig_keep, &own_sig);
    PyObject *sketch = NULL, *feats = NULL, *his = NULL, *result = NULL;
    Py_ssize_t k = a.len / 8, n = th.len / 8, w = sm.len / 8, m = n - w + 1;
    /* groups <= k keeps groups * 8 within a.len; bands * band_size <= k keeps the bands
     * within the sketch (each factor <= k first: no overflow) */
    if (b.len != a.len || family < 0 || family > 2 || groups < 1 || groups > k ||
        k % groups != 0 || w < 1 || c == 0 || lm.len < 8 || bands < 0 || band_size < 1 ||
        (bands > 0 && (bands > k || band_size > k || bands * band_size > k)) ||
        sample_at < 1) {
        PyErr_SetString(PyExc_ValueError, "inconsistent sketch or signature parameters");
        goto done;
    }
    sketch = PyBytes_FromStringAndSize(NULL, k * 4);
    feats = PyBytes_FromStringAndSize(NULL, (groups + bands) * 8);
    if (sketch == NULL || feats == NULL) goto done;
    uint32_t *sk = (uint32_t *)PyBytes_AS_STRING(sketch);
    if (m <= 0) {
        memset(sk, 0xFF, k * 4);
    } else {
        if (buf_reserve(xs, (size_t)m * 8)) { /* m <= n = th.len / 8 */
            PyErr_NoMemory();
            goto done;
        }
        uint64_t *x = (uint64_t *)xs->data;
        shingles_k(th.buf, n, sm.buf, w, x);
        minhash_any(x, m, a.buf, b.buf, k, family, sk);
    }
    if (m > 0 && sets) {
        const uint64_t *x = (const uint64_t *)xs->data;
        int shift = set_shift(sk, k, m, sample_at);
        uint64_t mask = (((uint64_t)1 << shift) - 1) << 32;
        Py_ssize_t kept = 0;
        for (Py_ssize_t i = 0; i < m; i++) kept += (x[i] & mask) == 0;
        his = PyBytes_FromStringAndSize(NULL, 4 + kept * 4);
        if (his == NULL) goto done;
        uint32_t *hi = (uint32_t *)PyBytes_AS_STRING(his);
        hi[0] = (uint32_t)shift, kept = 1;
        for (Py_ssize_t i = 0; i < m; i++)
            if ((x[i] & mask) == 0) hi[kept++] = (uint32_t)(x[i] >> 32);
    } else if ((his = PyBytes_FromStringAndSize(NULL, 0)) == NULL) {
        goto done;
    }
    uint64_t *keys = (uint64_t *)PyBytes_AS_STRING(feats);
    features_k(sk, groups, k / groups, seed, keys);
    features_k(sk, bands, band_size, band_seed, keys + groups);
    if (ld_append(sig, cps.buf, cps.len / 4, c, lm.buf, lm.len / 8)) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_BuildValue("(OOy#O)", sketch, feats, sig->data ? sig->data : "",
                           (Py_ssize_t)sig->len, his);
done:
    Py_XDECREF(sketch);
    Py_XDECREF(feats);
    Py_XDECREF(his);
    scratch_give(&shingle_keep, xs);
    scratch_give(&sig_keep, sig);
    PyBuffer_Release(&th);
    PyBuffer_Release(&sm);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&cps);
    PyBuffer_Release(&lm);
    return result;
}

/* --- memory index: posting lists in sorted runs ------------------------------------------------ */
/* First position in keys[0..n) not below (upper=0) / above (upper=1) key. */
static Py_ssize_t bound32(const uint32_t *keys, Py_ssize_t n, uint32_t key, int upper) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < key || (upper && keys[mid] == key)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The memtable maps a key's low 32 bits to its one value (an int: most keys are seen once, and
 * an int is no container for the garbage collector to track) or to a list of values, oldest
 * first, at most cap long. */
static int memtable_put(PyObject *mem, uint32_t k, PyObject *value, Py_ssize_t cap, int keep_first,
                        Py_ssize_t *added) {
    PyObject *key = PyLong_FromUnsignedLong(k);
    if (key == NULL) return -1;
    int rc = 0;
    PyObject *old = PyDict_GetItemWithError(mem, key); /* borrowed */
    if (old == NULL) {
        if (PyErr_Occurred() || PyDict_SetItem(mem, key, value) < 0) rc = -1;
        else (*added)++;
    } else if (PyList_Check(old)) {
        Py_ssize_t n = PyList_GET_SIZE(old);
        if (keep_first && n >= cap) {
            /* full: later values are not kept */
        } else if (PyList_Append(old, value) < 0) {
            rc = -1;
        } else if (!keep_first && n + 1 > cap) {
            rc = PyList_SetSlice(old, 0, n + 1 - cap, NULL);
        } else {
            (*added)++;
        }
    } else if (cap < 2) { /* one value per key */
        if (!keep_first) rc = PyDict_SetItem(mem, key, value);
    } else {
        PyObject *pair = PyList_New(2);
        if (pair == NULL) {
            rc = -1;
        } else {
            Py_INCREF(old);
            Py_INCREF(value);
            PyList_SET_ITEM(pair, 0, old);
            PyList_SET_ITEM(pair, 1, value);
            rc = PyDict_SetItem(mem, key, pair);
            Py_DECREF(pair);
            if (rc == 0) (*added)++;
        }
    }
    Py_DECREF(key);
    return rc;
}

/* memtable_add(mem, keys, value, cap, keep_first) -> int: `value` stored under every key (an int,
 * or uint64 buffer of keys; the low 32 bits count), a key keeping at most `cap` values
 * (keep_first: later values are not added; else the oldest is dropped). Returns how many entries
 * the memtable gained. */
static PyObject *memtable_add(PyObject *self, PyObject *args) {
    PyObject *mem, *keys_obj, *value;
    Py_ssize_t cap, added = 0;
    int keep_first, rc = 0;
    if (!PyArg_ParseTuple(args, "O!OOnp", &PyDict_Type, &mem, &keys_obj, &value, &cap,
                          &keep_first))
        return NULL;
    if (cap < 1) {
        PyErr_SetString(PyExc_ValueError, "cap must be >= 1");
        return NULL;
    }
    if (PyLong_Check(keys_obj)) {
        uint32_t k = (uint32_t)PyLong_AsUnsignedLongLongMask(keys_obj);
        if (PyErr_Occurred()) return NULL;
        rc = memtable_put(mem, k, value, cap, keep_first, &added);
    } else {
        Py_buffer q;
        if (PyObject_GetBuffer(keys_obj, &q, PyBUF_C_CONTIGUOUS) < 0) return NULL;
        const uint64_t *keys = q.buf;
        for (Py_ssize_t i = 0; i < q.len / 8 && rc == 0; i++)
            rc = memtable_put(mem, (uint32_t)keys[i], value, cap, keep_first, &added);
        PyBuffer_Release(&q);
    }
    return rc < 0 ? NULL : PyLong_FromSsize_t(added);
}

/* memtable_arrays(mem, count) -> (keys uint32 bytes, values uint32 bytes): every (key, value)
 * entry in dict order, the values of a key in their order; count is the number of entries. */
static PyObject *memtable_arrays(PyObject *self, PyObject *args) {
    PyObject *mem;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!n", &PyDict_Type, &mem, &count)) return NULL;
    if (count < 0 || count > PY_SSIZE_T_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "count out of range");
        return NULL;
    }
    PyObject *kb = PyBytes_FromStringAndSize(NULL, count * 4);
    PyObject *vb = PyBytes_FromStringAndSize(NULL, count * 4);
    if (kb == NULL || vb == NULL) goto fail;
    uint32_t *ko = (uint32_t *)PyBytes_AS_STRING(kb), *vo = (uint32_t *)PyBytes_AS_STRING(vb);
    Py_ssize_t pos = 0, k = 0;
    PyObject *key, *bucket;
    while (PyDict_Next(mem, &pos, &key, &bucket)) {
        uint32_t kv = (uint32_t)PyLong_AsUnsignedLongMask(key);
        int single = !PyList_Check(bucket);
        Py_ssize_t n = single ? 1 : PyList_GET_SIZE(bucket);
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *item = single ? bucket : PyList_GET_ITEM(bucket, j);
            unsigned long v = PyLong_AsUnsignedLongMask(item);
            if (PyErr_Occurred()) goto fail;
            if (k == count) {
                PyErr_SetString(PyExc_ValueError, "memtable holds more entries than count");
                goto fail;
            }
            ko[k] = kv;
            vo[k++] = (uint32_t)v;
        }
    }
    if (k != count) {
        PyErr_SetString(PyExc_ValueError, "memtable holds fewer entries than count");
        goto fail;
    }
    return Py_BuildValue("(NN)", kb, vb);
fail:
    Py_XDECREF(kb);
    Py_XDECREF(vb);
    return NULL;
}

/* Append the values stored in one sorted run (keys uint32 ascending, values uint32) under each
 * of the nq keys to out: the last `cap` of each key. */
static int run_values(PyObject *run, const uint64_t *keys, Py_ssize_t nq, Py_ssize_t cap,
                      PyObject *out) {
    Py_buffer kb, vb;
    if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 2) {
        PyErr_SetString(PyExc_TypeError, "a run is a (keys, values) tuple");
        return -1;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(run, 0), &kb, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(run, 1), &vb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&kb);
        return -1;
    }
    const uint32_t *rk = kb.buf, *rv = vb.buf;
    Py_ssize_t n = kb.len / 4 < vb.len / 4 ? kb.len / 4 : vb.len / 4;
    int rc = 0;
    for (Py_ssize_t i = 0; i < nq && rc == 0; i++) {
        uint32_t key = (uint32_t)keys[i];
        Py_ssize_t lo = bound32(rk, n, key, 0);
        if (lo == n || rk[lo] != key) continue;
        Py_ssize_t hi = bound32(rk + lo, n - lo, key, 1) + lo;
        if (hi - lo > cap) lo = hi - cap;
        for (Py_ssize_t j = lo; j < hi && rc == 0; j++) {
            PyObject *v = PyLong_FromUnsignedLong(rv[j]);
            rc = v == NULL ? -1 : PyList_Append(out, v);
            Py_XDECREF(v);
        }
    }
    PyBuffer_Release(&kb);
    PyBuffer_Release(&vb);
    return rc;
}

/* Append the memtable's values of one key (an int, or a list of them) to out. */
static int memtable_values(PyObject *mem, uint32_t key, PyObject *out) {
    PyObject *k = PyLong_FromUnsignedLong(key);
    if (k == NULL) return -1;
    PyObject *bucket = PyDict_GetItemWithError(mem, k); /* borrowed */
    Py_DECREF(k);
    if (bucket == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyList_Check(bucket)) return PyList_Append(out, bucket);
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(bucket); j++)
        if (PyList_Append(out, PyList_GET_ITEM(bucket, j)) < 0) return -1;
    return 0;
}

/* Key i's values (each) or every key's (not each) into out: the last `cap` in each run, then
 * the memtable's. */
static int multimap_values(PyObject *runs, PyObject *mem, const uint64_t *keys, Py_ssize_t nq,
                           Py_ssize_t cap, PyObject *out) {
    int rc = 0;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(runs) && rc == 0; r++)
        rc = run_values(PyList_GET_ITEM(runs, r), keys, nq, cap, out);
    for (Py_ssize_t i = 0; i < nq && rc == 0; i++)
        rc = memtable_values(mem, (uint32_t)keys[i], out);
    return rc;
}

/* multimap_get(runs, mem, keys, cap, each=False) -> list[int], or with `each` a list per key:
 * every value stored under the keys (a uint64 buffer, or one int; their low 32 bits count):
 * the last `cap` of each key in each run, then its memtable values (with `each`, a key's
 * `cap` largest, ascending, when its runs hold more). What SortedRunMultimap.get_many (and
 * postings) does in Python with two searchsorted calls per run. */
static PyObject *multimap_get(PyObject *self, PyObject *args) {
    PyObject *runs, *mem, *keys_obj;
    Py_ssize_t cap;
    int each = 0;
    if (!PyArg_ParseTuple(args, "O!O!On|p", &PyList_Type, &runs, &PyDict_Type, &mem, &keys_obj,
                          &cap, &each))
        return NULL;
    if (cap < 1) {
        PyErr_SetString(PyExc_ValueError, "cap must be >= 1");
        return NULL;
    }
    uint64_t one;
    Py_buffer q = {0};
    const uint64_t *keys = &one;
    Py_ssize_t nq = 1;
    if (PyLong_Check(keys_obj)) {
        one = PyLong_AsUnsignedLongLongMask(keys_obj);
        if (PyErr_Occurred()) return NULL;
    } else {
        if (PyObject_GetBuffer(keys_obj, &q, PyBUF_C_CONTIGUOUS) < 0) return NULL;
        keys = q.buf;
        nq = q.len / 8;
    }
    PyObject *out = PyList_New(each ? nq : 0);
    int rc = out == NULL ? -1 : 0;
    if (!each && rc == 0) rc = multimap_values(runs, mem, keys, nq, cap, out);
    for (Py_ssize_t i = 0; each && i < nq && rc == 0; i++) {
        PyObject *values = PyList_New(0);
        if (values == NULL) {
            rc = -1;
            break;
        }
        PyList_SET_ITEM(out, i, values); /* out owns it now, even if filling it fails */
        rc = multimap_values(runs, mem, keys + i, 1, cap, values);
        Py_ssize_t n = rc == 0 ? PyList_GET_SIZE(values) : 0;
        if (n > cap) /* several runs: the cap largest values (the most recent pages) */
            rc = PyList_Sort(values) < 0 ? -1 : PyList_SetSlice(values, 0, n - cap, NULL);
    }
    if (q.obj != NULL) PyBuffer_Release(&q);
    if (rc < 0) Py_CLEAR(out);
    return out;
}

static PyMethodDef methods[] = {
    {"bind_lexbor", bind_lexbor, METH_VARARGS,
     "bind_lexbor(path, text_node, marker, other): bind the tree walk to the loaded selectolax "
     "module, calibrated on a LexborNode whose text is `marker` (its text becomes `other`)."},
    {"visible_text", visible_text, METH_VARARGS,
     "visible_text(parser, drop_bitmap, break_bitmap) -> str: the walk over parser.body"},
    {"too_deep", too_deep, METH_VARARGS,
     "too_deep(html, min_tags, limit) -> bool: at least min_tags '<' and nesting_depth(html, "
     "limit) > limit"},
    {"nesting_depth", nesting_depth, METH_VARARGS,
     "nesting_depth(html, limit) -> int: the deepest stack of open elements of nesting.py's "
     "model, or limit + 1 once deeper"},
    {"tokenize", tokenize, METH_VARARGS,
     "tokenize(text, classes, offset_keys, fold, multi) -> (canonical uint32 bytes, token hash "
     "uint64 bytes), or None when fold is given and the text needs the whole-string NFKC"},
    {"block_path", block_path, METH_VARARGS,
     "block_path(name=None) -> str: the tokenizer's block path (\"avx512\" or \"generic\"); "
     "with a name, switch to it"},
    {"shingles", shingles, METH_VARARGS, "shingles(token_hashes, mult) -> uint64 bytes"},
    {"minhash", minhash, METH_VARARGS,
     "minhash(shingles, a, b, family) -> uint32 bytes (family 0: affine64, 1: mix64, 2: affine32)"},
    {"ld_signature", ld_signature, METH_VARARGS, "ld_signature(codepoints, c, mult) -> bytes"},
    {"sketch_page", sketch_page, METH_VARARGS,
     "sketch_page(token_hashes, shingle_mult, a, b, family, groups, feature_seed, codepoints, "
     "ld_c, ld_mult, bands, band_size, band_seed, sets) -> (sketch uint32 bytes, keys uint64 "
     "bytes, LD signature bytes, shingles: u32 0 then a uint32 each, or empty)"},
    {"set_overlap", set_overlap, METH_VARARGS,
     "set_overlap(x, y, mask) -> (a, b, common): two pages' shingle tops' exact Jaccard "
     "counts"},
    {"multimap_get", multimap_get, METH_VARARGS,
     "multimap_get(runs, mem, keys, cap, each=False) -> list[int]: the values of the keys "
     "(uint64 buffer or int) in the sorted runs (the last cap per run) and the memtable; with "
     "each, a list per key"},
    {"memtable_add", memtable_add, METH_VARARGS,
     "memtable_add(mem, keys, value, cap, keep_first) -> entries added"},
    {"memtable_arrays", memtable_arrays, METH_VARARGS,
     "memtable_arrays(mem, count) -> (keys uint32 bytes, values uint32 bytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (nesting_init() != 0) {
        PyErr_SetString(PyExc_ImportError, "the nesting model's name table is too small");
        return NULL;
    }
#ifdef HAVE_AVX512_PATH
    if (have_avx512()) fast_path = fast_avx512;
#endif
    return PyModule_Create(&module);
}
