/* The nesting model (_nesting.c, _tree.c, _names.c), part of the _native module: what its
 * three files share. */
#ifndef STREAM_DEDUP_NESTING_H
#define STREAM_DEDUP_NESTING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__GNUC__)
#define NESTING_INTERNAL __attribute__((visibility("hidden"))) /* (see _native.h) */
#else
#define NESTING_INTERNAL
#endif

#define SEARCH 64       /* elements an end tag looks down the stack, at most */
#define ACTIVE_MAX 512  /* active formatting elements, at most (more: too deep) */

enum { NS_HTML, NS_SVG, NS_MATH };

/* --- known names (_names.c): what the model needs to know about a tag name ---------------- */
enum {
    F_VOID = 1 << 0, F_NO_PUSH = 1 << 1, F_SPECIAL = 1 << 2, F_SCOPE = 1 << 3,
    F_SCOPED_END = 1 << 4, F_TABLE_PART = 1 << 5, F_SECTION = 1 << 6, F_TABLE_CONTEXT = 1 << 7,
    F_RAW = 1 << 8, F_HEADING = 1 << 9, F_P_CLOSER = 1 << 10, F_BREAKOUT = 1 << 11,
    F_FORMATTING = 1 << 12, F_MARKER = 1 << 13, F_SVG_IP = 1 << 14, F_MATH_IP = 1 << 15,
    F_MATH_SPECIAL = 1 << 16, F_MATH_IN_TEXT = 1 << 17, F_NO_RECONSTRUCT = 1 << 18,
};

/* Names of up to 16 ASCII characters, packed lower-cased into two words (exact, no hash). */
typedef struct {
    uint64_t lo, hi;
} Packed;

#define NAME_SLOTS 512
typedef struct {
    Packed key;
    uint32_t flags;
    uint16_t id; /* 0: free slot */
} NameSlot;
NESTING_INTERNAL extern NameSlot name_slots[NAME_SLOTS]; /* filled by nesting_init */

static inline size_t slot_of(Packed k) {
    uint64_t h = (k.lo ^ (k.hi * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
    return (size_t)(h >> 32) % NAME_SLOTS;
}

/* The slot of `k`, or of the free slot where it would go. */
static inline size_t find_slot(Packed k) {
    size_t s = slot_of(k);
    while (name_slots[s].id != 0 &&
           (name_slots[s].key.lo != k.lo || name_slots[s].key.hi != k.hi))
        s = (s + 1) % NAME_SLOTS;
    return s;
}

/* The id (0: a name the model does not know) and flags of a lower-cased ASCII name. */
static inline void name_lookup(Packed k, uint16_t *id, uint32_t *flags) {
    size_t s = find_slot(k);
    *id = name_slots[s].id;
    *flags = name_slots[s].flags;
}
NESTING_INTERNAL uint32_t flags_of(uint16_t id);
NESTING_INTERNAL extern uint16_t ID_P, ID_LI, ID_DD, ID_DT, ID_OPTION, ID_OPTGROUP, ID_BUTTON, ID_A,
    ID_NOBR, ID_INPUT, ID_SELECT, ID_FORM, ID_BR, ID_HTML, ID_HEAD, ID_BODY,
    ID_TABLE, ID_TEMPLATE, ID_TR, ID_TD, ID_TH, ID_TBODY, ID_THEAD, ID_TFOOT,
    ID_COLGROUP, ID_COL, ID_SCRIPT, ID_PLAINTEXT, ID_SVG, ID_MATH, ID_ANNOTATION_XML, ID_OL,
    ID_UL, ID_ADDRESS, ID_DIV, ID_FRAMESET;

/* --- the page ------------------------------------------------------------------------------ */
typedef struct {
    const void *d;
    int kind;
    Py_ssize_t n;
} Page;

static inline Py_UCS4 at(const Page *p, Py_ssize_t i) { return PyUnicode_READ(p->kind, p->d, i); }

static inline Py_UCS4 lower(Py_UCS4 c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static inline int space(Py_UCS4 c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r';
}

static inline int same_text(const Page *p, Py_ssize_t a, Py_ssize_t b, Py_ssize_t len, int fold) {
    for (Py_ssize_t k = 0; k < len; k++) {
        Py_UCS4 x = at(p, a + k), y = at(p, b + k);
        if (fold) {
            x = x == 0 ? 0xFFFD : lower(x);
            y = y == 0 ? 0xFFFD : lower(y);
        }
        if (x != y) return 0;
    }
    return 1;
}

/* --- the model's state (_tree.c) ------------------------------------------------------------- */
typedef struct {
    Py_ssize_t at, len;             /* the name in the page */
    Py_ssize_t attrs_at, attrs_len; /* the attributes as written (Noah's ark identity) */
    uint64_t serial;                /* which element; 0 marks a marker in `active` */
    uint32_t flags;
    uint16_t id;
    uint8_t html, children, special, scope, math_text, open;
} El;

typedef struct {
    const Page *p;
    El *stack, active[ACTIVE_MAX];
    Py_ssize_t depth, nactive, limit, deepest, tables;
    uint64_t serials;
    int overflow; /* the active list is full: reported as too deep */
} Tree;

enum { STOP_SPECIAL, STOP_SCOPE, STOP_BUTTON, STOP_LIST, STOP_TABLE, STOP_ITEM, STOP_NEVER };

/* A new element of namespace `ns` named at [at_, +len) in the page. */
static inline El element(Py_ssize_t at_, Py_ssize_t len, uint16_t id, uint32_t flags, int ns) {
    El e = {at_, len, 0, 0, 0, flags, id, ns == NS_HTML, (uint8_t)ns, 0, 0, 0, 0};
    if (e.html) {
        e.special = (flags & F_SPECIAL) != 0;
        e.scope = (flags & F_SCOPE) != 0;
    } else {
        e.special = (flags & (ns == NS_SVG ? F_SVG_IP : F_MATH_SPECIAL)) != 0;
        e.scope = e.special;
        e.math_text = ns == NS_MATH && (flags & F_MATH_IP);
        if (flags & (ns == NS_SVG ? F_SVG_IP : F_MATH_IP)) e.children = NS_HTML;
    }
    return e;
}

NESTING_INTERNAL int push(Tree *t, El e);
NESTING_INTERNAL void pop_to(Tree *t, Py_ssize_t depth);
NESTING_INTERNAL int reconstruct(Tree *t);
NESTING_INTERNAL void add_formatting(Tree *t, const El *e);
NESTING_INTERNAL uint64_t close_el(Tree *t, uint16_t a, uint16_t b, uint32_t any_of, int stop);
NESTING_INTERNAL void end_tag(Tree *t, Py_ssize_t at_, Py_ssize_t len, uint16_t id, uint32_t flags);
NESTING_INTERNAL void start_closes(Tree *t, uint16_t id, uint32_t flags);
NESTING_INTERNAL int table_part(Tree *t, uint16_t id);

/* --- the module's functions (_nesting.c, _names.c) ------------------------------------------- */
NESTING_INTERNAL int nesting_init(void);
NESTING_INTERNAL PyObject *nesting_depth(PyObject *self, PyObject *args);
NESTING_INTERNAL PyObject *too_deep(PyObject *self, PyObject *args);

#endif
