/* driver.c — runs a fuzz target without libFuzzer, so every build (and the
 * sanitizer build in `make test`) exercises it.
 *
 *   fuzz_x CORPUS_DIR|FILE...
 *
 * Feeds LLVMFuzzerTestOneInput every file given (directories: every regular
 * file inside, in name order), then deterministic mutations of them: bit
 * flips, truncations, byte insertions and deletions, chunk copies, and
 * "interesting" values (0, 1, -1, 0x7FFF..., 0x8000..., sizes) written over
 * 1-, 2-, 4- and 8-byte fields. Each input is a fresh allocation of exactly
 * its size, so the sanitizers see any read past it.
 *
 * A bug shows up as a crash (a signal, which ctest reports as a failure) or
 * a sanitizer report; the driver itself only prints its counts. Environment:
 * LI_FUZZ_MUTATIONS (default 2000), LI_FUZZ_SEED (default fixed),
 * LI_FUZZ_SECONDS (time cap on the mutation phase, default 20). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

typedef struct input {
    uint8_t *p;
    size_t n;
    char *name;
} input;

static input *inputs;
static size_t n_inputs, cap_inputs;
static uint64_t n_run;

static void add_input(uint8_t *p, size_t n, const char *name) {
    if (n_inputs == cap_inputs) {
        cap_inputs = cap_inputs ? cap_inputs * 2 : 16;
        inputs = realloc(inputs, cap_inputs * sizeof *inputs);
        if (!inputs) abort();
    }
    inputs[n_inputs++] = (input){p, n, strdup(name)};
}

static int read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "driver: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *p = malloc(cap);
    size_t got;
    while (p && (got = fread(p + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) p = realloc(p, cap *= 2);
    }
    fclose(f);
    if (!p) abort();
    add_input(p, n, path);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int read_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        if (!names) abort();
        if (asprintf(&names[n], "%s/%s", dir, e->d_name) < 0) abort();
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) read_file(names[i]);
        free(names[i]);
    }
    free(names);
    return 0;
}

/* Runs the target on an exact-size copy. */
static void run_one(const uint8_t *p, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) abort();
    if (n) memcpy(copy, p, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    n_run++;
}

/* ---- mutations ---------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static size_t rng_below(size_t n) { return n ? (size_t)(rng() % n) : 0; }

static const uint64_t interesting[] = {
    0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 64, 127, 128, 255, 256, 1024, 4096, 65535, 65536,
    0x7FFFFFFFull, 0x80000000ull, 0xFFFFFFFFull, 0x100000000ull, 0x7FFFFFFFFFFFFFFFull,
    0x8000000000000000ull, 0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFFEull, 0x1000000000000000ull,
};

/* One random edit of buf (length *n, capacity cap) in place. */
static void mutate_once(uint8_t *buf, size_t *n, size_t cap) {
    size_t len = *n;
    switch (rng_below(8)) {
    case 0: /* flip 1..4 bits */
        if (len)
            for (int k = 1 + (int)rng_below(4); k > 0; k--) buf[rng_below(len)] ^= (uint8_t)(1u << rng_below(8));
        break;
    case 1: /* truncate */
        *n = rng_below(len + 1);
        break;
    case 2: { /* insert 1..8 bytes */
        size_t k = 1 + rng_below(8), at = rng_below(len + 1);
        if (len + k > cap) break;
        memmove(buf + at + k, buf + at, len - at);
        for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rng();
        *n = len + k;
        break;
    }
    case 3: { /* delete 1..16 bytes */
        if (!len) break;
        size_t at = rng_below(len), k = 1 + rng_below(16);
        if (k > len - at) k = len - at;
        memmove(buf + at, buf + at + k, len - at - k);
        *n = len - k;
        break;
    }
    case 4:
    case 5: { /* interesting value over a 1/2/4/8-byte field, often 4-aligned */
        static const size_t widths[] = {1, 2, 4, 8, 8, 8};
        size_t w = widths[rng_below(sizeof widths / sizeof widths[0])];
        if (len < w) break;
        size_t at = rng_below(len - w + 1);
        if (rng() & 1) at &= ~(size_t)3;
        uint64_t v = interesting[rng_below(sizeof interesting / sizeof interesting[0])];
        if (rng_below(4) == 0) v = (uint64_t)len + (uint64_t)(int64_t)(rng_below(5) - 2);
        memcpy(buf + at, &v, w); /* little-endian low bytes */
        break;
    }
    case 6: /* random byte */
        if (len) buf[rng_below(len)] = (uint8_t)rng();
        break;
    case 7: { /* copy a chunk over another place */
        if (len < 2) break;
        size_t from = rng_below(len), to = rng_below(len), k = 1 + rng_below(32);
        if (k > len - from) k = len - from;
        if (k > len - to) k = len - to;
        memmove(buf + to, buf + from, k);
        break;
    }
    }
}

static unsigned long env_ul(const char *name, unsigned long def) {
    const char *s = getenv(name);
    return s && *s ? strtoul(s, NULL, 0) : def;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    if (!strncmp(prog, "fuzz_", 5)) prog += 5; /* "fuzz gguf: ..." */
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR|FILE...\n", prog);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz %s: no corpus at %s (%s); using built-in seeds\n", prog, argv[i],
                    strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) read_dir(argv[i]);
        else read_file(argv[i]);
    }
    if (n_inputs == 0) { /* still exercise the target: empty input and a few random bytes */
        add_input(calloc(1, 1), 0, "<empty>");
        uint8_t *r = malloc(64);
        rng_state = 0x9E3779B97F4A7C15ull;
        for (int i = 0; i < 64; i++) r[i] = (uint8_t)rng();
        add_input(r, 64, "<random>");
    }

    size_t max_len = 0;
    for (size_t i = 0; i < n_inputs; i++) {
        run_one(inputs[i].p, inputs[i].n);
        if (inputs[i].n > max_len) max_len = inputs[i].n;
    }
    size_t n_seeds = n_inputs;

    unsigned long n_mut = env_ul("LI_FUZZ_MUTATIONS", 2000);
    double deadline = now() + (double)env_ul("LI_FUZZ_SECONDS", 20);
    rng_state = env_ul("LI_FUZZ_SEED", 0x1234ABCDu) | 1;
    size_t cap = max_len + 256;
    uint8_t *buf = malloc(cap);
    unsigned long done = 0;
    for (; done < n_mut; done++) {
        if ((done & 63) == 0 && now() > deadline) {
            fprintf(stderr, "fuzz %s: time cap reached after %lu mutations\n", prog, done);
            break;
        }
        const input *in = &inputs[done % n_seeds];
        size_t n = in->n;
        memcpy(buf, in->p, n);
        /* mostly one edit; sometimes a few stacked */
        int edits = rng_below(4) == 0 ? 2 + (int)rng_below(4) : 1;
        for (int e = 0; e < edits; e++) mutate_once(buf, &n, cap);
        run_one(buf, n);
    }
    free(buf);
    printf("fuzz %s: %llu inputs, 0 crashes (%zu seeds, %lu mutations)\n", prog, (unsigned long long)n_run,
           n_seeds, done);
    for (size_t i = 0; i < n_inputs; i++) {
        free(inputs[i].p);
        free(inputs[i].name);
    }
    free(inputs);
    return 0;
}
