/* The tokenizer kernel of the _native module: canonical code points and one hash per token,
 * the arithmetic of tokens.py (the reference the tests compare against), with a block path
 * for ASCII text (_ascii.c). */
#include "_tokens.h"

/* --- tokens ------------------------------------------------------------------------------- */
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
            Py_ssize_t stop = ascii_blocks(&st, data, kind, i, n, key);
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
PyObject *tokenize(PyObject *self, PyObject *args) {
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
