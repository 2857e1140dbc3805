/* Compiled kernels of the pure core: the same arithmetic as the numpy code in tokens.py,
 * sketch.py and ldsig.py (which stays as the reference the tests compare against), without
 * numpy's temporaries and Python calls per token.
 *
 *   visible_text(body, drop, brk)  walk of a lexbor tree parsed by selectolax
 *   tokenize(text, classes, keys)  canonical code points and one hash per token
 *   shingles(hashes, mult)         w-token window fingerprints
 *   minhash(shingles, a, b, fam)   k*s minima, top 32 bits
 *   ld_signature(cps, c, mult)     Coates' signature bytes
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
 * than the work. The GIL is held throughout, so one buffer per kernel is safe; one grown
 * past KEEP_MAX by a huge page is released after use. */
#define KEEP_MAX ((size_t)8 << 20)

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static void buf_release_if_huge(Buf *b) {
    if (b->cap > KEEP_MAX) {
        PyMem_Free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    b->len = 0;
}

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
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

static struct {
    node_fn first_child, next, parent;
    tag_fn tag_id;
    str_data_fn str_data;
    str_len_fn str_len;
    uintptr_t text_tag;
    size_t text_offset; /* where a text node's lexbor_str_t sits */
    int bound;
} lxb;

#define TAG_BITS 1024 /* standard HTML tag ids are small; custom elements get large ids */

static inline int tag_in(const unsigned char *bits, uintptr_t tag) {
    return tag < TAG_BITS && (bits[tag >> 3] >> (tag & 7)) & 1;
}

static PyObject *bind_lexbor(PyObject *self, PyObject *args) {
    const char *path;
    unsigned long long node_addr, text_tag;
    const char *marker;
    Py_ssize_t marker_len;
    if (!PyArg_ParseTuple(args, "sKKy#", &path, &node_addr, &text_tag, &marker, &marker_len))
        return NULL;
    lxb.bound = 0;
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
    dlclose(h); /* the module stays loaded: Python holds it */
    if (!lxb.first_child || !lxb.next || !lxb.parent || !lxb.tag_id || !lxb.str_data ||
        !lxb.str_len) {
        PyErr_SetString(PyExc_ImportError, "selectolax does not export lexbor's accessors");
        return NULL;
    }
    /* Calibrate: find the lexbor_str_t {data, length} holding the marker in a text node.
     * Only offsets whose length field equals the marker's length (an unusual value) and
     * whose data field looks like a pointer are dereferenced. */
    unsigned char *node = (unsigned char *)(uintptr_t)node_addr;
    if (lxb.tag_id(node) != (uintptr_t)text_tag) {
        PyErr_SetString(PyExc_ImportError, "calibration node is not a text node");
        return NULL;
    }
    for (size_t off = 0; off <= 512; off += sizeof(void *)) {
        void *str = node + off;
        uintptr_t data_field;
        size_t len_field;
        memcpy(&data_field, node + off, sizeof data_field);
        memcpy(&len_field, node + off + sizeof(void *), sizeof len_field);
        if (len_field != (size_t)marker_len || data_field < 65536) continue;
        if (lxb.str_len(str) == (size_t)marker_len &&
            memcmp(lxb.str_data(str), marker, marker_len) == 0) {
            lxb.text_offset = off;
            lxb.text_tag = (uintptr_t)text_tag;
            lxb.bound = 1;
            Py_RETURN_NONE;
        }
    }
    PyErr_SetString(PyExc_ImportError, "could not find a text node's characters");
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

static PyObject *visible_text(PyObject *self, PyObject *args) {
    unsigned long long root;
    Py_buffer drop, brk;
    if (!lxb.bound) {
        PyErr_SetString(PyExc_RuntimeError, "bind_lexbor() has not succeeded");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "Ky*y*", &root, &drop, &brk)) return NULL;
    PyObject *result = NULL;
    static Buf out;
    out.len = 0;
    if (drop.len * 8 < TAG_BITS || brk.len * 8 < TAG_BITS) {
        PyErr_SetString(PyExc_ValueError, "tag bitmaps must have TAG_BITS bits");
    } else if (walk((void *)(uintptr_t)root, drop.buf, brk.buf, &out) != 0) {
        PyErr_NoMemory();
    } else {
        result = PyUnicode_DecodeUTF8(out.data ? out.data : "", (Py_ssize_t)out.len, "replace");
    }
    buf_release_if_huge(&out);
    PyBuffer_Release(&drop);
    PyBuffer_Release(&brk);
    return result;
}

/* --- nesting depth ------------------------------------------------------------------------ */
/* too_deep(html, min_tags, limit, flat): True if the page has at least `min_tags` '<' and
 * its element nesting exceeds `limit`, by the rule of extract._too_deep: every `<name`
 * deepens, every `</name` closes one, except the names in `flat` (each packed as up to 8
 * lower-case bytes in a little-endian uint64), which never nest. Names longer than 8
 * characters are never in `flat`. One-byte strings (nearly all HTML) are scanned with
 * memchr, which skips the text between tags at memory speed. */
static inline int tag_char(Py_UCS4 c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

#define NEXT_LT(TYPE, I)                                                                     \
    if (sizeof(TYPE) == 1) {                                                                 \
        const void *p_ = memchr(d + (I), '<', (size_t)(n - (I)));                            \
        I = p_ == NULL ? n : (const TYPE *)p_ - d;                                           \
    } else {                                                                                 \
        while (I < n && d[I] != '<') I++;                                                    \
    }

#define DEPTH_LOOP(TYPE)                                                                     \
    {                                                                                        \
        const TYPE *d = data;                                                                \
        Py_ssize_t tags = 0;                                                                 \
        for (Py_ssize_t i = 0; i < n && tags < min_tags; i++, tags++) {                      \
            NEXT_LT(TYPE, i)                                                                 \
            if (i >= n) break;                                                               \
        }                                                                                    \
        if (tags < min_tags) Py_RETURN_FALSE;                                                \
        for (Py_ssize_t i = 0; i < n; i++) {                                                 \
            NEXT_LT(TYPE, i)                                                                 \
            if (i >= n) break;                                                               \
            Py_ssize_t j = i + 1;                                                            \
            int closing = j < n && d[j] == '/';                                              \
            j += closing;                                                                    \
            if (j >= n || !((d[j] | 32) >= 'a' && (d[j] | 32) <= 'z')) continue;            \
            uint64_t name = 0;                                                               \
            Py_ssize_t len = 0;                                                              \
            for (; j < n && tag_char(d[j]); j++, len++) {                                    \
                if (len < 8) {                                                               \
                    Py_UCS4 c = d[j];                                                        \
                    if (c >= 'A' && c <= 'Z') c += 32;                                       \
                    name |= (uint64_t)c << (8 * len);                                        \
                }                                                                            \
            }                                                                                \
            int is_flat = 0;                                                                 \
            for (Py_ssize_t k = 0; len <= 8 && k < nflat; k++) is_flat |= flat[k] == name;   \
            if (is_flat) continue;                                                           \
            if (closing) {                                                                   \
                depth -= depth > 0;                                                          \
            } else if (++depth > limit) {                                                    \
                Py_RETURN_TRUE;                                                              \
            }                                                                                \
            i = j - 1;                                                                       \
        }                                                                                    \
    }

static PyObject *too_deep(PyObject *self, PyObject *args) {
    PyObject *html;
    Py_ssize_t min_tags, limit;
    Py_buffer flat_buf;
    if (!PyArg_ParseTuple(args, "Unny*", &html, &min_tags, &limit, &flat_buf)) return NULL;
    const uint64_t *flat = flat_buf.buf;
    Py_ssize_t nflat = flat_buf.len / 8, n = PyUnicode_GET_LENGTH(html), depth = 0;
    const void *data = PyUnicode_DATA(html);
    PyBuffer_Release(&flat_buf); /* `flat` is a bytes object the caller keeps alive */
    switch (PyUnicode_KIND(html)) {
    case PyUnicode_1BYTE_KIND:
        DEPTH_LOOP(Py_UCS1)
        break;
    case PyUnicode_2BYTE_KIND:
        DEPTH_LOOP(Py_UCS2)
        break;
    default:
        DEPTH_LOOP(Py_UCS4)
    }
    Py_RETURN_FALSE;
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

static int tok_room(Tok *t, Py_ssize_t extra) {
    if (t->nc + extra <= t->cap) return 0;
    Py_ssize_t cap = 2 * t->cap + extra;
    uint32_t *canon = PyMem_Realloc(t->canon, cap * sizeof *canon);
    if (canon == NULL) return -1;
    t->canon = canon;
    uint64_t *hashes = PyMem_Realloc(t->hashes, (cap + 1) * sizeof *hashes);
    if (hashes == NULL) return -1;
    t->hashes = hashes;
    t->cap = cap;
    return 0;
}

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

/* The loop over one string kind. 0: done; 1: a FOLD_COMPLEX code point; -1: no memory;
 * -2: a corrupt fold table. Runs of word characters and runs of separators (the bulk of any
 * text) go through tight loops whose branches are predictable; SOLO characters and
 * multi-character mappings go through TOK_FEED one by one. The room made up front is one
 * output per input; a multi-character mapping makes room for its extra outputs. */
#define TOK_FOLD(CP, ON_SPECIAL)                                                             \
    if (fmap != NULL) {                                                                      \
        uint32_t f_ = fmap[CP];                                                              \
        if (f_ >= FOLD_MULTI) ON_SPECIAL;                                                    \
        CP = f_;                                                                             \
    }

#define TOK_LOOP(TYPE)                                                                       \
    for (Py_ssize_t i = 0; i < n;) {                                                         \
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
                if (++i >= n) break;                                                         \
                cp = d[i];                                                                   \
                TOK_FOLD(cp, break)                                                          \
                if (cls[cp] != WORD) break;                                                  \
            }                                                                                \
            hashes[nt] = sum;                                                                \
            prev = WORD;                                                                     \
        } else if (c == SEP) {                                                               \
            if (prev != SEP) canon[nc++] = 32;                                               \
            prev = SEP;                                                                      \
            for (i++; i < n; i++) {                                                          \
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
        if (at + len >= mlen) return -2;                                                     \
        t->nc = nc;                                                                          \
        if (tok_room(t, len + (n - i))) return -1;                                           \
        canon = t->canon;                                                                    \
        hashes = t->hashes;                                                                  \
        for (Py_ssize_t j = 1; j <= len; j++) TOK_FEED(mseq[at + j]);                        \
        i++;                                                                                 \
    }                                                                                        \
    }

static int tok_run(Tok *t, const void *data, int kind, Py_ssize_t n, const uint32_t *fmap,
                   const uint32_t *mseq, Py_ssize_t mlen) {
    const unsigned char *cls = t->cls;
    const uint64_t *key = t->key;
    uint32_t *canon = t->canon;
    uint64_t *hashes = t->hashes;
    Py_ssize_t nc = 0, nt = 0;
    int prev = SEP;
    uint64_t sum = 0;
    unsigned offset = 0;
    if (kind == PyUnicode_1BYTE_KIND) {
        TOK_LOOP(Py_UCS1)
    } else if (kind == PyUnicode_2BYTE_KIND) {
        TOK_LOOP(Py_UCS2)
    } else {
        TOK_LOOP(Py_UCS4)
    }
    for (Py_ssize_t i = 1; i <= nt; i++) hashes[i] = mix64(hashes[i]);
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
    static Tok t; /* scratch kept across calls, see Buf */
    int folding = fold_obj != Py_None;
    if (folding && PyObject_GetBuffer(fold_obj, &fold, PyBUF_SIMPLE) != 0) goto done;
    if (classes.len < 0x110000 || keys.len < (Py_ssize_t)((MAX_OFFSET + 1) * 8) ||
        (folding && fold.len < 0x110000 * 4)) {
        PyErr_SetString(PyExc_ValueError, "classes, keys or fold too short");
        goto done;
    }
    t.cls = classes.buf;
    t.key = keys.buf;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    t.nc = t.nt = 0;
    if (tok_room(&t, n + 64)) goto nomem;
    int status = tok_run(&t, PyUnicode_DATA(text), PyUnicode_KIND(text), n,
                         folding ? fold.buf : NULL, multi.buf, multi.len / 4);
    if (status == 1) {
        result = Py_NewRef(Py_None);
    } else if (status == -2) {
        PyErr_SetString(PyExc_ValueError, "fold table points past multi");
    } else if (status == 0) {
        result = Py_BuildValue("(y#y#)", (const char *)t.canon, t.nc * (Py_ssize_t)4,
                               (const char *)(t.hashes + 1), t.nt * (Py_ssize_t)8);
    } else {
        goto nomem;
    }
    goto done;
nomem:
    PyErr_NoMemory();
done:
    if ((size_t)t.cap * 12 > KEEP_MAX) {
        PyMem_Free(t.canon);
        PyMem_Free(t.hashes);
        t.canon = NULL;
        t.hashes = NULL;
        t.cap = 0;
    }
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

#define PERM_BLOCK 32 /* permutations per pass over the shingles: their state stays in registers */

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

static PyObject *minhash(PyObject *self, PyObject *args) {
    Py_buffer x, a, b;
    int family;
    if (!PyArg_ParseTuple(args, "y*y*y*i", &x, &a, &b, &family)) return NULL;
    Py_ssize_t k = a.len / 8;
    PyObject *result = NULL;
    if (b.len != a.len || (family != 0 && family != 1)) {
        PyErr_SetString(PyExc_ValueError, "a and b differ in length, or unknown family");
    } else if ((result = PyBytes_FromStringAndSize(NULL, k * 4)) != NULL) {
        uint32_t *out = (uint32_t *)PyBytes_AS_STRING(result);
        if (x.len == 0) {
            memset(out, 0xFF, k * 4);
        } else {
            minhash_k(x.buf, x.len / 8, a.buf, b.buf, k, family, out);
        }
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

/* --- Coates' signature ----------------------------------------------------------------------- */
#define LD_BLOCK 1024

MULTIVERSION
static void window_hashes(const uint32_t *cp, Py_ssize_t m, const uint64_t *mult, Py_ssize_t n,
                          uint64_t *out) {
    for (Py_ssize_t i = 0; i < m; i++) out[i] = (uint64_t)cp[i] * mult[0];
    for (Py_ssize_t j = 1; j < n; j++) {
        uint64_t mj = mult[j];
        for (Py_ssize_t i = 0; i < m; i++) out[i] += (uint64_t)cp[i + j] * mj;
    }
    for (Py_ssize_t i = 0; i < m; i++) out[i] = mix64(out[i]);
}

/* ld_signature(codepoints uint32 bytes, c, mult uint64[n]) -> bytes */
static PyObject *ld_signature(PyObject *self, PyObject *args) {
    Py_buffer cps, mult;
    unsigned long long c;
    if (!PyArg_ParseTuple(args, "y*Ky*", &cps, &c, &mult)) return NULL;
    Py_ssize_t len = cps.len / 4, n = mult.len / 8, total = len - n + 1;
    PyObject *result = NULL;
    static Buf out;
    out.len = 0;
    if (c == 0 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "c and n must be >= 1");
        goto done;
    }
    const uint32_t *cp = cps.buf;
    uint64_t hs[LD_BLOCK];
    int pow2 = (c & (c - 1)) == 0;
    for (Py_ssize_t lo = 0; lo < total; lo += LD_BLOCK) {
        Py_ssize_t m = total - lo < LD_BLOCK ? total - lo : LD_BLOCK;
        window_hashes(cp + lo, m, mult.buf, n, hs);
        if (buf_reserve(&out, (size_t)m)) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            uint64_t h = hs[i];
            if (pow2 ? (h & (c - 1)) == 0 : h % c == 0) out.data[out.len++] = (char)(h >> 40);
        }
    }
    result = PyBytes_FromStringAndSize(out.data ? out.data : "", (Py_ssize_t)out.len);
done:
    buf_release_if_huge(&out);
    PyBuffer_Release(&cps);
    PyBuffer_Release(&mult);
    return result;
}

static PyMethodDef methods[] = {
    {"bind_lexbor", bind_lexbor, METH_VARARGS,
     "bind_lexbor(path, text_node_addr, text_tag_id, marker): bind the tree walk to the "
     "loaded selectolax module, calibrated on a text node holding `marker`."},
    {"visible_text", visible_text, METH_VARARGS,
     "visible_text(root_addr, drop_bitmap, break_bitmap) -> str"},
    {"too_deep", too_deep, METH_VARARGS,
     "too_deep(html, min_tags, limit, flat_names) -> bool: at least min_tags tags and element "
     "nesting deeper than limit"},
    {"tokenize", tokenize, METH_VARARGS,
     "tokenize(text, classes, offset_keys, fold, multi) -> (canonical uint32 bytes, token hash "
     "uint64 bytes), or None when fold is given and the text needs the whole-string NFKC"},
    {"shingles", shingles, METH_VARARGS, "shingles(token_hashes, mult) -> uint64 bytes"},
    {"minhash", minhash, METH_VARARGS,
     "minhash(shingles, a, b, family) -> uint32 bytes (family 0: affine64, 1: mix64)"},
    {"ld_signature", ld_signature, METH_VARARGS, "ld_signature(codepoints, c, mult) -> bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
