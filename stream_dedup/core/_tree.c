/* The nesting model's state (see _nesting.c): lexbor's stack of open elements and its list
 * of active formatting elements, and what a start or end tag does to them, as nesting.py
 * models it. The stack holds at most the limit + 1 elements; an end tag looks at most
 * SEARCH elements down. */
#include "_nesting.h"

#include <string.h>

#define ARK 3 /* Noah's ark: the same formatting element at most so many times after a marker */

static int same_name(const Page *p, const El *e, Py_ssize_t at_, Py_ssize_t len, uint16_t id) {
    if (e->id || id) return e->id == id;
    return e->len == len && same_text(p, e->at, at_, len, 1);
}

static int is_html(const El *e, uint16_t id) { return e->html && e->id == id && id != 0; }

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
int push(Tree *t, El e) {
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

void pop_to(Tree *t, Py_ssize_t depth) {
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
int reconstruct(Tree *t) {
    Py_ssize_t k = t->nactive;
    while (k > 0 && t->active[k - 1].serial != 0 && !t->active[k - 1].open) k--;
    for (; k < t->nactive; k++) {
        if (push(t, t->active[k])) return 1;
        t->active[k] = t->stack[t->depth - 1];
    }
    return 0;
}

void add_formatting(Tree *t, const El *e) {
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
uint64_t close_el(Tree *t, uint16_t a, uint16_t b, uint32_t any_of, int stop) {
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

void end_tag(Tree *t, Py_ssize_t at_, Py_ssize_t len, uint16_t id, uint32_t flags) {
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

void start_closes(Tree *t, uint16_t id, uint32_t flags) {
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

/* Before a table part: push what lexbor implies. 0 if lexbor ignores the tag; -1 too deep. */
int table_part(Tree *t, uint16_t id) {
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
