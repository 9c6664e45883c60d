/* amx.h — the tile configuration the AMX kernels share (ops_amx.c,
 * w8_amx.c, ops_q4g_amx.c). Only for files compiled with -mamx-tile;
 * callers check li_cpu_amx_usable() (cpu_kernels.h) first. */
#ifndef LI_AMX_H
#define LI_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct li_amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} li_amx_cfg;

/* Loads palette 1 with tile t (< 8) of rows[t] rows of colsb[t] bytes
 * (rows 0: unused). Tile data is zeroed by it. */
static inline void li_amx_config(const uint8_t rows[8], const uint16_t colsb[8]) {
    li_amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = rows[t];
        c.colsb[t] = rows[t] ? colsb[t] : 0;
    }
    /* GCC 12 does not see ldtilecfg read c and drops the stores above */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

#endif
