/* Compiled kernels of the pure core: the same arithmetic as the numpy code in tokens.py,
 * sketch.py and ldsig.py (which stays as the reference the tests compare against), without
 * numpy's temporaries and Python calls per token; and the memory index's hot loops, whose
 * Python twins are in index/memory.py (tests/test_index.py compares them). One module,
 * a file a job (what they share is in _native.h; the tokenizer's two files also
 * share _tokens.h):
 *
 *   _native.c   visible_text(parser, drop, brk)   walk of a lexbor tree parsed by selectolax;
 *               bind_lexbor; the module's table
 *   _nesting.c  too_deep, nesting_depth           the nesting model of nesting.py (its state
 *                                                 in _tree.c, its tag names in _names.c;
 *                                                 what they share in _nesting.h)
 *   _tokens.c   tokenize(text, classes, keys)     canonical code points, one hash per token
 *   _ascii.c    its block path for ASCII text;
 *               block_path(name=None)             which build of it runs
 *   _sketch.c   shingles(hashes, mult)            w-token window fingerprints
 *               minhash(shingles, a, b, fam)      k*s minima (32-bit values)
 *               sketch_page(...)                  shingles, min-hashes, features, band keys,
 *                                                 signature, shingles' top halves in one call
 *               set_overlap(x, y, mask)           two pages' shingle tops: exact Jaccard counts
 *               contain_keys(tops, q, tag, none[, again, xor])  their q smallest in the
 *                                                 containment order (and the first again)
 *               sample_keys(tops, most, tag, below)  the smallest of a MOD sample
 *   _ldsig.c    ld_signature(cps, c, mult)        Coates' signature bytes
 *   _deep.c     held_add(table, keys, row)       the deep containment keys' newest entries
 *               deep_get(table, runs, block, keys, cap)  a key's rows in them and on disk
 *   _memtable.c multimap_get(runs, mem, k, cap)   values of keys in the memory index (runs,
 *                                                 then memtable; with `each`, a list per key)
 *               memtable_add, memtable_arrays     the memtable: add a page; dump it for a run
 *
 * The tree walk calls lexbor through the functions selectolax's own module exports (the
 * "_noi" accessors lexbor provides for bindings), bound once by bind_lexbor(). Where a text
 * node keeps its characters is found by calibration on a node whose text is known, not
 * assumed from a header, so a selectolax built from another lexbor either binds correctly
 * or refuses (and the Python walk is used).
 */
#include "_native.h"

#include <dlfcn.h>

#include "_nesting.h"

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
    {"contain_keys", contain_keys, METH_VARARGS,
     "contain_keys(tops, asked, tag, none[, again, xor]) -> uint64 bytes: the asked smallest "
     "shingle tops in the containment order (bit-reversed), as keys; the first again ^ xor"},
    {"sample_keys", sample_keys, METH_VARARGS,
     "sample_keys(tops, most, tag, below) -> uint64 bytes: the smallest shingle tops in the "
     "containment order below `below`, at most `most`, as keys"},
    {"multimap_get", multimap_get, METH_VARARGS,
     "multimap_get(runs, mem, keys, cap, each=False) -> list[int]: the values of the keys "
     "(uint64 buffer or int) in the sorted runs (the last cap per run) and the memtable; with "
     "each, a list per key"},
    {"held_add", held_add, METH_VARARGS,
     "held_add(table, keys, row) -> int: row under each key in the open-addressing table"},
    {"deep_get", deep_get, METH_VARARGS,
     "deep_get(table, runs, block, keys, cap) -> list[list[int]]: each key's last cap rows "
     "in the runs on disk, then the table"},
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
    ascii_init();
    return PyModule_Create(&module);
}
