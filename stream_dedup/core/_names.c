/* The nesting model's known names (see _nesting.c): each tag name the model treats apart, its
 * id and its flags, in an exact hash table of packed names built once at import. */
#include "_nesting.h"

#include <string.h>

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

NameSlot name_slots[NAME_SLOTS];
static uint16_t name_count;
static uint32_t id_flags[NAME_SLOTS / 2]; /* the flags of each id (ids stay below half) */

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
    return name_slots[s].id;
}

uint16_t ID_P, ID_LI, ID_DD, ID_DT, ID_OPTION, ID_OPTGROUP, ID_BUTTON, ID_A, ID_NOBR,
    ID_INPUT, ID_SELECT, ID_FORM, ID_BR, ID_HTML, ID_HEAD, ID_BODY, ID_TABLE, ID_TEMPLATE,
    ID_TR, ID_TD, ID_TH, ID_TBODY, ID_THEAD, ID_TFOOT, ID_COLGROUP, ID_COL, ID_SCRIPT, ID_PLAINTEXT, ID_SVG,
    ID_MATH, ID_ANNOTATION_XML, ID_OL, ID_UL, ID_ADDRESS, ID_DIV, ID_FRAMESET;

uint32_t flags_of(uint16_t id) { return id_flags[id]; }

int nesting_init(void) {
    memset(name_slots, 0, sizeof name_slots);
    name_count = 0;
    for (size_t g = 0; g < sizeof NAME_SETS / sizeof NAME_SETS[0]; g++) {
        const char *p = NAME_SETS[g].names;
        while (*p) {
            while (*p == ' ') p++;
            size_t len = strcspn(p, " ");
            Packed k;
            if (len && pack_ascii(p, len, &k)) {
                size_t s = find_slot(k);
                if (name_slots[s].id == 0) {
                    if (name_count + 1 >= NAME_SLOTS / 2) return -1;
                    name_slots[s].key = k;
                    name_slots[s].id = ++name_count;
                }
                name_slots[s].flags |= NAME_SETS[g].flag;
            }
            p += len;
        }
    }
    for (size_t s = 0; s < NAME_SLOTS; s++) id_flags[name_slots[s].id] = name_slots[s].flags;
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
