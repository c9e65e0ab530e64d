/* dsarl/arena.h: a bump allocator over one pre-allocated region (host or device memory).
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Memory is planned, not discovered: a run sizes each phase (params, grads, optimizer, activations, KV cache) by
 * replaying its allocations on a planning arena (base NULL: it only counts), then allocates one region of the
 * high-water size and replays them for real with identical offsets. The arena never dereferences base, so base
 * may be a device pointer. Alignment is applied to offsets, so the base must itself be aligned to every alignment
 * requested (cudaMalloc and posix_memalign(256) bases are). */
#ifndef DSARL_ARENA_H
#define DSARL_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"

DSARL_BEGIN_DECLS

/* Alignment used when dsarl_arena_alloc is given align 0: enough for any CUDA vector load and cuBLAS/cuDNN. */
#define DSARL_ARENA_DEFAULT_ALIGN 256

typedef struct dsarl_arena {
    void *base;        /* start of the region; NULL for a planning arena */
    size_t capacity;   /* bytes available; SIZE_MAX for an unbounded planning arena */
    size_t used;       /* offset one past the last allocation */
    size_t high_water; /* the largest `used` ever reached: the size a real region needs */
    const char *name;  /* shown in errors ("activations"); "arena" by default */
} dsarl_arena;

/* A position to return to: everything allocated after it is released at once. */
typedef size_t dsarl_arena_mark;

/* Starts an empty arena over [base, base + capacity); base NULL makes a planning arena. */
DSARL_API void dsarl_arena_init(dsarl_arena *a, void *base, size_t capacity);

/* Reserves bytes at the next offset aligned to align (a power of two; 0 means DSARL_ARENA_DEFAULT_ALIGN) and
 * returns its offset from base. Fails without changing the arena when it does not fit. */
DSARL_API int dsarl_arena_alloc_offset(dsarl_arena *a, size_t bytes, size_t align, size_t *offset,
                                       dsarl_error *err);

/* As dsarl_arena_alloc_offset, returning base + offset (NULL in a planning arena). */
DSARL_API int dsarl_arena_alloc(dsarl_arena *a, size_t bytes, size_t align, void **ptr, dsarl_error *err);

/* The current position. */
DSARL_API dsarl_arena_mark dsarl_arena_get_mark(const dsarl_arena *a);

/* Releases everything allocated after mark; fails if mark lies past the current position (marks are LIFO). */
DSARL_API int dsarl_arena_reset_to_mark(dsarl_arena *a, dsarl_arena_mark mark, dsarl_error *err);

/* Releases everything (the high-water mark is kept). */
DSARL_API void dsarl_arena_reset(dsarl_arena *a);

/* Bytes in use (including alignment padding). */
DSARL_API size_t dsarl_arena_used(const dsarl_arena *a);

/* The largest use since init: the capacity a real arena needs for the same allocations. */
DSARL_API size_t dsarl_arena_high_water(const dsarl_arena *a);

DSARL_END_DECLS

#endif /* DSARL_ARENA_H */
