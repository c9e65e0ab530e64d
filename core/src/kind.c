/* kind.c: names of plugin kinds. */
#include <string.h>

#include "dsarl/plugin.h"

static const char *const kind_names[DSARL_KIND_COUNT] = {"model", "device", "dsa", "generation", "algorithm",
                                                         "environment"};

const char *dsarl_kind_name(dsarl_kind kind)
{
    return (unsigned)kind < DSARL_KIND_COUNT ? kind_names[kind] : NULL;
}

int dsarl_kind_parse(const char *name, dsarl_kind *out)
{
    for (int i = 0; i < DSARL_KIND_COUNT; i++) {
        if (name && strcmp(name, kind_names[i]) == 0) {
            *out = (dsarl_kind)i;
            return 0;
        }
    }
    return -1;
}
