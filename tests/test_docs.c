// tests/test_docs.c — every Markdown document the repository cites exists, and so does every
// section it cites.
//
// The files read: moet.c, build.sh, README.md, .ci/run, the .c .h .cu .cuh .md .sh files under
// arena/, format/, gpu/ and sass/, and tests/*.c, tests/*.h (not tests/fixtures). In them, a
// citation is a word that ends in ".md" (letters, digits, _ - . / before it), with the sections
// that may follow it: "sass/MODEL.md §3.4", "§3–4", "§A.4-A.7", "§3.5, §4.1" (the list may go on
// across a comment's line break).
//
// The rule: a document is named by its path from the citing file's own directory or, when no
// such file exists there, from the repository root. So a file beside a document may name it
// bare (format/planes.c cites its own folder's plane file spec that way), and any other file
// names it from the root (sass/MODEL.md, arena/DESIGN.md, format/CHECKPOINT.md).
//
// One check per citation: the document exists, and each cited section is the number of one of
// its headings ("## 3. Forward math", "### 3.4 Gated full attention", "## B. safetensors shards").
// In a Markdown file a § that follows no document name refers to that file itself, and is
// checked the same way (one check each). Runs from the repository root (build.sh run_tests).
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#define DOCS_MAX_FILES 512
#define DOCS_MAX_IDS 16    // sections in one citation
#define DOCS_ID_LEN 16

typedef struct {
    char path[512];
    char *text;            // NUL-terminated
    size_t len;
} docs_file;

static docs_file docs_files[DOCS_MAX_FILES];
static int docs_n_files;                        // files read (sources and cited documents)
static int docs_n_scanned, docs_n_cites, docs_n_sections, docs_n_self;

static int docs_is_regular(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

// The text of path, read once; NULL when it cannot be read.
static const docs_file *docs_get(const char *path) {
    for (int i = 0; i < docs_n_files; i++)
        if (!strcmp(docs_files[i].path, path)) return &docs_files[i];
    if (docs_n_files == DOCS_MAX_FILES) {
        CHECK(0, "more than %d files to read", DOCS_MAX_FILES);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return NULL;
    }
    docs_file *d = &docs_files[docs_n_files];
    d->text = malloc((size_t)sb.st_size + 1);
    if (!d->text) {
        fclose(f);
        return NULL;
    }
    d->len = fread(d->text, 1, (size_t)sb.st_size, f);
    d->text[d->len] = 0;
    fclose(f);
    snprintf(d->path, sizeof d->path, "%s", path);
    docs_n_files++;
    return d;
}

static int docs_line(const char *text, const char *at) {
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

// A section number at s: one capital letter or a number, then ".number" parts (A, B.2, 3, 3.4,
// A.5). Returns its length (copied to out), or 0 when s holds none.
static size_t docs_id(const char *s, char *out) {
    size_t n = 0;
    if (isupper((unsigned char)s[0])) {
        if (isalnum((unsigned char)s[1])) return 0;   // a word, not a section letter
        n = 1;
    } else if (isdigit((unsigned char)s[0])) {
        while (isdigit((unsigned char)s[n])) n++;
    } else {
        return 0;
    }
    while (s[n] == '.' && isdigit((unsigned char)s[n + 1])) {
        n++;
        while (isdigit((unsigned char)s[n])) n++;
    }
    if (n >= DOCS_ID_LEN) return 0;
    memcpy(out, s, n);
    out[n] = 0;
    return n;
}

static int docs_is_section_sign(const char *s) { return (unsigned char)s[0] == 0xc2 && (unsigned char)s[1] == 0xa7; }

// The sections cited from s on (s at a "§"): "§X", "§X–Y", "§X-Y", and more of them after a
// comma, also across a line break and a comment leader. Fills ids; returns where the citation
// ends.
static const char *docs_sections(const char *s, char ids[DOCS_MAX_IDS][DOCS_ID_LEN], int *n_ids) {
    *n_ids = 0;
    while (docs_is_section_sign(s)) {
        size_t k = *n_ids < DOCS_MAX_IDS ? docs_id(s + 2, ids[*n_ids]) : 0;
        if (!k) break;
        (*n_ids)++;
        s += 2 + k;
        // a range: X–Y (en dash) or X-Y
        const char *r = !strncmp(s, "\xe2\x80\x93", 3) ? s + 3 : *s == '-' ? s + 1 : NULL;
        if (r && *n_ids < DOCS_MAX_IDS && (k = docs_id(r, ids[*n_ids]))) {
            (*n_ids)++;
            s = r + k;
        }
        // ", §…" continues the list
        if (*s != ',') break;
        const char *q = s + 1;
        for (;;) {
            while (*q == ' ' || *q == '\t' || *q == '\n') q++;
            if (q[0] == '/' && q[1] == '/') q += 2;
            else if (*q == '*' || *q == '#') q++;
            else break;
        }
        if (!docs_is_section_sign(q)) break;
        s = q;
    }
    return s;
}

// Whether the Markdown text d has a heading numbered id: "## 3. Forward math", "### 3.4 Gated",
// "## B. safetensors" (headings inside ``` blocks do not count).
static int docs_has_heading(const docs_file *d, const char *id) {
    size_t n = strlen(id);
    int fenced = 0;
    for (const char *l = d->text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (!strncmp(l, "```", 3)) {
            fenced = !fenced;
            continue;
        }
        if (fenced || *l != '#') continue;
        const char *h = l;
        while (*h == '#') h++;
        if (*h != ' ') continue;
        while (*h == ' ') h++;
        if (strncmp(h, id, n)) continue;
        char c = h[n];
        if (c == ' ' || c == '\n' || c == 0 || (c == '.' && (h[n + 1] == ' ' || h[n + 1] == '\n' || h[n + 1] == 0))) return 1;
    }
    return 0;
}

// The sections of ids that are no heading of the document d, as "§3.9, §C.8" into missing
// (empty when every one is).
static void docs_missing(const docs_file *d, char ids[DOCS_MAX_IDS][DOCS_ID_LEN], int n_ids, char *missing, size_t cap) {
    *missing = 0;
    for (int i = 0; i < n_ids; i++)
        if (!docs_has_heading(d, ids[i])) snprintf(missing + strlen(missing), cap - strlen(missing), "%s§%s", *missing ? ", " : "", ids[i]);
}

// Every citation in the file at path; dir is its directory with a trailing '/' ("" at the root).
static void docs_scan(const char *path) {
    const docs_file *f = docs_get(path);
    if (!f) {
        CHECK(f != NULL, "%s: cannot read", path);
        return;
    }
    docs_n_scanned++;
    char dir[512];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path + 1) : 0, path);
    size_t plen = strlen(path);
    int is_md = plen > 3 && !strcmp(path + plen - 3, ".md");
    const char *text = f->text;
    // the § signs that belong to a document's citation (the others, in a Markdown file, refer to it)
    static const char *used[8192];
    int n_used = 0;
    for (const char *p = text; (p = strstr(p, ".md")) != NULL; p += 3) {
        if (isalnum((unsigned char)p[3]) || p[3] == '_') continue;   // .mdx, not a document
        const char *a = p;
        while (a > text && (isalnum((unsigned char)a[-1]) || strchr("_-./", a[-1]))) a--;
        if (a == p || !(isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '-')) continue;   // ".md", "*.md"
        if (*a == '/' || (a > text && a[-1] == ':')) continue;   // an absolute path or a URL: not the repository's
        char name[512], here[1024];
        snprintf(name, sizeof name, "%.*s", (int)(p + 3 - a), a);
        snprintf(here, sizeof here, "%s%s", dir, name);
        const char *res = *dir && docs_is_regular(here) ? here : docs_is_regular(name) ? name : NULL;
        // the sections after it
        const char *s = p + 3;
        while (*s == ' ' || *s == '\t') s++;
        char ids[DOCS_MAX_IDS][DOCS_ID_LEN];
        int n_ids = 0;
        if (docs_is_section_sign(s)) {
            const char *sec = s;
            const char *end = docs_sections(s, ids, &n_ids);
            for (const char *q = sec; q < end; q++)
                if (docs_is_section_sign(q) && n_used < (int)(sizeof used / sizeof used[0])) used[n_used++] = q;
        }
        docs_n_cites++;
        docs_n_sections += n_ids > 0;
        // one check: the document resolves, and has every section cited
        const docs_file *d = res && n_ids ? docs_get(res) : NULL;
        char missing[256] = "";
        if (d) docs_missing(d, ids, n_ids, missing, sizeof missing);
        if (!res && *dir)
            CHECK(res != NULL, "%s:%d: %s does not resolve: neither %s (beside the citing file) nor %s (from the root) is a file", path,
                  docs_line(text, a), name, here, name);
        else if (!res)
            CHECK(res != NULL, "%s:%d: %s does not resolve: no such file from the repository root", path, docs_line(text, a), name);
        else if (n_ids && !d)
            CHECK(d != NULL, "%s:%d: %s: cannot read %s", path, docs_line(text, a), name, res);
        else
            CHECK(!*missing, "%s:%d: %s: %s is not a heading of %s", path, docs_line(text, a), name, missing, res);
    }
    if (!is_md) return;
    // a § of its own: this document's sections
    for (const char *p = text; (p = strstr(p, "\xc2\xa7")) != NULL; p += 2) {
        int seen = 0;
        for (int i = 0; i < n_used && !seen; i++) seen = used[i] == p;
        if (seen) continue;
        char ids[DOCS_MAX_IDS][DOCS_ID_LEN];
        int n_ids = 0;
        const char *end = docs_sections(p, ids, &n_ids);
        for (const char *q = p + 2; q < end; q++)
            if (docs_is_section_sign(q) && n_used < (int)(sizeof used / sizeof used[0])) used[n_used++] = q;
        docs_n_self++;
        char missing[256] = "";
        docs_missing(f, ids, n_ids, missing, sizeof missing);
        if (!n_ids) CHECK(n_ids > 0, "%s:%d: a § without a section number", path, docs_line(text, p));
        else CHECK(!*missing, "%s:%d: %s is not a heading of this document", path, docs_line(text, p), missing);
    }
}

static int docs_has_ext(const char *name, const char *const *exts) {
    size_t n = strlen(name);
    for (; *exts; exts++) {
        size_t k = strlen(*exts);
        if (n > k && !strcmp(name + n - k, *exts)) return 1;
    }
    return 0;
}

// Every file with one of exts under dir, in name order; into subdirectories when recurse.
static void docs_walk(const char *dir, const char *const *exts, int recurse) {
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) CHECK(n >= 0, "%s: cannot list the directory", dir);
    for (int i = 0; i < n; i++) {
        char path[512];
        const char *nm = ents[i]->d_name;
        if (nm[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, nm);
            struct stat sb;
            if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                if (recurse) docs_walk(path, exts, 1);
            } else if (S_ISREG(sb.st_mode) && docs_has_ext(nm, exts)) {
                docs_scan(path);
            }
        }
        free(ents[i]);
    }
    if (n >= 0) free(ents);
}

int main(void) {
    static const char *const src[] = {".c", ".h", ".cu", ".cuh", ".md", ".sh", NULL};
    static const char *const tests[] = {".c", ".h", NULL};
    static const char *const top[] = {"moet.c", "build.sh", "README.md", ".ci/run"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (docs_is_regular(top[i])) docs_scan(top[i]);
    docs_walk("arena", src, 1);
    docs_walk("format", src, 1);
    docs_walk("gpu", src, 1);
    docs_walk("sass", src, 1);
    docs_walk("tests", tests, 0);   // not tests/fixtures: data, not the repository's text
    CHECK(docs_n_scanned >= 20, "only %d files read: not run from the repository root?", docs_n_scanned);
    fprintf(stderr, "test_docs: %d files read, %d document citations (%d with sections), %d sections cited by their own document\n",
            docs_n_scanned, docs_n_cites, docs_n_sections, docs_n_self);
    return check_report("test_docs");
}
