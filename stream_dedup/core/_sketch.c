/* The sketch kernels of the _native module: shingles, min-hashes, features and band keys
 * (sketch.py is the reference), the whole sketch step of a page in one call (with Coates'
 * signature from _ldsig.c), and the exact overlap of two pages' shingle sets. */
#include "_native.h"

#include <stdlib.h>

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

PyObject *shingles(PyObject *self, PyObject *args) {
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

PyObject *minhash(PyObject *self, PyObject *args) {
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
PyObject *set_overlap(PyObject *self, PyObject *args) {
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
PyObject *sketch_page(PyObject *self, PyObject *args) {
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


/* contain_keys(tops, asked, tag, none[, again, xor]) -> uint64 bytes: the `asked` smallest
 * distinct values of the shingle tops (uint32, any order, repeats allowed) in the
 * containment order (each value bit-reversed), ascending, each as reversed | tag; fewer
 * values than asked: the rest i | none; then the first `again` of those keys once more,
 * each ^ xor (a probe's deep-asked keys). sketch.py's contain_keys (numpy) defines the same
 * keys. One pass, the smallest kept sorted: past the first few values most are larger than
 * the largest kept.
 * sample_keys(tops, most, tag, below) -> uint64 bytes: the same of the values below
 * `below` only, at most `most`, and no fill keys (a MOD sample). */
static inline uint32_t reverse32(uint32_t v) {
    v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
    v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
    v = ((v >> 4) & 0x0F0F0F0Fu) | ((v & 0x0F0F0F0Fu) << 4);
    v = ((v >> 8) & 0x00FF00FFu) | ((v & 0x00FF00FFu) << 8);
    return (v >> 16) | (v << 16);
}

#define CONTAIN_MOST 4096

/* The `asked` smallest distinct reversed values below `below` into low[]; how many. */
static Py_ssize_t smallest(const Py_buffer *x, Py_ssize_t asked, unsigned long long below,
                           uint32_t *low) {
    Py_ssize_t have = 0, n = x->len / 4;
    const unsigned char *p = x->buf;
    for (Py_ssize_t i = 0; i < n && asked; i++) {
        uint32_t t;
        memcpy(&t, p + 4 * i, 4); /* little-endian, as shingle_tops writes them (x86) */
        uint32_t v = reverse32(t);
        if ((unsigned long long)v >= below || (have == asked && v >= low[have - 1])) continue;
        Py_ssize_t lo = 0, hi = have; /* first slot >= v */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (low[mid] < v) lo = mid + 1; else hi = mid;
        }
        if (lo < have && low[lo] == v) continue;
        Py_ssize_t end = have < asked ? have : asked - 1;
        memmove(low + lo + 1, low + lo, (size_t)(end - lo) * 4);
        low[lo] = v;
        if (have < asked) have++;
    }
    return have;
}

PyObject *contain_keys(PyObject *self, PyObject *args) {
    Py_buffer x;
    Py_ssize_t asked, again = 0;
    unsigned long long tag, none, xor = 0;
    if (!PyArg_ParseTuple(args, "y*nKK|nK", &x, &asked, &tag, &none, &again, &xor)) return NULL;
    if (asked < 0 || asked > CONTAIN_MOST || again < 0 || again > asked) {
        PyBuffer_Release(&x);
        PyErr_SetString(PyExc_ValueError, "contain_keys asks 0..4096 keys, again 0..asked");
        return NULL;
    }
    uint32_t low[CONTAIN_MOST];
    Py_ssize_t have = smallest(&x, asked, 1ULL << 32, low);
    PyBuffer_Release(&x);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (asked + again) * 8);
    if (out == NULL) return NULL;
    uint64_t *keys = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < asked; i++)
        keys[i] = i < have ? ((uint64_t)low[i] | tag) : ((uint64_t)(i - have) | none);
    for (Py_ssize_t i = 0; i < again; i++) keys[asked + i] = keys[i] ^ xor;
    return out;
}

PyObject *sample_keys(PyObject *self, PyObject *args) {
    Py_buffer x;
    Py_ssize_t most;
    unsigned long long tag, below;
    if (!PyArg_ParseTuple(args, "y*nKK", &x, &most, &tag, &below)) return NULL;
    if (most < 0 || most > CONTAIN_MOST) {
        PyBuffer_Release(&x);
        PyErr_SetString(PyExc_ValueError, "sample_keys takes 0..4096 keys");
        return NULL;
    }
    uint32_t low[CONTAIN_MOST];
    Py_ssize_t have = smallest(&x, most, below, low);
    PyBuffer_Release(&x);
    PyObject *out = PyBytes_FromStringAndSize(NULL, have * 8);
    if (out == NULL) return NULL;
    uint64_t *keys = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < have; i++) keys[i] = (uint64_t)low[i] | tag;
    return out;
}
