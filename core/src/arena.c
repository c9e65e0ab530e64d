/* arena.c: bump allocation by offsets, so a planning arena (no memory) and a real one agree exactly. */
#include "dsarl/arena.h"

void dsarl_arena_init(dsarl_arena *a, void *base, size_t capacity)
{
    a->base = base;
    a->capacity = capacity;
    a->used = 0;
    a->high_water = 0;
    a->name = "arena";
}

int dsarl_arena_alloc_offset(dsarl_arena *a, size_t bytes, size_t align, size_t *offset, dsarl_error *err)
{
    const char *name = a->name ? a->name : "arena";
    if (align == 0)
        align = DSARL_ARENA_DEFAULT_ALIGN;
    if (align & (align - 1))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: alignment %zu is not a power of two", name, align);
    if (a->base && (uintptr_t)a->base % align != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: base %p is not aligned to the requested %zu bytes; give the "
                          "arena a base aligned to its largest alignment", name, a->base, align);
    size_t start = (a->used + align - 1) & ~(align - 1);
    if (start < a->used || bytes > SIZE_MAX - start || start + bytes > a->capacity)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of capacity: requested %zu bytes (aligned to %zu) with %zu of "
                          "%zu bytes used", name, bytes, align, a->used, a->capacity);
    a->used = start + bytes;
    if (a->used > a->high_water)
        a->high_water = a->used;
    *offset = start;
    return DSARL_OK;
}

int dsarl_arena_alloc(dsarl_arena *a, size_t bytes, size_t align, void **ptr, dsarl_error *err)
{
    size_t offset;
    DSARL_TRY(dsarl_arena_alloc_offset(a, bytes, align, &offset, err));
    /* Byte arithmetic on a possibly-device pointer: computed, never dereferenced. */
    *ptr = a->base ? (void *)((char *)a->base + offset) : NULL;
    return DSARL_OK;
}

dsarl_arena_mark dsarl_arena_get_mark(const dsarl_arena *a)
{
    return a->used;
}

int dsarl_arena_reset_to_mark(dsarl_arena *a, dsarl_arena_mark mark, dsarl_error *err)
{
    if (mark > a->used)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: mark %zu lies past the current use %zu; reset marks in the "
                          "reverse order they were taken", a->name ? a->name : "arena", mark, a->used);
    a->used = mark;
    return DSARL_OK;
}

void dsarl_arena_reset(dsarl_arena *a)
{
    a->used = 0;
}

size_t dsarl_arena_used(const dsarl_arena *a)
{
    return a->used;
}

size_t dsarl_arena_high_water(const dsarl_arena *a)
{
    return a->high_water;
}
