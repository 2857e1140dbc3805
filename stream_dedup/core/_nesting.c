/* The nesting model of nesting.py in C (that module documents it; tests/test_nesting.py
 * compares the two): how deep a page can make lexbor's stack of open elements, which bounds
 * lexbor's parse time.
 *
 *   nesting_depth(html, limit)        the deepest stack the model reaches, or limit + 1
 *   too_deep(html, min_tags, limit)   at least min_tags '<' and nesting_depth > limit
 *
 * Every size is bounded: the stack holds at most limit + 1 elements (the scan stops there),
 * the list of active formatting elements at most ACTIVE_MAX (more is reported as too deep),
 * and an end tag looks at most SEARCH elements down. */
#include "_nesting.h"

#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SEARCH 64
#define ACTIVE_MAX 512
#define ARK 3
#define MAX_LIMIT ((Py_ssize_t)1 << 20)

enum { NS_HTML, NS_SVG, NS_MATH };

/* --- known names: what the model needs to know about a tag name -------------------------- */
enum {
    F_VOID = 1 << 0, F_NO_PUSH = 1 << 1, F_SPECIAL = 1 << 2, F_SCOPE = 1 << 3,
    F_SCOPED_END = 1 << 4, F_TABLE_PART = 1 << 5, F_SECTION = 1 << 6, F_TABLE_CONTEXT = 1 << 7,
    F_RAW = 1 << 8, F_HEADING = 1 << 9, F_P_CLOSER = 1 << 10, F_BREAKOUT = 1 << 11,
    F_FORMATTING = 1 << 12, F_MARKER = 1 << 13, F_SVG_IP = 1 << 14, F_MATH_IP = 1 << 15,
    F_MATH_SPECIAL = 1 << 16, F_MATH_IN_TEXT = 1 << 17, F_NO_RECONSTRUCT = 1 << 18,
};

/* The same lists as nesting.py. */
static const struct {
    uint32_t flag;
    const char *names;
} NAME_SETS[] = {
    {F_VOID, "area base basefont bgsound br col embed frame hr image img input keygen link meta "
             "param source track wbr"},
    {F_NO_PUSH, "html head body"},
    {F_SPECIAL,
     "address applet area article aside base basefont bgsound blockquote body br button caption "
     "center col colgroup dd details dir div dl dt embed fieldset figcaption figure "
     "footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html iframe img input "
     "keygen li link listing main marquee menu meta nav noembed noframes noscript object ol p "
     "param plaintext pre script search section select source style summary table tbody td "
     "template textarea tfoot th thead title tr track ul wbr xmp"},
    {F_SCOPE, "applet caption html table td th marquee object template select"},
    {F_SCOPED_END,
     "address article aside blockquote button center details dialog dir div dl fieldset "
     "figcaption figure footer header hgroup listing main menu nav ol pre search section summary "
     "ul form p li dd dt h1 h2 h3 h4 h5 h6 applet marquee object template select table caption "
     "colgroup tbody tfoot thead tr td th"},
    {F_TABLE_PART, "caption col colgroup tbody tfoot thead tr td th"},
    {F_SECTION, "tbody thead tfoot"},
    {F_TABLE_CONTEXT, "table tbody thead tfoot tr td th caption colgroup template"},
    {F_RAW, "style xmp iframe noembed noframes noscript textarea title"},
    {F_HEADING, "h1 h2 h3 h4 h5 h6"},
    {F_P_CLOSER,
     "address article aside blockquote center details dialog dir div dl fieldset figcaption "
     "figure footer header hgroup main menu nav ol p search section summary ul pre listing form "
     "plaintext xmp hr h1 h2 h3 h4 h5 h6 li dd dt"},
    {F_BREAKOUT,
     "b big blockquote body br center code dd div dl dt em embed h1 h2 h3 h4 h5 h6 head hr i "
     "img li listing menu meta nobr ol p pre ruby s small span strong strike sub table tt u ul "
     "var"},
    {F_FORMATTING, "a b big code em font i nobr s small strike strong tt u"},
    {F_MARKER, "applet object marquee template td th caption"},
    {F_SVG_IP, "foreignobject desc title"},
    {F_MATH_IP, "mi mo mn ms mtext"},
    {F_MATH_SPECIAL, "mi mo mn ms mtext annotation-xml"},
    {F_MATH_IN_TEXT, "mglyph malignmark"},
    {F_NO_RECONSTRUCT,
     "address article aside blockquote center details dialog dir div dl fieldset figcaption "
     "figure footer header hgroup main menu nav ol p search section summary ul pre listing form "
     "plaintext hr h1 h2 h3 h4 h5 h6 li dd dt table caption col colgroup tbody tfoot thead tr td "
     "th rb rtc rp rt base basefont bgsound link meta noframes script style template title "
     "frameset"},
    {0, "svg math annotation-xml option optgroup button a nobr select table template colgroup "
        "script plaintext ol ul address div frameset"},
};

/* Names of up to 16 ASCII characters, packed lower-cased into two words (exact, no hash). */
typedef struct {
    uint64_t lo, hi;
} Packed;

#define NAME_SLOTS 512
static struct {
    Packed key;
    uint32_t flags;
    uint16_t id; /* 0: free slot */
} names[NAME_SLOTS];
static uint16_t name_count;
static uint32_t id_flags[NAME_SLOTS / 2]; /* the flags of each id (ids stay below half) */

static size_t slot_of(Packed k) {
    uint64_t h = (k.lo ^ (k.hi * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
    return (size_t)(h >> 32) % NAME_SLOTS;
}

/* The slot of `k`, or of the free slot where it would go. */
static size_t find_slot(Packed k) {
    size_t s = slot_of(k);
    while (names[s].id != 0 && (names[s].key.lo != k.lo || names[s].key.hi != k.hi))
        s = (s + 1) % NAME_SLOTS;
    return s;
}

static int pack_ascii(const char *s, size_t len, Packed *out) {
    if (len == 0 || len > 16) return 0;
    Packed k = {0, 0};
    for (size_t i = 0; i < len; i++) {
        uint64_t c = (unsigned char)s[i];
        if (i < 8) k.lo |= c << (8 * i);
        else k.hi |= c << (8 * (i - 8));
    }
    *out = k;
    return 1;
}

static uint16_t id_of(const char *name) {
    Packed k;
    if (!pack_ascii(name, strlen(name), &k)) return 0;
    size_t s = find_slot(k);
    return names[s].id;
}

static uint16_t ID_P, ID_LI, ID_DD, ID_DT, ID_OPTION, ID_OPTGROUP, ID_BUTTON, ID_A, ID_NOBR,
    ID_INPUT, ID_SELECT, ID_FORM, ID_BR, ID_HTML, ID_HEAD, ID_BODY, ID_TABLE, ID_TEMPLATE,
    ID_TR, ID_TD, ID_TH, ID_TBODY, ID_THEAD, ID_TFOOT, ID_COLGROUP, ID_COL, ID_SCRIPT, ID_PLAINTEXT, ID_SVG,
    ID_MATH, ID_ANNOTATION_XML, ID_OL, ID_UL, ID_ADDRESS, ID_DIV, ID_FRAMESET;

int nesting_init(void) {
    memset(names, 0, sizeof names);
    name_count = 0;
    for (size_t g = 0; g < sizeof NAME_SETS / sizeof NAME_SETS[0]; g++) {
        const char *p = NAME_SETS[g].names;
        while (*p) {
            while (*p == ' ') p++;
            size_t len = strcspn(p, " ");
            Packed k;
            if (len && pack_ascii(p, len, &k)) {
                size_t s = find_slot(k);
                if (names[s].id == 0) {
                    if (name_count + 1 >= NAME_SLOTS / 2) return -1;
                    names[s].key = k;
                    names[s].id = ++name_count;
                }
                names[s].flags |= NAME_SETS[g].flag;
            }
            p += len;
        }
    }
    for (size_t s = 0; s < NAME_SLOTS; s++) id_flags[names[s].id] = names[s].flags;
    id_flags[0] = 0;
#define ID(VAR, NAME) VAR = id_of(NAME);
    ID(ID_P, "p") ID(ID_LI, "li") ID(ID_DD, "dd") ID(ID_DT, "dt") ID(ID_OPTION, "option")
    ID(ID_OPTGROUP, "optgroup") ID(ID_BUTTON, "button") ID(ID_A, "a") ID(ID_NOBR, "nobr")
    ID(ID_INPUT, "input") ID(ID_SELECT, "select") ID(ID_FORM, "form") ID(ID_BR, "br")
    ID(ID_HTML, "html") ID(ID_HEAD, "head") ID(ID_BODY, "body") ID(ID_TABLE, "table")
    ID(ID_TEMPLATE, "template") ID(ID_TR, "tr") ID(ID_TD, "td") ID(ID_TH, "th")
    ID(ID_TBODY, "tbody") ID(ID_THEAD, "thead") ID(ID_TFOOT, "tfoot") ID(ID_COLGROUP, "colgroup") ID(ID_COL, "col")
    ID(ID_SCRIPT, "script") ID(ID_PLAINTEXT, "plaintext") ID(ID_SVG, "svg") ID(ID_MATH, "math")
    ID(ID_ANNOTATION_XML, "annotation-xml") ID(ID_OL, "ol") ID(ID_UL, "ul")
    ID(ID_ADDRESS, "address") ID(ID_DIV, "div") ID(ID_FRAMESET, "frameset")
#undef ID
    return 0;
}

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

/* --- the model's state ----------------------------------------------------------------------- */
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

static int same_text(const Page *p, Py_ssize_t a, Py_ssize_t b, Py_ssize_t len, int fold) {
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

static int same_name(const Page *p, const El *e, Py_ssize_t at_, Py_ssize_t len, uint16_t id) {
    if (e->id || id) return e->id == id;
    return e->len == len && same_text(p, e->at, at_, len, 1);
}

static int is_html(const El *e, uint16_t id) { return e->html && e->id == id && id != 0; }

static El element(Py_ssize_t at_, Py_ssize_t len, uint16_t id, uint32_t flags, int ns) {
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

static Py_ssize_t after_marker(const Tree *t) {
    Py_ssize_t k = t->nactive;
    while (k > 0 && t->active[k - 1].serial != 0) k--;
    return k;
}

static void remove_active(Tree *t, Py_ssize_t k) {
    memmove(t->active + k, t->active + k + 1, (size_t)(t->nactive - k - 1) * sizeof(El));
    t->nactive--;
}

static int add_active(Tree *t, El e) {
    if (t->nactive == ACTIVE_MAX) {
        t->overflow = 1;
        return -1;
    }
    t->active[t->nactive++] = e;
    return 0;
}

/* 1 when the stack is now deeper than the limit (or the active list overflowed). */
static int push(Tree *t, El e) {
    e.serial = ++t->serials;
    e.open = 1;
    t->stack[t->depth++] = e;
    if (e.html && (e.flags & F_MARKER)) {
        El marker = {0};
        if (add_active(t, marker)) return 1;
    }
    t->tables += is_html(&e, ID_TABLE) || is_html(&e, ID_TEMPLATE);
    if (t->depth > t->deepest) t->deepest = t->depth;
    return t->deepest > t->limit;
}

static void pop_to(Tree *t, Py_ssize_t depth) {
    while (t->depth > depth) {
        El *e = &t->stack[--t->depth];
        if (e->html && (e->flags & F_FORMATTING)) {
            for (Py_ssize_t k = t->nactive - 1; k >= 0; k--) {
                if (t->active[k].serial == e->serial) {
                    t->active[k].open = 0;
                    break;
                }
            }
        }
        if (e->html && (e->flags & F_MARKER)) { /* clear the list to the last marker */
            while (t->nactive > 0 && t->active[--t->nactive].serial != 0) {
            }
        }
        t->tables -= is_html(e, ID_TABLE) || is_html(e, ID_TEMPLATE);
    }
}

/* Reopen the closed formatting elements at the end of the list (lexbor's rule). */
static int reconstruct(Tree *t) {
    Py_ssize_t k = t->nactive;
    while (k > 0 && t->active[k - 1].serial != 0 && !t->active[k - 1].open) k--;
    for (; k < t->nactive; k++) {
        if (push(t, t->active[k])) return 1;
        t->active[k] = t->stack[t->depth - 1];
    }
    return 0;
}

static void add_formatting(Tree *t, const El *e) {
    Py_ssize_t start = after_marker(t), same = 0, first = -1;
    for (Py_ssize_t k = start; k < t->nactive; k++) {
        const El *a = &t->active[k];
        if (a->id == e->id && a->attrs_len == e->attrs_len &&
            same_text(t->p, a->attrs_at, e->attrs_at, e->attrs_len, 0)) {
            if (first < 0) first = k;
            same++;
        }
    }
    if (same >= ARK) remove_active(t, first);
    add_active(t, *e);
}

static Py_ssize_t find_active(const Tree *t, uint16_t id) {
    for (Py_ssize_t k = t->nactive - 1; k >= after_marker(t); k--)
        if (t->active[k].id == id) return k;
    return -1;
}

enum { STOP_SPECIAL, STOP_SCOPE, STOP_BUTTON, STOP_LIST, STOP_TABLE, STOP_ITEM, STOP_NEVER };

static int stops(const El *e, int stop) {
    switch (stop) {
    case STOP_SPECIAL:
        return e->special;
    case STOP_SCOPE:
        return e->scope;
    case STOP_BUTTON:
        return e->scope || is_html(e, ID_BUTTON);
    case STOP_LIST:
        return e->scope || is_html(e, ID_OL) || is_html(e, ID_UL);
    case STOP_TABLE:
        return is_html(e, ID_HTML) || is_html(e, ID_TABLE) || is_html(e, ID_TEMPLATE);
    case STOP_ITEM:
        return e->special && !(is_html(e, ID_ADDRESS) || is_html(e, ID_DIV) || is_html(e, ID_P));
    default: /* STOP_NEVER */
        return 0;
    }
}

/* Pop through the nearest open HTML element with id a or b (or any heading, for
 * F_HEADING) within SEARCH; its serial, or 0 if none or a `stop` element came first. */
static uint64_t close_el(Tree *t, uint16_t a, uint16_t b, uint32_t any_of, int stop) {
    Py_ssize_t low = t->depth - SEARCH > 0 ? t->depth - SEARCH : 0;
    for (Py_ssize_t d = t->depth - 1; d >= low; d--) {
        El *e = &t->stack[d];
        if (e->html && ((e->id != 0 && (e->id == a || e->id == b)) || (e->flags & any_of))) {
            uint64_t serial = e->serial;
            pop_to(t, d);
            return serial;
        }
        if (stops(e, stop)) return 0;
    }
    return 0;
}

static void end_tag(Tree *t, Py_ssize_t at_, Py_ssize_t len, uint16_t id, uint32_t flags) {
    if (id && (id == ID_HTML || id == ID_HEAD || id == ID_BODY || id == ID_BR || id == ID_FRAMESET))
        return; /* lexbor may have ignored the <frameset>: its end tag pops nothing */
    if (flags & F_FORMATTING) {
        Py_ssize_t k = find_active(t, id);
        if (k >= 0 && !t->active[k].open) {
            remove_active(t, k); /* closed already: forgotten */
            return;
        }
    }
    Py_ssize_t low = t->depth - SEARCH > 0 ? t->depth - SEARCH : 0;
    if (id && id == ID_FORM) { /* lexbor removes the form alone */
        for (Py_ssize_t d = t->depth - 1; d >= low; d--) {
            El *e = &t->stack[d];
            if (is_html(e, ID_FORM)) {
                t->depth--;
                memmove(e, e + 1, (size_t)(t->depth - d) * sizeof(El));
                return;
            }
            if (e->scope) return;
        }
        return;
    }
    for (Py_ssize_t d = t->depth - 1; d >= low; d--) { /* in svg/math: the foreign element */
        El *e = &t->stack[d];
        if (e->html) break;
        if (same_name(t->p, e, at_, len, id)) {
            pop_to(t, d);
            return;
        }
    }
    if (!id) { /* an unknown name: "any other end tag" matches it by name */
        for (Py_ssize_t d = t->depth - 1; d >= low; d--) {
            El *e = &t->stack[d];
            if (e->html && same_name(t->p, e, at_, len, 0)) {
                pop_to(t, d);
                return;
            }
            if (e->special) return;
        }
        return;
    }
    int stop = id == ID_TEMPLATE         ? STOP_NEVER /* pops through whatever is above */
               : !(flags & F_SCOPED_END) ? STOP_SPECIAL
               : id == ID_P            ? STOP_BUTTON
               : id == ID_LI           ? STOP_LIST
                                       : STOP_SCOPE;
    uint64_t closed = close_el(t, id, id, flags & F_HEADING, stop);
    if (closed && (flags & F_FORMATTING)) {
        for (Py_ssize_t k = t->nactive - 1; k >= 0; k--) {
            if (t->active[k].serial == closed) {
                remove_active(t, k);
                break;
            }
        }
    }
}

static void pop_top_if(Tree *t, uint16_t id) {
    if (t->depth > 0 && is_html(&t->stack[t->depth - 1], id)) pop_to(t, t->depth - 1);
}

static void start_closes(Tree *t, uint16_t id, uint32_t flags) {
    if (!id) return;
    if (id == ID_LI) close_el(t, ID_LI, ID_LI, 0, STOP_ITEM);
    if (id == ID_DD || id == ID_DT) close_el(t, ID_DD, ID_DT, 0, STOP_ITEM);
    if (flags & F_P_CLOSER) {
        close_el(t, ID_P, ID_P, 0, STOP_BUTTON);
        if ((flags & F_HEADING) && t->depth > 0) {
            El *top = &t->stack[t->depth - 1];
            if (top->html && (top->flags & F_HEADING)) pop_to(t, t->depth - 1);
        }
    } else if (id == ID_OPTION || id == ID_OPTGROUP) {
        pop_top_if(t, ID_OPTION);
    } else if (id == ID_BUTTON) {
        close_el(t, ID_BUTTON, ID_BUTTON, 0, STOP_SCOPE);
    } else if (id == ID_INPUT) {
        close_el(t, ID_SELECT, ID_SELECT, 0, STOP_SCOPE);
    } else if (id == ID_A || id == ID_NOBR) {
        if (find_active(t, id) >= 0) end_tag(t, 0, 0, id, flags);
    } else if (flags & F_TABLE_PART) {
        if (id == ID_TD || id == ID_TH || id == ID_TR || (flags & F_SECTION))
            close_el(t, ID_TD, ID_TH, 0, STOP_TABLE);
        if (id == ID_TR) {
            pop_top_if(t, ID_TR);
        } else if (flags & F_SECTION) {
            pop_top_if(t, ID_TR);
            for (int k = 0; k < 3; k++) { /* tbody, thead, tfoot, in that order */
                if (t->depth > 0) {
                    El *top = &t->stack[t->depth - 1];
                    if (top->html && (top->flags & F_SECTION) &&
                        top->id == (k == 0 ? ID_TBODY : k == 1 ? ID_THEAD : ID_TFOOT))
                        pop_to(t, t->depth - 1);
                }
            }
        }
    }
}

static uint32_t flags_of(uint16_t id) { return id_flags[id]; }

/* Before a table part: push what lexbor implies. 0 if lexbor ignores the tag; -1 too deep. */
static int table_part(Tree *t, uint16_t id) {
    if (!t->tables) return 0;
    uint16_t ctx = 0;
    Py_ssize_t low = t->depth - SEARCH > 0 ? t->depth - SEARCH : 0;
    for (Py_ssize_t d = t->depth - 1; d >= low; d--) {
        const El *e = &t->stack[d];
        if (is_html(e, ID_COLGROUP) && id != ID_COL) continue; /* closed by lexbor (below) */
        if (e->html && (e->flags & F_TABLE_CONTEXT)) {
            ctx = e->id;
            if (ctx == ID_TABLE || ctx == ID_TR || (e->flags & F_SECTION))
                pop_to(t, d + 1); /* lexbor clears the stack back to it */
            break;
        }
    }
    int cell = id == ID_TD || id == ID_TH;
    if (ctx && ctx == ID_TABLE && (cell || id == ID_TR)) {
        if (push(t, element(0, 0, ID_TBODY, flags_of(ID_TBODY), NS_HTML))) return -1;
        ctx = ID_TBODY;
    }
    if (ctx && (flags_of(ctx) & F_SECTION) && cell)
        if (push(t, element(0, 0, ID_TR, flags_of(ID_TR), NS_HTML))) return -1;
    if (ctx && ctx == ID_TABLE && id == ID_COL)
        if (push(t, element(0, 0, ID_COLGROUP, flags_of(ID_COLGROUP), NS_HTML))) return -1;
    return 1;
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
        if (ascii) {
            size_t s = find_slot(k);
            id = names[s].id;
            flags = names[s].flags;
        }
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
