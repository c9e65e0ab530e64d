/* key_table.c: joins a plugin's recipe-key lists into one table (dsarl_key_table_join, plugin.h). Plugins whose keys
 * come partly from libdsarl (checkpointing, optimizer, logger, datasets) cannot list them in a static initializer,
 * so they join them at load into a fixed table; the join refuses to overflow it rather than drop keys. */
#include <string.h>

#include "dsarl/plugin.h"

int dsarl_key_table_join(const char *owner, const dsarl_key_list *lists, size_t n_lists, dsarl_key_spec *table,
                         size_t capacity, size_t *n_out, dsarl_error *err)
{
    *n_out = 0;
    const char *who = owner ? owner : "a plugin";
    if (n_lists > 0 && !lists)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "%s: %zu key lists to join but no list array", who, n_lists);
    size_t total = 0;
    for (size_t i = 0; i < n_lists; i++) {
        if (lists[i].n_keys > 0 && !lists[i].keys)
            return DSARL_FAIL(err, DSARL_E_INTERNAL, "%s: key list %zu has %zu keys but no array", who, i,
                              lists[i].n_keys);
        if (lists[i].n_keys > SIZE_MAX - total)
            return DSARL_FAIL(err, DSARL_E_INTERNAL, "%s: key lists too long to count", who);
        total += lists[i].n_keys;
    }
    if (total > capacity || (total > 0 && !table))
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "%s: %zu recipe keys do not fit its key table of %zu", who, total,
                          table ? capacity : 0);
    size_t at = 0;
    for (size_t i = 0; i < n_lists; i++) {
        if (lists[i].n_keys > 0)
            memcpy(table + at, lists[i].keys, lists[i].n_keys * sizeof *table);
        at += lists[i].n_keys;
    }
    *n_out = total;
    return DSARL_OK;
}
