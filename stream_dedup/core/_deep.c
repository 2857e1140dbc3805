/* The deep containment keys' store (index/deep.py, which holds the Python twins the tests
 * compare these with). An entry is one uint64: key << 32 | row, so entries sorted as
 * integers are sorted by key, then row (oldest first).
 *
 *   held_add(table, keys, row)          the newest entries: an open-addressing table of
 *                                       uint64 slots (EMPTY: none), linear probing from the
 *                                       key's hash; a key's entries lie on its probe path in
 *                                       the order they came (nothing is ever removed)
 *   deep_get(table, runs, block, keys, cap)  each key's `cap` most recent rows: the runs'
 *                                       (oldest run first; a run is a file of sorted entries
 *                                       and the first key of each block of `block` entries),
 *                                       then the table's
 */
#include "_native.h"

#include <errno.h>
#include <unistd.h>

#define EMPTY UINT64_MAX

static inline size_t slot_of(uint32_t key, size_t mask) {
    return (size_t)mix64((uint64_t)key) & mask;
}

/* held_add(table, keys, row) -> int: `row` under each key (uint64 buffer: the low 32
 * bits); the table (a writable uint64 buffer, a power of two long) must have a free slot
 * for each. */
PyObject *held_add(PyObject *self, PyObject *args) {
    Py_buffer t, k;
    long long row;
    if (!PyArg_ParseTuple(args, "w*y*L", &t, &k, &row)) return NULL;
    uint64_t *table = t.buf;
    size_t slots = (size_t)t.len / 8, n = (size_t)k.len / 8, mask = slots - 1, used = 0;
    const uint64_t *keys = k.buf;
    int ok = slots && !(slots & mask) && row >= 0 && row < 0xFFFFFFFFll;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t entry = (keys[i] & 0xFFFFFFFFull) << 32 | (uint64_t)row;
        size_t s = slot_of((uint32_t)(entry >> 32), mask), probes = 0;
        while (table[s] != EMPTY && probes++ < slots) s = (s + 1) & mask;
        if (table[s] != EMPTY || entry == EMPTY) {
            ok = 0;
            break;
        }
        table[s] = entry;
        used++;
    }
    PyBuffer_Release(&t);
    PyBuffer_Release(&k);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "held_add: a full table, a length not a power of "
                        "two, or a row not in 0..2**32 - 2");
        return NULL;
    }
    return PyLong_FromSize_t(used);
}

/* Appends the rows of `key` in sorted entries e[0..n) to `out` (a list). */
static int rows_of(const uint64_t *e, size_t n, uint32_t key, PyObject *out) {
    uint64_t lo_v = (uint64_t)key << 32;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e[mid] < lo_v) lo = mid + 1; else hi = mid;
    }
    for (; lo < n && (uint32_t)(e[lo] >> 32) == key; lo++) {
        PyObject *r = PyLong_FromUnsignedLong((unsigned long)(uint32_t)e[lo]);
        if (r == NULL || PyList_Append(out, r) != 0) {
            Py_XDECREF(r);
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

/* One run's rows of `key` (appended to out): the blocks whose first key is not past it,
 * from the last whose first key is below it, read with one pread. */
static int run_rows(int fd, const uint32_t *fences, size_t nf, size_t block, uint32_t key,
                    uint64_t *buf, size_t buf_entries, PyObject *out) {
    size_t lo = 0, hi = nf; /* first fence >= key */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fences[mid] < key) lo = mid + 1; else hi = mid;
    }
    size_t first = lo ? lo - 1 : 0, end = lo; /* end: first fence > key */
    while (end < nf && fences[end] == key) end++;
    if (end == first) end = first + 1;
    size_t want = (end - first) * block;
    if (want > buf_entries) want = buf_entries; /* (a key over many blocks: its first ones) */
    ssize_t got;
    do {
        got = pread(fd, buf, want * 8, (off_t)(first * block * 8));
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return rows_of(buf, (size_t)got / 8, key, out);
}

/* deep_get(table, runs, block, keys, cap) -> list[list[int]]: runs a list of (fd, fences
 * uint32 buffer); each key's rows, the runs' then the table's, its last `cap`. */
PyObject *deep_get(PyObject *self, PyObject *args) {
    Py_buffer t, k;
    PyObject *runs;
    Py_ssize_t block, cap;
    if (!PyArg_ParseTuple(args, "y*O!ny*n", &t, &PyList_Type, &runs, &block, &k, &cap))
        return NULL;
    PyObject *result = NULL;
    uint64_t *buf = NULL;
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    Py_buffer *fences = PyMem_Calloc((size_t)nruns + 1, sizeof(Py_buffer));
    int *fds = PyMem_Calloc((size_t)nruns + 1, sizeof(int));
    Py_ssize_t bound = 0;
    size_t buf_entries = (size_t)(block > 0 ? block : 1) * 4;
    if (fences == NULL || fds == NULL || block < 1 || cap < 1) {
        if (fences != NULL && fds != NULL) PyErr_SetString(PyExc_ValueError, "deep_get: block "
                                                           "and cap must be >= 1");
        else PyErr_NoMemory();
        goto done;
    }
    for (; bound < nruns; bound++) {
        PyObject *item = PyList_GET_ITEM(runs, bound);
        if (!PyArg_ParseTuple(item, "iy*", &fds[bound], &fences[bound])) goto done;
    }
    buf = PyMem_Malloc(buf_entries * 8);
    result = PyList_New(0);
    if (buf == NULL || result == NULL) {
        if (buf == NULL) PyErr_NoMemory();
        goto done;
    }
    const uint64_t *table = t.buf, *keys = k.buf;
    size_t slots = (size_t)t.len / 8, mask = slots - 1, n = (size_t)k.len / 8;
    for (size_t i = 0; i < n; i++) {
        uint32_t key = (uint32_t)keys[i];
        PyObject *rows = PyList_New(0);
        if (rows == NULL || PyList_Append(result, rows) != 0) {
            Py_XDECREF(rows);
            goto fail;
        }
        Py_DECREF(rows);
        for (Py_ssize_t r = 0; r < nruns; r++)
            if (run_rows(fds[r], fences[r].buf, (size_t)fences[r].len / 4, (size_t)block, key,
                         buf, buf_entries, rows) != 0)
                goto fail;
        if (slots && !(slots & mask)) {
            size_t s = slot_of(key, mask), probes = 0;
            for (; table[s] != EMPTY && probes < slots; s = (s + 1) & mask, probes++) {
                if ((uint32_t)(table[s] >> 32) != key) continue;
                PyObject *v = PyLong_FromUnsignedLong((unsigned long)(uint32_t)table[s]);
                if (v == NULL || PyList_Append(rows, v) != 0) {
                    Py_XDECREF(v);
                    goto fail;
                }
                Py_DECREF(v);
            }
        }
        Py_ssize_t have = PyList_GET_SIZE(rows);
        if (have > cap && PyList_SetSlice(rows, 0, have - cap, NULL) != 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (Py_ssize_t r = 0; r < bound; r++) PyBuffer_Release(&fences[r]);
    PyMem_Free(fences);
    PyMem_Free(fds);
    PyMem_Free(buf);
    PyBuffer_Release(&t);
    PyBuffer_Release(&k);
    return result;
}
