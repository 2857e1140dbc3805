/* The memory index's hot loops (index/memory.py holds their Python twins, which
 * tests/test_index.py compares them against): the memtable, and lookups in sorted runs. */
#include "_native.h"

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
PyObject *memtable_add(PyObject *self, PyObject *args) {
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
PyObject *memtable_arrays(PyObject *self, PyObject *args) {
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
PyObject *multimap_get(PyObject *self, PyObject *args) {
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

