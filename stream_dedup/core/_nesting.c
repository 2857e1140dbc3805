/* The nesting model of nesting.py in C (that module documents it; tests/test_nesting.py
 * compares the two): how deep a page can make lexbor's stack of open elements, which bounds
 * lexbor's parse time.
 *
 *   nesting_depth(html, limit)        the deepest stack the model reaches, or limit + 1
 *   too_deep(html, min_tags, limit)   at least min_tags '<' and nesting_depth > limit
 *
 * Every size is bounded: the stack holds at most limit + 1 elements (the scan stops there),
 * the list of active formatting elements at most ACTIVE_MAX (more is reported as too deep),
 * and an end tag looks at most SEARCH elements down.
 *
 * This file scans the page (tags, comments, raw text, scripts) and drives the model; _tree.c
 * holds the model's state and what each tag does to it; _names.c the tag names it knows. */
#include "_nesting.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_LIMIT ((Py_ssize_t)1 << 20)

/* --- the page ------------------------------------------------------------------------------ */
/* The first c at or after i, or n: memchr for one-byte strings, 16 bytes at a time (SSE2)
 * for the others. */
static Py_ssize_t find_char(const Page *p, Py_UCS4 c, Py_ssize_t i) {
    Py_ssize_t n = p->n;
    if (i >= n) return n;
    if (p->kind == PyUnicode_1BYTE_KIND) {
        if (c > 0xFF) return n;
        const Py_UCS1 *d = p->d;
        const void *q = memchr(d + i, (int)c, (size_t)(n - i));
        return q == NULL ? n : (const Py_UCS1 *)q - d;
    }
    if (p->kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *d = p->d;
        if (c > 0xFFFF) return n;
#if defined(__SSE2__)
        __m128i needle = _mm_set1_epi16((short)c);
        for (; i + 8 <= n; i += 8) {
            int m = _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(d + i)), needle));
            if (m) return i + __builtin_ctz((unsigned)m) / 2;
        }
#endif
        for (; i < n; i++)
            if (d[i] == c) return i;
        return n;
    }
    const Py_UCS4 *d = p->d;
#if defined(__SSE2__)
    __m128i needle = _mm_set1_epi32((int)c);
    for (; i + 4 <= n; i += 4) {
        int m = _mm_movemask_epi8(_mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(d + i)), needle));
        if (m) return i + __builtin_ctz((unsigned)m) / 4;
    }
#endif
    for (; i < n; i++)
        if (d[i] == c) return i;
    return n;
}

/* The ASCII `lit` (lower case) at i, ASCII case-insensitively when `fold`. */
static int has(const Page *p, Py_ssize_t i, const char *lit, int fold) {
    for (; *lit; lit++, i++) {
        if (i >= p->n) return 0;
        Py_UCS4 c = at(p, i);
        if ((fold ? lower(c) : c) != (Py_UCS4)(unsigned char)*lit) return 0;
    }
    return 1;
}

/* The first `lit` (which starts with a non-letter) at or after i, or -1. */
static Py_ssize_t find_lit(const Page *p, const char *lit, Py_ssize_t i) {
    for (;; i++) {
        i = find_char(p, (unsigned char)lit[0], i);
        if (i >= p->n) return -1;
        if (has(p, i, lit, 0)) return i;
    }
}

/* Past the first "-->" or "--!>" at or after i, or -1. */
static Py_ssize_t comment_end(const Page *p, Py_ssize_t i) {
    for (;; i++) {
        i = find_char(p, '-', i);
        if (i + 2 >= p->n) return -1;
        if (at(p, i + 1) != '-') continue;
        if (at(p, i + 2) == '>') return i + 3;
        if (at(p, i + 2) == '!' && i + 3 < p->n && at(p, i + 3) == '>') return i + 4;
    }
}

static inline int delimiter(const Page *p, Py_ssize_t i) {
    if (i >= p->n) return 1;
    Py_UCS4 c = at(p, i);
    return space(c) || c == '/' || c == '>';
}

/* The '<' of the end tag closing raw text of the element named at [name_at, +len). */
static Py_ssize_t end_of_text(const Page *p, Py_ssize_t name_at, Py_ssize_t len, Py_ssize_t i) {
    for (;; i++) {
        i = find_char(p, '<', i);
        if (i >= p->n) return p->n;
        if (i + 2 + len <= p->n && at(p, i + 1) == '/' && same_text(p, i + 2, name_at, len, 1) &&
            delimiter(p, i + 2 + len))
            return i;
    }
}

static int script_tag(const Page *p, Py_ssize_t i, int closing) {
    const char *lit = closing ? "</script" : "<script";
    return has(p, i, lit, 1) && delimiter(p, i + (Py_ssize_t)strlen(lit));
}

/* The '<' of the end tag closing a script, through the script data escape states. */
static Py_ssize_t end_of_script(const Page *p, Py_ssize_t i) {
    int state = 0; /* 0: script data, 1: escaped, 2: double escaped */
    Py_ssize_t k = -1; /* the next "-->" at or after i (n: none), found once per "-->" */
    for (;;) {
        Py_ssize_t j = find_char(p, '<', i);
        if (state && k < i) {
            k = find_lit(p, "-->", i);
            k = k < 0 ? p->n : k;
        }
        if (state && k < p->n && (j >= p->n || k < j)) {
            state = 0;
            i = k + 3;
            continue;
        }
        if (j >= p->n) return p->n;
        if (state == 0 && has(p, j, "<!--", 0)) {
            state = 1;
            i = j + 2;
            continue;
        }
        if (script_tag(p, j, 1)) {
            if (state != 2) return j;
            state = 1;
        } else if (script_tag(p, j, 0) && state == 1) {
            state = 2;
        }
        i = j + 1;
    }
}

/* From after a tag's name: past its '>' (-1 if the page ends first); *self_closing, and
 * where its first `encoding` attribute's value is (*enc_at = -1 if it has none). */
static Py_ssize_t tag_end(const Page *p, Py_ssize_t i, int *self_closing, Py_ssize_t *enc_at,
                          Py_ssize_t *enc_len) {
    Py_ssize_t n = p->n;
    *self_closing = 0;
    *enc_at = -1;
    *enc_len = 0;
    while (i < n) {
        Py_UCS4 c = at(p, i);
        if (c == '>') return i + 1;
        if (c == '/') {
            if (i + 1 < n && at(p, i + 1) == '>') {
                *self_closing = 1;
                return i + 2;
            }
            i++;
            continue;
        }
        if (space(c)) {
            i++;
            continue;
        }
        Py_ssize_t start = i;
        for (i++; i < n; i++) { /* an attribute name */
            c = at(p, i);
            if (space(c) || c == '/' || c == '>' || c == '=') break;
        }
        int named = *enc_at < 0 && i - start == 8 && has(p, start, "encoding", 1);
        Py_ssize_t value = i, value_len = 0;
        while (i < n && space(at(p, i))) i++;
        if (i < n && at(p, i) == '=') {
            for (i++; i < n && space(at(p, i)); i++) {
            }
            if (i < n && (at(p, i) == '"' || at(p, i) == '\'')) {
                Py_ssize_t close = find_char(p, at(p, i), i + 1);
                if (close >= n) return -1;
                value = i + 1;
                value_len = close - value;
                i = close + 1;
            } else {
                value = i;
                while (i < n && !space(at(p, i)) && at(p, i) != '>') i++;
                value_len = i - value;
            }
        }
        if (named) {
            *enc_at = value;
            *enc_len = value_len;
        }
    }
    return -1;
}

/* An annotation-xml whose encoding says HTML: an HTML integration point. */
static int html_encoding(const Page *p, Py_ssize_t at_, Py_ssize_t len) {
    return at_ >= 0 && ((len == 9 && has(p, at_, "text/html", 1)) ||
                        (len == 21 && has(p, at_, "application/xhtml+xml", 1)));
}

static Py_ssize_t depth_of(const Page *p, Py_ssize_t limit, El *stack) {
    Tree t = {p, stack, {{0}}, 0, 0, limit, 0, 0, 0, 0};
    Py_ssize_t n = p->n, i = 0, markup_end = 0;
#define TOO_DEEP (t.overflow ? limit + 1 : t.deepest > limit ? limit + 1 : t.deepest)
    for (;;) {
        i = find_char(p, '<', i);
        if (i + 1 >= n || t.deepest > limit || t.overflow) return TOO_DEEP;
        if (i > markup_end && (t.depth == 0 || t.stack[t.depth - 1].children == NS_HTML) &&
            reconstruct(&t))
            continue; /* text: reopen formatting elements */
        Py_UCS4 c = at(p, i + 1);
        if (t.depth > 0 && !t.stack[t.depth - 1].html && has(p, i, "<![CDATA[", 0)) {
            Py_ssize_t k = find_lit(p, "]]>", i + 9);
            if (k < 0) return TOO_DEEP;
            i = markup_end = k + 3;
            continue;
        }
        if (has(p, i, "<!--", 0)) {
            if (has(p, i, "<!-->", 0) || has(p, i, "<!--->", 0)) {
                i = markup_end = i + 5 + (at(p, i + 4) == '-');
                continue;
            }
            Py_ssize_t e = comment_end(p, i + 4);
            if (e < 0) return TOO_DEEP;
            i = markup_end = e;
            continue;
        }
        int closing = c == '/';
        Py_UCS4 first = closing ? (i + 2 < n ? at(p, i + 2) : '/') : c;
        if (closing && first == '>') { /* </> is nothing */
            i = markup_end = i + 3;
            continue;
        }
        if (!((first | 32) >= 'a' && (first | 32) <= 'z')) {
            if (c == '!' || c == '?' || closing) { /* a bogus comment, to the next '>' */
                Py_ssize_t k = find_char(p, '>', i + 2);
                if (k >= n) return TOO_DEEP;
                i = markup_end = k + 1;
            } else {
                i++; /* a '<' that is text */
            }
            continue;
        }
        Py_ssize_t name_at = i + 1 + closing, j = name_at;
        Packed k = {0, 0};
        int ascii = 1;
        for (; j < n; j++) {
            Py_UCS4 ch = at(p, j);
            if (space(ch) || ch == '/' || ch == '>') break;
            ch = lower(ch);
            if (ch == 0 || ch > 127 || j - name_at >= 16) ascii = 0;
            else if (j - name_at < 8) k.lo |= (uint64_t)ch << (8 * (j - name_at));
            else k.hi |= (uint64_t)ch << (8 * (j - name_at - 8));
        }
        Py_ssize_t len = j - name_at;
        uint16_t id = 0;
        uint32_t flags = 0;
        if (ascii) name_lookup(k, &id, &flags);
        int self_closing;
        Py_ssize_t enc_at, enc_len;
        Py_ssize_t end = tag_end(p, j, &self_closing, &enc_at, &enc_len);
        if (end < 0) return TOO_DEEP; /* the page ends inside the tag: no tag */
        i = markup_end = end;
        El *top = t.depth ? &t.stack[t.depth - 1] : NULL;
        int ns = top ? top->children : NS_HTML;
        if (ns != NS_HTML && (closing ? (id && (id == ID_P || id == ID_BR)) : (flags & F_BREAKOUT))) {
            while (t.depth > 0 && t.stack[t.depth - 1].children != NS_HTML)
                pop_to(&t, t.depth - 1);
            top = t.depth ? &t.stack[t.depth - 1] : NULL;
            ns = NS_HTML;
        }
        if (closing) {
            end_tag(&t, name_at, len, id, flags);
            continue;
        }
        if (ns == NS_HTML && top && top->math_text && (flags & F_MATH_IN_TEXT)) ns = NS_MATH;
        if (ns == NS_HTML && id && (id == ID_SVG || id == ID_MATH)) {
            if (!self_closing && (reconstruct(&t) ||
                                  push(&t, element(name_at, len, id, flags,
                                                   id == ID_SVG ? NS_SVG : NS_MATH))))
                return TOO_DEEP;
        } else if (ns != NS_HTML) {
            El e = element(name_at, len, id, flags, ns);
            if (ns == NS_MATH && id && id == ID_ANNOTATION_XML && html_encoding(p, enc_at, enc_len))
                e.children = NS_HTML; /* an HTML integration point */
            if (!self_closing && push(&t, e)) return TOO_DEEP;
        } else if (!(flags & F_NO_PUSH)) {
            if (flags & F_TABLE_PART) {
                int r = table_part(&t, id);
                if (r < 0) return TOO_DEEP;
                if (r == 0) continue;
            }
            if (id && id == ID_SELECT && close_el(&t, ID_SELECT, ID_SELECT, 0, STOP_SCOPE))
                continue; /* a <select> in a select ends it, and is not inserted */
            start_closes(&t, id, flags);
            if (!(flags & F_NO_RECONSTRUCT) && reconstruct(&t)) return TOO_DEEP;
            if (flags & F_VOID) continue;
            El e = element(name_at, len, id, flags, NS_HTML);
            Py_ssize_t a0 = j, a1 = end - 1; /* the attributes, trimmed of space and '/' */
            while (a0 < a1 && (space(at(p, a0)) || at(p, a0) == '/')) a0++;
            while (a1 > a0 && (space(at(p, a1 - 1)) || at(p, a1 - 1) == '/')) a1--;
            e.attrs_at = a0;
            e.attrs_len = a1 - a0;
            if (push(&t, e)) return TOO_DEEP;
            if (flags & F_FORMATTING) add_formatting(&t, &t.stack[t.depth - 1]);
            if (id && id == ID_PLAINTEXT) return TOO_DEEP;
            if (id && id == ID_SCRIPT) i = markup_end = end_of_script(p, i);
            else if (flags & F_RAW) i = markup_end = end_of_text(p, name_at, len, i);
        }
    }
#undef TOO_DEEP
}

static int check_limit(Py_ssize_t limit) {
    if (limit < 0 || limit > MAX_LIMIT) {
        PyErr_Format(PyExc_ValueError, "limit must be in [0, %zd]", MAX_LIMIT);
        return -1;
    }
    return 0;
}

static Py_ssize_t run(PyObject *html, Py_ssize_t limit) {
    Page p = {PyUnicode_DATA(html), PyUnicode_KIND(html), PyUnicode_GET_LENGTH(html)};
    El *stack = PyMem_Calloc((size_t)limit + 2, sizeof(El)); /* + implied parents */
    if (stack == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t d = depth_of(&p, limit, stack);
    PyMem_Free(stack);
    return d;
}

PyObject *nesting_depth(PyObject *self, PyObject *args) {
    PyObject *html;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "Un", &html, &limit) || check_limit(limit)) return NULL;
    Py_ssize_t d = run(html, limit);
    return d < 0 ? NULL : PyLong_FromSsize_t(d);
}

/* How many '<' in the string, counting no further than `enough` (a chunk at a time, in a
 * loop the compiler vectorizes). */
#define COUNT_CHUNK 4096
#define COUNT_LT(TYPE)                                                                        \
    {                                                                                         \
        const TYPE *d = p.d;                                                                  \
        for (Py_ssize_t i = 0; i < p.n && count < enough; i += COUNT_CHUNK) {                 \
            Py_ssize_t end = p.n - i < COUNT_CHUNK ? p.n : i + COUNT_CHUNK;                   \
            Py_ssize_t c = 0;                                                                 \
            for (Py_ssize_t j = i; j < end; j++) c += d[j] == '<';                            \
            count += c;                                                                       \
        }                                                                                     \
    }

static Py_ssize_t count_lt(PyObject *html, Py_ssize_t enough) {
    Page p = {PyUnicode_DATA(html), PyUnicode_KIND(html), PyUnicode_GET_LENGTH(html)};
    Py_ssize_t count = 0;
    if (p.kind == PyUnicode_1BYTE_KIND) COUNT_LT(Py_UCS1)
    else if (p.kind == PyUnicode_2BYTE_KIND) COUNT_LT(Py_UCS2)
    else COUNT_LT(Py_UCS4)
    return count;
}

PyObject *too_deep(PyObject *self, PyObject *args) {
    PyObject *html;
    Py_ssize_t min_tags, limit;
    if (!PyArg_ParseTuple(args, "Unn", &html, &min_tags, &limit) || check_limit(limit))
        return NULL;
    if (count_lt(html, min_tags) < min_tags) Py_RETURN_FALSE;
    Py_ssize_t d = run(html, limit);
    if (d < 0) return NULL;
    return PyBool_FromLong(d > limit);
}
