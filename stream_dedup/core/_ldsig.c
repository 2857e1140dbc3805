/* Coates' signature kernel of the _native module (ldsig.py is the reference): the symbols of
 * the n-code-point windows whose hash is 0 mod c, for the estimated Levenshtein distance of
 * two pages. sketch_page (_sketch.c) appends it to a page's sketch. */
#include "_native.h"

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
int ld_append(Buf *out, const uint32_t *cp, Py_ssize_t len, uint64_t c, const uint64_t *mult,
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
PyObject *ld_signature(PyObject *self, PyObject *args) {
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
