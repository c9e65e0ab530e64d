/* math_regex.h: a small backtracking regular-expression matcher over Unicode code points, with the semantics of
 * Python's re module for the subset hf_math_verify's answer extraction and LaTeX normalisation need: literals,
 * ., [classes] with ranges and \d \s \w, groups (?:...) (?P<name>...) (?i:...), alternation in order (leftmost
 * branch first), greedy and lazy * + ? {m,n}, ^ $ \b, negative lookahead (?!...) and one-character negative
 * lookbehind (?<!a|b). Every search runs under a step budget, so no input can make it run unbounded: a search
 * that exhausts it reports MRE_BUDGET and the caller counts a verifier failure. */
#ifndef DSARL_MATH_REGEX_H
#define DSARL_MATH_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define MRE_DOTALL 1u /* . also matches a newline (Python's re.DOTALL) */

enum { MRE_NOMATCH = 0, MRE_MATCH = 1, MRE_BUDGET = -1 };

typedef struct mre_prog mre_prog;

/* Compiles pattern (UTF-8). NULL on a syntax error (err gets a sentence) or when out of memory. */
mre_prog *mre_compile(const char *pattern, unsigned flags, char *err, size_t errlen);
void mre_free(mre_prog *prog);

/* Number of capture groups including group 0 (the whole match); caps arrays hold 2 longs per group. */
int mre_ngroups(const mre_prog *prog);

/* Index of the named group, or -1 when the pattern has none by that name. */
int mre_group(const mre_prog *prog, const char *name);

/* Name of group g (NULL for unnamed groups and group 0). */
const char *mre_group_name(const mre_prog *prog, int g);

/* Leftmost match starting at or after from in text[0..len) (code points), as re.search(text, from) would find
 * it; caps[2g], caps[2g+1] = start, end of group g (-1 when it did not take part). *budget is decremented per
 * step; at zero the search stops with MRE_BUDGET. */
int mre_search(const mre_prog *prog, const uint32_t *text, long len, long from, long *caps, long *budget);

/* UTF-8 to code points: a malloc'd array (*n code points), invalid bytes become U+FFFD. NULL when out of memory. */
uint32_t *mre_decode(const char *s, size_t bytes, long *n);

/* Code points back to UTF-8: malloc'd, NUL-terminated. NULL when out of memory. */
char *mre_encode(const uint32_t *cp, long n);

/* Python's str.isspace() for one code point. */
int mre_is_space(uint32_t c);

#endif /* DSARL_MATH_REGEX_H */
