// format/lines.c — what a line of text input is, for every command that reads lines: the
// requests of `moet serve`, the data of `moet eval --data`, the input of `moet tokenize`.
//
// A line is the bytes up to "\n" (the last line may lack it), without a "\r" before the "\n"
// and without a UTF-8 byte order mark (EF BB BF) at its start (files saved by some editors begin
// every line, or the first, with one). A line longer than the reader's limit is skipped through
// its newline and reported once (LN_LONG), so it never splits into several lines. Each line
// carries its number (from 1, every line counting) and the offset of its first byte that is
// not well-formed UTF-8 (RFC 3629), or -1.
//
// The reader holds a buffer that it fills from a file descriptor (ln_fill, with a timeout, for
// the server's loop) or that already holds the whole text (ln_init_text: a mapped file).

enum { LN_NONE, LN_LINE, LN_LONG };   // ln_take: nothing complete yet (or the end) / a line / a line too long

typedef struct {
    char *buf;            // [cap] bytes read and not yet taken (the text itself for a memory reader)
    size_t cap, start, end;
    size_t max;           // longest line accepted, in bytes without its "\n"
    int fd;               // where the bytes come from; -1: buf holds all of them
    int eof;              // the end of the input was seen
    int err;              // reading failed with this errno (the input ends there); 0: it ended normally
    int skipping;         // inside a line longer than max
    int64_t line_no;      // lines taken so far
} ln_reader;

typedef struct {
    const char *s;        // the line's bytes (in the reader's buffer: valid until the next ln_fill)
    size_t n;
    int64_t no;           // its number, from 1
    int64_t bad_utf8;     // offset of the first byte that is not well-formed UTF-8; -1: none
    size_t end;           // offset just past the line (and its newline) in the text of a memory reader
} ln_line;

// A reader of fd through buf[cap]; cap must exceed max (a whole line and its newline fit).
static void ln_init_fd(ln_reader *r, int fd, char *buf, size_t cap, size_t max) {
    MOET_ASSERT(cap > max, "line buffer of %zu bytes for lines of %zu", cap, max);
    memset(r, 0, sizeof *r);
    r->buf = buf;
    r->cap = cap;
    r->max = max;
    r->fd = fd;
}

// A reader of the whole text[0..n) (not modified).
static void ln_init_text(ln_reader *r, const char *text, size_t n, size_t max) {
    memset(r, 0, sizeof *r);
    r->buf = (char *)text;
    r->cap = r->end = n;
    r->max = max;
    r->fd = -1;
    r->eof = 1;
}

// Offset of the first byte of s[0..n) that is not well-formed UTF-8, or -1.
static int64_t ln_bad_utf8(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) { i++; continue; }
        size_t k = js_utf8_len(u + i, n - i);
        if (!k) return (int64_t)i;
        i += k;
    }
    return -1;
}

static void ln_set(ln_reader *r, ln_line *l, const char *s, size_t n) {
    if (n && s[n - 1] == '\r') n--;
    if (n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) s += 3, n -= 3;
    l->s = s;
    l->n = n;
    l->no = ++r->line_no;
    l->bad_utf8 = ln_bad_utf8(s, n);
    l->end = r->start;
}

// The next line: LN_LINE, LN_LONG (a line over the limit, skipped: l->no says which), or
// LN_NONE when no complete line is there (ln_fill for more; at the end of the input: done).
static int ln_take(ln_reader *r, ln_line *l) {
    for (;;) {
        char *base = r->buf + r->start;
        size_t avail = r->end - r->start;
        char *nl = memchr(base, '\n', avail);
        if (r->skipping) {
            if (nl) r->start += (size_t)(nl - base) + 1;
            else {
                r->start = r->end;
                if (!r->eof) return LN_NONE;   // else the long line ended with the input
            }
            r->skipping = 0;
            memset(l, 0, sizeof *l);
            l->no = ++r->line_no;
            l->bad_utf8 = -1;
            l->end = r->start;
            return LN_LONG;
        }
        if (nl && (size_t)(nl - base) <= r->max) {
            r->start += (size_t)(nl - base) + 1;
            ln_set(r, l, base, (size_t)(nl - base));
            return LN_LINE;
        }
        if (nl || avail > r->max) {   // too long: skip through its newline
            r->skipping = 1;
            continue;
        }
        if (r->eof && avail) {   // the last line had no "\n"
            r->start = r->end;
            ln_set(r, l, base, avail);
            return LN_LINE;
        }
        return LN_NONE;
    }
}

// Bytes read and not yet taken.
static size_t ln_pending(const ln_reader *r) { return r->end - r->start; }

// Drops what was read and not taken, and reads no more (the input ends here).
static void ln_drop(ln_reader *r) {
    r->start = r->end = 0;
    r->eof = 1;
}

// Reads what the descriptor has, waiting up to timeout_ms for it (-1: until there is input, the
// end, or a signal). The lines taken before are no longer valid.
static void ln_fill(ln_reader *r, int timeout_ms) {
    if (r->eof || r->fd < 0) return;
    if (r->start > 0) {   // keep the bytes not taken at the front
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->end == r->cap) return;
    struct pollfd p = {r->fd, POLLIN, 0};
    int k = poll(&p, 1, timeout_ms);
    if (k <= 0) return;   // nothing yet, or a signal
    ssize_t got = read(r->fd, r->buf + r->end, r->cap - r->end);
    if (got > 0) r->end += (size_t)got;
    else if (got == 0) r->eof = 1;
    else if (errno != EINTR && errno != EAGAIN) {   // no more input either, but not a normal end
        r->eof = 1;
        r->err = errno;
    }
}
