// format/outfile.c — how moet writes a file or a directory it was asked to write (run --out,
// build-planes --out, eval --save-ref, synth --out DIR): every command's output goes through
// here, so every command keeps the same promises.
//
// A file: of_begin → write through of->fd → of_commit, or of_abort on any error:
// - the path must be given (an empty path is refused), its directory must exist, and a path
//   that exists must be a regular file: a symbolic link (dangling or not: it is not followed, as
//   renaming over it would replace the link and never write its target), a FIFO, a character or
//   block device, a directory, a socket are refused. Commands check their output flags this way
//   before any work (moet_args), and of_begin checks again;
// - the bytes go to PATH.tmp.PID in the same directory (created exclusively), which is
//   fsync'ed and renamed over PATH only when complete, so PATH is never half-written;
// - the temporary file is removed on every error path (of_commit's own failures included) and
//   when a signal ends the process: every signal whose default action terminates it and that
//   the process does not ignore (SIGHUP, SIGINT, SIGPIPE, SIGTERM, SIGQUIT, SIGABRT, SIGSEGV,
//   SIGUSR1, SIGALRM, ...), caught for as long as the file is being written and then re-raised
//   with the default action. SIGKILL cannot be caught; nothing can clean up after it.
// A directory (of_dir_*): the same, for a command that writes several files into one directory:
// - a path that does not exist is built as the directory PATH.tmp.PID beside it and renamed to
//   PATH when complete; an existing directory (not a symbolic link to one) is filled through
//   PATH/.tmp.PID inside it, whose files are moved into PATH when complete, each replacing only a
//   regular file (checked before any work with of_dir_check);
// - the temporary directory and everything in it is removed on every error and on the same
//   signals as a file.
//
// One output file and one output directory are in progress at a time (a file may be written
// inside the directory).

typedef struct {
    int fd;                               // the temporary file, open for writing; -1 when none
    char path[MOET_MAX_PATH];             // the file to replace
    char tmp[MOET_MAX_PATH + 32];         // PATH.tmp.PID
} of_file;

typedef struct {
    char path[MOET_MAX_PATH];             // the directory asked for (without trailing slashes)
    char tmp[MOET_MAX_PATH + 32];         // where its files are made: PATH.tmp.PID, or PATH/.tmp.PID
    int existing;                         // PATH is an existing directory: the files move into it
    int live;                             // tmp exists and is this run's
} of_dir;

// What the signal handler removes (copies: the handler may read only static storage): the
// temporary file, and the temporary directory with every file in it.
static char of_live_tmp[MOET_MAX_PATH + 32], of_live_dir[MOET_MAX_PATH + 32];
static volatile sig_atomic_t of_live, of_dir_live;
static struct sigaction of_old_action[NSIG];
static unsigned char of_caught[NSIG];
static int of_holds;   // outputs in progress (the handlers are installed while any is)

// Removes every entry of the directory (files: what the commands put there) and the directory.
// Async-signal-safe (getdents64 into a stack buffer, unlinkat, rmdir), for the handler too.
static void of_remove_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096] __attribute__((aligned(8)));
        for (int pass = 0; pass < 1 << 20; pass++) {   // each pass removes what one read lists
            if (lseek(fd, 0, SEEK_SET) != 0) break;
            ssize_t n = getdents64(fd, buf, sizeof buf);
            if (n <= 0) break;
            int removed = 0;
            for (ssize_t at = 0; at < n;) {
                struct dirent64 *d = (struct dirent64 *)(buf + at);
                const char *nm = d->d_name;
                if (!(nm[0] == '.' && (nm[1] == 0 || (nm[1] == '.' && nm[2] == 0))) && unlinkat(fd, nm, 0) == 0) removed++;
                at += d->d_reclen;
            }
            if (!removed) break;
        }
        close(fd);
    }
    rmdir(dir);
}

// Signals whose default action does not end the process (or that cannot be caught).
static int of_not_fatal(int sig) {
    return sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGCONT || sig == SIGTSTP || sig == SIGTTIN ||
           sig == SIGTTOU || sig == SIGURG || sig == SIGWINCH;
}

static void of_on_signal(int sig) {
    if (of_live) unlink(of_live_tmp);
    if (of_dir_live) of_remove_dir(of_live_dir);
    signal(sig, SIG_DFL);
    raise(sig);   // delivered when the handler returns: the process ends as it would have
}

// Every fatal signal the process does not ignore or handle otherwise, into set (when given)
// and, with install, caught by of_on_signal until of_release.
static void of_signals(sigset_t *set, int install) {
    if (set) sigemptyset(set);
    for (int s = 1; s < NSIG; s++) {
        if (of_not_fatal(s)) continue;
        struct sigaction old;
        if (sigaction(s, NULL, &old) != 0) continue;   // reserved by the C library
        int ours = !(old.sa_flags & SA_SIGINFO) && old.sa_handler == of_on_signal;
        if (!ours && (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO))) continue;   // ignored, or someone else's
        if (set) sigaddset(set, s);
        if (install && !ours) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = of_on_signal;
            sigemptyset(&sa.sa_mask);
            if (sigaction(s, &sa, &of_old_action[s]) == 0) of_caught[s] = 1;
        }
    }
}

static void of_release(void) {
    for (int s = 1; s < NSIG; s++)
        if (of_caught[s]) {
            sigaction(s, &of_old_action[s], NULL);
            of_caught[s] = 0;
        }
}

// One more / one fewer output in progress: the handlers are installed by the first and removed
// with the last. of_hold is called with the fatal signals blocked.
static void of_hold(void) {
    if (of_holds++ == 0) of_signals(NULL, 1);
}
static void of_drop(void) {
    if (--of_holds == 0) of_release();
}

static const char *of_kind(mode_t m) {
    return S_ISLNK(m) ? "a symbolic link" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

// 0 when the directory path would be created in exists (and is a directory); else -1.
static int of_check_parent(const char *path, moet_err *e) {
    char dir[MOET_MAX_PATH];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return err_set(e, "the path is longer than %d bytes", MOET_MAX_PATH - 1);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
    char *slash = strrchr(dir, '/');
    if (!slash) return 0;   // the working directory
    if (slash == dir) slash[1] = 0;
    else *slash = 0;
    struct stat st;
    if (stat(dir, &st) != 0) return err_set(e, "%s: cannot create: its directory %s: %s", path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return err_set(e, "%s: cannot create: %s is not a directory", path, dir);
    return 0;
}

// 0 when path may be written as a file (dir = 0: given, absent or a regular file) or as a
// directory (dir = 1: given, absent or a directory, not a symbolic link to one), in an existing
// directory; else -1 with a message that names what is there.
static int of_check_kind(const char *path, int dir, moet_err *e) {
    if (!*path) return err_set(e, "an empty path; expected the name of a %s to write", dir ? "directory" : "file");
    if (strlen(path) >= MOET_MAX_PATH) return err_set(e, "the path is longer than %d bytes", MOET_MAX_PATH - 1);
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return of_check_parent(path, e);
        return err_set(e, "%s: cannot write here: %s", path, strerror(errno));
    }
    if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
        return err_set(e, dir ? "%s exists and is %s; expected a directory or a new path (symbolic links are not followed)"
                              : "%s exists and is %s; moet writes only to a new path or over a regular file (symbolic links are "
                                "not followed)",
                       path, of_kind(st.st_mode));
    return 0;
}

static int of_check_target(const char *path, moet_err *e) { return of_check_kind(path, 0, e); }
static int of_check_dir_target(const char *path, moet_err *e) { return of_check_kind(path, 1, e); }

// Checks path (of_check_target) and creates its temporary file; f->fd is open for writing.
static int of_begin(of_file *f, const char *path, moet_err *e) {
    f->fd = -1;
    f->path[0] = f->tmp[0] = 0;
    MOET_ASSERT(!of_live, "a second output file while %s is being written", of_live_tmp);
    if (strlen(path) >= sizeof f->path) return err_set(e, "output path is longer than %d bytes", MOET_MAX_PATH - 1);
    if (of_check_target(path, e)) return -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld", path, (long)getpid());
    // no fatal signal between creating the file and recording it for the handler
    sigset_t fatal, old;
    of_signals(&fatal, 0);
    pthread_sigmask(SIG_BLOCK, &fatal, &old);
    f->fd = open(f->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);   // read too: eval hashes what it wrote
    int err = errno;
    if (f->fd >= 0) {
        memcpy(of_live_tmp, f->tmp, sizeof of_live_tmp);
        of_live = 1;
        of_hold();
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (f->fd < 0) return err_set(e, "%s: cannot create: %s", f->tmp, strerror(err));
    return 0;
}

// Closes and removes the temporary file (nothing when none is open). Safe to call twice.
static void of_abort(of_file *f) {
    if (f->fd < 0) return;
    close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
    of_live = 0;
    of_drop();
}

// Makes a rename durable: fsync the directory that holds path.
static void of_sync_dir_of(const char *path) {
    char dir[MOET_MAX_PATH];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) { if (slash == dir) slash[1] = 0; else *slash = 0; }
    else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
}

// fsync, close, rename over the path (checked again: something may have appeared there while
// the file was written), fsync the directory. On failure the temporary file is removed.
static int of_commit(of_file *f, moet_err *e) {
    MOET_ASSERT(f->fd >= 0, "commit of %s without an open file", f->path);
    int rc = 0;
    if (fsync(f->fd)) rc = err_set(e, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) && !rc) rc = err_set(e, "%s: close failed: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (!rc) rc = of_check_target(f->path, e);
    if (!rc && rename(f->tmp, f->path)) rc = err_set(e, "cannot rename %s to %s: %s", f->tmp, f->path, strerror(errno));
    if (rc) {
        unlink(f->tmp);
        of_live = 0;
        of_drop();
        return -1;
    }
    of_live = 0;
    of_drop();
    of_sync_dir_of(f->path);
    return 0;
}

// Writes n bytes at the file's current end (short writes and EINTR retried).
static int of_write(of_file *f, const void *p, size_t n, moet_err *e) {
    const uint8_t *s = p;
    while (n) {
        ssize_t r = write(f->fd, s, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return err_set(e, "%s: write failed: %s", f->tmp, r < 0 ? strerror(errno) : "no progress");
        s += r;
        n -= (size_t)r;
    }
    return 0;
}

// ---- a directory ---------------------------------------------------------------------------

// Checks path (of_check_dir_target) and creates the temporary directory its files are made in.
static int of_dir_begin(of_dir *d, const char *path, moet_err *e) {
    memset(d, 0, sizeof *d);
    MOET_ASSERT(!of_dir_live, "a second output directory while %s is being written", of_live_dir);
    if (of_check_dir_target(path, e)) return -1;
    snprintf(d->path, sizeof d->path, "%s", path);
    size_t n = strlen(d->path);
    while (n > 1 && d->path[n - 1] == '/') d->path[--n] = 0;
    struct stat st;
    d->existing = lstat(d->path, &st) == 0;
    snprintf(d->tmp, sizeof d->tmp, d->existing ? "%s/.tmp.%ld" : "%s.tmp.%ld", d->path, (long)getpid());
    sigset_t fatal, old;
    of_signals(&fatal, 0);
    pthread_sigmask(SIG_BLOCK, &fatal, &old);
    int rc = mkdir(d->tmp, 0755), err = errno;
    if (rc == 0) {
        memcpy(of_live_dir, d->tmp, sizeof of_live_dir);
        of_dir_live = 1;
        d->live = 1;
        of_hold();
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) return err_set(e, "%s: cannot create: %s", d->tmp, strerror(err));
    return 0;
}

// Where the file `name` of the directory is written now (inside the temporary directory).
static void of_dir_file(const of_dir *d, const char *name, char *out, size_t cap) {
    int k = snprintf(out, cap, "%s/%s", d->tmp, name);
    MOET_ASSERT(k > 0 && (size_t)k < cap, "path of %s in %s", name, d->tmp);
}

// 0 when the file `name` may be put in place in the directory: in a new directory always; in an
// existing one when PATH/name is absent or a regular file (of_check_target).
static int of_dir_check(const of_dir *d, const char *name, moet_err *e) {
    if (!d->existing) return 0;
    char p[MOET_MAX_PATH + 256];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", d->path, name) >= sizeof p) return err_set(e, "%s/%s: path too long", d->path, name);
    return of_check_target(p, e);
}

// Removes the temporary directory and what is in it. Safe to call twice.
static void of_dir_abort(of_dir *d) {
    if (!d->live) return;
    of_remove_dir(d->tmp);
    d->live = 0;
    of_dir_live = 0;
    of_drop();
}

// Puts the files in place: a new directory is renamed to PATH; into an existing one every file
// is moved (each target checked first, the moves made with the fatal signals held back, so a
// signal finds either none or all of them moved). On failure the temporary directory is removed.
static int of_dir_commit(of_dir *d, moet_err *e) {
    MOET_ASSERT(d->live, "commit of %s without its directory", d->path);
    int rc = 0;
    if (!d->existing) {
        struct stat st;
        if (lstat(d->path, &st) == 0) rc = err_set(e, "%s appeared while it was being written; it was left as it is", d->path);
        else if (rename(d->tmp, d->path)) rc = err_set(e, "cannot rename %s to %s: %s", d->tmp, d->path, strerror(errno));
        if (rc) { of_dir_abort(d); return -1; }
        d->live = 0;
        of_dir_live = 0;
        of_drop();
        of_sync_dir_of(d->path);
        return 0;
    }
    DIR *dir = opendir(d->tmp);
    if (!dir) rc = err_set(e, "%s: %s", d->tmp, strerror(errno));
    struct dirent *x;
    while (!rc && (x = readdir(dir)))   // every target first
        if (strcmp(x->d_name, ".") && strcmp(x->d_name, "..")) rc = of_dir_check(d, x->d_name, e);
    sigset_t fatal, old;
    of_signals(&fatal, 0);
    pthread_sigmask(SIG_BLOCK, &fatal, &old);
    if (!rc) {
        rewinddir(dir);
        while (!rc && (x = readdir(dir))) {
            if (!strcmp(x->d_name, ".") || !strcmp(x->d_name, "..")) continue;
            char from[MOET_MAX_PATH + 300], to[MOET_MAX_PATH + 300];
            snprintf(from, sizeof from, "%s/%s", d->tmp, x->d_name);
            snprintf(to, sizeof to, "%s/%s", d->path, x->d_name);
            if (rename(from, to)) rc = err_set(e, "cannot rename %s to %s: %s", from, to, strerror(errno));
        }
    }
    if (dir) closedir(dir);
    of_dir_abort(d);   // the (now empty, or failed) temporary directory
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!rc) {
        char any[MOET_MAX_PATH + 4];
        snprintf(any, sizeof any, "%s/.", d->path);
        of_sync_dir_of(any);
    }
    return rc;
}
