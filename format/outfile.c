// format/outfile.c — how moet writes a file it was asked to write (build-planes --out, run --out,
// the files of synth --out DIR): the path is replaced only when it is absent or a regular file,
// only by a complete file, and no temporary file outlives the process.
//
// of_begin → write through of->fd → of_commit, or of_abort on any error:
// - a path that exists and is not a regular file is refused: a symbolic link (it is not
//   followed: renaming over it would replace the link and never write its target), a FIFO, a
//   character or block device, a directory, a socket;
// - the bytes go to PATH.tmp.PID in the same directory (created exclusively), which is
//   fsync'ed and renamed over PATH only when complete, so PATH is never half-written;
// - the temporary file is removed on every error path (of_commit's own failures included) and
//   when a signal ends the process: every signal whose default action terminates it and that
//   the process does not ignore (SIGHUP, SIGINT, SIGPIPE, SIGTERM, SIGQUIT, SIGABRT, SIGSEGV,
//   SIGUSR1, SIGALRM, ...), caught for as long as the file is being written and then re-raised
//   with the default action. SIGKILL cannot be caught; nothing can clean up after it.
//
// One output file is in progress at a time (the commands write their files one after another).

typedef struct {
    int fd;                               // the temporary file, open for writing; -1 when none
    char path[MOET_MAX_PATH];             // the file to replace
    char tmp[MOET_MAX_PATH + 32];         // PATH.tmp.PID
} of_file;

// The temporary file the signal handler removes (a copy of of_file.tmp: the handler may read
// only static storage).
static char of_live_tmp[MOET_MAX_PATH + 32];
static volatile sig_atomic_t of_live;
static struct sigaction of_old_action[NSIG];
static unsigned char of_caught[NSIG];

// Signals whose default action does not end the process (or that cannot be caught).
static int of_not_fatal(int sig) {
    return sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGCONT || sig == SIGTSTP || sig == SIGTTIN ||
           sig == SIGTTOU || sig == SIGURG || sig == SIGWINCH;
}

static void of_on_signal(int sig) {
    if (of_live) unlink(of_live_tmp);
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
        if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;   // ignored, or someone else's
        if (set) sigaddset(set, s);
        if (install) {
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

static const char *of_kind(mode_t m) {
    return S_ISLNK(m) ? "a symbolic link" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

// 0 when path is absent or a regular file; else -1 with a message that names what is there.
static int of_check_target(const char *path, moet_err *e) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return err_set(e, "%s: cannot write here: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return err_set(e, "%s exists and is %s; moet writes only to a new path or over a regular file (symbolic links are "
                       "not followed)", path, of_kind(st.st_mode));
    return 0;
}

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
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int err = errno;
    if (f->fd >= 0) {
        memcpy(of_live_tmp, f->tmp, sizeof of_live_tmp);
        of_live = 1;
        of_signals(NULL, 1);
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
    of_release();
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
        of_release();
        return -1;
    }
    of_live = 0;
    of_release();
    // make the rename durable: fsync the directory
    char dir[MOET_MAX_PATH];
    snprintf(dir, sizeof dir, "%s", f->path);
    char *slash = strrchr(dir, '/');
    if (slash) { if (slash == dir) slash[1] = 0; else *slash = 0; }
    else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
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
