/* What the translation units of the _native module share (see _native.c for the map): the
 * build attributes, a hash mix, the scratch buffers, and the kernels the module table lists.
 * The kernels are hidden from other shared objects, so that no library loaded later can
 * interpose a function of the same name. */
#ifndef STREAM_DEDUP_NATIVE_H
#define STREAM_DEDUP_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define INTERNAL __attribute__((visibility("hidden")))
#else
#define INTERNAL
#endif

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

static inline Buf *scratch_take(Scratch *s, Buf *own) {
    if (s->leased) {
        *own = (Buf){0};
        return own;
    }
    s->leased = 1;
    s->buf.len = 0;
    return &s->buf;
}

static inline void scratch_give(Scratch *s, Buf *b) {
    if (b != &s->buf || b->cap > KEEP_MAX) {
        PyMem_Free(b->data);
        *b = (Buf){0};
    }
    if (b == &s->buf) s->leased = 0;
}

/* Room for `extra` more bytes; -1 (no exception set) when that is more than can be allocated. */
static inline int buf_reserve(Buf *b, size_t extra) {
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


/* _tokens.c */
INTERNAL PyObject *tokenize(PyObject *self, PyObject *args);
/* _ascii.c */
INTERNAL PyObject *block_path(PyObject *self, PyObject *args);
INTERNAL void ascii_init(void);
/* _sketch.c */
INTERNAL PyObject *shingles(PyObject *self, PyObject *args);
INTERNAL PyObject *minhash(PyObject *self, PyObject *args);
INTERNAL PyObject *sketch_page(PyObject *self, PyObject *args);
INTERNAL PyObject *set_overlap(PyObject *self, PyObject *args);
INTERNAL PyObject *contain_keys(PyObject *self, PyObject *args);
INTERNAL PyObject *sample_keys(PyObject *self, PyObject *args);
INTERNAL PyObject *held_add(PyObject *self, PyObject *args);
INTERNAL PyObject *deep_get(PyObject *self, PyObject *args);
/* _ldsig.c */
INTERNAL PyObject *ld_signature(PyObject *self, PyObject *args);
INTERNAL int ld_append(Buf *out, const uint32_t *cp, Py_ssize_t len, uint64_t c,
                       const uint64_t *mult, Py_ssize_t n);
/* _memtable.c */
INTERNAL PyObject *multimap_get(PyObject *self, PyObject *args);
INTERNAL PyObject *memtable_add(PyObject *self, PyObject *args);
INTERNAL PyObject *memtable_arrays(PyObject *self, PyObject *args);

#endif
