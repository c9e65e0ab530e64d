/* check_arena.c: alignment, exhaustion messages, marks and high water, and that a planning arena reproduces a real
 * arena's offsets for a random allocation script. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsarl/arena.h"

static uint64_t rng_state;

static uint32_t next_u32(void) /* xorshift64*, test-only */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

START_TEST(test_alignment)
{
    void *region = NULL;
    ck_assert_int_eq(posix_memalign(&region, 4096, 1 << 16), 0);
    dsarl_arena a;
    dsarl_arena_init(&a, region, 1 << 16);
    dsarl_error err = {0};
    void *p;
    ck_assert_int_eq(dsarl_arena_alloc(&a, 3, 1, &p, &err), DSARL_OK);
    ck_assert_ptr_eq(p, region);
    ck_assert_uint_eq(dsarl_arena_used(&a), 3);
    ck_assert_int_eq(dsarl_arena_alloc(&a, 10, 0, &p, &err), DSARL_OK); /* default 256 */
    ck_assert_ptr_eq(p, (char *)region + 256);
    ck_assert_uint_eq(dsarl_arena_used(&a), 266);
    static const size_t aligns[] = {1, 2, 4, 8, 16, 64, 128, 512, 1024, 4096};
    for (int i = 0; i < 200; i++) {
        size_t align = aligns[next_u32() % 10];
        ck_assert_int_eq(dsarl_arena_alloc(&a, next_u32() % 97, align, &p, &err), DSARL_OK);
        ck_assert_uint_eq((uintptr_t)p % align, 0);
        ck_assert((char *)p >= (char *)region && (char *)p <= (char *)region + (1 << 16));
        memset(p, 0x5a, 1); /* the memory is really ours (ASan would object otherwise) */
        if (dsarl_arena_used(&a) > (1 << 15))
            dsarl_arena_reset(&a);
    }
    ck_assert_int_eq(dsarl_arena_alloc(&a, 1, 24, &p, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "alignment 24 is not a power of two"));
    /* A base that is not aligned enough is refused rather than handing out a misaligned pointer. */
    dsarl_arena off;
    dsarl_arena_init(&off, (char *)region + 8, 1024);
    ck_assert_int_eq(dsarl_arena_alloc(&off, 4, 8, &p, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_arena_alloc(&off, 4, 64, &p, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "not aligned to the requested 64"));
    free(region);
}
END_TEST

START_TEST(test_exhaustion_names_the_numbers)
{
    unsigned char region[1024] __attribute__((aligned(256)));
    dsarl_arena a;
    dsarl_arena_init(&a, region, sizeof region);
    a.name = "activations";
    dsarl_error err = {0};
    void *p;
    ck_assert_int_eq(dsarl_arena_alloc(&a, 700, 0, &p, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_arena_alloc(&a, 300, 0, &p, &err), DSARL_E_NOMEM); /* 768 + 300 > 1024 after padding */
    ck_assert_str_eq(err.message,
                     "activations: out of capacity: requested 300 bytes (aligned to 256) with 700 of 1024 bytes used");
    ck_assert_uint_eq(dsarl_arena_used(&a), 700); /* a failed allocation changes nothing */
    ck_assert_int_eq(dsarl_arena_alloc(&a, 300, 4, &p, &err), DSARL_OK); /* fits with small alignment */
    ck_assert_ptr_eq(p, region + 700);
    ck_assert_int_eq(dsarl_arena_alloc(&a, SIZE_MAX, 1, &p, &err), DSARL_E_NOMEM); /* no wrap-around */
    dsarl_arena plan;
    dsarl_arena_init(&plan, NULL, SIZE_MAX);
    ck_assert_int_eq(dsarl_arena_alloc(&plan, 16, 0, &p, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_arena_alloc(&plan, SIZE_MAX - 100, 0, &p, &err), DSARL_E_NOMEM);
}
END_TEST

START_TEST(test_marks_and_high_water)
{
    dsarl_arena a;
    dsarl_arena_init(&a, NULL, 1 << 20);
    dsarl_error err = {0};
    size_t off;
    ck_assert_int_eq(dsarl_arena_alloc_offset(&a, 1000, 0, &off, &err), DSARL_OK);
    dsarl_arena_mark m1 = dsarl_arena_get_mark(&a);
    ck_assert_int_eq(dsarl_arena_alloc_offset(&a, 5000, 0, &off, &err), DSARL_OK);
    ck_assert_uint_eq(off, 1024);
    dsarl_arena_mark m2 = dsarl_arena_get_mark(&a);
    ck_assert_int_eq(dsarl_arena_alloc_offset(&a, 3, 0, &off, &err), DSARL_OK);
    ck_assert_uint_eq(off, 6144);
    ck_assert_uint_eq(dsarl_arena_high_water(&a), 6147);
    ck_assert_int_eq(dsarl_arena_reset_to_mark(&a, m2, &err), DSARL_OK);
    ck_assert_uint_eq(dsarl_arena_used(&a), 6024);
    ck_assert_int_eq(dsarl_arena_reset_to_mark(&a, m1, &err), DSARL_OK);
    ck_assert_uint_eq(dsarl_arena_used(&a), 1000);
    ck_assert_int_eq(dsarl_arena_alloc_offset(&a, 8, 0, &off, &err), DSARL_OK);
    ck_assert_uint_eq(off, 1024); /* the released space is reused */
    ck_assert_int_eq(dsarl_arena_reset_to_mark(&a, m2, &err), DSARL_E_INVALID); /* m2 is past use now */
    ck_assert_ptr_nonnull(strstr(err.message, "mark 6024 lies past the current use 1032"));
    ck_assert_uint_eq(dsarl_arena_high_water(&a), 6147); /* kept across resets */
    dsarl_arena_reset(&a);
    ck_assert_uint_eq(dsarl_arena_used(&a), 0);
    ck_assert_uint_eq(dsarl_arena_high_water(&a), 6147);
}
END_TEST

/* Replays one random script of allocations, marks and resets; returns the offsets it got. */
static int replay(dsarl_arena *a, uint64_t seed, size_t *offsets, int n)
{
    rng_state = seed;
    dsarl_arena_mark marks[16];
    int depth = 0, got = 0;
    dsarl_error err = {0};
    for (int i = 0; i < n; i++) {
        uint32_t action = next_u32() % 10;
        if (action == 0 && depth < 16) {
            marks[depth++] = dsarl_arena_get_mark(a);
        } else if (action == 1 && depth > 0) {
            ck_assert_int_eq(dsarl_arena_reset_to_mark(a, marks[--depth], &err), DSARL_OK);
        } else {
            size_t align = (size_t)1 << (next_u32() % 9);
            size_t bytes = next_u32() % 5000;
            void *p;
            ck_assert_int_eq(dsarl_arena_alloc(a, bytes, align, &p, &err), DSARL_OK);
            offsets[got] = a->base ? (size_t)((char *)p - (char *)a->base) : dsarl_arena_used(a) - bytes;
            got++;
        }
    }
    return got;
}

START_TEST(test_plan_matches_real)
{
    uint64_t seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL + 1;
    enum { STEPS = 2000 };
    size_t *planned = calloc(STEPS, sizeof *planned), *real = calloc(STEPS, sizeof *real);
    dsarl_arena plan;
    dsarl_arena_init(&plan, NULL, SIZE_MAX);
    int n_plan = replay(&plan, seed, planned, STEPS);
    /* A real region of exactly the planned high water: the same script must fit and land on the same offsets. */
    size_t size = dsarl_arena_high_water(&plan);
    void *region = NULL;
    ck_assert_int_eq(posix_memalign(&region, 256, size ? size : 1), 0);
    dsarl_arena a;
    dsarl_arena_init(&a, region, size);
    int n_real = replay(&a, seed, real, STEPS);
    ck_assert_int_eq(n_plan, n_real);
    ck_assert_mem_eq(planned, real, (size_t)n_real * sizeof *real);
    ck_assert_uint_eq(dsarl_arena_high_water(&a), size);
    /* One byte less and the same script must run out. */
    dsarl_arena small;
    dsarl_arena_init(&small, region, size - 1);
    rng_state = seed;
    dsarl_error err = {0};
    int failed = 0;
    dsarl_arena_mark marks[16];
    int depth = 0;
    for (int i = 0; i < STEPS && !failed; i++) {
        uint32_t action = next_u32() % 10;
        if (action == 0 && depth < 16) {
            marks[depth++] = dsarl_arena_get_mark(&small);
        } else if (action == 1 && depth > 0) {
            ck_assert_int_eq(dsarl_arena_reset_to_mark(&small, marks[--depth], &err), DSARL_OK);
        } else {
            size_t align = (size_t)1 << (next_u32() % 9);
            void *p;
            failed = dsarl_arena_alloc(&small, next_u32() % 5000, align, &p, &err) == DSARL_E_NOMEM;
        }
    }
    ck_assert(failed);
    free(region);
    free(planned);
    free(real);
}
END_TEST

int main(void)
{
    rng_state = (uint64_t)time(NULL) | 1;
    Suite *s = suite_create("arena");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_alignment);
    tcase_add_test(tc, test_exhaustion_names_the_numbers);
    tcase_add_test(tc, test_marks_and_high_water);
    tcase_add_test(tc, test_plan_matches_real);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
