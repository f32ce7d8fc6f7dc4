/* sigdefer: signal handlers that use a socket, run under the shim by
 * tests/tests/signal_deferral.rs (built there with cc).
 *
 *   sigdefer actions                       sigaction/signal round trips, printed
 *   sigdefer sink TOTAL MSGS PORT          listens ("listening PORT"), checks the
 *                                          stream, answers and prints a verdict
 *   sigdefer burst PORT BYTES SIGNALS GO   main thread sends BYTES in large sends
 *                                          while another thread sends it SIGNALS
 *                                          real-time signals; each handler writes
 *                                          one 64-byte message on the socket;
 *                                          prints the sink's verdict, then waits
 *                                          for the file GO before closing
 *   sigdefer jumpsink GO PORT              listens, waits for GO, reads to EOF,
 *                                          prints "got N tail T" (T: the trailer
 *                                          was whole and last)
 *   sigdefer jump PORT MODE                block-recv | block-send | nonblock |
 *                                          nonblock-stay: loops in that call until
 *                                          SIGTERM, whose handler (installed with
 *                                          signal(), as iperf3 does) longjmps out;
 *                                          then writes a 16-byte trailer, closes
 *                                          and exits (nonblock-stay: lives on)
 *   sigdefer restart                       blocking recv and send interrupted by a
 *                                          handler with or without SA_RESTART, or
 *                                          on a socket with SO_RCVTIMEO; prints
 *                                          what each call returned
 *
 * Main-thread bytes are the stream position mod 127 (below 0x80); handler
 * message k is 64 bytes of 0x80|k; the trailer is 16 bytes of 0xfe. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG 64
#define TRAILER 16

static void die(const char *what) {
    fprintf(stderr, "sigdefer: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits (at most 120 s) for `path` to exist. */
static void wait_file(const char *path) {
    for (int i = 0; i < 120000; i++) {
        struct stat st;
        if (stat(path, &st) == 0)
            return;
        sleep_ms(1);
    }
    fprintf(stderr, "sigdefer: %s never appeared\n", path);
    exit(2);
}

static int listen_on(int port) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0)
        die("socket");
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4) != 0)
        die("bind/listen");
    socklen_t len = sizeof a;
    getsockname(l, (struct sockaddr *)&a, &len);
    printf("listening %d\n", ntohs(a.sin_port));
    fflush(stdout);
    return l;
}

static int connect_to(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
        die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect");
    return s;
}

/* Writes all of buf (blocking socket), through EINTR and short writes. */
static int write_all(int fd, const unsigned char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- actions: what the program sees of its own handlers ---- */

static volatile sig_atomic_t hits;
static volatile long seen_value, seen_code, seen_pid;

static void h_plain(int sig) { (void)sig; hits++; }
static void h_other(int sig) { (void)sig; hits += 100; }
static void h_info(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    hits++;
    seen_value = si->si_value.sival_int;
    seen_code = si->si_code;
    seen_pid = si->si_pid;
}

static const char *name(void *h) {
    if (h == (void *)SIG_DFL) return "SIG_DFL";
    if (h == (void *)SIG_IGN) return "SIG_IGN";
    if (h == (void *)h_plain) return "h_plain";
    if (h == (void *)h_other) return "h_other";
    if (h == (void *)h_info) return "h_info";
    return "unknown";
}

static void show(const char *what, int sig) {
    struct sigaction o;
    memset(&o, 0, sizeof o);
    if (sigaction(sig, NULL, &o) != 0) {
        printf("%s: query failed errno=%d\n", what, errno);
        return;
    }
    printf("%s: handler=%s flags=%#x usr2_masked=%d\n", what, name((void *)o.sa_sigaction),
           (unsigned)o.sa_flags, sigismember(&o.sa_mask, SIGUSR2));
}

/* The kernel's struct sigaction, for rt_sigaction through syscall(2). */
struct kaction {
    unsigned long handler, flags, restorer, mask;
};

static int actions(void) {
    struct sigaction a, o;
    memset(&a, 0, sizeof a);
    a.sa_sigaction = h_info;
    a.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&a.sa_mask);
    sigaddset(&a.sa_mask, SIGUSR2);
    memset(&o, 0, sizeof o);
    printf("install rc=%d\n", sigaction(SIGUSR1, &a, &o));
    printf("before: handler=%s\n", name((void *)o.sa_sigaction));
    show("installed", SIGUSR1);

    union sigval v = {.sival_int = 42};
    sigqueue(getpid(), SIGUSR1, v);
    printf("siginfo hits=%d value=%ld code=%ld self=%d\n", (int)hits, seen_value, seen_code,
           seen_pid == getpid());

    a.sa_handler = h_other;
    a.sa_flags = SA_NODEFER;
    memset(&o, 0, sizeof o);
    sigaction(SIGUSR1, &a, &o);
    printf("replaced: old=%s old_flags_siginfo=%d old_restart=%d\n", name((void *)o.sa_sigaction),
           (o.sa_flags & SA_SIGINFO) != 0, (o.sa_flags & SA_RESTART) != 0);
    show("now", SIGUSR1);

    /* One-shot: runs once, then the default action is installed. */
    hits = 0;
    a.sa_handler = h_plain;
    a.sa_flags = SA_RESETHAND;
    sigaction(SIGUSR2, &a, NULL);
    show("oneshot", SIGUSR2);
    raise(SIGUSR2);
    printf("oneshot ran=%d\n", (int)hits);
    show("after oneshot", SIGUSR2);

    /* signal(3): BSD semantics in glibc, and what it returns. */
    printf("signal first old=%s\n", name((void *)signal(SIGHUP, h_plain)));
    printf("signal second old=%s\n", name((void *)signal(SIGHUP, h_other)));
    show("signal", SIGHUP);
    hits = 0;
    raise(SIGHUP);
    printf("signal ran=%d\n", (int)hits);
    printf("sysv_signal old=%s\n", name((void *)sysv_signal(SIGWINCH, h_plain)));
    show("sysv_signal", SIGWINCH);
    printf("sigset old=%s\n", name((void *)sigset(SIGCHLD, h_plain)));
    printf("sigset again old=%s\n", name((void *)sigset(SIGCHLD, SIG_DFL)));
    printf("siginterrupt rc=%d\n", siginterrupt(SIGHUP, 1));
    show("siginterrupt", SIGHUP);

    /* rt_sigaction through syscall(2), in the kernel's layout. */
    struct kaction k = {0};
    long r = syscall(SYS_rt_sigaction, SIGHUP, NULL, &k, 8);
    printf("raw query rc=%ld handler=%s flags_siginfo=%d\n", r, name((void *)k.handler),
           (k.flags & SA_SIGINFO) != 0);
    struct kaction set = {.handler = (unsigned long)h_plain, .flags = k.flags, .restorer = k.restorer};
    r = syscall(SYS_rt_sigaction, SIGTERM, &set, &k, 8);
    printf("raw install rc=%ld old=%s\n", r, name((void *)k.handler));
    show("raw", SIGTERM);
    hits = 0;
    raise(SIGTERM);
    printf("raw ran=%d\n", (int)hits);

    printf("ign old=%s\n", name((void *)signal(SIGTERM, SIG_IGN)));
    show("ign", SIGTERM);
    printf("bad signal rc=%d\n", sigaction(SIGKILL, &a, NULL));
    printf("done\n");
    return 0;
}

/* ---- sink: checks a stream of main bytes and handler messages ---- */

static int sink(long long total, int msgs, int port) {
    int l = listen_on(port);
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    static unsigned char buf[1 << 16];
    long long got = 0, main_pos = 0;
    int run_val = -1, run_len = 0, seen = 0, bad = 0;
    unsigned char done[64] = {0};
    char why[256] = "";
    while (got < total) {
        ssize_t n = read(s, buf, sizeof buf);
        if (n <= 0) {
            snprintf(why, sizeof why, "stream ended after %lld of %lld bytes", got, total);
            bad = 1;
            break;
        }
        for (ssize_t i = 0; i < n && !bad; i++) {
            unsigned char b = buf[i];
            if (run_val >= 0 && (b != run_val || run_len == MSG)) {
                if (run_len != MSG) {
                    snprintf(why, sizeof why, "message %#x cut to %d bytes", run_val, run_len);
                    bad = 1;
                }
                run_val = -1;
            }
            if (b < 0x80) {
                if (b != main_pos % 127) {
                    snprintf(why, sizeof why, "main byte %lld is %d", main_pos, b);
                    bad = 1;
                }
                main_pos++;
            } else if (run_val < 0) {
                int k = b & 0x3f;
                if (done[k]++) {
                    snprintf(why, sizeof why, "message %d twice", k);
                    bad = 1;
                }
                run_val = b;
                run_len = 1;
                seen++;
            } else {
                run_len++;
            }
        }
        got += n;
        if (bad)
            break;
    }
    if (!bad && run_val >= 0 && run_len != MSG) {
        snprintf(why, sizeof why, "last message cut to %d bytes", run_len);
        bad = 1;
    }
    if (!bad && seen != msgs) {
        snprintf(why, sizeof why, "%d handler messages, not %d", seen, msgs);
        bad = 1;
    }
    char verdict[400];
    if (bad)
        snprintf(verdict, sizeof verdict, "verdict bad: %s\n", why);
    else
        snprintf(verdict, sizeof verdict, "verdict ok main=%lld messages=%d\n", main_pos, seen);
    printf("%s", verdict);
    fflush(stdout);
    write_all(s, (const unsigned char *)verdict, strlen(verdict));
    while (read(s, buf, sizeof buf) > 0) {
    }
    return bad;
}

/* ---- burst: a handler writes while the main thread is in long sends ---- */

static int burst_fd;
static atomic_int next_msg, handled;

static void burst_handler(int sig) {
    (void)sig;
    int saved = errno;
    unsigned char m[MSG];
    memset(m, 0x80 | (atomic_fetch_add(&next_msg, 1) & 0x3f), MSG);
    if (write_all(burst_fd, m, MSG) != 0)
        _exit(3);
    atomic_fetch_add(&handled, 1);
    errno = saved;
}

struct kicker {
    pthread_t target;
    int signals;
    atomic_int *started;
};

static void *kick(void *arg) {
    struct kicker *k = arg;
    while (!atomic_load(k->started))
        sleep_ms(1);
    union sigval v = {0};
    for (int i = 0; i < k->signals; i++) {
        if (pthread_sigqueue(k->target, SIGRTMIN, v) != 0)
            die("pthread_sigqueue");
        sleep_ms(3);
    }
    return NULL;
}

static int burst(int port, long long bytes, int signals, const char *go) {
    burst_fd = connect_to(port);
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = burst_handler;
    sigemptyset(&a.sa_mask);
    /* No SA_RESTART: blocking sends return short or EINTR. */
    if (sigaction(SIGRTMIN, &a, NULL) != 0)
        die("sigaction");
    sigset_t rt;
    sigemptyset(&rt);
    sigaddset(&rt, SIGRTMIN);
    atomic_int started = 0;
    struct kicker k = {pthread_self(), signals, &started};
    pthread_t t;
    /* The kicker thread never takes the signal itself. */
    pthread_sigmask(SIG_BLOCK, &rt, NULL);
    pthread_create(&t, NULL, kick, &k);
    pthread_sigmask(SIG_UNBLOCK, &rt, NULL);

    size_t chunk = 1 << 20;
    unsigned char *buf = malloc(chunk + 127);
    for (size_t i = 0; i < chunk + 127; i++)
        buf[i] = (unsigned char)(i % 127);
    long long sent = 0, shorts = 0, eintrs = 0;
    atomic_store(&started, 1);
    while (sent < bytes) {
        size_t want = (size_t)(bytes - sent < (long long)chunk ? bytes - sent : (long long)chunk);
        ssize_t n = send(burst_fd, buf + sent % 127, want, 0);
        if (n < 0 && errno == EINTR) {
            eintrs++;
            continue;
        }
        if (n <= 0)
            die("send");
        if ((size_t)n < want)
            shorts++;
        sent += n;
    }
    pthread_join(t, NULL);
    for (int i = 0; i < 60000 && atomic_load(&handled) < signals; i++)
        sleep_ms(1);
    printf("sent %lld handled %d shorts %lld eintrs %lld\n", sent, atomic_load(&handled), shorts,
           eintrs);
    char line[400];
    size_t have = 0;
    while (have < sizeof line - 1) {
        ssize_t n = read(burst_fd, line + have, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || line[have] == '\n')
            break;
        have++;
    }
    line[have] = 0;
    printf("%s\n", line);
    fflush(stdout);
    wait_file(go);
    close(burst_fd);
    return 0;
}

/* ---- jump: a handler longjmps out of a socket call (iperf3's SIGTERM) ---- */

static jmp_buf jump_env;

static void jump_handler(int sig) {
    (void)sig;
    longjmp(jump_env, 1);
}

static int jumpsink(const char *go, int port) {
    int l = listen_on(port);
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    wait_file(go);
    static unsigned char buf[1 << 16];
    long long got = 0, bad_main = -1, main_pos = 0;
    int tail = 0;
    for (;;) {
        ssize_t n = read(s, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            unsigned char b = buf[i];
            if (b == 0xfe) {
                tail++;
            } else if (tail > 0 || b != main_pos % 127) {
                if (bad_main < 0)
                    bad_main = got + i;
            } else {
                main_pos++;
            }
        }
        got += n;
    }
    printf("got %lld main %lld tail %s\n", got, main_pos,
           tail == TRAILER && bad_main < 0 ? "whole" : "broken");
    fflush(stdout);
    return !(tail == TRAILER && bad_main < 0);
}

static int jump(int port, const char *mode) {
    int s = connect_to(port);
    static unsigned char buf[1 << 16];
    static long long sent;
    if (setjmp(jump_env)) {
        /* As iperf3 does: back from the handler, tell the peer and exit. */
        int fl = fcntl(s, F_GETFL);
        fcntl(s, F_SETFL, fl & ~O_NONBLOCK);
        unsigned char t[TRAILER];
        memset(t, 0xfe, sizeof t);
        if (write_all(s, t, sizeof t) != 0)
            die("trailer");
        printf("terminated after %lld\n", sent);
        fflush(stdout);
        close(s);
        if (strcmp(mode, "nonblock-stay") == 0) {
            /* The peer must see the end while this process lives on. */
            printf("closed\n");
            fflush(stdout);
            sleep(120);
        }
        exit(0);
    }
    if (signal(SIGTERM, jump_handler) == SIG_ERR)
        die("signal");
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i % 127);
    int nonblock = strncmp(mode, "nonblock", 8) == 0;
    if (nonblock)
        fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        if (strcmp(mode, "block-recv") == 0) {
            recv(s, buf, sizeof buf, 0);
        } else {
            /* Sends of whole pattern periods, so the stream stays in order. */
            size_t want = nonblock ? 1270 : 127 * 256;
            ssize_t n = send(s, buf + sent % 127, want, 0);
            if (n > 0)
                sent += n;
            if (nonblock) {
                char c;
                recv(s, &c, 1, 0);
            }
        }
    }
}

/* ---- restart: which interrupted blocking calls are restarted ---- */

static volatile sig_atomic_t restart_hits;
static void h_count(int sig) { (void)sig; restart_hits++; }

/* The state letter of thread `tid` of this process ('S': sleeping). */
static char thread_state(pid_t tid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

struct kick {
    pthread_t target;
    pid_t tid;
    int sig;
    int go; /* write end of the pipe to the peer process */
};

/* Once the target has slept in its call for a while, signals it; once the
 * handler has run, lets the peer answer (write, or read what fills the
 * buffer), so the call's outcome depends only on the handler's flags. */
static void *kicker(void *arg) {
    struct kick *k = arg;
    for (int still = 0; still < 20;) {
        sleep_ms(5);
        still = thread_state(k->tid) == 'S' ? still + 1 : 0;
    }
    pthread_kill(k->target, k->sig);
    for (int i = 0; i < 20000 && restart_hits == 0; i++)
        sleep_ms(1);
    char c = 'g';
    if (write(k->go, &c, 1) != 1)
        die("write go");
    return NULL;
}

/* The peer: per connection, a mode byte ('r': answer 5 bytes, 's': read),
 * then a go byte on `go` before it answers; then reads to EOF. */
static void restart_peer(int l, int go) {
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            exit(0);
        char mode, g;
        if (recv(c, &mode, 1, MSG_WAITALL) != 1 || read(go, &g, 1) != 1)
            exit(2);
        if (mode != 's' && write_all(c, (const unsigned char *)"hello", 5) != 0)
            exit(2);
        static char sinkbuf[65536];
        while (recv(c, sinkbuf, sizeof sinkbuf, 0) > 0) {
        }
        close(c);
    }
}

static void restart_case(const char *name, int port, int go, char mode, int sig, int timeo) {
    int s = connect_to(port);
    if (timeo) {
        struct timeval tv = {5, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    if (send(s, &mode, 1, 0) != 1)
        die("send mode");
    if (mode == 's') {
        /* Fill what the connection buffers, then block on one more byte.
         * Room may show up a little later (TCP frees sent bytes when a
         * delayed ACK comes, up to 200 ms later; a ring's reader publishes
         * what it consumed lazily): fill until five tries 60 ms apart find
         * none. */
        fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
        static char fill[65536];
        for (int none = 0; none < 5;) {
            if (send(s, fill, sizeof fill, 0) > 0) {
                none = 0;
                continue;
            }
            if (errno != EAGAIN && errno != EINTR)
                die("fill");
            none++;
            sleep_ms(60);
        }
        fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
    }
    restart_hits = 0;
    struct kick k = {pthread_self(), (pid_t)syscall(SYS_gettid), sig, go};
    pthread_t t;
    pthread_create(&t, NULL, kicker, &k);
    char buf[8];
    ssize_t n = mode == 'r'   ? recv(s, buf, 5, MSG_WAITALL)
                : mode == 'p' ? recv(s, buf, 5, MSG_PEEK | MSG_WAITALL)
                              : send(s, "x", 1, 0);
    int e = n < 0 ? errno : 0;
    pthread_join(t, NULL);
    printf("%s: ret=%zd errno=%s hits=%d\n", name, n, e ? strerrorname_np(e) : "0",
           (int)restart_hits);
    close(s);
}

static int restart(void) {
    struct sigaction a = {0};
    a.sa_handler = h_count;
    a.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &a, NULL);
    /* Installed but not the one that fires in the SA_RESTART cases. */
    a.sa_flags = 0;
    sigaction(SIGUSR2, &a, NULL);
    int l = listen_on(0);
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    getsockname(l, (struct sockaddr *)&sa, &len);
    int port = ntohs(sa.sin_port);
    int p[2];
    if (pipe(p) != 0)
        die("pipe");
    pid_t peer = fork();
    if (peer == 0) {
        close(p[1]);
        restart_peer(l, p[0]);
    }
    close(p[0]);
    /* The listener stays open here too: the shim registered it for this
     * process, and a forked child's copy is registered only at its first
     * accept (docs/limits.md), too late for the first connection's ring. */
    restart_case("recv, SA_RESTART", port, p[1], 'r', SIGUSR1, 0);
    restart_case("recv, no SA_RESTART", port, p[1], 'r', SIGUSR2, 0);
    restart_case("recv with SO_RCVTIMEO, SA_RESTART", port, p[1], 'r', SIGUSR1, 1);
    restart_case("peek, SA_RESTART", port, p[1], 'p', SIGUSR1, 0);
    restart_case("peek, no SA_RESTART", port, p[1], 'p', SIGUSR2, 0);
    restart_case("send, SA_RESTART", port, p[1], 's', SIGUSR1, 0);
    restart_case("send, no SA_RESTART", port, p[1], 's', SIGUSR2, 0);
    kill(peer, SIGTERM);
    waitpid(peer, NULL, 0);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "actions") == 0)
        return actions();
    if (argc >= 2 && strcmp(argv[1], "restart") == 0)
        return restart();
    if (argc == 5 && strcmp(argv[1], "sink") == 0)
        return sink(atoll(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc == 6 && strcmp(argv[1], "burst") == 0)
        return burst(atoi(argv[2]), atoll(argv[3]), atoi(argv[4]), argv[5]);
    if (argc == 4 && strcmp(argv[1], "jumpsink") == 0)
        return jumpsink(argv[2], atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "jump") == 0)
        return jump(atoi(argv[2]), argv[3]);
    fprintf(stderr, "usage: see the top of sigdefer.c\n");
    return 2;
}
