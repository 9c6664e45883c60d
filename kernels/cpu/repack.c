/* repack.c — weights copied at load time into the panel layout the SIMD
 * kernels stream (cpu_kernels.h, "packed weights"), and back out of it.
 *
 * A panel is 16 weight rows interleaved so one vector lane holds one row:
 * the kernels then need no horizontal sums at all, and each output is
 * computed by its own lane with the reference's operations in the
 * reference's order. Within a panel the quants of all blocks come first,
 * then the scales, so both are read as straight streams.
 *
 * After packing, the original rows are not read again by the CPU backend
 * (get_rows reads the panels too). When they lie in a read-only file
 * mapping (the GGUF), their pages are dropped from this process with
 * MADV_DONTNEED, so the model is not resident twice; they come back from the
 * page cache if anything reads them again. Any other memory is left alone
 * (DONTNEED would zero anonymous memory). */
#define _GNU_SOURCE
#include "util/common.h"
#include "cpu/cpu_kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * the arena: panels of successive weights back to back
 *
 * Weights are prepared in the order the forward pass uses them (embedding,
 * then each layer's q, k, v, o, gate, up, down), so packing them one after
 * another into big chunks turns a decode step's weight reads into one long
 * stream: the prefetching that runs ahead of one matmul is already fetching
 * the next one. Chunks are 2 MiB aligned and asked for transparent huge
 * pages (fewer TLB misses while streaming ~100 MB per token). A chunk is
 * unmapped when the last weight in it is released.
 * ---------------------------------------------------------------------- */

#define ARENA_CHUNK ((size_t)64 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct arena_chunk {
    uint8_t *base;         /* HUGE_PAGE aligned */
    size_t size, used;
    int live;              /* packed weights in it */
} arena_chunk;

static pthread_mutex_t arena_mu = PTHREAD_MUTEX_INITIALIZER;
static arena_chunk *arena_cur; /* the chunk being filled, NULL if none */

static arena_chunk *chunk_new(size_t need) {
    const size_t size = (LI_MAX(need, ARENA_CHUNK) + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    /* over-map by a huge page to align the start */
    uint8_t *raw = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    const size_t tail = (size_t)(raw + size + HUGE_PAGE - (base + size));
    if (tail) munmap(base + size, tail);
#ifdef MADV_HUGEPAGE
    (void)madvise(base, size, MADV_HUGEPAGE);
#endif
    arena_chunk *c = calloc(1, sizeof *c);
    if (!c) {
        munmap(base, size);
        return NULL;
    }
    c->base = base;
    c->size = size;
    return c;
}

/* Each allocation is preceded by a 64-byte header holding its size, so the
 * one after p is found at p + its size (li_cpu_packed_next). */
#define ARENA_HDR 64

/* bytes (a multiple of 64) of zeroed memory, 64-byte aligned */
static void *arena_alloc(size_t bytes, arena_chunk **owner) {
    bytes = (bytes + 63) & ~(size_t)63;
    pthread_mutex_lock(&arena_mu);
    arena_chunk *c = arena_cur;
    bytes += ARENA_HDR;
    if (!c || c->size - c->used < bytes + ARENA_HDR) { /* room for the next header too */
        if (c && c->live == 0) { /* nothing left in it: drop it now */
            munmap(c->base, c->size);
            free(c);
        }
        c = arena_cur = chunk_new(bytes + ARENA_HDR);
    }
    void *p = NULL;
    if (c) {
        p = c->base + c->used + ARENA_HDR; /* fresh mmap pages are zero */
        __atomic_store_n((uint64_t *)(c->base + c->used), (uint64_t)(bytes - ARENA_HDR), __ATOMIC_RELAXED);
        c->used += bytes;
        c->live++;
        *owner = c;
    }
    pthread_mutex_unlock(&arena_mu);
    return p;
}

static void arena_free(arena_chunk *c) {
    pthread_mutex_lock(&arena_mu);
    if (--c->live == 0 && c != arena_cur) {
        munmap(c->base, c->size);
        free(c);
    } else if (c->live == 0) { /* the current chunk, now empty: start it over */
        (void)madvise(c->base, c->used, MADV_DONTNEED);
        c->used = 0;
    }
    pthread_mutex_unlock(&arena_mu);
}

void *li_cpu_arena_alloc(size_t bytes, void **chunk) { return arena_alloc(bytes, (arena_chunk **)chunk); }

void li_cpu_arena_free(void *chunk) {
    if (chunk) arena_free(chunk);
}

bool li_cpu_pack_supported(li_type t) {
    switch (t) {
    case LI_TYPE_Q4_0:
    case LI_TYPE_Q4_1:
    case LI_TYPE_Q8_0:
    case LI_TYPE_F32:
    case LI_TYPE_F16:
    case LI_TYPE_BF16: return true;
    default: return false;
    }
}

static bool is_quant(li_type t) { return t == LI_TYPE_Q4_0 || t == LI_TYPE_Q4_1 || t == LI_TYPE_Q8_0; }

/* ------------------------------------------------------------------------
 * one panel
 * ---------------------------------------------------------------------- */

/* Rows [r0, r0 + rows) of w (rows <= 16) into panel `dst` (zeroed). */
static void pack_panel_q(const li_weight *w, const li_cpu_packed *p, int64_t r0, int rows, uint8_t *dst) {
    const li_type t = w->type;
    const int64_t nb = p->nb;
    const size_t qsb = p->qs_bytes;
    uint8_t *qs = dst, *dd = dst + nb * qsb, *mm = dd + nb * 32;
    if (t == LI_TYPE_Q8_0) memset(qs, 0x80, (size_t)nb * qsb); /* padding rows: q = 0, stored as 128 */
    for (int l = 0; l < rows; l++) {
        const char *row = (const char *)w->data + (r0 + l) * w->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *q = qs + b * qsb;
            if (t == LI_TYPE_Q8_0) {
                const li_block_q8_0 *x = (const li_block_q8_0 *)row + b;
                memcpy(dd + b * 32 + l * 2, &x->d, 2);
                for (int j = 0; j < 32; j++) q[(j / 4) * 64 + l * 4 + j % 4] = (uint8_t)(x->qs[j] ^ 0x80);
            } else {
                const uint8_t *xq;
                if (t == LI_TYPE_Q4_1) {
                    const li_block_q4_1 *x = (const li_block_q4_1 *)row + b;
                    memcpy(dd + b * 32 + l * 2, &x->d, 2);
                    memcpy(mm + b * 32 + l * 2, &x->m, 2);
                    xq = x->qs;
                } else {
                    const li_block_q4_0 *x = (const li_block_q4_0 *)row + b;
                    memcpy(dd + b * 32 + l * 2, &x->d, 2);
                    xq = x->qs;
                }
                for (int j = 0; j < 16; j++) q[(j / 4) * 64 + l * 4 + j % 4] = xq[j];
            }
        }
    }
}

static void pack_panel_f(const li_weight *w, const li_cpu_packed *p, int64_t r0, int rows, uint8_t *dst) {
    const size_t es = p->qs_bytes;
    for (int l = 0; l < rows; l++) {
        const char *row = (const char *)w->data + (r0 + l) * w->row_bytes;
        for (int64_t j = 0; j < w->k; j++) memcpy(dst + ((size_t)j * LI_PANEL + l) * es, row + j * es, es);
    }
}

/* true when [p, p + n) lies in one read-only private mapping of a file
 * (/proc/self/maps: "start-end perms offset dev inode path") */
static bool in_readonly_file_map(const void *p, size_t n) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return false;
    const uintptr_t lo = (uintptr_t)p, hi = lo + n;
    char line[512], perms[8];
    bool ok = false;
    unsigned long long start, end, inode;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx-%llx %7s %*s %*s %llu", &start, &end, perms, &inode) != 4) continue;
        if (lo >= start && lo < end) {
            ok = hi <= end && inode != 0 && perms[0] == 'r' && perms[1] == '-' && perms[3] == 'p';
            break;
        }
    }
    fclose(f);
    return ok;
}

void li_cpu_drop_pages(const void *data, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)data + page - 1) & ~(page - 1);
    const uintptr_t hi = ((uintptr_t)data + bytes) & ~(page - 1);
    if (hi > lo && in_readonly_file_map((const void *)lo, hi - lo)) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ------------------------------------------------------------------------
 * prepare / release
 * ---------------------------------------------------------------------- */

int li_cpu_pack(li_weight *w) {
    /* scheme weights (scales beside the codes) have no panel layout yet */
    if (!li_cpu_pack_supported(w->type) || w->scheme != LI_SCHEME_PLAIN || w->k <= 0 || w->m <= 0) return LI_EUNSUP;
    if (is_quant(w->type) && w->k % 32) return LI_EUNSUP;
    li_cpu_packed *p = calloc(1, sizeof *p);
    if (!p) return LI_ENOMEM;
    p->magic = LI_PACKED_MAGIC;
    p->type = w->type;
    p->k = w->k;
    p->m = w->m;
    p->n_panels = (w->m + LI_PANEL - 1) / LI_PANEL;
    if (is_quant(w->type)) {
        p->nb = w->k / 32;
        p->qs_bytes = w->type == LI_TYPE_Q8_0 ? 512 : 256;
        p->panel_bytes = (size_t)p->nb * (p->qs_bytes + 32 * (w->type == LI_TYPE_Q4_1 ? 2 : 1));
    } else {
        p->qs_bytes = li_kv_elem_size(w->type);
        p->panel_bytes = (size_t)w->k * LI_PANEL * p->qs_bytes;
    }
    p->panel_bytes = (p->panel_bytes + 63) & ~(size_t)63;
    const size_t bytes = p->panel_bytes * (size_t)p->n_panels;
    p->data = arena_alloc(bytes, (arena_chunk **)&p->chunk);
    if (!p->data) {
        free(p);
        return LI_ENOMEM;
    }
    for (int64_t pi = 0; pi < p->n_panels; pi++) {
        const int rows = (int)LI_MIN((int64_t)LI_PANEL, w->m - pi * LI_PANEL);
        uint8_t *dst = p->data + pi * p->panel_bytes;
        if (is_quant(w->type)) pack_panel_q(w, p, pi * LI_PANEL, rows, dst);
        else pack_panel_f(w, p, pi * LI_PANEL, rows, dst);
    }
    li_cpu_drop_pages(w->data, w->row_bytes * (size_t)w->m); /* the original rows are not read again here */
    w->packed = p;
    return 0;
}

void li_cpu_pack_free(li_weight *w) {
    li_cpu_packed *p = w->packed;
    if (!p || p->magic != LI_PACKED_MAGIC) return;
    p->magic = 0;
    arena_free(p->chunk);
    free(p);
    w->packed = NULL;
}

void li_cpu_arena_next(const void *data, size_t bytes, const uint8_t **next, size_t *next_bytes) {
    /* the chunk always has room for the header after the last allocation;
     * with no successor (yet, or any more) it reads 0 */
    const uint8_t *end = (const uint8_t *)data + ((bytes + 63) & ~(size_t)63);
    *next_bytes = (size_t)__atomic_load_n((const uint64_t *)end, __ATOMIC_RELAXED);
    *next = end + ARENA_HDR;
}

void li_cpu_packed_next(const li_cpu_packed *p, const uint8_t **data, size_t *bytes) {
    li_cpu_arena_next(p->data, p->panel_bytes * (size_t)p->n_panels, data, bytes);
}

/* ------------------------------------------------------------------------
 * get_rows from panels: the type's to_float, reading the panel layout
 * ---------------------------------------------------------------------- */

void li_cpu_packed_get_row(const li_cpu_packed *p, int64_t row, float *out) {
    const uint8_t *panel = p->data + (row / LI_PANEL) * p->panel_bytes;
    const int l = (int)(row % LI_PANEL);
    if (!is_quant(p->type)) {
        for (int64_t j = 0; j < p->k; j++)
            out[j] = li_float_load(p->type, panel, j * LI_PANEL + l);
        return;
    }
    const int64_t nb = p->nb;
    const size_t qsb = p->qs_bytes;
    const uint8_t *dd = panel + nb * qsb, *mm = dd + nb * 32;
    for (int64_t b = 0; b < nb; b++, out += 32) {
        const uint8_t *q = panel + b * qsb;
        uint16_t h;
        memcpy(&h, dd + b * 32 + l * 2, 2);
        const float d = li_fp16_to_fp32(h);
        switch (p->type) {
        case LI_TYPE_Q8_0:
            for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)(q[(j / 4) * 64 + l * 4 + j % 4] ^ 0x80) * d;
            break;
        case LI_TYPE_Q4_1: {
            memcpy(&h, mm + b * 32 + l * 2, 2);
            const float m = li_fp16_to_fp32(h);
            for (int j = 0; j < 16; j++) {
                const uint8_t v = q[(j / 4) * 64 + l * 4 + j % 4];
                out[j] = (float)(v & 0x0f) * d + m;
                out[j + 16] = (float)(v >> 4) * d + m;
            }
            break;
        }
        case LI_TYPE_Q4_0:
            for (int j = 0; j < 16; j++) {
                const uint8_t v = q[(j / 4) * 64 + l * 4 + j % 4];
                out[j] = (float)((v & 0x0f) - 8) * d;
                out[j + 16] = (float)((v >> 4) - 8) * d;
            }
            break;
        default: li_type_unreachable("cpu: packed get_row", p->type); /* li_cpu_pack packs no other */
        }
    }
}
