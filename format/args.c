// format/args.c — the command line of every command, read by one parser from one table per
// command (moet_flag), so every command treats its flags alike and a new command gets the same
// rules by declaring its table:
// - a flag that takes a value takes the next argument, whatever it is; missing (the flag ends
//   the line), empty, malformed or out of its range, it is refused with one line on stderr that
//   names the command, the flag, the value and what was expected, and exit status 2;
// - a flag given twice is refused (which one was meant?);
// - numbers are read exactly from their text: decimal digits with an optional minus sign, no
//   spaces, no '+', no rounding; lists are integers separated by commas, an empty item refused;
// - paths: one that is read must exist and be of its kind (a regular file, a directory), one
//   that is written must be writable there (format/outfile.c: a new path or a regular file, in an
//   existing directory, never a special file or a symbolic link); a refused path is one line
//   naming the flag, and exit status 1, before the command does any work;
// - -h / --help prints the command's usage on stdout (format/stdout.c) and exits 0.
// The same number and list readers serve the files and JSON the commands read where a flag's
// rules apply (run --ids-file); JSON numbers are read exactly by format/json.c (js_whole, js_u64).

// ---- numbers and lists from text ------------------------------------------------------------

// An unsigned integer written as decimal digits only: 0 with *out; -1 when the text is not such
// an integer; -2 when it is one beyond 2^64 - 1.
static int moet_text_u64(const char *s, size_t n, uint64_t *out) {
    if (!n) return -1;
    uint64_t v = 0;
    int big = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) big = 1;
        else v = v * 10 + d;
    }
    if (big) return -2;
    *out = v;
    return 0;
}

// The same with an optional '-': -2 when the integer is beyond int64.
static int moet_text_i64(const char *s, size_t n, int64_t *out) {
    int neg = n && s[0] == '-';
    uint64_t v;
    int rc = moet_text_u64(s + neg, n - (size_t)neg, &v);
    if (rc) return rc;
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return -2;
    *out = !neg ? (int64_t)v : v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    return 0;
}

static int moet_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// A list of integers in [lo, hi] from s[0..n): items separated by a comma (with spaces around it
// or not) or by whitespace alone; an empty item — two commas in a row, a comma first or last —
// is refused. Returns the count (at most cap, into out), or -1 with why[whycap] saying which item
// is wrong and how ("item 2 is empty", "item 3 'x' is not an integer", "item 1 '7000' is outside
// 1..1024", "more than 16 items").
static int moet_list_parse(const char *s, size_t n, int64_t lo, int64_t hi, int32_t *out, int cap, char *why, size_t whycap) {
    int count = 0;
    size_t i = 0;
    while (i < n && moet_space(s[i])) i++;
    if (i == n) {
        snprintf(why, whycap, "no items");
        return -1;
    }
    for (int item = 1;; item++) {
        size_t a = i;
        while (i < n && !moet_space(s[i]) && s[i] != ',') i++;
        if (i == a) {
            snprintf(why, whycap, "item %d is empty", item);
            return -1;
        }
        int64_t v;
        int rc = moet_text_i64(s + a, i - a, &v);
        if (rc == -1) {
            snprintf(why, whycap, "item %d '%.*s' is not an integer", item, (int)(i - a < 40 ? i - a : 40), s + a);
            return -1;
        }
        if (rc == -2 || v < lo || v > hi) {
            snprintf(why, whycap, "item %d '%.*s' is outside %" PRId64 "..%" PRId64, item, (int)(i - a < 40 ? i - a : 40), s + a, lo, hi);
            return -1;
        }
        if (count == cap) {
            snprintf(why, whycap, "more than %d items", cap);
            return -1;
        }
        out[count++] = (int32_t)v;
        while (i < n && moet_space(s[i])) i++;
        if (i == n) return count;
        if (s[i] == ',') {   // a separator: an item must follow
            i++;
            while (i < n && moet_space(s[i])) i++;
            if (i == n) {
                snprintf(why, whycap, "item %d is empty (a comma ends the list)", item + 1);
                return -1;
            }
        }
    }
}

// ---- the flag tables ------------------------------------------------------------------------

enum {
    ARG_SWITCH,     // no value: the int at `at` is set to 1
    ARG_INT,        // int in [lo, hi]
    ARG_I64,        // int64_t in [lo, hi]
    ARG_U64,        // uint64_t, 0 .. 2^64 - 1
    ARG_NUM,        // double in [dlo, dhi]
    ARG_STR,        // const char *, non-empty, at most hi bytes when hi > 0
    ARG_CHOICE,     // const char *, one of `choices` ("auto|gpu|cpu")
    ARG_LIST,       // moet_list: integers in [lo, hi], comma separated, at most MOET_ARG_LIST_MAX
    ARG_IN_FILE,    // const char *: a regular file that is read
    ARG_IN_DIR,     // const char *: a directory that is read
    ARG_IN_ANY,     // const char *: a regular file or a directory that is read
    ARG_OUT_FILE,   // const char *: a file the command writes (format/outfile.c)
    ARG_OUT_DIR,    // const char *: a directory the command writes (format/outfile.c)
};

#define MOET_ARG_LIST_MAX 16
#define MOET_ARG_MAX_FLAGS 64

typedef struct {
    int n;
    int32_t v[MOET_ARG_LIST_MAX];
} moet_list;

typedef struct {
    const char *name;       // "--threads"; NULL: the positional argument, named by meta
    const char *alias;      // a second spelling ("-q"), or NULL
    int kind;               // ARG_*
    size_t at;              // offsetof(the command's options, the field the value goes to)
    int64_t lo, hi;         // ARG_INT, ARG_I64, ARG_LIST: the range; ARG_STR: the longest value (0: any)
    double dlo, dhi;        // ARG_NUM: the range
    const char *choices;    // ARG_CHOICE: the accepted values, '|' separated
    const char *meta;       // what the value is, for messages: "N", "FILE", "DIR", ...
    size_t given;           // when not 0: offsetof(an int set to 1 when the flag is given) + 1
} moet_flag;

#define MOET_ARGS_HELP (-1)   // moet_args: -h/--help was given (the usage is on stdout)

static const char *moet_kind_value(int kind) {
    switch (kind) {
    case ARG_INT: case ARG_I64: return "an integer";
    case ARG_U64: return "an unsigned integer";
    case ARG_NUM: return "a number";
    case ARG_LIST: return "integers, comma separated";
    case ARG_IN_FILE: case ARG_OUT_FILE: return "a file";
    case ARG_IN_DIR: case ARG_OUT_DIR: return "a directory";
    case ARG_IN_ANY: return "a file or a directory";
    default: return "a value";
    }
}

static const char *moet_flag_name(const moet_flag *f) { return f->name ? f->name : f->meta; }

// One line on stderr: "moet CMD: FLAG VALUE: what is wrong" (the value quoted when empty).
static int moet_arg_fail(const char *cmd, const moet_flag *f, const char *v, int rc, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int moet_arg_fail(const char *cmd, const moet_flag *f, const char *v, int rc, const char *fmt, ...) {
    char what[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (v) fprintf(stderr, "moet %s: %s %.*s%s: %s\n", cmd, moet_flag_name(f), 512, *v ? v : "''", strlen(v) > 512 ? "..." : "", what);
    else fprintf(stderr, "moet %s: %s: %s\n", cmd, moet_flag_name(f), what);
    return rc;
}

// One value into its field. 0, or 2 after a message. (noinline: inlined into a command with
// its table known, the compiler checks each kind's store against that command's options and
// warns about kinds the table never uses.)
__attribute__((noinline)) static int moet_arg_value(const char *cmd, const moet_flag *f, const char *v, void *opts) {
    char *dst = (char *)opts + f->at;
    size_t n = strlen(v);
    if (!n) {
        if (f->kind == ARG_CHOICE) return moet_arg_fail(cmd, f, NULL, 2, "the value is empty; expected %s", f->choices);
        if (f->kind == ARG_INT || f->kind == ARG_I64 || f->kind == ARG_LIST)
            return moet_arg_fail(cmd, f, NULL, 2, "the value is empty; expected %s in %" PRId64 "..%" PRId64, moet_kind_value(f->kind),
                                 f->lo, f->hi);
        return moet_arg_fail(cmd, f, NULL, 2, "the value is empty; expected %s", moet_kind_value(f->kind));
    }
    switch (f->kind) {
    case ARG_INT:
    case ARG_I64: {
        int64_t x;
        if (moet_text_i64(v, n, &x) || x < f->lo || x > f->hi)
            return moet_arg_fail(cmd, f, v, 2, "expected an integer in %" PRId64 "..%" PRId64, f->lo, f->hi);
        if (f->kind == ARG_INT) *(int *)dst = (int)x;
        else *(int64_t *)dst = x;
        return 0;
    }
    case ARG_U64:
        if (moet_text_u64(v, n, (uint64_t *)dst))
            return moet_arg_fail(cmd, f, v, 2, "expected an unsigned integer in 0..%" PRIu64, UINT64_MAX);
        return 0;
    case ARG_NUM: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (moet_space(v[0]) || *end || errno || !(x >= f->dlo && x <= f->dhi))
            return moet_arg_fail(cmd, f, v, 2, "expected a number in [%g, %g]", f->dlo, f->dhi);
        *(double *)dst = x;
        return 0;
    }
    case ARG_STR:
        if (f->hi > 0 && (int64_t)n > f->hi) return moet_arg_fail(cmd, f, NULL, 2, "%zu bytes; at most %" PRId64, n, f->hi);
        *(const char **)dst = v;
        return 0;
    case ARG_CHOICE: {
        for (const char *c = f->choices; *c;) {
            const char *bar = strchr(c, '|');
            size_t k = bar ? (size_t)(bar - c) : strlen(c);
            if (k == n && !memcmp(c, v, n)) {
                *(const char **)dst = v;
                return 0;
            }
            c += k + (bar != NULL);
        }
        char list[256];
        size_t at = 0;
        for (const char *c = f->choices; *c && at + 8 < sizeof list; c++) {
            if (*c != '|') list[at++] = *c;
            else at += (size_t)snprintf(list + at, sizeof list - at, strchr(c + 1, '|') ? ", " : " or ");
        }
        list[at] = 0;
        return moet_arg_fail(cmd, f, v, 2, "expected %s", list);
    }
    case ARG_LIST: {
        moet_list *l = (moet_list *)dst;
        char why[160];
        int k = moet_list_parse(v, n, f->lo, f->hi, l->v, MOET_ARG_LIST_MAX, why, sizeof why);
        if (k < 0)
            return moet_arg_fail(cmd, f, v, 2, "%s; expected up to %d integers in %" PRId64 "..%" PRId64 ", comma separated", why,
                                 MOET_ARG_LIST_MAX, f->lo, f->hi);
        l->n = k;
        return 0;
    }
    default:   // paths: checked once everything is read (moet_arg_path)
        if (n >= MOET_MAX_PATH) return moet_arg_fail(cmd, f, NULL, 2, "the path is longer than %d bytes", MOET_MAX_PATH - 1);
        *(const char **)dst = v;
        return 0;
    }
}

// A path flag's value, checked against its kind. 0, or 1 after a message.
static int moet_arg_path(const char *cmd, const moet_flag *f, const char *p) {
    moet_err e = {{0}};
    if (f->kind == ARG_OUT_FILE) {
        if (of_check_target(p, &e)) return moet_arg_fail(cmd, f, p, 1, "%s", e.msg);
        return 0;
    }
    if (f->kind == ARG_OUT_DIR) {
        if (of_check_dir_target(p, &e)) return moet_arg_fail(cmd, f, p, 1, "%s", e.msg);
        return 0;
    }
    struct stat st;
    if (stat(p, &st) != 0) return moet_arg_fail(cmd, f, p, 1, "cannot open: %s", strerror(errno));
    int file = S_ISREG(st.st_mode), dir = S_ISDIR(st.st_mode);
    if (f->kind == ARG_IN_FILE && !file)
        return moet_arg_fail(cmd, f, p, 1, "not a regular file (%s)", dir ? "a directory" : of_kind(st.st_mode));
    if (f->kind == ARG_IN_DIR && !dir) return moet_arg_fail(cmd, f, p, 1, "not a directory");
    if (f->kind == ARG_IN_ANY && !file && !dir)
        return moet_arg_fail(cmd, f, p, 1, "not a regular file or a directory (%s)", of_kind(st.st_mode));
    return 0;
}

// Reads argv[2..] (argv[1] is the command) into opts by the table flags[0..n). Returns 0;
// MOET_ARGS_HELP after printing usage on stdout; 2 after a message for a malformed command line
// (an unknown flag is followed by the usage on stderr); 1 after a message for a path that is
// refused. Nothing is opened or written before every flag has been read and checked.
static int moet_args(const char *cmd, const char *usage, const moet_flag *flags, int n, int argc, char **argv, void *opts) {
    MOET_ASSERT(n <= MOET_ARG_MAX_FLAGS, "%d flags", n);
    unsigned char seen[MOET_ARG_MAX_FLAGS] = {0};
    const char *value[MOET_ARG_MAX_FLAGS] = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            so_puts(usage);
            return MOET_ARGS_HELP;
        }
        int k = -1;
        for (int j = 0; j < n && k < 0; j++)
            if (flags[j].name && (!strcmp(a, flags[j].name) || (flags[j].alias && !strcmp(a, flags[j].alias)))) k = j;
        if (k < 0 && !(a[0] == '-' && a[1]))
            for (int j = 0; j < n && k < 0; j++)
                if (!flags[j].name) k = j;   // the positional argument
        if (k < 0) {
            fprintf(stderr, "moet %s: unknown option '%s'\n%s", cmd, a, usage);
            return 2;
        }
        const moet_flag *f = &flags[k];
        if (seen[k]) {
            if (!f->name) {
                fprintf(stderr, "moet %s: one %s only ('%s' and '%s')\n", cmd, f->meta, value[k], a);
                return 2;
            }
            fprintf(stderr, "moet %s: %s given twice\n", cmd, f->name);
            return 2;
        }
        seen[k] = 1;
        if (f->given) *(int *)((char *)opts + f->given - 1) = 1;
        if (f->kind == ARG_SWITCH) {
            *(int *)((char *)opts + f->at) = 1;
            continue;
        }
        const char *v = a;
        if (f->name) {
            if (i + 1 >= argc) return moet_arg_fail(cmd, f, NULL, 2, "needs a value (%s)", f->meta ? f->meta : moet_kind_value(f->kind));
            v = argv[++i];
        }
        value[k] = v;
        int rc = moet_arg_value(cmd, f, v, opts);
        if (rc) return rc;
    }
    for (int k = 0; k < n; k++)
        if (seen[k] && flags[k].kind >= ARG_IN_FILE) {
            int rc = moet_arg_path(cmd, &flags[k], value[k]);
            if (rc) return rc;
        }
    return 0;
}

// The usage of a command on stderr after a message (a flag the command needs is missing, two
// that exclude each other): returns 2.
static int moet_usage_error(const char *cmd, const char *usage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int moet_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "moet %s: %s\n%s", cmd, what, usage);
    return 2;
}

// Flag table entries.
#define FLAG_SWITCH(nm, T, f) {.name = nm, .kind = ARG_SWITCH, .at = offsetof(T, f)}
#define FLAG_INT(nm, T, f, l, h) {.name = nm, .kind = ARG_INT, .at = offsetof(T, f), .lo = l, .hi = h, .meta = "N"}
#define FLAG_I64(nm, T, f, l, h) {.name = nm, .kind = ARG_I64, .at = offsetof(T, f), .lo = l, .hi = h, .meta = "N"}
#define FLAG_U64(nm, T, f, g) {.name = nm, .kind = ARG_U64, .at = offsetof(T, f), .meta = "N", .given = offsetof(T, g) + 1}
#define FLAG_NUM(nm, T, f, l, h) {.name = nm, .kind = ARG_NUM, .at = offsetof(T, f), .dlo = l, .dhi = h, .meta = "X"}
#define FLAG_STR(nm, T, f, maxb) {.name = nm, .kind = ARG_STR, .at = offsetof(T, f), .hi = maxb, .meta = "S"}
#define FLAG_CHOICE(nm, T, f, ch) {.name = nm, .kind = ARG_CHOICE, .at = offsetof(T, f), .choices = ch, .meta = ch}
#define FLAG_LIST(nm, T, f, l, h) {.name = nm, .kind = ARG_LIST, .at = offsetof(T, f), .lo = l, .hi = h, .meta = "LIST"}
#define FLAG_PATH(nm, T, f, k, m) {.name = nm, .kind = k, .at = offsetof(T, f), .meta = m}
#define FLAG_FILE(nm, T, f) FLAG_PATH(nm, T, f, ARG_IN_FILE, "FILE")
#define FLAG_DIR(nm, T, f) FLAG_PATH(nm, T, f, ARG_IN_DIR, "DIR")
